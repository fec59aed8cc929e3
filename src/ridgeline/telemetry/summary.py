"""A step's result, summarised from its records: what ``ridgeline run --json`` prints.

Every answered request counts in the latency percentiles — errors at the time the
error came, timeouts at the time they were given up on, drops at the time of the
refusal — and errors, timeouts and incomplete requests all count in ``error_rate``.
Drops (the server said at once that a request could not meet its SLO) are counted
apart, in ``drop_rate``. These percentiles show what was measured; the SLO's judgement
(``health.metrics``, ``health.judge``) counts every request not answered OK beyond
every bound instead.

Token metrics of streamed answers (vLLM ``benchmark_serving``'s definitions; see
docs/llm.md): TTFT, first content chunk − scheduled send, over every request that
produced a first token; ITL, every gap between consecutive content chunks, pooled over
requests; TPOT, per successful request of two tokens or more, (e2e − ttft) / (output
tokens − 1). Goodput counts the successful requests that met every per-request bound of
an SLO (``good``); each bound says which requests meet it (``health.metrics`` holds
every metric's rule: telemetry sits below the SLO and takes the judgment).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, Field

from ridgeline.telemetry.histogram import PERCENTILES, latency_summary_ms
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


class WorkerLoad(BaseModel):
    """One generator worker of a step sent from a Ray cluster (``--workers``): where it
    ran, its share of the schedule, and how late it sent it."""

    worker: int = Field(description="its index: it sent arrivals worker, worker + N, ...")
    node: str = Field(description="the address of the node it ran on")
    scheduled: int
    sent: int = Field(description="requests it sent (a lost worker: the last count it reported)")
    lateness_p99_ms: float | None = Field(None, description="its own p99 send lateness")
    lateness_max_ms: float | None = None
    state: Literal["ok", "behind", "lost"] = Field(
        "ok", description="ok | behind (its lateness broke the validity rule) | lost (died)"
    )
    reason: str | None = Field(None, description="why it is behind or lost")


class StepSummary(BaseModel):
    offered_rps: float = Field(description="scheduled requests / step duration")
    achieved_rps: float = Field(
        description="successful answers / the seconds from the step's start to its last "
        "answer (at least its duration: a generator or server that fell behind is slower)"
    )
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
    ttft_ms: Percentiles | None = Field(
        None, description="time to first token, from the scheduled send (vLLM's TTFT)"
    )
    ttft_from_send_ms: Percentiles | None = Field(
        None, description="time to first token from the actual send, for tools that time so"
    )
    itl_ms: Percentiles | None = Field(
        None, description="inter-token latency: every gap between chunks, pooled (vLLM's ITL)"
    )
    tpot_ms: Percentiles | None = Field(
        None, description="time per output token, one per request: (e2e − ttft)/(tokens − 1)"
    )
    input_tokens_per_s: float | None = Field(
        None, description="prompt tokens of the successful requests / step duration"
    )
    output_tokens_per_s: float | None = Field(
        None, description="output tokens of the successful requests / the answered span"
    )
    good: int | None = Field(
        None, description="successful requests that met every per-request bound of the SLO"
    )
    goodput_rps: float | None = Field(
        None, description="good / the answered span, as achieved_rps (with an SLO)"
    )
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
    workers: list[WorkerLoad] | None = Field(
        None, description="each generator worker, when the step was sent from Ray (--workers)"
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
    answered_s = answered_span(rec, duration_s)
    tokens = token_percentiles(rec, 0, len(rec))
    return StepSummary(
        offered_rps=len(rec) / span,
        achieved_rps=float(ok.sum()) / answered_s,
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
        **tokens,
        input_tokens_per_s=_per_s(rec.prompt_tokens[ok], answered_s),
        output_tokens_per_s=_per_s(rec.output_tokens[ok], answered_s),
        error_kinds=dict(rec.errors),
        valid=valid,
        invalid_reason=invalid_reason,
        warning=warning,
        status="interrupted" if interrupted else "complete",
        processes=processes,
    )


def _per_s(tokens: NDArray[np.int32], span_s: float) -> float | None:
    total = int(tokens.sum(dtype=np.int64))
    return total / span_s if total else None


def ttft_s(rec: Records, since: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """Each request's time to first token from its scheduled send (or ``since``). A
    request that failed before its first token counts at the time it failed, beyond
    any bound its wait already broke (never left out: a server that times requests out
    in its queue must not look fast); NaN when it succeeded without streaming or was
    never sent."""
    start = rec.scheduled if since is None else since
    failed = np.isin(rec.outcome, [int(o) for o in FAILED]) & ~np.isfinite(rec.first_token)
    return np.where(failed, rec.done, rec.first_token) - start


def tpot_s(rec: Records) -> NDArray[np.float64]:
    """Each request's time per output token after the first, (e2e − ttft) / (tokens −
    1); NaN unless it succeeded with two tokens or more and a first token."""
    keep = (rec.outcome == int(Outcome.OK)) & (rec.output_tokens > 1) & np.isfinite(rec.first_token)
    out = np.full(len(rec), np.nan)
    out[keep] = (rec.done[keep] - rec.first_token[keep]) / (rec.output_tokens[keep] - 1)
    return out


def token_percentiles(
    rec: Records, a: int, b: int, tpot: NDArray[np.float64] | None = None
) -> dict[str, Percentiles | None]:
    """TTFT (from schedule and from send), pooled ITL and TPOT of requests ``a:b`` (in
    schedule order), as ``StepSummary`` fields; all None when none streamed. ``tpot``:
    ``tpot_s(rec)``, when a caller cutting many slices has it already."""
    if not np.isfinite(rec.first_token[a:b]).any():
        return dict.fromkeys(("ttft_ms", "ttft_from_send_ms", "itl_ms", "tpot_ms"))
    part = slice(a, b)
    ttft = ttft_s(rec)[part]
    counted = np.isfinite(ttft)
    gaps = rec.gaps[rec.gap_start[a] : rec.gap_start[b]]
    tpot = (tpot_s(rec) if tpot is None else tpot)[a:b]
    return {
        "ttft_ms": _pct(ttft[counted]),
        "ttft_from_send_ms": _pct(ttft_s(rec, rec.sent)[part][counted]),
        "itl_ms": _pct(gaps) if gaps.size else None,
        "tpot_ms": _pct(tpot) if np.isfinite(tpot).any() else None,
    }


class RequestBound(Protocol):
    """One latency bound of an SLO, as ``good`` reads it (``health.slo.LatencyBound``,
    which judges by its metric's row of ``health.metrics.METRICS``)."""

    def meets(self, rec: Records) -> NDArray[np.bool_]: ...


def good(rec: Records, bounds: Sequence[RequestBound]) -> NDArray[np.bool_]:
    """The requests that succeeded and met every bound, each judged on its own values."""
    ok = rec.outcome == int(Outcome.OK)
    for b in bounds:
        ok &= b.meets(rec)
    return np.asarray(ok, dtype=np.bool_)


def gap_statistic(rec: Records, percentile: str) -> NDArray[np.float64]:
    """Each request's ``percentile`` (p50 ... p999 by nearest rank, max, mean) of its own
    inter-chunk gaps; NaN for a request without gaps."""
    counts = rec.gap_counts()
    out = np.full(len(rec), np.nan)
    has = counts > 0
    if not has.any():
        return out
    owner = np.repeat(np.arange(len(rec)), counts)
    if percentile == "mean":
        out[has] = np.bincount(owner, weights=rec.gaps, minlength=len(rec))[has] / counts[has]
        return out
    ordered = rec.gaps[np.lexsort((rec.gaps, owner))]
    q = 1.0 if percentile == "max" else PERCENTILES[percentile] / 100.0
    rank = np.maximum(np.ceil(q * counts[has] - 1e-9).astype(np.int64), 1)
    out[has] = ordered[rec.gap_start[:-1][has] + rank - 1]
    return out


def with_goodput(summary: StepSummary, rec: Records, bounds: Sequence[RequestBound]) -> StepSummary:
    """``summary`` with the good requests of ``rec`` under ``bounds`` and its goodput."""
    n = int(good(rec, bounds).sum())
    span = answered_span(rec, summary.duration_s)
    return summary.model_copy(update={"good": n, "goodput_rps": n / span})


def answered_span(rec: Records, duration_s: float) -> float:
    """The seconds a step's successful answers took to come: from its start to the last
    of them, at least its ``duration_s`` (1 s when that is 0). A step whose sends went
    out 55 s late, or whose server queued them, answered its requests over longer than
    it was scheduled for, and its throughput is that much less than what it offered."""
    span = duration_s if duration_s > 0 else 1.0
    done = rec.done[rec.outcome == int(Outcome.OK)]
    done = done[np.isfinite(done)]
    return max(span, float(done.max())) if done.size else span
