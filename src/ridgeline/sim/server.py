"""A simulated inference server in virtual time: the fake server's latency model, run as
a discrete-event simulation instead of on an event loop.

``simulate`` takes one step's arrival times and returns the step's ``Records`` — what a
load generator would have measured against a ``BatchingEngine`` serving ``model`` — and
the server's state after the step, to pass to the next one. The batching policy is the
same ``decide`` the engine calls, and batch service times come from the same
``mean_service_s`` and lognormal noise (divided by ``speed``, multiplied by the
interference factor), pushed past stalls by the same ``stall_release``; see ``_queue``
for the event loop.

Times in a step are seconds from the step's start, which is ``state.server_time_s`` of
server time: warm-up, stalls and interference windows are all in server time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError
from ridgeline.sim._queue import QueueRun, Service, run_queue
from ridgeline.sim.interference import Interference
from ridgeline.synthetic.model import (
    LatencyModel,
    lognormal_params,
    mean_service_s,
    stall_release,
    warmup_factor,
)
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.workload.payloads import RequestShape

QUEUE_FULL = "queue full"
INJECTED = "injected error"
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SimState:
    """What a simulated server carries from one step to the next."""

    server_time_s: float = 0.0
    """How long the server has been up when the next step starts."""
    served: int = 0
    """Requests executed so far (warm-up by requests counts them)."""

    @classmethod
    def fresh(cls) -> SimState:
        """A server that has just started."""
        return cls()

    def advance(self, seconds: float) -> SimState:
        """The same server after ``seconds`` of idle time (between steps)."""
        if not seconds >= 0.0 or math.isinf(seconds):
            raise ConfigError(f"idle time must be a finite number ≥ 0 s, got {seconds}")
        return replace(self, server_time_s=self.server_time_s + seconds)


def simulate(
    model: LatencyModel,
    times: NDArray[np.float64],
    shapes: Sequence[RequestShape] | None = None,
    *,
    state: SimState | None = None,
    seed: int = 0,
    timeout_s: float = 30.0,
    speed: float = 1.0,
    interference: Interference | None = None,
    span_s: float | None = None,
) -> tuple[Records, SimState]:
    """Serve requests arriving at ``times`` (seconds from the step start, sorted) with
    ``shapes[i].items`` rows each (1 when ``shapes`` is None) on a simulated ``model``.

    Each request ends OK, ERROR ("queue full" at once when ``max_queue`` requests wait;
    "injected error" at ``error_rate``) or TIMEOUT (its answer came later than arrival +
    ``timeout_s``: done is then arrival + ``timeout_s``, and the server still executes
    it). A simulated generator is never late: sent = scheduled = ``times``.

    ``seed`` picks the noise and error draws (together with ``model.seed``): the same
    arguments give the same records. ``speed`` divides every service time (a faster
    GPU); ``interference`` multiplies it while a neighbour is busy.

    The returned state's server time is ``state.server_time_s`` plus the later of the
    last completion (the server's, even of a request that timed out) and the step's span
    (``span_s``, by default the last arrival), so every instance is free when the next
    step starts; ``state.advance`` adds idle time between steps.
    """
    state = state or SimState.fresh()
    t, n = check_times(times), int(np.shape(times)[0])
    cum = _cumulative_rows(model, shapes, n)
    check_run(speed, timeout_s)
    service = _service(model, state, seed, speed, interference, n)
    run = run_queue(t.tolist(), cum, model.batching, model.instances, model.max_queue, service)
    records = _records(model, t, run, seed, timeout_s)
    if span_s is None:
        span_s = float(t[-1]) if n else 0.0
    last = max(run.ends, default=0.0)
    after = SimState(state.server_time_s + max(last, span_s), state.served + run.served)
    return records, after


def check_run(speed: float, timeout_s: float) -> None:
    """The settings every simulation takes: a finite speed above 0, a timeout above 0."""
    if not (speed > 0.0 and math.isfinite(speed)):
        raise ConfigError(f"speed must be a finite number > 0 (1: as measured), got {speed}")
    if not timeout_s > 0.0:
        raise ConfigError(f"timeout_s must be > 0 s, got {timeout_s}")


def check_times(times: NDArray[np.float64]) -> NDArray[np.float64]:
    """``times`` as a 1-D float array, checked: finite, ≥ 0, sorted (ConfigError if not)."""
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1:
        raise ConfigError(f"times must be a 1-D array of seconds, got shape {t.shape}")
    if t.size and not (np.isfinite(t).all() and t[0] >= 0.0):
        raise ConfigError("times must be finite seconds ≥ 0 from the step start")
    if t.size > 1 and bool((np.diff(t) < 0.0).any()):
        raise ConfigError("times must be sorted ascending; sort the schedule first")
    return t


def _cumulative_rows(
    model: LatencyModel, shapes: Sequence[RequestShape] | None, n: int
) -> list[int]:
    if shapes is None:
        return list(range(n + 1))
    if len(shapes) != n:
        raise ConfigError(f"got {len(shapes)} shapes for {n} times; pass one shape per request")
    rows = np.fromiter((s.items for s in shapes), dtype=np.int64, count=n)
    biggest = model.batching.max_batch_size
    if n and (rows.min() < 1 or rows.max() > biggest):
        bad = int(np.flatnonzero((rows < 1) | (rows > biggest))[0])
        raise ConfigError(
            f"request {bad} has {rows[bad]} rows, but a batch holds 1..{biggest} "
            "(max_batch_size); cap the size spec's `high` or raise max_batch_size"
        )
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(rows, out=cum[1:])
    out: list[int] = cum.tolist()
    return out


def _service(
    model: LatencyModel,
    state: SimState,
    seed: int,
    speed: float,
    interference: Interference | None,
    batches: int,
) -> Service:
    """End of a batch, in step time: ``mean_service_s`` times its lognormal noise draw
    (``noise_cv`` > 0), ÷ speed × interference, past stalls.

    The noise of up to ``batches`` batches is drawn at once (one draw each, as
    ``service_time_s`` makes), and once warm a batch of r rows always has the same mean,
    so ``mean_service_s`` is asked once per r and remembered."""
    t0, served0 = state.server_time_s, state.served
    noise: list[float] | None = None
    if model.noise_cv > 0.0:
        gen = np.random.default_rng([model.seed & _U64, seed & _U64, 2])
        noise = gen.lognormal(*lognormal_params(model.noise_cv), size=batches).tolist()
    stalls = bool(model.stalls) or model.periodic_stall is not None
    factor = None if interference is None else interference.factor
    cache: dict[int, float] = {}
    warm = model.warmup is None
    k = 0  # batches served in the step

    def service(rows: int, start: float, served: int) -> float:
        nonlocal warm, k
        since = t0 + start
        if not warm:
            warm = warmup_factor(model, since, served0 + served) == 1.0
        if warm:
            s = cache.get(rows)
            if s is None:
                s = cache[rows] = mean_service_s(model, rows, since, served0 + served) / speed
        else:
            s = mean_service_s(model, rows, since, served0 + served) / speed
        if noise is not None:
            s *= noise[k]
            k += 1
        if factor is not None:
            s *= factor(since)
        if stalls:
            return stall_release(model, since + s) - t0
        return start + s

    return service


def _records(
    model: LatencyModel, t: NDArray[np.float64], run: QueueRun, seed: int, timeout_s: float
) -> Records:
    n = t.shape[0]
    rec = Records.empty(t)
    rec.sent = t.copy()
    admitted = len(run.order) if run.order is not None else n
    bounds = np.asarray([*run.firsts, admitted], dtype=np.int64)
    counts = bounds[1:] - bounds[:-1]
    served_done = np.repeat(np.asarray(run.ends, dtype=np.float64), counts)
    done = np.empty(n, dtype=np.float64)
    outcome = np.full(n, int(Outcome.OK), dtype=np.int8)
    executed = np.ones(n, dtype=bool)
    if run.order is None:
        done[:] = served_done
    else:
        done[np.asarray(run.order, dtype=np.int64)] = served_done
        refused = np.asarray(run.rejected, dtype=np.int64)
        done[refused] = t[refused]
        outcome[refused] = int(Outcome.ERROR)
        executed[refused] = False
    late = executed & (done - t > timeout_s)
    done[late] = t[late] + timeout_s
    outcome[late] = int(Outcome.TIMEOUT)
    injected = np.zeros(n, dtype=bool)
    if model.error_rate > 0.0:
        draws = np.random.default_rng([model.seed & _U64, seed & _U64, 1]).random(n)
        injected = executed & ~late & (draws < model.error_rate)
        outcome[injected] = int(Outcome.ERROR)
    rec.done, rec.outcome = done, outcome
    counted = {
        QUEUE_FULL: len(run.rejected),
        f"timeout after {timeout_s:g} s": int(late.sum()),
        INJECTED: int(injected.sum()),
    }
    rec.errors = {reason: k for reason, k in counted.items() if k}
    return rec
