"""Is a step the server's result, or the generator's? A pure rule.

A step is invalid, with the reason, when it was interrupted, could not send every
scheduled request, waited on the outstanding-request limit, had requests fail in the
generator itself (out of file descriptors, memory or local ports), or fell behind its
schedule by enough to move what it measured. It is never reported as the server's
result.

**Lateness.** Latency is timed from the *scheduled* send, so a late send never hides a
slow server: it adds its lateness to the latency measured, and can only make the server
look worse. What matters is how much it moved the figure judged. The rule measures that
directly: the p99 latency from the schedule minus the p99 latency from the actual send
(one estimator, the summary's) is the generator's share of the p99. It may be at most
``effect_fraction`` (5 %) of a reference, and never less than ``effect_floor_ms`` (1 ms):
the SLO's tightest latency bound when the step is judged against one
(``latency_bound_ms``, which ``probe`` and ``verify`` set), else the step's own p99 from
the send. 5 % is the agreement a capacity estimate is held to; a step whose generator
moved its p99 by more than that says more about the generator than about the server.
Above ``warn_fraction`` (2 %, the search's default precision) the step stays valid and
says so in its ``warning``. A fixed bound on p99 lateness itself (``lateness_p99_bound_s``,
``--lateness-bound-ms``) replaces the rule when given: 3–7 ms of lateness at 5 req/s on a
busy 2-core host is nothing against a 100 ms bound, and everything against a 2 ms one.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import NonNegative, Share
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import latency_from_send_ms, latency_ms, lateness_ms


class ValidityConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    lateness_p99_bound_s: float | None = Field(
        None,
        gt=0,
        description="a fixed bound on the p99 of (actual send − scheduled send); None: the "
        "generator's share of the p99 latency judged against latency_bound_ms",
    )
    latency_bound_ms: float | None = Field(
        None, gt=0, description="the SLO's tightest latency bound, when the step is judged on one"
    )
    effect_fraction: Share = Field(
        0.05, description="the generator's share of the p99 allowed, of the reference"
    )
    warn_fraction: Share = Field(0.02, description="a share above this, still valid, warns")
    effect_floor_ms: NonNegative = Field(1.0, description="a share this small is always valid")


def assess_validity(
    rec: Records, cfg: ValidityConfig, *, interrupted: bool = False
) -> tuple[bool, str | None]:
    """(valid, reason): the reason names every rule the step broke, and how to fix it."""
    reasons: list[str] = []
    if interrupted:
        reasons.append("interrupted before its end")
    not_sent = rec.count(Outcome.NOT_SENT)
    if not_sent and not interrupted:
        reasons.append(f"{not_sent} of {len(rec)} scheduled requests were never sent")
    if (behind := fell_behind(rec, cfg)) is not None:
        reasons.append(
            f"generator fell behind: {behind} (lower the rate, add generator processes, "
            "or set the bound: --lateness-bound-ms)"
        )
    if rec.outstanding_limited:
        reasons.append(
            f"{rec.outstanding_limited} sends waited for the outstanding-request limit "
            "(the server is not keeping up, or raise --max-outstanding)"
        )
    if rec.client_failures:
        kinds = "; ".join(k for k in rec.errors if k.startswith("client: "))
        reasons.append(
            f"{rec.client_failures} requests failed in the load generator itself ({kinds}); "
            "they say nothing of the server"
        )
    if not reasons:
        return True, None
    return False, "; ".join(reasons)


def fell_behind(rec: Records, cfg: ValidityConfig) -> str | None:
    """What the lateness rule measured, when ``rec``'s generator broke it; else None. A
    step of many generators judges each one's records by it too (``distributed``)."""
    late = _lateness(rec, cfg)
    if late is None or late.measured_ms <= late.limit_ms:
        return None
    return late.text


def validity_warning(rec: Records, cfg: ValidityConfig) -> str | None:
    """For a step that passed the lateness rule: whether it came near it (above
    ``warn_fraction / effect_fraction`` of the allowance), and by how much."""
    late = _lateness(rec, cfg)
    if late is None or not late.warn_ms < late.measured_ms <= late.limit_ms:
        return None
    return f"near the lateness rule: {late.text}"


@dataclass(frozen=True, slots=True)
class _Late:
    measured_ms: float
    limit_ms: float
    warn_ms: float
    text: str


def _lateness(rec: Records, cfg: ValidityConfig) -> _Late | None:
    """The lateness rule in force, measured; None when nothing was sent."""
    near = cfg.warn_fraction / cfg.effect_fraction
    if cfg.lateness_p99_bound_s is not None:
        p99 = lateness_ms(rec).p99
        if p99 is None:
            return None
        bound = cfg.lateness_p99_bound_s * 1000.0
        text = f"p99 lateness {p99:.3f} ms against a bound of {bound:g} ms"
        return _Late(p99, bound, near * bound, text)
    scheduled, sent = latency_ms(rec).p99, latency_from_send_ms(rec).p99
    if scheduled is None or sent is None:
        return None
    effect = max(0.0, scheduled - sent)
    if cfg.latency_bound_ms is not None:
        reference, of = cfg.latency_bound_ms, f"the SLO's {cfg.latency_bound_ms:g} ms bound"
    else:
        reference, of = sent, f"the step's own p99 of {sent:.1f} ms"
    limit = max(cfg.effect_floor_ms, cfg.effect_fraction * reference)
    text = (
        f"its lateness (p99 {lateness_ms(rec).p99 or 0.0:.1f} ms) moved the p99 latency by "
        f"{effect:.2f} ms, against {limit:.2f} ms allowed ({cfg.effect_fraction:.0%} of {of}, "
        f"at least {cfg.effect_floor_ms:g} ms)"
    )
    return _Late(effect, limit, near * limit, text)
