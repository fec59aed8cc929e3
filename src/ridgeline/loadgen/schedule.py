"""A schedule: every send time (and request size) of a step, made before it runs.

``build_schedule`` is the one way from what a user gives (an arrival spec at a rate, or
a recorded trace brought to a rate) to a schedule: ``ridgeline run``, the probe's steps
and ``ridgeline simulate`` all make theirs through it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError
from ridgeline.workload.arrivals import ArrivalSpec, parse_arrival
from ridgeline.workload.llm import LlmWorkload
from ridgeline.workload.payloads import RequestShape, shapes_from_trace
from ridgeline.workload.traces import Trace, bundled_trace_path, read_trace


@dataclass(frozen=True)
class Schedule:
    times: NDArray[np.float64]
    """Seconds from the step's start, sorted."""
    shapes: list[RequestShape] | None
    """Per-request sizes, or None for the default shape throughout."""
    duration_s: float
    description: str

    @property
    def rate(self) -> float:
        return len(self.times) / self.duration_s if self.duration_s > 0 else 0.0


TraceScale = Literal["overlay", "speed", "window"]
"""How a recorded trace is brought to a rate: copies of it overlaid, each at its own pace
(``trace_overlaid``: that many times its users; ``trace_superposed`` for a probe's
step, its count drawn); the one trace sped up to hold the rate from its first arrival
(``trace_at_rate``: every burst shortened in proportion, the stress case); or the whole
trace time-scaled and a window of it cut out (``from_trace``, as ``ridgeline run``
replays one: at its own pace when no rate is given)."""


def build_schedule(
    arrival: str = "poisson",
    *,
    rate: float | None = None,
    duration_s: float,
    seed: int = 0,
    trace: Trace | Path | str | None = None,
    target_rate: float | None = None,
    trace_scale: TraceScale = "overlay",
    trace_start_s: float = 0.0,
    drawn: bool = False,
) -> Schedule:
    """``duration_s`` of arrivals: the arrival spec ``arrival`` at ``rate``
    (``parse_arrival``), or, given a ``trace``, the trace brought to ``target_rate``
    (``rate`` when no target rate is given) as ``trace_scale`` says; a ``window`` starts
    ``trace_start_s`` into the scaled trace. ``seed`` draws the arrivals, and an overlaid
    trace's starting points. An overlaid trace holds exactly ``rate × duration_s``
    arrivals (``trace_overlaid``), or with ``drawn`` as many as its copies' stretches
    hold, their mean the rate (``trace_superposed``, a probe's step)."""
    if trace is None:
        return from_arrival(parse_arrival(arrival, rate), duration_s, seed)
    target = rate if target_rate is None else target_rate
    if trace_scale == "window":
        return from_trace(trace, target_rate=target, start_s=trace_start_s, duration_s=duration_s)
    if target is None:
        raise ConfigError("a trace needs --target-rate, the mean rate to scale it to (requests/s)")
    if trace_scale not in ("speed", "overlay"):
        raise ConfigError(f"--trace-scale must be overlay, speed or window, got {trace_scale!r}")
    recorded = trace if isinstance(trace, Trace) else read_trace(trace)
    if trace_scale == "speed":
        return trace_at_rate(recorded, target, duration_s)
    if drawn:
        return trace_superposed(recorded, target, duration_s, seed)
    return trace_overlaid(recorded, target, duration_s, seed)


BUNDLED_TRACE = "azure_llm_2023_code"
"""What ``trace:BUNDLED`` names: the production trace shipped with ridgeline."""
_TRACE_KINDS: dict[str, TraceScale] = {"trace": "overlay", "trace-speed": "speed"}


def named_arrivals(spec: str, rate: float, duration_s: float, seed: int = 0) -> Schedule:
    """``duration_s`` of the arrivals ``spec`` names at ``rate``, in the words of
    ``ridgeline plan --check-arrivals`` and of a plan's ``checked_arrivals``: an arrival
    spec (``poisson``, ``gamma:cv=3``: ``workload.arrivals``), ``trace:NAME`` (a bundled
    trace; ``trace:BUNDLED`` the one shipped) or ``trace:PATH.csv``, brought to the rate
    as that many times its users (copies overlaid from ``seed``'s starting points), or
    ``trace-speed:NAME`` / ``PATH``, the one trace sped up to the rate."""
    kind, _, name = spec.partition(":")
    if kind not in _TRACE_KINDS:
        return build_schedule(spec, rate=rate, duration_s=duration_s, seed=seed)
    if not name:
        raise ConfigError(f"{spec!r} names no trace: give {kind}:BUNDLED or {kind}:FILE.csv")
    name = BUNDLED_TRACE if name == "BUNDLED" else name
    path = Path(name) if Path(name).suffix else bundled_trace_path(name)
    return build_schedule(
        trace=path,
        target_rate=rate,
        trace_scale=_TRACE_KINDS[kind],
        duration_s=duration_s,
        seed=seed,
    )


def shaped(
    schedule: Schedule, workload: LlmWorkload | None, seed: int, *, text: bool = True
) -> Schedule:
    """``schedule`` with its requests' prompts and lengths from ``workload`` (the lengths
    it does not set kept from the schedule's own shapes); unchanged when there is none."""
    if workload is None:
        return schedule
    shapes = workload.shapes(len(schedule.times), seed, schedule.shapes, text=text)
    return schedule if shapes is None else replace(schedule, shapes=shapes)


def from_arrival(spec: ArrivalSpec, duration_s: float, seed: int = 0) -> Schedule:
    if duration_s <= 0:
        raise ConfigError(f"duration must be > 0 s, got {duration_s}", field="duration_s")
    times = spec.schedule(duration_s, seed)
    return Schedule(times, None, duration_s, f"{_arrival(spec)}, {duration_s:g} s, seed {seed}")


def _arrival(spec: ArrivalSpec) -> str:
    """An arrival spec as the user wrote it: ``poisson rate=50``, ``gamma rate=20 cv=2``."""
    fields = spec.model_dump(exclude={"kind"})
    kind = str(getattr(spec, "kind", type(spec).__name__))
    return " ".join([kind, *(f"{k}={_value(v)}" for k, v in fields.items())])


def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return "/".join(_value(x) for x in v)
    return str(v)


def from_trace(
    trace: Trace | str | Path,
    *,
    target_rate: float | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
) -> Schedule:
    """Replay a recorded trace at its own pace, or time-scaled to ``target_rate`` (the
    relative gaps kept); optionally a window [start_s, start_s + duration_s) of it,
    taken after scaling."""
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    if target_rate is not None:
        tr = tr.scaled_to_rate(target_rate)
    end = tr.duration + 1e-9 if duration_s is None else start_s + duration_s
    tr = tr.window(start_s, end)
    if len(tr) == 0:
        raise ConfigError(
            f"the trace window [{start_s:g}, {end:g}) s of {tr.source} holds no requests; "
            "widen --duration or move the window"
        )
    span = duration_s if duration_s is not None else float(tr.times[-1]) + _last_gap(tr.times)
    scaled = f", scaled to {target_rate:g}/s" if target_rate is not None else ""
    return Schedule(
        np.asarray(tr.times, dtype=np.float64),
        shapes_from_trace(tr),
        span,
        f"trace {tr.source}{scaled}, {span:g} s from {start_s:g} s",
    )


def trace_at_rate(trace: Trace, rate: float, duration_s: float) -> Schedule:
    """``duration_s`` of the trace's arrivals holding ``rate``: its first
    ``n = rate·duration_s`` requests (cycling from its start again when it holds fewer),
    time-scaled so that they fill the span, their gaps and sizes kept. The step offers
    exactly its labelled rate, with the trace's burstiness; every step and confirmation
    replays the same opening stretch, so steps at different rates differ by their rate
    and not by which part of the trace they saw. Scaling the whole trace to ``rate`` and
    cutting out the first ``duration_s`` would not hold the rate: a recorded trace's
    opening seconds are far from its mean (a "50 req/s" step offered 11.2 req/s)."""
    _check_step(rate, duration_s)
    _check_gaps(trace)
    n = max(1, round(rate * duration_s))
    gaps = np.diff(trace.times)
    picked = np.resize(gaps, n)  # the first n gaps, cycling
    if not picked.sum() > 0:  # those arrivals came all at once: spread them evenly
        picked = np.ones(n)
    # shares first: a denormal gap (2e-313 s, found by Hypothesis) over its own sum is 1,
    # where duration / sum overflows
    ends = np.cumsum(picked / picked.sum()) * duration_s
    times = np.minimum(np.concatenate(([0.0], ends[:-1])), duration_s)  # the (n+1)-th at the end
    rows = np.resize(np.arange(len(trace)), n)
    sized = Trace(times, {k: c[rows] for k, c in trace.columns.items()}, trace.source)
    return Schedule(
        np.asarray(times, dtype=np.float64),
        shapes_from_trace(sized),
        duration_s,
        f"trace {trace.source}, its first {n} arrivals at {rate:g}/s over {duration_s:g} s",
    )


def trace_overlaid(trace: Trace, rate: float, duration_s: float, seed: int = 0) -> Schedule:
    """``duration_s`` of arrivals at ``rate`` from copies of the trace overlaid, each at
    its own pace: ``k = rate / mean rate`` copies (at least one), each starting at its own
    random point of the trace (seed ``seed``; the trace cycles), merged. The first
    ``n = rate·duration_s`` merged arrivals are time-scaled to fill the span (by
    ``k·mean/rate``, within a copy's share of 1; a trace faster than ``rate`` is one copy
    slowed down), so the step offers exactly its labelled rate.

    This is the traffic of ``k`` times as many users as the trace recorded, each group
    behaving as the recorded one did: a burst of the trace stays as long as it was and as
    large in requests, on top of the other copies. ``trace_at_rate`` instead replays the
    one trace ``k`` times faster: an hour's swings pass in half a minute and a second's
    burst of 26 times the mean lasts 10 ms at 300 req/s (the bundled trace: 2.6 req/s, an
    inter-arrival CV of 13), a traffic no population of users makes; it stays the
    stress case (``ridgeline simulate --trace-scale speed``)."""
    _check_step(rate, duration_s)
    _check_gaps(trace)
    period = trace.duration + _last_gap(trace.times)  # the trace cycles with this period
    mean = len(trace) / period
    n = max(1, round(rate * duration_s))
    copies = min(n + 1, max(1, round(rate / mean)))  # more copies than arrivals add none
    pace = copies * mean / rate  # scheduled seconds per trace second: the merged stream's
    # rate over the one asked for
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0.0, period, copies)
    # the trace seconds that hold the n arrivals, and half as many again (a trace much
    # faster than the rate, one copy slowed down, needs a short window: sized by the
    # scheduled span instead, it once tiled 10^11 arrivals)
    window = duration_s / pace * 1.5 + 2 * _last_gap(trace.times)
    while True:
        laps = int(np.ceil((window + period) / period))
        tiled = (trace.times[None, :] + period * np.arange(laps)[:, None]).ravel()
        rows_tiled = np.tile(np.arange(len(trace)), laps)
        lo = np.searchsorted(tiled, starts, side="left")
        hi = np.searchsorted(tiled, starts + window, side="left")
        if int((hi - lo).sum()) > n:
            break
        window *= 2
    taken = hi - lo
    firsts = np.cumsum(taken) - taken  # where each copy's run starts in the merged list
    picks = np.repeat(lo - firsts, taken) + np.arange(int(taken.sum()))
    offsets = np.repeat(starts, taken)
    merged = tiled[picks] - offsets
    order = np.argsort(merged, kind="stable")[: n + 1]
    end = float(merged[order][n])
    times = (
        np.minimum(merged[order][:n] / end, 1.0) * duration_s  # the (n+1)-th at the end
        if end > 0
        else np.arange(n) * (duration_s / n)  # all at one instant: spread them evenly
    )
    rows = rows_tiled[picks][order][:n]
    return _rows_at(
        trace,
        times,
        rows,
        duration_s,
        f"{copies} cop{'y' if copies == 1 else 'ies'} overlaid at {rate:g}/s over "
        f"{duration_s:g} s, seed {seed}",
    )


def trace_superposed(trace: Trace, rate: float, duration_s: float, seed: int = 0) -> Schedule:
    """``duration_s`` of the traffic of ``k = rate / mean rate`` times the trace's users:
    ``⌊k⌋`` copies of the trace, and one more thinned to the fraction left (each of its
    requests kept with that probability), each copy replaying ``duration_s`` of the trace
    at its own pace from its own random point of it (uniform over the whole trace, which
    cycles; seed ``seed``), merged. Nothing is time-scaled: a burst lasts as long and
    holds as many requests as recorded, and each copy's stretch of the trace is as long
    as the step, so the step's count varies as the trace's counts over that length do
    (``trace_overlaid`` instead holds the count at ``rate·duration_s`` and time-scales
    the merged stream to it: a step starting in a burst then replays a stretch of the
    trace far shorter than itself, and its count never varies).

    The count is drawn, its mean ``rate·duration_s`` (exactly, but for the one request
    an empty draw is given: a copy from a uniform point of a trace cycling with period
    ``P`` holds on average ``len·duration_s / P`` requests). A step's seed draws it
    anew, so two steps at one rate see different stretches as two spells of one
    service's traffic would. A draw holding no request holds one: the first copy's next
    request, at 0 (a step sends one at least). Each request keeps its row's sizes."""
    _check_step(rate, duration_s)
    _check_gaps(trace)
    period = trace.duration + _last_gap(trace.times)
    k = rate * period / len(trace)
    whole = int(np.floor(k + 1e-9))
    part = k - whole if whole == 0 or k - whole > 1e-9 else 0.0
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0.0, period, whole + (part > 0))
    places, offsets = _places(trace, starts[:whole], duration_s)
    if part > 0:
        # the fraction of a copy, its users thinned: a binomial count of its requests,
        # chosen uniformly (Floyd's sampling: a trace far faster than the step's rate
        # puts many more requests in the copy's stretch than the step keeps)
        first, last = _place_bounds(trace, starts[whole:], duration_s)
        m = int(last[0] - first[0])
        kept = first[0] + np.sort(rng.choice(m, rng.binomial(m, part), replace=False))
        places = np.concatenate([places, kept])
        offsets = np.concatenate([offsets, np.full(len(kept), starts[whole])])
    if len(places) == 0:  # the first copy's next request, at 0
        places = _place_bounds(trace, starts[:1], duration_s)[0]
        offsets = trace.times[places % len(trace)] + (places // len(trace)) * period
    times, rows = _at(trace, places, offsets, duration_s)
    order = np.argsort(times, kind="stable")
    times, rows = times[order], rows[order]
    return _rows_at(
        trace,
        times,
        rows,
        duration_s,
        f"its users ×{k:.3g} (copies overlaid at their own pace), {rate:g}/s on average "
        f"over {duration_s:g} s ({len(times)} requests), seed {seed}",
    )


def _rows_at(
    trace: Trace, times: np.ndarray, rows: np.ndarray, duration_s: float, how: str
) -> Schedule:
    """The schedule sending the trace's ``rows`` at ``times``, each with its recorded
    sizes; ``how`` says how the trace was laid out."""
    sized = Trace(times - times[0], {c: v[rows] for c, v in trace.columns.items()}, trace.source)
    return Schedule(
        np.asarray(times, dtype=np.float64),
        shapes_from_trace(sized),
        duration_s,
        f"trace {Path(trace.source).name or '(unnamed)'}, {how}",
    )


def trace_copies(
    trace: Trace, starts: NDArray[np.float64], duration_s: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Copies of the trace overlaid: for each start ``s``, the requests the trace (cycling
    with period ``duration + one mean gap``) holds at ``s ≤ t < s + duration_s``, at
    ``t - s``. Returns their times, copy after copy (unsorted), and the trace row of
    each. The copies add up: those from two lists of starts are those of each."""
    places, offsets = _places(trace, np.asarray(starts, dtype=np.float64), duration_s)
    return _at(trace, places, offsets, duration_s)


def _place_bounds(
    trace: Trace, starts: NDArray[np.float64], duration_s: float
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each copy's requests as places in the cycling trace (``lap · len + row``): the
    first at or after its start, and one past the last before its end."""
    period = trace.duration + _last_gap(trace.times)
    if len(trace) * (duration_s / period) > 2.0**53:  # places past a float's whole numbers
        raise ConfigError(
            f"trace {trace.source!r} holds {len(trace)} requests in {period:g} s: too fast "
            f"to replay for {duration_s:g} s; record a longer stretch of it"
        )
    starts = np.mod(starts, period)
    ends = starts + duration_s
    laps = np.floor(ends / period)
    lo = np.searchsorted(trace.times, starts, side="left").astype(np.int64)
    hi = laps.astype(np.int64) * len(trace) + np.searchsorted(
        trace.times, ends - laps * period, side="left"
    )
    return lo, np.maximum(hi, lo)


def _places(
    trace: Trace, starts: NDArray[np.float64], duration_s: float
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Every copy's places, copy after copy, and each one's copy's start."""
    lo, hi = _place_bounds(trace, starts, duration_s)
    taken = hi - lo
    firsts = np.cumsum(taken) - taken
    places = np.repeat(lo - firsts, taken) + np.arange(int(taken.sum()), dtype=np.int64)
    return places, np.repeat(np.mod(starts, trace.duration + _last_gap(trace.times)), taken)


def _at(
    trace: Trace, places: NDArray[np.int64], offsets: NDArray[np.float64], duration_s: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Places in the cycling trace as times from their copy's start, and their rows."""
    period = trace.duration + _last_gap(trace.times)
    rows = (places % len(trace)).astype(np.int64)
    times = trace.times[rows] + (places // len(trace)) * period - offsets
    # within [0, duration_s) though the sums round
    times = np.clip(times, 0.0, np.nextafter(duration_s, 0.0))
    return np.asarray(times, dtype=np.float64), rows


def _check_step(rate: float, duration_s: float) -> None:
    if not (np.isfinite(rate) and rate > 0):
        raise ConfigError(f"a step's rate must be finite and > 0 req/s, got {rate}")
    if not (np.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"a step's duration must be finite and > 0 s, got {duration_s}")


def _check_gaps(trace: Trace) -> None:
    if len(trace) < 2:
        raise ConfigError(f"trace {trace.source!r} holds one request: it has no gaps to replay")
    if not trace.duration > 0:
        raise ConfigError(f"trace {trace.source!r} spans no time: it has no gaps to replay")


def trace_held(trace: Trace, rate: float, duration_s: float, hold_s: float = 2.0) -> Schedule:
    """``duration_s`` of the trace's arrivals at ``rate``, the rate held every ``hold_s``:
    consecutive stretches of the trace, each of ``rate·hold_s`` requests time-scaled to
    fill its ``hold_s`` (``trace_at_rate`` per stretch, the trace cycling from its start
    when it runs out). Within a stretch the trace's burstiness is kept; across stretches
    the level is the rate. ``trace_at_rate`` alone keeps the burstiness at every scale,
    so a 12 s phase at 30 req/s may put most of its requests in its last 2 s (the
    bundled trace's opening does): a demand that steps between phases then cannot be
    told from the trace's own swings at the scale a controller watches."""
    if not (np.isfinite(hold_s) and hold_s > 0):
        raise ConfigError(f"hold_s must be finite and > 0 s, got {hold_s}")
    pieces: list[NDArray[np.float64]] = []
    shapes: list[RequestShape] = []
    at = 0.0
    offset = 0
    while at < duration_s - 1e-9:
        span = min(hold_s, duration_s - at)
        n = max(1, round(rate * span))
        rows = (offset + np.arange(n + 1)) % len(trace)
        stretch = Trace.from_times(
            trace.times[rows] + (rows < rows[0]) * trace.times[-1],
            {k: c[rows] for k, c in trace.columns.items()},
            trace.source,
        )
        step = trace_at_rate(stretch, rate, span)
        pieces.append(step.times + at)
        if step.shapes is not None:
            shapes += step.shapes
        offset = (offset + n) % len(trace)
        at += span
    times = np.concatenate(pieces)
    return Schedule(
        times,
        shapes if len(shapes) == len(times) else None,
        duration_s,
        f"trace {trace.source} at {rate:g}/s over {duration_s:g} s, the rate held every "
        f"{hold_s:g} s",
    )


def _last_gap(times: NDArray[np.float64]) -> float:
    """A span for an open-ended replay: to the last arrival plus one mean gap."""
    if len(times) < 2:
        return 1.0
    return float(times[-1] - times[0]) / (len(times) - 1)
