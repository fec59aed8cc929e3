"""Decoder processes: infer bodies parsed into arrays beside the event loop, not on it.

A v2 JSON body of an image is hundreds of kilobytes of numbers: parsing it (orjson) and
making the array (numpy) hold the GIL for milliseconds (efficientnet-b0's 395 kB body:
about 3 ms on this project's 2-core machine). On the one event loop every request of a
Poisson burst waited behind the others' parsing, and the loop could use one core at
most. ``DecoderPool`` hands each large body to one of N processes: the loop copies the
body into the decoder's shared buffer (``arena``), the decoder parses and checks it
exactly as the loop would (``v2.http_codec.decode_body``: the same errors), copies the
arrays into its own buffer and answers with their layout; the loop copies them out. The
loop's share of a request is two copies and two small messages. Each decoder holds two
bodies at a time (``DEPTH``), so it starts the next as soon as it has answered one
rather than when the loop gets round to taking the answer (one decoder at 180 req/s:
a body's round trip was 4.4 ms at the median for 3.2 ms of decoding).

A body under ``inline_below`` bytes is decoded on the loop (the round trip would cost
more than the parse). A decoder that dies fails the bodies it held (503,
``unavailable``) and is replaced; a replacement that cannot start is not tried again,
and once no decoder is left (none alive, none starting) every body, those already
waiting for a decoder included, is decoded on the loop: slower, never stuck.
``decoders=0`` decodes everything on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

from ridgeline.aio import signals_held
from ridgeline.errors import InferFailed, InvalidRequest, WorkerStartError
from ridgeline.serve._decoder_child import decoder_main
from ridgeline.serve._futures import end_process, exit_text, fail, resolve, retrieve
from ridgeline.serve.arena import Arena, ArenaView, Grown
from ridgeline.v2.http_codec import Decoded, decode_body
from ridgeline.v2.spec import ModelShape, ModelSpec

__all__ = ["DEFAULT_INLINE_BELOW", "DecoderPool", "default_decoders"]

DEFAULT_INLINE_BELOW = 64 << 10
"""Bodies smaller than this are decoded on the event loop."""
DEPTH = 2
"""Bodies in flight per decoder: the next is already there when one is answered, so a
decoder does not wait for a busy loop to take its answer before it starts again."""


def default_decoders() -> int:
    """One decoder a core, at most 4. On two cores, one decoder (pipelined) held
    efficientnet-b0's JSON to p99 77 ms at 180 req/s where two held 34 ms: a burst is
    parsed on both cores, and each decoder is idle while the loop or worker runs."""
    return max(1, min(4, os.cpu_count() or 1))


class DecoderPool:
    """``await pool(model, body, header_length, max_bytes)`` → ``Decoded``, a
    ``v2.http_codec.BodyDecoder``; ``start``/``stop`` (or ``async with``) its processes.
    ``decoded_off_loop`` and ``decoded_inline`` count the bodies each way."""

    def __init__(self, decoders: int, inline_below: int = DEFAULT_INLINE_BELOW) -> None:
        if decoders < 0:
            raise ValueError(f"decoders is {decoders}; give 0 (decode on the loop) or more")
        self.size, self.inline_below = decoders, inline_below
        self._idle: asyncio.Queue[tuple[_Decoder, int] | None] = asyncio.Queue()
        """Free places: (decoder, buffer), each decoder's first buffers first; None once
        no decoder is left (``_none_left``), for every waiter in turn."""
        self._all: set[_Decoder] = set()
        self._spawning: set[asyncio.Task[None]] = set()
        self._stopped = False
        self.decoded_off_loop = 0
        self.decoded_inline = 0
        self.restarts = 0
        """Decoders that died and were sent for a replacement."""
        self.failed_starts = 0
        """Replacements that could not start (not tried again)."""

    @property
    def alive(self) -> int:
        """Decoders running now."""
        return len(self._all)

    def _none_left(self) -> bool:
        return not self._all and not self._spawning

    async def start(self) -> None:
        """Spawn the decoders and wait until each has said it is ready."""
        started = await asyncio.gather(
            *(_Decoder.spawn(f"decoder#{i}") for i in range(self.size)), return_exceptions=True
        )
        for slot in range(DEPTH):
            for d in started:
                if isinstance(d, _Decoder):
                    self._all.add(d)
                    self._idle.put_nowait((d, slot))
        errors = [e for e in started if isinstance(e, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]

    async def stop(self) -> None:
        """Stop every decoder (a body in decoding fails with 503); safe to call twice."""
        self._stopped = True
        for t in self._spawning:
            t.cancel()
        await asyncio.gather(*self._spawning, return_exceptions=True)
        await asyncio.gather(*(d.close() for d in self._all))
        self._all.clear()

    async def __aenter__(self) -> DecoderPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def __call__(
        self, model: ModelSpec, body: bytes, header_length: str | None, max_bytes: int
    ) -> Decoded:
        place = None
        if self.size > 0 and len(body) >= self.inline_below and not self._stopped:
            place = await self._take_place()
        if place is None:
            self.decoded_inline += 1
            return decode_body(model, body, header_length, max_bytes)
        decoder, slot = place
        job = decoder.submit(slot, ModelShape.of(model), body, header_length, max_bytes)
        job.add_done_callback(lambda _: self._release(decoder, slot))
        self.decoded_off_loop += 1
        return await asyncio.shield(job)  # a cancelled caller's body is still decoding

    async def _take_place(self) -> tuple[_Decoder, int] | None:
        """A free (decoder, buffer), waiting for one; None once no decoder is left."""
        while not self._none_left():
            place = await self._idle.get()
            if place is None:  # no decoder left: pass the word to the next waiter
                self._idle.put_nowait(None)
                return None
            if not place[0].exited.done():
                return place
            self._release(*place)  # it died idle: replace it, take the next place
        return None

    def _release(self, decoder: _Decoder, slot: int) -> None:
        if not decoder.exited.done():
            self._idle.put_nowait((decoder, slot))
            return
        if decoder not in self._all or self._stopped:  # replaced already (another slot)
            return
        self._all.discard(decoder)
        self.restarts += 1
        task = asyncio.get_running_loop().create_task(self._replace(decoder.name))
        self._spawning.add(task)
        task.add_done_callback(self._spawned)

    def _spawned(self, task: asyncio.Task[None]) -> None:
        """A replacement started, or could not: with none left, waiters decode on the loop."""
        self._spawning.discard(task)
        if self._none_left():
            self._idle.put_nowait(None)

    async def _replace(self, name: str) -> None:
        try:
            fresh = await _Decoder.spawn(name)
        except Exception:  # could not start, however: the others serve (``_spawned``)
            self.failed_starts += 1
            return
        self._all.add(fresh)
        for slot in range(DEPTH):
            self._idle.put_nowait((fresh, slot))


class _Decoder:
    """The parent's handle on one decoder process: its pipe, its exit, its body in flight."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.get_running_loop()
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=decoder_main, args=(child_conn, DEPTH), name=name, daemon=True
        )
        try:
            with signals_held():  # a stop mid-start left the child a half-written pipe
                self._process.start()
        finally:  # a process that could not start leaves no pipe open behind it
            child_conn.close()
            if self._process.pid is None:
                self._conn.close()
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        self._bodies = [Arena(self._conn, self.pid, slot) for slot in range(DEPTH)]
        self._answers = ArenaView()
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.ready.add_done_callback(retrieve)
        self.exited: asyncio.Future[int | None] = self._loop.create_future()
        self._jobs: dict[int, asyncio.Future[Decoded]] = {}
        """The bodies in flight by their sequence number."""
        self._seq = 0
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        self._loop.add_reader(self._process.sentinel, self._on_exit)
        os.set_blocking(self._conn.fileno(), True)  # as workers: uvloop made it non-blocking

    @classmethod
    async def spawn(cls, name: str) -> _Decoder:
        d = cls(name)
        try:
            await d.ready
        except BaseException:
            await d.close()
            raise
        return d

    def submit(
        self,
        slot: int,
        model: ModelShape,
        body: bytes,
        header_length: str | None,
        max_bytes: int,
    ) -> asyncio.Future[Decoded]:
        """Send one body in buffer ``slot`` (free: its last answer was taken); the future
        is its decoding (or the decoder's death)."""
        self._seq += 1
        job = self._loop.create_future()
        job.add_done_callback(retrieve)
        if self.exited.done():
            fail(job, self._died())
            return job
        self._jobs[self._seq] = job
        try:
            layout = self._bodies[slot].pack({"body": np.frombuffer(body, np.uint8)})
            self._conn.send_bytes(
                ForkingPickler.dumps((self._seq, model, header_length, max_bytes, layout))
            )
        except OSError:  # the process is gone: _on_exit fails the job
            pass
        return job

    def _on_readable(self) -> None:
        if not self._read_one():  # the process is gone; _on_exit says how
            self._loop.remove_reader(self._conn.fileno())

    def _read_one(self) -> bool:
        """Take one message; False when the pipe is closed."""
        try:
            message = self._conn.recv()
            if isinstance(message, Grown):
                self._answers.take(self._conn, message)
                return True
        except (EOFError, OSError):
            return False
        self._dispatch(message)
        return True

    def _dispatch(self, message: Any) -> None:
        match message:
            case "ready":
                resolve(self.ready, None)
            case (int() as seq, "ok", Decoded() as decoded, layout) if seq in self._jobs:
                views = self._answers.unpack(layout)
                arrays = [np.array(views[str(i)]) for i in range(len(views))]  # copies out
                resolve(self._jobs.pop(seq), Decoded(decoded.request, decoded.rows, arrays))
            case (int() as seq, "invalid", str() as text) if seq in self._jobs:
                fail(self._jobs.pop(seq), InvalidRequest(text))
            case (int() as seq, "failed", str() as text) if seq in self._jobs:
                problem = f"decoding the body failed: {text}"
                fail(self._jobs.pop(seq), InferFailed("internal", problem))

    def _died(self) -> InferFailed:
        code = self.exited.result() if self.exited.done() else None
        return InferFailed(
            "unavailable",
            f"{self.name} died decoding the body ({exit_text(code)}); it is replaced, so "
            "retry the request",
        )

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._process.sentinel)
        with contextlib.suppress(EOFError, OSError):  # answers sent just before it exited
            while self._conn.poll() and self._read_one():
                pass
        self._loop.remove_reader(self._conn.fileno())
        self._conn.close()
        for arena in self._bodies:
            arena.close()
        self._answers.close()
        self._process.join()
        code = self._process.exitcode
        self._process.close()
        resolve(self.exited, code)
        fail(
            self.ready,
            WorkerStartError(f"{self.name} exited with {exit_text(code)} before it was ready"),
        )
        for job in self._jobs.values():
            fail(job, self._died())
        self._jobs.clear()

    async def close(self, timeout_s: float = 2.0) -> None:
        """Ask the process to exit; terminate it after ``timeout_s``, kill it a second later."""
        if self.exited.done():
            return
        with contextlib.suppress(OSError):
            self._conn.send(None)
        await end_process(self._process, self.exited, timeout_s)
