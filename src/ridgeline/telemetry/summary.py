"""A step's result, summarised from its records: what ``ridgeline run --json`` prints.

Every answered request counts in the latency percentiles — errors at the time the
error came, timeouts at the time they were given up on — and errors, timeouts and
incomplete requests all count in ``error_rate``. Drops (the server said at once that a
request could not meet its SLO) are counted apart, in ``drop_rate``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, Field

from ridgeline.telemetry.histogram import latency_summary_ms
from ridgeline.telemetry.records import FAILED, Outcome, Records


class ServerMetrics(BaseModel):
    """What the server's own metrics (``--metrics-url``) said over a step."""

    url: str
    increase: dict[str, float] = Field(
        default_factory=dict, description="each counter's increase over the step"
    )
    peak: dict[str, float] = Field(
        default_factory=dict, description="each gauge's highest value over the step"
    )
    scrapes: int = Field(0, description="samples taken")
    failures: int = Field(0, description="scrapes that failed")


class Percentiles(BaseModel):
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None
    mean: float | None = None


class StepSummary(BaseModel):
    offered_rps: float = Field(description="scheduled requests / step duration")
    achieved_rps: float = Field(description="successful answers / step duration")
    duration_s: float
    scheduled: int
    sent: int
    ok: int
    errors: int
    timeouts: int
    dropped: int
    incomplete: int
    not_sent: int
    error_rate: float = Field(description="(errors + timeouts + incomplete) / sent")
    drop_rate: float
    latency_ms: Percentiles = Field(description="from the scheduled send (no coordinated omission)")
    latency_from_send_ms: Percentiles = Field(description="from the actual send, for comparison")
    lateness_ms: Percentiles = Field(description="actual send − scheduled send")
    ttft_ms: Percentiles | None = Field(None, description="time to first token, from schedule")
    itl_ms: Percentiles | None = Field(None, description="mean inter-token latency per request")
    output_tokens_per_s: float | None = None
    error_kinds: dict[str, int] = Field(default_factory=dict)
    valid: bool = True
    invalid_reason: str | None = None
    warning: str | None = Field(
        None, description="valid, but the generator came near what would make it invalid"
    )
    status: str = Field("complete", description="complete | interrupted")
    processes: int = 1
    run_id: int | None = None
    step_id: int | None = None
    server: ServerMetrics | None = Field(
        None, description="the server's own metrics over the step, when --metrics-url was given"
    )


def _pct(seconds: NDArray[np.float64]) -> Percentiles:
    return Percentiles(**latency_summary_ms(seconds))


def _answered(rec: Records) -> NDArray[np.bool_]:
    return np.asarray(rec.outcome != int(Outcome.NOT_SENT), dtype=np.bool_)


def latency_ms(rec: Records) -> Percentiles:
    """Latency of the requests sent, from their scheduled send (no coordinated
    omission). This and the two below are the one estimator (HdrHistogram, 3
    significant figures) the summary shows and the validity rule judges by."""
    return _pct(rec.latency_from_schedule[_answered(rec)])


def latency_from_send_ms(rec: Records) -> Percentiles:
    """Latency of the requests sent, from their actual send."""
    return _pct(rec.latency_from_send[_answered(rec)])


def lateness_ms(rec: Records) -> Percentiles:
    """How late the requests sent went out: actual send − scheduled send."""
    return _pct(np.maximum(rec.lateness[_answered(rec)], 1e-6))


def summarize(
    rec: Records,
    duration_s: float,
    *,
    valid: bool,
    invalid_reason: str | None,
    interrupted: bool = False,
    processes: int = 1,
    warning: str | None = None,
) -> StepSummary:
    outcome = rec.outcome
    answered = outcome != int(Outcome.NOT_SENT)
    sent = int(answered.sum())
    ok = outcome == int(Outcome.OK)
    failed = int(np.isin(outcome, [int(o) for o in FAILED]).sum())
    span = duration_s if duration_s > 0 else 1.0
    streamed = np.isfinite(rec.first_token)
    ttft = itl = None
    tokens_per_s = None
    if streamed.any():
        ttft = _pct((rec.first_token - rec.scheduled)[streamed])
        multi = streamed & (rec.output_tokens > 1) & np.isfinite(rec.done)
        gaps = (rec.done[multi] - rec.first_token[multi]) / (rec.output_tokens[multi] - 1)
        itl = _pct(gaps)
        tokens_per_s = float(rec.output_tokens[ok].sum()) / span
    return StepSummary(
        offered_rps=len(rec) / span,
        achieved_rps=float(ok.sum()) / span,
        duration_s=duration_s,
        scheduled=len(rec),
        sent=sent,
        ok=int(ok.sum()),
        errors=rec.count(Outcome.ERROR),
        timeouts=rec.count(Outcome.TIMEOUT),
        dropped=rec.count(Outcome.DROPPED),
        incomplete=rec.count(Outcome.INCOMPLETE),
        not_sent=rec.count(Outcome.NOT_SENT),
        error_rate=failed / sent if sent else 0.0,
        drop_rate=rec.count(Outcome.DROPPED) / sent if sent else 0.0,
        latency_ms=latency_ms(rec),
        latency_from_send_ms=latency_from_send_ms(rec),
        lateness_ms=lateness_ms(rec),
        ttft_ms=ttft,
        itl_ms=itl,
        output_tokens_per_s=tokens_per_s,
        error_kinds=dict(rec.errors),
        valid=valid,
        invalid_reason=invalid_reason,
        warning=warning,
        status="interrupted" if interrupted else "complete",
        processes=processes,
    )
