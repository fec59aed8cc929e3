"""The LLM engine on the real clock: one asyncio task stepping ``synthetic.llm``'s scheduler.

Steps run back to back while anything is running or waiting, each from the logical end of
the one before (so the event loop's lateness never accumulates: the throughput is the
model's), and the first step after an idle spell starts when its request arrives. A
request joins the scheduler at the first step that starts after it arrived, as in the
simulator, even when the loop runs late (it is refused, or not, when it arrives). At a
step's end every sequence that produced a token gets it: its ``TokenStream`` records the
step's end time and wakes the request's handler, which writes what it has not written.
A handler that goes away (the client closed, the server stops) aborts its request, which
frees its KV blocks, as vLLM aborts a disconnected request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque

from ridgeline.clock import Clock
from ridgeline.fakeserver.metrics import LlmStats
from ridgeline.synthetic.llm import LlmScheduler, Refused, Step, output_length
from ridgeline.synthetic.model import LatencyModel


class TokenStream:
    """One request's tokens as the engine produces them."""

    __slots__ = ("arrival", "closed", "event", "finished", "max_tokens", "prompt", "rid", "times")

    def __init__(self, rid: int, arrival: float, prompt: int, max_tokens: int) -> None:
        self.rid, self.arrival, self.prompt, self.max_tokens = rid, arrival, prompt, max_tokens
        self.times: list[float] = []
        """Clock time of each token produced (a step's logical end)."""
        self.finished = False
        self.closed = False
        """The server stopped before the request finished."""
        self.event = asyncio.Event()

    @property
    def length_limited(self) -> bool:
        """It ran to max_tokens (finish_reason "length", else "stop")."""
        return len(self.times) >= self.max_tokens


class LlmRunner:
    """The scheduler of ``model.llm`` stepped on ``clock``; ``start`` inside the loop."""

    def __init__(self, model: LatencyModel, clock: Clock, stats: LlmStats) -> None:
        if model.llm is None:
            raise ValueError(f"model {model.name!r} has no `llm:` engine to run")
        self.engine, self.clock, self.stats, self._seed = model.llm, clock, stats, model.seed
        self.scheduler = LlmScheduler(model.llm, model.max_queue)
        s = self.scheduler
        stats.gauges = lambda: (self.running, self.waiting, s.kv_usage, s.preemptions)
        self._streams: dict[int, TokenStream] = {}
        self._arrived: deque[tuple[TokenStream, int]] = deque()
        """Requests taken but not yet handed to the scheduler, with their output length."""
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Requests taken and not yet admitted (arrived since the step began included)."""
        return self.scheduler.waiting + len(self._arrived)

    @property
    def running(self) -> int:
        """Sequences running."""
        return self.scheduler.running

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="llm-engine")

    async def close(self) -> None:
        """Stop stepping; every unfinished request ends (``closed``)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for stream in self._streams.values():
            stream.finished = stream.closed = True
            stream.event.set()
        self._streams.clear()
        self._arrived.clear()

    def submit(
        self, prompt: int, max_tokens: int, *, ignore_eos: bool, min_tokens: int = 0
    ) -> TokenStream | Refused:
        """Queue a request; its stream, or why it was refused (400 or 503)."""
        rid = next(self._ids)
        target = output_length(
            self.engine,
            max_tokens,
            ignore_eos=ignore_eos,
            min_tokens=min_tokens,
            seed=self._seed,
            index=rid,
        )
        refused = self.scheduler.refusal(prompt, max_tokens, ahead=len(self._arrived))
        if refused is not None:
            return refused
        stream = self._streams[rid] = TokenStream(rid, self.clock.now(), prompt, max_tokens)
        self._arrived.append((stream, target))
        self.stats.prompt_tokens += prompt
        self._wake.set()
        return stream

    def abort(self, stream: TokenStream) -> None:
        """The request's client went away: free what it holds."""
        if self._streams.pop(stream.rid, None) is not None:
            self.scheduler.abort(stream.rid)  # False while it has not joined: it never will

    async def _run(self) -> None:
        end, arrived = self.clock.now(), self._arrived
        while True:
            if self.scheduler.idle:
                if not arrived:
                    self._wake.clear()
                    await self._wake.wait()
                end = max(end, arrived[0][0].arrival)
            while arrived and arrived[0][0].arrival <= end:
                stream, target = arrived.popleft()
                if stream.rid in self._streams:  # not aborted before it joined
                    self.scheduler.add(
                        stream.rid, stream.prompt, stream.max_tokens, target, checked=True
                    )
            step = self.scheduler.step(end)
            if step is None:  # every request was aborted before it ran
                continue
            delay = step.end - self.clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            end = step.end
            self._deliver(step)

    def _deliver(self, step: Step) -> None:
        stats, at = self.stats, step.end
        for rid in step.tokens:
            stream = self._streams.get(rid)
            if stream is None:
                continue  # aborted during the step
            times = stream.times
            if times:
                stats.itl.observe(at - times[-1])
            else:
                stats.ttft.observe(at - stream.arrival)
            times.append(at)
            stats.generation_tokens += 1
            stream.event.set()
        for rid in step.finished:
            done = self._streams.pop(rid, None)
            if done is not None:
                done.finished = True
                stats.e2e.observe(at - done.arrival)
