"""A simulated LLM server in virtual time: the fake server's continuous-batching scheduler
(``synthetic.llm.LlmScheduler``) stepped back to back on a virtual clock.

``simulate_llm`` takes one step's arrival times and request shapes (prompt tokens in,
output tokens asked) and returns the ``Records`` a streaming client would have measured
against ``ridgeline fake-server`` serving the same model: the first token at the end of
the step that prefilled the request, one token per decode step after, every gap between
them (``gaps``/``gap_start``), the prompt and output tokens. Engine steps run back to back
while anything is running or waiting; requests arriving during a step join at its end,
as on the server.

A request the cache can never hold ends ERROR at once (the server's 400), so does one
over ``max_queue`` waiting (503 "queue full"). A request not finished ``timeout_s`` after
its arrival is TIMEOUT (done at the deadline, no tokens kept) and aborted at the next
step boundary, freeing its KV blocks, as vLLM aborts a request whose client went away.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError
from ridgeline.sim.interference import Interference
from ridgeline.sim.server import SimState, check_run, check_times
from ridgeline.synthetic.llm import LlmScheduler, output_length
from ridgeline.synthetic.model import LatencyModel, LlmEngine
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.workload.payloads import RequestShape

DEFAULT_MAX_TOKENS = 16
"""Output tokens asked when a shape asks none (the OpenAI target's default)."""


def simulate_llm(
    model: LatencyModel,
    times: NDArray[np.float64],
    shapes: Sequence[RequestShape],
    *,
    state: SimState | None = None,
    seed: int = 0,
    timeout_s: float = 30.0,
    speed: float = 1.0,
    interference: Interference | None = None,
    span_s: float | None = None,
    ignore_eos: bool = True,
) -> tuple[Records, SimState]:
    """Serve requests arriving at ``times`` (seconds from the step start, sorted) with
    ``shapes[i]``'s prompt and output tokens on a simulated ``model`` (its ``llm`` engine).

    ``speed`` divides every step's duration, ``interference`` multiplies it while the
    neighbour is busy (judged at the step's start, in server time). With ``ignore_eos``
    false and the engine's ``eos_mean_tokens`` set, requests may end early at a natural
    length seeded by (``model.seed``, ``seed``, index). The returned state is as
    ``sim.simulate``'s: server time advanced past the last token and the step's span.
    """
    engine = _engine_of(model)
    state = state or SimState.fresh()
    t = check_times(times)
    n = int(t.shape[0])
    if len(shapes) != n:
        raise ConfigError(f"got {len(shapes)} shapes for {n} times; pass one shape per request")
    check_run(speed, timeout_s)
    run = _Run(engine, model.max_queue, n)
    at = t.tolist()
    prompts = [max(1, s.prompt_tokens) for s in shapes]
    asked = [s.output_tokens or DEFAULT_MAX_TOKENS for s in shapes]
    stream = (model.seed * 1_000_003 + seed) & 0xFFFF_FFFF
    clock, i, last = 0.0, 0, 0.0
    while i < n or not run.sched.idle:
        if run.sched.idle:
            clock = max(clock, at[i])
        while i < n and at[i] <= clock:
            out = output_length(engine, asked[i], ignore_eos=ignore_eos, seed=stream, index=i)
            run.arrive(i, at[i], prompts[i], asked[i], out, at[i] + timeout_s)
            i += 1
        run.expire(clock)
        if run.sched.idle:
            continue
        slowdown = 1.0 / speed
        if interference is not None:
            slowdown *= interference.factor(state.server_time_s + clock)
        step = run.sched.step(clock, slowdown)
        assert step is not None
        clock = last = step.end
        run.produced(step.tokens, step.finished, clock)
    rec = run.records(t, prompts, timeout_s)
    if span_s is None:
        span_s = at[-1] if n else 0.0
    served = n - int(np.count_nonzero(rec.outcome == int(Outcome.ERROR)))
    return rec, SimState(state.server_time_s + max(last, span_s), state.served + served)


def _engine_of(model: LatencyModel) -> LlmEngine:
    if model.llm is None:
        raise ConfigError(
            f"model {model.name!r} has no `llm:` engine; give it one or simulate it with "
            "sim.simulate"
        )
    return model.llm


class _Run:
    """The scheduler, and what it produced step by step (token times are laid out per
    request once, at the end, with numpy)."""

    def __init__(self, engine: LlmEngine, max_queue: int | None, n: int) -> None:
        self.sched = LlmScheduler(engine, max_queue)
        self.done = np.full(n, np.nan)
        self.outcome = np.full(n, int(Outcome.OK), dtype=np.int8)
        self.deadline = [math.inf] * n
        self.errors: dict[str, int] = {}
        self._expiry: list[tuple[float, int]] = []
        self._rids: list[int] = []
        self._counts: list[int] = []
        self._ends: list[float] = []

    def arrive(self, i: int, at: float, prompt: int, asked: int, out: int, deadline: float) -> None:
        refused = self.sched.add(i, prompt, asked, out)
        if refused is not None:
            self.outcome[i], self.done[i] = int(Outcome.ERROR), at
            self.errors[refused.reason] = self.errors.get(refused.reason, 0) + 1
            return
        self.deadline[i] = deadline
        heapq.heappush(self._expiry, (deadline, i))

    def expire(self, now: float) -> None:
        """Abort the requests whose deadline has passed by ``now``."""
        while self._expiry and self._expiry[0][0] <= now:
            _, i = heapq.heappop(self._expiry)
            if self.sched.abort(i):
                self._time_out(i)

    def produced(self, rids: list[int], finished: list[int], now: float) -> None:
        self._rids.extend(rids)
        self._counts.append(len(rids))
        self._ends.append(now)
        for i in finished:
            if now > self.deadline[i]:
                self._time_out(i)
            else:
                self.done[i] = now

    def _time_out(self, i: int) -> None:
        self.outcome[i], self.done[i] = int(Outcome.TIMEOUT), self.deadline[i]

    def records(self, t: NDArray[np.float64], prompts: list[int], timeout_s: float) -> Records:
        n = t.shape[0]
        rec = Records.empty(t)
        rec.sent = t.copy()
        rec.done, rec.outcome = self.done, self.outcome
        rec.prompt_tokens = np.asarray(prompts, dtype=np.int32)
        rids = np.asarray(self._rids, dtype=np.int64)
        at = np.repeat(np.asarray(self._ends, dtype=np.float64), self._counts)
        kept = self.outcome[rids] == int(Outcome.OK)  # a timed-out request keeps no token
        rids, at = rids[kept], at[kept]
        order = np.argsort(rids, kind="stable")  # each request's tokens stay in time order
        rids, at = rids[order], at[order]
        tokens = np.bincount(rids, minlength=n)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(tokens, out=starts[1:])
        some = tokens > 0
        rec.first_token[some] = at[starts[:-1][some]]
        rec.output_tokens = tokens.astype(np.int32)
        rec.gaps = np.diff(at)[rids[1:] == rids[:-1]]
        np.cumsum(np.maximum(tokens - 1, 0), out=rec.gap_start[1:])
        late = int(np.count_nonzero(self.outcome == int(Outcome.TIMEOUT)))
        if late:
            self.errors[f"timeout after {timeout_s:g} s"] = late
        rec.errors = dict(self.errors)
        return rec
