"""One window's health: per-metric scores, a combined score, a state and its reason.

Metric scores (``Assessment.metric_scores``), each a value over its bound, 1.0 on it:

- one per latency bound (``p99``, ``ttft_p99``, ``itl_p99``, ``tpot_p99`` ...): the
  statistic over its bound — end-to-end and token-level bounds alike, one weight
  (``weights.latency``), one critical factor; infinite when the statistic falls among
  requests not answered OK (``health.metrics``: beyond every bound);
- ``errors``: error rate over ``max_error_rate``;
- ``attainment``: the throughput shortfall (1 − achieved/offered) over the allowed
  shortfall, max(1 − min_attainment, 3/√n) for n requests offered in the window: a short
  window's counting noise (a Poisson count's relative sd is 1/√n) is not overload;
- ``trend``: the least-squares slope of ``trend_percentile`` over the last
  ``trend_windows`` windows (``history`` then this one), over ``trend_growth`` × the
  latency bound (that statistic's bound, else the tightest one, else its own mean), when
  the rise is significant (the slope's t statistic, slope / its standard error, above
  Student's one-sided 0.99 quantile with n − 2 degrees of freedom), else 0: the scatter
  of a few noisy windows is no trend; of
  the end-to-end latency, unless the SLO bounds only token metrics: then of the TTFT
  when it is bounded (a queue shows there first; an LLM's end-to-end latency varies with
  each answer's length), else of the first token metric bounded;
- ``gpu`` (when a GPU is monitored): 0 when healthy, 1.5 when it throttles or runs hot,
  ``critical_factor`` on an XID or ECC double-bit error.

The combined ``score`` is the weighted maximum maxᵢ (wᵢ / w_max) · sᵢ: with the default
weights (latency, errors and attainment 1; trend and gpu 0.5) it is exactly 1 on the SLO
boundary of whichever metric is worst — the search reads the score as its distance to
the boundary, so the boundary must not move with how many other metrics happen to be
near theirs (an averaged or soft maximum would put "one metric 15 % over" inside the
SLO). A lighter weight discounts a metric's pull on that distance, not its say in the
state, which the rules below decide.

State rules, first match wins:

1. Critical — error rate ≥ 0.5 with answers in the window; a latency or error metric
   ≥ ``critical_factor``; or a GPU XID / ECC double-bit error. (Attainment and trend are
   left to rule 2: however far short, demand beyond capacity is overload, not failure.)
2. Overloaded — attainment short beyond its allowance, or trend > 1 (latency growing
   without bound).
3. Unhealthy — any metric > 1 (a throttling GPU included).
4. Warn — any metric > ``warn_fraction``; or nothing measured (no evidence is never
   Healthy).
5. Healthy.

A server that reports its KV cache (vLLM's metrics, ``_observe``) makes a window that
would be Healthy at least Warn when it preempted requests in the window, or its KV cache
was ``KV_FULL`` full or more with requests waiting: it is batching at its memory's edge,
the sign of the knee. The score is left as the SLO makes it, so these signals never
move the SLO's capacity by themselves: capacity is what the SLO says.

``reason`` names the metrics that decided, with values and bounds: "p99 142.0 ms > 100 ms",
"ttft p99 240.0 ms > 200 ms".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ridgeline.health._observe import observation_from_window
from ridgeline.health.metrics import DEFAULT, METRICS
from ridgeline.health.slo import SLOPolicy
from ridgeline.health.state import Assessment, HealthState, Observation
from ridgeline.telemetry.gpu import fatal_gpu_problem

__all__ = ["assess", "observation_from_window", "severity"]

_SEVERITY = {
    HealthState.HEALTHY: 0,
    HealthState.WARN: 1,
    HealthState.UNHEALTHY: 2,
    HealthState.OVERLOADED: 3,
    HealthState.CRITICAL: 4,
}
_GPU_DEGRADED = 1.5
_ERRORS_DOMINATE = 0.5
KV_FULL = 0.98
"""KV-cache use at or above which requests waiting mean the cache, not compute, binds."""


def severity(state: HealthState) -> int:
    """Healthy 0 < Warn 1 < Unhealthy 2 < Overloaded 3 < Critical 4."""
    return _SEVERITY[state]


@dataclass(frozen=True, slots=True)
class _Reading:
    name: str
    score: float
    weight: float
    value: str
    """The measured value, named: "p99 142.0 ms"."""
    bound: str
    """Its bound: "100 ms"; empty for the GPU (its value says it all)."""

    def versus(self, scale: str = "", op: str = ">") -> str:
        return f"{self.value} {op} {scale}{self.bound}" if self.bound else self.value


def assess(obs: Observation, policy: SLOPolicy, history: Sequence[Observation] = ()) -> Assessment:
    """The window's state before hysteresis; pure (see the module docstring)."""
    readings = _readings(obs, policy, history)
    scores = {r.name: r.score for r in readings}
    state, reason = _state(obs, policy, readings)
    if state is HealthState.HEALTHY and (saturated := _saturation(obs)):
        state, reason = HealthState.WARN, saturated
    return Assessment(
        state=state,
        score=_weighted_max(readings),
        metric_scores=scores,
        reason=reason,
        all_failed=obs.answered > 0 and obs.error_rate >= 1.0,
    )


def _state(
    obs: Observation, policy: SLOPolicy, readings: list[_Reading]
) -> tuple[HealthState, str]:
    if obs.answered > 0 and obs.error_rate >= _ERRORS_DOMINATE:
        return HealthState.CRITICAL, f"error rate {obs.error_rate:.1%} ≥ 50%: errors dominate"
    fatal = [p for p in obs.gpu_problems if fatal_gpu_problem(p)]
    if fatal:
        return HealthState.CRITICAL, "; ".join(fatal)
    cf = policy.critical_factor
    levels = [r for r in readings if r.name not in ("attainment", "trend", "gpu")]
    crit = [r for r in levels if r.score >= cf]
    if crit:
        return HealthState.CRITICAL, "; ".join(r.versus(f"{cf:g}× ", "≥") for r in crit)
    over = [r for r in readings if r.name in ("attainment", "trend") and r.score > 1]
    if over:
        return HealthState.OVERLOADED, "; ".join(r.versus() for r in over)
    bad = [r for r in readings if r.score > 1]
    if bad:
        return HealthState.UNHEALTHY, "; ".join(r.versus() for r in bad)
    wf = policy.warn_fraction
    near = [r for r in readings if r.score > wf]
    if near:
        return HealthState.WARN, "; ".join(r.versus(f"{wf:.0%} of ") for r in near)
    if not readings:  # no evidence either way: never Healthy, and no bound broken
        return HealthState.WARN, "nothing measured in the window"
    worst = max(readings, key=lambda r: r.score)
    return HealthState.HEALTHY, f"within {wf:.0%} of every bound (closest: {worst.value})"


def _saturation(obs: Observation) -> str | None:
    """Why the server's own metrics say it batches at its memory's edge, or None."""
    signs = []
    if obs.preemptions:
        signs.append(f"{obs.preemptions:g} requests preempted (KV cache full)")
    kv, waiting = obs.kv_cache_usage, obs.queue_length
    if kv is not None and kv >= KV_FULL and waiting:
        signs.append(f"KV cache {kv:.0%} full with {waiting:g} requests waiting")
    return "; ".join(signs) or None


def _weighted_max(readings: list[_Reading]) -> float:
    heaviest = max((r.weight for r in readings), default=0.0)
    if heaviest <= 0:
        return max((r.score for r in readings), default=0.0)
    return max(r.weight / heaviest * r.score if r.weight else 0.0 for r in readings)


def _readings(
    obs: Observation, policy: SLOPolicy, history: Sequence[Observation]
) -> list[_Reading]:
    w = policy.weights
    out: list[_Reading] = []
    for b in policy.latency:
        v = obs.statistic(b.metric, b.percentile)
        if v is not None and not math.isnan(v):
            unit = METRICS[b.metric].unit
            shown = (
                f"{v:.1f} {unit}" if math.isfinite(v) else "beyond every bound (not answered OK)"
            )
            out.append(
                _Reading(
                    b.name,
                    v / b.bound_ms,
                    w.latency,
                    f"{b.name.replace('_', ' ')} {shown}",
                    f"{b.bound_ms:g} {unit}",
                )
            )
    if obs.answered > 0 or obs.error_rate > 0:
        out.append(
            _Reading(
                "errors",
                obs.error_rate / policy.max_error_rate,
                w.errors,
                f"error rate {obs.error_rate:.2%}",
                _pct(policy.max_error_rate),
            )
        )
    offered = obs.offered_rps * (obs.end_s - obs.start_s)
    if offered > 0:
        allowed = max(1 - policy.min_attainment, 3 / math.sqrt(offered))
        shortfall = max(0.0, 1 - obs.achieved_rps / obs.offered_rps)
        out.append(
            _Reading(
                "attainment",
                shortfall / allowed,
                w.attainment,
                f"attainment shortfall {shortfall:.1%} of {offered:.0f} offered",
                f"{allowed:.1%} allowed",
            )
        )
    trend = _trend(obs, policy, history)
    if trend is not None:
        out.append(trend)
    if obs.gpu_problems or obs.gpu_utilisation is not None:
        fatal = any(fatal_gpu_problem(p) for p in obs.gpu_problems)
        score = policy.critical_factor if fatal else _GPU_DEGRADED if obs.gpu_problems else 0.0
        text = "; ".join(obs.gpu_problems) or "GPU healthy"
        out.append(_Reading("gpu", score, w.gpu, text, ""))
    return out


def _trend(obs: Observation, policy: SLOPolicy, history: Sequence[Observation]) -> _Reading | None:
    pct = policy.trend_percentile
    metric = _trend_metric(policy)
    recent = [*history, obs][-policy.trend_windows :]
    pts = [
        (float(i), v)
        for i, o in enumerate(recent)
        if (v := o.statistic(metric, pct)) is not None and math.isfinite(v)
    ]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts)
    # the slope's t statistic, one-sided: a rise the windows' own scatter explains is
    # no trend (a few requests a window make a noisy percentile)
    se = math.sqrt(residual / (n - 2) / sxx)
    rising = slope > 0 and slope > _t_critical_99(n - 2) * se
    bounds = {b.percentile: b.bound_ms for b in policy.latency if b.metric == metric}
    scale = bounds.get(pct) or min(bounds.values(), default=my)
    limit = policy.trend_growth * scale
    if limit <= 0:
        return None
    label = METRICS[metric].bound_name(pct).replace("_", " ")
    noise = "" if rising or slope <= 0 else " (not significant)"
    return _Reading(
        "trend",
        slope / limit if rising else 0.0,
        policy.weights.trend,
        f"{label} trend {slope:+.1f} ms/window{noise}",
        f"{limit:.3g} ms/window",
    )


_T_99 = (
    31.821, 6.965, 4.541, 3.747, 3.365, 3.143, 2.998, 2.896, 2.821, 2.764,
    2.718, 2.681, 2.650, 2.624, 2.602, 2.583, 2.567, 2.552, 2.539, 2.528,
    2.518, 2.508, 2.500, 2.492, 2.485, 2.479, 2.473, 2.467, 2.462, 2.457,
)  # fmt: skip
"""Student's t, one-sided 0.99 quantile, for 1 … 30 degrees of freedom."""


def _t_critical_99(dof: int) -> float:
    """Student's t one-sided 0.99 quantile for ``dof`` ≥ 1 degrees of freedom: the table
    up to 30, above it the Cornish-Fisher expansion about the normal's (within 1e-3)."""
    if dof <= len(_T_99):
        return _T_99[dof - 1]
    z, v = 2.3263478740408408, float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def _trend_metric(policy: SLOPolicy) -> str:
    """The latency whose trend is fitted: end-to-end, unless only other metrics are
    bounded (then the first of the table's timed from the schedule, where a queue shows
    first: TTFT; else the first bounded)."""
    metrics = [b.metric for b in policy.latency]
    if not metrics or DEFAULT in metrics:
        return DEFAULT
    queued = (m for m, row in METRICS.items() if row.from_schedule and m in metrics)
    return next(queued, metrics[0])


def _pct(x: float) -> str:
    return f"{x * 100:g}%"
