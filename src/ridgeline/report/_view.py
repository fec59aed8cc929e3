"""A stored run (``RunStore.get_run``) read into typed series for the report.

Steps ran one after another, so a window's time on the run's clock is the sum of the
earlier steps' durations plus its own start within its step (warmup steps included,
as the probe's own timeline counts them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ridgeline.errors import StoreError
from ridgeline.probe.config import AtCapacity
from ridgeline.telemetry.summary import Percentiles, ServerMetrics, StepSummary
from ridgeline.telemetry.windows import Window

STATES = ("healthy", "warn", "unhealthy", "overloaded", "critical")
"""Health states from best to worst: the order of the timeline's axis and legend."""


class TrajectoryPoint(BaseModel):
    """One search step as the strategy was told it (a ``StepVerdict``)."""

    model_config = ConfigDict(extra="ignore")

    rate: float
    duration_s: float
    state: str
    score: float
    valid: bool = True
    purpose: str = ""
    achieved_rps: float = 0.0
    p99_ms: float | None = None
    excluded_warmup_s: float = 0.0
    reason: str = ""


class ProbeSummary(BaseModel):
    """The stored summary of a probe run (what ``ridgeline probe --json`` prints)."""

    model_config = ConfigDict(extra="ignore")

    capacity_rps: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    strategy: str = ""
    steps: int = 0
    test_seconds: float = 0.0
    warmup_excluded_s: float = 0.0
    valid: bool = False
    confirmed: bool | None = None
    reason: str = ""
    slo: str = ""
    at_capacity: AtCapacity | None = None
    health_timeline: list[dict[str, Any]] = Field(default_factory=list)
    trajectory: list[TrajectoryPoint] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StepView:
    index: int
    start_s: float
    """When the step began on the run's clock, s."""
    summary: StepSummary


@dataclass(frozen=True, slots=True)
class WindowView:
    step: int
    t_s: float
    """Window start on the run's clock, s."""
    window: Window

    @property
    def state(self) -> str | None:
        """The health state; 'warmup' for an excluded window with no state; None if unassessed."""
        if self.window.state is not None:
            return self.window.state
        return "warmup" if self.window.excluded else None


@dataclass(frozen=True, slots=True)
class RunView:
    id: int
    kind: str
    target: str
    status: str
    status_reason: str | None
    started_at: float
    """Unix time the run began."""
    steps: list[StepView]
    windows: list[WindowView]
    probe: ProbeSummary | None
    """Set for a probe run that stored its summary."""

    @property
    def duration_s(self) -> float:
        return sum(s.summary.duration_s for s in self.steps)


def view_of(run: dict[str, Any]) -> RunView:
    """Read ``run`` (as ``RunStore.get_run`` returns it) into typed series."""
    try:
        steps: list[StepView] = []
        wins: list[WindowView] = []
        t = 0.0
        for step in run["steps"]:
            summary = StepSummary.model_validate(step["summary"])
            steps.append(StepView(step["index"], t, summary))
            for w in step["windows"]:
                window = Window.model_validate(w)
                wins.append(WindowView(step["index"], t + window.start_s, window))
            t += summary.duration_s
        stored = run.get("summary")
        probe = (
            ProbeSummary.model_validate(stored)
            if run["kind"] == "probe" and isinstance(stored, dict)
            else None
        )
        return RunView(
            id=int(run["id"]),
            kind=str(run["kind"]),
            target=str(run["target"]),
            status=str(run["status"]),
            status_reason=run.get("status_reason"),
            started_at=float(run["started_at"]),
            steps=steps,
            windows=wins,
            probe=probe,
        )
    except (KeyError, TypeError, ValidationError) as exc:
        raise StoreError(
            f"run {run.get('id')} is not laid out as this version of ridgeline stores runs "
            f"({type(exc).__name__}: {exc}); pass a dict from RunStore.get_run, or re-run it"
        ) from exc


def step_label(index: int) -> str:
    """A stored step's name wherever it is shown (the live probe lines, ``runs show``,
    the report): numbered from 1, warmup steps included, as the probe ran them."""
    return f"step {index + 1}"


SERVER_LINES = 16
"""Server metrics shown per step at most (all are kept: ``runs show --json``)."""


def server_lines(m: ServerMetrics) -> list[str]:
    """What the server's metrics said over a step: a heading, then each counter that
    moved (its increase) and each gauge ever above zero (its peak), by name, histogram
    buckets left out."""
    moved = [f"{k} +{v:,.6g}" for k, v in sorted(m.increase.items()) if v and _shown(k)]
    peaks = [f"{k} peak {v:,.6g}" for k, v in sorted(m.peak.items()) if v and _shown(k)]
    failed = f", {m.failures} failed" if m.failures else ""
    head = f"server metrics from {m.url} ({m.scrapes} scrapes{failed})"
    items = moved + peaks or ["nothing moved"]
    more = len(items) - SERVER_LINES
    return [head, *items[:SERVER_LINES], *([f"… {more} more (--json)"] if more > 0 else [])]


def _shown(key: str) -> bool:
    """A histogram's buckets are left to ``--json``: its count and sum say enough here."""
    return not key.partition("{")[0].endswith("_bucket")


def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} req/s"


def fmt_ci(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:,.1f}, {high:,.1f}] req/s"


def _p50_p99(p: Percentiles | None) -> str | None:
    if p is None or p.p50 is None or p.p99 is None:
        return None
    return f"p50 {p.p50:,.2f} ms, p99 {p.p99:,.2f} ms"


def token_facts(s: StepSummary | AtCapacity) -> list[tuple[str, str]]:
    """Goodput, tokens/s and the token latencies of a step (or of the step that held at
    a probe's capacity), those it measured: what an LLM endpoint is judged by."""
    out = []
    if s.goodput_rps is not None:
        out.append(("goodput", f"{fmt_rate(s.goodput_rps)} within every bound of the SLO"))
    if s.input_tokens_per_s is not None or s.output_tokens_per_s is not None:
        tin, tout = (
            "-" if v is None else f"{v:,.1f}" for v in (s.input_tokens_per_s, s.output_tokens_per_s)
        )
        out.append(("tokens/s", f"in {tin}, out {tout}"))
    for label, p in (
        ("TTFT (from schedule)", s.ttft_ms),
        ("ITL (every gap, pooled)", s.itl_ms),
        ("TPOT (per request)", s.tpot_ms),
    ):
        if (text := _p50_p99(p)) is not None:
            out.append((label, text))
    return out


def facts(view: RunView) -> list[tuple[str, str]]:
    """The run's headline numbers as (label, text) pairs: the report's header."""
    status = view.status + (f" ({view.status_reason})" if view.status_reason else "")
    p = view.probe
    if p is not None:
        verdict = "valid" if p.valid else "NOT valid"
        if p.confirmed is not None:
            verdict += ", confirmed" if p.confirmed else ", did not hold its confirmation"
        return [
            ("target", view.target),
            ("SLO", p.slo or "-"),
            (
                "estimate",
                "none within the SLO" if p.capacity_rps is None else fmt_rate(p.capacity_rps),
            ),
            ("confidence interval", fmt_ci(p.ci_low, p.ci_high)),
            *(
                (f"at the estimate: {k}", v)
                for k, v in (token_facts(p.at_capacity) if p.at_capacity else [])
            ),
            ("strategy", p.strategy or "-"),
            ("steps", str(p.steps)),
            ("test-seconds", f"{p.test_seconds:,.1f} s"),
            ("warmup excluded", f"{p.warmup_excluded_s:,.1f} s"),
            ("verdict", verdict + (f": {p.reason}" if p.reason else "")),
            ("status", status),
        ]
    out = [("target", view.target), ("status", status), ("duration", f"{view.duration_s:,.1f} s")]
    for s in view.steps:
        m = s.summary
        p99 = "-" if m.latency_ms.p99 is None else f"{m.latency_ms.p99:,.2f} ms"
        valid = "valid" if m.valid else f"INVALID: {m.invalid_reason}"
        out.append(
            (
                step_label(s.index),
                f"offered {fmt_rate(m.offered_rps)}, achieved {fmt_rate(m.achieved_rps)}, "
                f"p99 {p99}, errors {m.error_rate:.2%}, {valid}",
            )
        )
        out += [(f"{step_label(s.index)}: {k}", v) for k, v in token_facts(m)]
    return out
