"""Every command's exit status, from one table: what a script, CI job or scheduler can
tell apart without reading the output (README, "Exit status")."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ridgeline.loop.verify import VerifyResult
    from ridgeline.probe.config import ProbeResult
    from ridgeline.telemetry.summary import StepSummary


class ExitCode(IntEnum):
    OK = 0
    """Measured, and it passed: a valid step, a capacity found, a plan verified."""
    SLO_MISSED = 1
    """Measured, and the server missed its SLO: no rate held it, a plan failed verify,
    requests were lost."""
    ERROR = 2
    """Bad input, or a failure: an option or file rejected, an endpoint that failed its
    connect check (a wrong model name or path), a server that stopped answering."""
    INCONCLUSIVE = 3
    """Measured, but what was measured was the host, not the server: a step marked
    INVALID (the generator fell behind its schedule), a probe without a valid estimate,
    a verify the busy host left INCONCLUSIVE."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C or SIGTERM: what was measured is stored, the run marked
    interrupted."""


EPILOG = (
    "Exit status: 0 passed; 1 the SLO was missed; 2 bad input or an error (an endpoint "
    "that fails its connect check: a wrong model name or URL path); 3 inconclusive (the "
    "host, not the server, was measured: an INVALID step); 130 interrupted by Ctrl-C or "
    "SIGTERM (what was measured is stored)."
)


def step_code(summary: StepSummary) -> ExitCode:
    """``ridgeline run``: a step has no SLO; it is the server's (0) or the host's (3)."""
    return ExitCode.OK if summary.valid else ExitCode.INCONCLUSIVE


def probe_code(result: ProbeResult) -> ExitCode:
    """``ridgeline probe``: a valid estimate (0); none, where the steps that measured the
    server all missed the SLO (1); a failed probe (2); none, or one not valid, because
    the steps measured the host (3); interrupted (130)."""
    from ridgeline.health.state import HealthState

    if result.status == "interrupted":
        return ExitCode.INTERRUPTED
    if result.status == "failed":
        return ExitCode.ERROR
    if result.valid:
        return ExitCode.OK
    measured = [HealthState(v["state"]) for v in result.trajectory if v["valid"]]
    if result.capacity_rps is None and measured and not any(s.sustainable for s in measured):
        return ExitCode.SLO_MISSED
    if result.confirmed is False:
        return ExitCode.SLO_MISSED  # the estimate failed its confirmation, and every back-off
    return ExitCode.INCONCLUSIVE


def verify_code(result: VerifyResult) -> ExitCode:
    """``ridgeline verify``: its verdict's code (``loop_code``)."""
    return loop_code(result.verdict)


def loop_code(verdict: str) -> ExitCode:
    """``verify`` and ``demo``: PASS (0), FAIL (1), INCONCLUSIVE (3)."""
    if verdict == "FAIL":
        return ExitCode.SLO_MISSED
    if verdict == "INCONCLUSIVE":
        return ExitCode.INCONCLUSIVE
    return ExitCode.OK
