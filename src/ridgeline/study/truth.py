"""The true capacity of a simulated server: the highest constant rate whose long runs meet
the SLO, judged plainly, apart from the health engine and the probe.

*Plainly* means over every request of the run at once, with no windows, no warm-up
exclusion and no hysteresis:

* a latency bound ``pXX < B`` holds when at least XX % of all requests were answered OK
  within B (latency from the scheduled send); an error or a timeout counts as beyond
  every bound. ``max < B`` needs every request within B, ``mean < B`` an OK answer to
  every request and their mean below B;
* token bounds are judged the same way, each on its own samples: ``ttft_pXX < B`` over
  every request (one that failed before its first token is beyond every bound),
  ``tpot_pXX < B`` over every request (a failed one beyond; a successful one-token
  answer has no TPOT and is within), ``itl_pXX < B`` over every gap of every request
  pooled, each failed request adding one sample beyond the bound;
* the error rate (errors and timeouts over all requests) must stay below the SLO's;
* the SLO's attainment bound is not judged: a server short of throughput fails its
  latency percentile long before a long run's achieved rate falls 5 % short.

Arrivals are Poisson at the rate, or recorded traffic (``Overlaid``: the whole trace's
copies superposed, as more users of one service add up; see below); several seeds' runs
are pooled, and each run is long: ``requests`` in all and at least ``periods``
periods of the server's stalls or neighbour, bounded by ``max_requests``, each run a
whole number of the longest of those periods. Each run meets the server at a random
point of its periodic behaviour, drawn per seed from the truth's own stream: it starts at
a random server time within a stall period, and its neighbour's cycle at a random phase
(``phased``). Started at server time 0, every run would see the same stalls: a 12 s
period gives 9 stalls in 120 s, never 10, and a neighbour always busy at the start. The
rate is
bisected (in log space, with arrivals coupled across rates, so the verdict moves with
the rate and not with the draw: Poisson's are the same unit-rate arrivals time-scaled,
an overlay's copies at a higher rate hold those at a lower one) to ``tolerance``: a
short-run pass brackets it, full-length runs narrow the bracket.

Recorded traffic at a rate ``r`` is the trace's users multiplied (``Overlaid``): ``k =
r / m`` copies of the whole trace (``m`` its mean rate), each cycling with period
``duration + one mean gap`` (so a copy's mean rate is ``m``) from its own uniformly
random starting point, superposed; a fractional copy left over (``k`` not whole) is one
more copy thinned binomially, each of its requests kept with probability ``k − ⌊k⌋``.
Nothing is time-scaled: a burst of the trace lasts as long and holds as many requests
as recorded, on top of the other copies, so the traffic's burstiness (the variance of
its counts over a minute) grows with ``k`` as ``k`` independent copies' does. A run at
``r`` lasts ``n / r`` seconds of it (``n`` requests on average). The starting points
and the thinning come from the truth's own streams (``[_SEED, seed, _OVERLAY]``), apart
from any probe's; the code is this module's own, not the load generator's
(``loadgen.schedule``'s overlays are what it checks).

A server that warms up is judged warm: the same model without its warm-up. Capacity is
a steady-state property; a probe that judges a server before it is warm is wrong about
it, and that error is what the study measures.

This judge stays apart from ``health.judge`` on purpose: it is the independent ground
truth the probe is validated against, so it shares neither the metric table nor the
percentile estimator with the code under test (one bug in a shared judge would move the
probe and its truth together, and the study would not see it). Only the SLO's parsed
form (``health.slo``) and the percentiles' quantiles are common.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from ridgeline.health.sampling import QUANTILES
from ridgeline.health.slo import SLOPolicy, parse_slo
from ridgeline.sim import SimPreset, SimState, shapes_for, simulate_preset
from ridgeline.sim.llm import DEFAULT_MAX_TOKENS
from ridgeline.synthetic.llm import saturated_rps
from ridgeline.synthetic.model import capacity_rps
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import tpot_s, ttft_s
from ridgeline.workload.payloads import RequestShape
from ridgeline.workload.traces import Trace

_SEED = 0x7275_7468  # the truth's own arrival streams, apart from any probe's
_PHASE = 1  # the tag of each seed's phase stream, beside its arrivals' ([_SEED, seed])
_OVERLAY = 2  # the tag of each seed's overlay streams: the copies' starts, the thinning


class TruthConfig(BaseModel):
    """How long and how many runs decide one rate, and how fine the answer is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int = Field(200_000, ge=1_000, description="requests per rate, all seeds")
    seeds: int = Field(4, ge=1, le=64, description="runs pooled per rate")
    periods: int = Field(
        10,
        ge=1,
        description="stall or neighbour periods all runs cover together, each a whole number",
    )
    run_s: float = Field(120.0, gt=0, description="seconds each run lasts at least")
    max_requests: int = Field(2_000_000, ge=1_000, description="requests per rate at most")
    tolerance: float = Field(0.005, gt=0, lt=0.2, description="relative width of the answer")
    coarse: float = Field(0.1, gt=0, le=1, description="share of the requests in the first pass")
    first_seed: int = Field(0, ge=0, description="the runs use seeds first_seed, +1, …")
    timeout_s: float = Field(30.0, gt=0, description="per-request timeout, as the sim driver's")


Arrivals = tuple[NDArray[np.float64], list[RequestShape] | None]
"""A run's arrival times (seconds from its start, sorted) and its requests' shapes (None:
one row each, the simulator's default)."""


class Traffic(Protocol):
    """A run's arrivals at a rate and its requests' shapes, per seed."""

    @property
    def name(self) -> str: ...

    def times(self, rate: float, n: int, seed: int) -> NDArray[np.float64]:
        """``n`` requests' arrival times at mean rate ``rate`` (``n`` on average where the
        traffic's count over ``n / rate`` seconds varies), sorted, from 0."""
        ...

    def arrivals(self, preset: SimPreset, rate: float, n: int, seed: int) -> Arrivals:
        """``times(rate, n, seed)`` and the shapes of those requests on ``preset``."""
        ...


@dataclass(frozen=True)
class Poisson:
    """Poisson arrivals: the same unit-rate arrivals per seed and count, time-scaled to
    the rate; sizes drawn from the server's size spec."""

    name: str = "poisson"

    def times(self, rate: float, n: int, seed: int) -> NDArray[np.float64]:
        gaps = np.random.default_rng([_SEED, seed]).exponential(1.0, n)
        unit = np.asarray(np.cumsum(gaps) - gaps[0], dtype=np.float64)
        return unit / rate

    def arrivals(self, preset: SimPreset, rate: float, n: int, seed: int) -> Arrivals:
        return self.times(rate, n, seed), shapes_for(preset, n, seed)


def _trace_shapes(
    trace: Trace, preset: SimPreset, rows: NDArray[np.int64]
) -> list[RequestShape] | None:
    """The shapes of a trace's ``rows`` where the simulator reads them, as a probe's step
    replaying the trace sends them: an LLM server their prompt and output tokens (and
    items), any other server their ``items`` (None, one row each, without the column:
    the simulated non-LLM server reads no tokens)."""
    items = trace.columns.get("items")
    if preset.model.llm is None:
        return None if items is None else [RequestShape(items=int(r)) for r in items[rows]]
    cols = [
        trace.columns[c][rows].tolist() if c in trace.columns else [d] * len(rows)
        for c, d in (("items", 1), ("prompt_tokens", 0), ("output_tokens", 0))
    ]
    return [RequestShape(i, p, o) for i, p, o in zip(*cols, strict=True)]


def _check_trace(trace: Trace) -> None:
    if len(trace) < 2 or not trace.duration > 0:
        raise ValueError(f"trace {trace.source!r} has no gaps: it needs two requests apart")


@dataclass(frozen=True)
class Recorded:
    """A recorded trace's gaps, cycled from an offset per seed and scaled to mean 1, then
    divided by the rate: the one trace sped up (every burst shortened in proportion), the
    stress case; the study's recorded traffic is ``Overlaid``. Shapes as ``Overlaid``'s."""

    trace: Trace
    name: str = "trace-speed"

    def _rows(self, n: int, seed: int) -> NDArray[np.int64]:
        start = (seed * (len(self.trace) - 1)) // 7 % (len(self.trace) - 1)
        return np.resize(np.roll(np.arange(len(self.trace) - 1), -start), n)

    def times(self, rate: float, n: int, seed: int) -> NDArray[np.float64]:
        _check_trace(self.trace)
        picked = np.diff(self.trace.times)[self._rows(n, seed)]
        picked = picked / picked.mean()
        return np.concatenate(([0.0], np.cumsum(picked[:-1]))) / rate

    def arrivals(self, preset: SimPreset, rate: float, n: int, seed: int) -> Arrivals:
        return self.times(rate, n, seed), _trace_shapes(self.trace, preset, self._rows(n, seed))


_CHUNK = 1 << 22


def _thinned(m: int, share: float, stream: list[int]) -> NDArray[np.int64]:
    """Which of ``m`` requests a copy thinned to ``share`` keeps: those whose uniform mark
    (the ``stream``'s draws in order, the same for every ``m`` and ``share``) is below
    ``share``; drawn in chunks, so a long span of a sparse copy needs no ``m`` marks at
    once."""
    rng = np.random.default_rng(stream)
    kept = [
        start + np.flatnonzero(rng.random(min(_CHUNK, m - start)) < share)
        for start in range(0, m, _CHUNK)
    ]
    return np.concatenate(kept).astype(np.int64) if kept else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Overlaid:
    """Recorded traffic at a rate: the whole trace's copies superposed (see the module
    docstring). At rate ``r``, ``k = r / mean_rate`` copies: copy ``c`` starts at the
    ``c``-th uniform draw of the seed's stream over the period (the same start at every
    rate), the last one, when ``k`` is not whole, thinned: each of its requests kept when
    its own uniform mark (from the copy's stream, the same at every rate) is below ``k −
    ⌊k⌋``. So a higher rate's arrivals hold a lower one's, over the same span. Each request
    keeps its trace row's sizes where the simulator reads them (``_trace_shapes``)."""

    trace: Trace
    name: str = "trace"

    def __post_init__(self) -> None:
        _check_trace(self.trace)

    @property
    def period(self) -> float:
        """The cycle: the trace's duration and one mean gap (a copy's mean rate is then
        ``len / period``, the trace's own ``mean_rate``)."""
        return self.trace.duration * len(self.trace) / (len(self.trace) - 1)

    @property
    def mean_rate(self) -> float:
        return len(self.trace) / self.period

    def copies(self, rate: float) -> tuple[int, float]:
        """Whole copies at ``rate`` and the share kept of one more (0: none)."""
        k = rate / self.mean_rate
        whole = math.floor(k + 1e-9)
        part = k - whole
        return whole, part if part > 1e-9 else 0.0

    def draw(
        self, rate: float, span_s: float, seed: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """The arrivals of ``span_s`` seconds at ``rate`` (sorted, from the run's start at
        0) and the trace row of each. Never empty: a draw holding no request holds the
        first copy's first, at 0 (a run sends one at least)."""
        if not (rate > 0 and span_s > 0):
            raise ValueError(f"an overlay needs a rate and a span > 0, got {rate}, {span_s}")
        times, length, period = self.trace.times, len(self.trace), self.period
        whole, part = self.copies(rate)
        count = whole + (part > 0)
        starts = np.random.default_rng([_SEED, seed, _OVERLAY]).random(count) * period
        # each copy's requests in [start, start + span) of the cycling trace, as places
        # lap·length + row: the first at or after the start, one past the last before the end
        ends = starts + span_s
        laps = np.floor(ends / period)
        lo = np.searchsorted(times, starts, side="left").astype(np.int64)
        hi = laps.astype(np.int64) * length + np.searchsorted(
            times, ends - laps * period, side="left"
        ).astype(np.int64)
        taken = np.maximum(hi - lo, 0)[:whole]  # the whole copies' (the last may be thinned)
        firsts = np.cumsum(taken) - taken
        places = np.repeat(lo[:whole] - firsts, taken) + np.arange(int(taken.sum()))
        origin = np.repeat(starts[:whole], taken)
        if part > 0:  # the last copy's requests, each kept with probability part
            kept = lo[whole] + _thinned(
                int(hi[whole] - lo[whole]), part, [_SEED, seed, _OVERLAY, whole]
            )
            places = np.concatenate([places, kept])
            origin = np.concatenate([origin, np.full(len(kept), starts[whole])])
        if places.shape[0] == 0:  # the first copy's next request, at 0
            places = lo[:1]
            origin = times[lo[:1] % length] + (lo[:1] // length) * period
        rows = places % length
        at = times[rows] + (places // length) * period - origin
        order = np.argsort(at, kind="stable")
        return np.asarray(at[order], dtype=np.float64), np.asarray(rows[order], dtype=np.int64)

    def times(self, rate: float, n: int, seed: int) -> NDArray[np.float64]:
        return self.draw(rate, n / rate, seed)[0]

    def arrivals(self, preset: SimPreset, rate: float, n: int, seed: int) -> Arrivals:
        at, rows = self.draw(rate, n / rate, seed)
        return at, _trace_shapes(self.trace, preset, rows)


@dataclass(frozen=True, slots=True)
class Truth:
    capacity_rps: float | None
    """The highest rate found to meet the SLO (None: not even the lowest tried)."""
    failing_rps: float
    """The lowest rate found to fail it: the truth lies in [capacity, failing)."""
    requests_per_rate: int
    evaluations: int
    seconds: float
    """Wall-clock seconds spent."""
    broken_by: str
    """What the long runs at ``failing_rps`` broke: ``"errors"``, a latency statistic,
    or ``"saturation"`` when that rate is the saturated throughput (never run)."""


def broken(latency_s: NDArray[np.float64], ok: NDArray[np.bool_], policy: SLOPolicy) -> str | None:
    """The bound a pooled run breaks, judged plainly (see the module docstring):
    ``"errors"``, a latency statistic (``"p99"``), or None when it meets ``policy``.
    ``latency_s`` per request, ``ok`` whether it was answered OK."""
    n = int(latency_s.shape[0])
    if n == 0:
        return None
    failed = n - int(np.count_nonzero(ok))
    if not failed / n < policy.max_error_rate:
        return "errors"
    for bound in policy.latency:
        b = bound.bound_ms / 1000.0
        if bound.percentile == "mean":
            if failed or not float(latency_s[ok].mean()) < b:
                return "mean"
            continue
        within = int(np.count_nonzero(ok & (latency_s < b)))
        q = 1.0 if bound.percentile == "max" else QUANTILES[bound.percentile]
        if within < math.ceil(q * n - 1e-9):
            return bound.percentile
    return None


def broken_records(rec: Records, policy: SLOPolicy) -> str | None:
    """``broken`` for a pooled run's records, token bounds included (see the module
    docstring): ``"errors"``, the bound's name (``"p99"``, ``"ttft_p99"``), or None."""
    sent = rec.outcome != int(Outcome.NOT_SENT)
    ok = rec.outcome == int(Outcome.OK)
    e2e = [b for b in policy.latency if b.metric == "e2e"]
    plain = policy.model_copy(update={"latency": tuple(e2e)})
    why = broken((rec.done - rec.scheduled)[sent], ok[sent], plain)
    if why is not None:
        return why
    n = int(np.count_nonzero(sent))
    for bound in policy.latency:
        if bound.metric == "e2e":
            continue
        b = bound.bound_ms / 1000.0
        if bound.metric == "itl":
            failed = n - int(np.count_nonzero(ok[sent]))
            values = rec.gaps
            samples = values.shape[0] + failed
            within_all = values < b
            mean_ok = failed == 0 and (values.size == 0 or float(values.mean()) < b)
        else:
            values = (ttft_s(rec) if bound.metric == "ttft" else tpot_s(rec))[sent]
            if bound.metric == "ttft":  # a failed request's TTFT is its failure's time
                within_all = np.isfinite(rec.first_token[sent]) & (values < b)
            else:  # a successful answer without a TPOT (one token) is within
                within_all = ok[sent] & ~(values >= b)
            samples = n
            good = values[ok[sent] & np.isfinite(values)]
            mean_ok = bool(np.all(ok[sent])) and (good.size == 0 or float(good.mean()) < b)
        name = f"{bound.metric}_{bound.percentile}"
        if bound.percentile == "mean":
            if not mean_ok:
                return name
            continue
        q = 1.0 if bound.percentile == "max" else QUANTILES[bound.percentile]
        if int(np.count_nonzero(within_all)) < math.ceil(q * samples - 1e-9):
            return name
    return None


def _warm(preset: SimPreset) -> SimPreset:
    return preset.model_copy(update={"model": preset.model.model_copy(update={"warmup": None})})


def longest_period(preset: SimPreset) -> float:
    """The longest period of the server's periodic behaviours (its stalls, its neighbour
    when not always busy); 0 when it has none."""
    m, i = preset.model, preset.interference
    periods = [m.periodic_stall.every_s] if m.periodic_stall is not None else []
    if i is not None and i.duty < 1.0:
        periods.append(i.period_s)
    return max(periods, default=0.0)


def _per_seed(preset: SimPreset, rate: float, cfg: TruthConfig, share: float) -> int:
    """Requests in each seed's run at ``rate``: ``requests`` over all seeds, each run at
    least ``run_s`` long (an overload shows as a queue that grows with time, not with
    the number of runs), and ``periods`` stall or neighbour periods over all runs; each
    run (the short ones, ``share`` of that, too) rounded up to a whole number of the
    longest period, so that with its random phase it sees each stall or busy window as
    often as any other (fewer whole periods, or none, when ``max_requests`` cuts it)."""
    period = longest_period(preset)
    span = cfg.periods * period / cfg.seeds
    cap = cfg.max_requests / cfg.seeds
    n = min(max(cfg.requests / cfg.seeds, rate * cfg.run_s, rate * span), cap) * share
    if period > 0.0:
        per_period = rate * period
        whole = max(1, math.ceil(n / per_period - 1e-9))
        if whole * per_period > cap:
            whole = math.floor(cap / per_period)
        n = whole * per_period if whole >= 1 else cap
    return max(100, math.ceil(n - 1e-9))


def phased(preset: SimPreset, seed: int) -> tuple[SimPreset, SimState]:
    """The server as seed ``seed``'s run meets it, and the state it starts in: at a
    random server time within its stall period (its stalls fall at every_s, 2·every_s, …
    of server time) and its neighbour (when not always busy) at a random phase of its
    cycle, both uniform, drawn from the truth's own stream for the seed. A server with
    neither is unchanged and starts at 0, as ``simulate`` starts one."""
    draw = np.random.default_rng([_SEED, seed, _PHASE]).random(2)  # both drawn, always
    stall = preset.model.periodic_stall
    start = float(draw[0]) * stall.every_s if stall is not None else 0.0
    i = preset.interference
    if i is not None and i.duty < 1.0:
        phase = (i.phase_s + float(draw[1]) * i.period_s) % i.period_s
        preset = preset.model_copy(update={"interference": i.model_copy(update={"phase_s": phase})})
    return preset, SimState(server_time_s=start)


class _Runs:
    """The runs at a rate, one per seed, each from its seed's phase (``phased``), its
    arrivals from the traffic."""

    def __init__(self, preset: SimPreset, traffic: Traffic, cfg: TruthConfig):
        self.preset, self.traffic, self.cfg = _warm(preset), traffic, cfg
        seeds = range(cfg.first_seed, cfg.first_seed + cfg.seeds)
        self._phased = {seed: phased(self.preset, seed) for seed in seeds}

    def __call__(self, rate: float, share: float) -> list[Records]:
        per_seed = _per_seed(self.preset, rate, self.cfg, share)
        runs = []
        for seed, (server, state) in self._phased.items():
            times, shapes = self.traffic.arrivals(self.preset, rate, per_seed, seed)
            rec, _ = simulate_preset(
                server, times, shapes, state=state, seed=seed, timeout_s=self.cfg.timeout_s
            )
            runs.append(rec)
        return runs


def runs_at(
    preset: SimPreset,
    rate: float,
    *,
    traffic: Traffic | None = None,
    cfg: TruthConfig | None = None,
    share: float = 1.0,
) -> list[Records]:
    """The runs ``true_capacity`` pools to judge ``rate`` (``share`` of their full
    length: the short pass's), one per seed: what the truth sees of ``preset``, warm."""
    return _Runs(preset, traffic or Poisson(), cfg or TruthConfig())(rate, share)


class _Judge:
    """Runs at a rate, pooled over seeds, judged against the policy."""

    def __init__(self, preset: SimPreset, policy: SLOPolicy, traffic: Traffic, cfg: TruthConfig):
        self.policy = policy
        self._runs = _Runs(preset, traffic, cfg)
        self.runs = 0
        self.broken: dict[float, str] = {}
        """What the full-length runs broke, by rate."""

    def __call__(self, rate: float, share: float) -> bool:
        self.runs += 1
        why = broken_records(Records.concat(self._runs(rate, share)), self.policy)
        if why is not None and share == 1.0:
            self.broken[rate] = why
        return why is None


def _bisect(
    holds: Callable[[float], bool], lo: float, hi: float, tol: float
) -> tuple[float, float]:
    """Narrow [lo, hi) — lo holds, hi fails — to hi / lo ≤ 1 + tol."""
    while hi / lo > 1.0 + tol:
        mid = math.sqrt(lo * hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def true_capacity(
    preset: SimPreset,
    slo: str | None = None,
    *,
    traffic: Traffic | None = None,
    cfg: TruthConfig | None = None,
) -> Truth:
    """The highest constant rate at which ``preset`` (warm) meets ``slo`` (by default
    its own) plainly, to ``cfg.tolerance``."""
    cfg = cfg or TruthConfig()
    started = time.perf_counter()
    judge = _Judge(preset, parse_slo(slo or preset.slo), traffic or Poisson(), cfg)
    ceiling = _ceiling(preset)

    def coarse(r: float) -> bool:
        return judge(r, cfg.coarse)

    def full(r: float) -> bool:
        return judge(r, 1.0)

    # No rate at or above the saturated throughput is sustainable, however a finite run
    # went: the bracket's top fails by definition and is never run.
    hi, lo = ceiling, ceiling / 2.0
    while not coarse(lo):
        hi, lo = lo, lo / 2.0
        if lo < ceiling * 1e-4:
            n = cfg.seeds * _per_seed(preset, lo, cfg, 1.0)
            return Truth(None, hi, n, judge.runs, _since(started), "all rates tried")
    lo, hi = _bisect(coarse, lo, hi, 0.02)
    step = 1.02
    while not full(lo):  # the short runs were lucky: step down until a long one holds
        hi, lo = lo, lo / step
        step *= step
    while hi < ceiling and full(hi):  # or unlucky: step up until a long one fails
        lo, hi = hi, min(hi * step, ceiling)
        step *= step
    lo, hi = _bisect(full, lo, hi, cfg.tolerance)
    n = cfg.seeds * _per_seed(preset, lo, cfg, 1.0)
    return Truth(lo, hi, n, judge.runs, _since(started), judge.broken.get(hi, "saturation"))


def _ceiling(preset: SimPreset) -> float:
    """A rate no run can sustain: one-row requests saturating the batches, or twice the
    LLM engine's saturated rate for the preset's mean prompt and output (that rate
    ignores preemption and varying lengths: a guide, doubled to be safely above)."""
    engine = preset.model.llm
    if engine is None:
        return capacity_rps(preset.model) * preset.speed
    shapes = shapes_for(preset, 4096, 0) or [RequestShape()]
    prompt = max(1, round(float(np.mean([s.prompt_tokens for s in shapes]))))
    output = max(1, round(float(np.mean([s.output_tokens or DEFAULT_MAX_TOKENS for s in shapes]))))
    return 2.0 * saturated_rps(engine, prompt, output) * preset.speed


def _since(started: float) -> float:
    return time.perf_counter() - started
