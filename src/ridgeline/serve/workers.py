"""Worker processes: one backend in one process, bound to a placement, one batch at a time.

``Worker`` spawns a process (multiprocessing "spawn", running ``_child.child_main``) that
applies its ``Placement``, builds and loads its backend, then runs the batches it is
sent. The parent side is asyncio: the pipe and the process's sentinel are watched with
``loop.add_reader``, so a reply never blocks the event loop, and a process that dies
fails its batch in flight at once (``WorkerCrashed``, with the exit code) and is
replaced by a fresh one.

Messages on the duplex pipe::

    parent → child   Grown(size), then a memory file's descriptor  |  (batch_id, Layout)
                     |  None: stop
    child → parent   ("ready", Signature)  |  ("failed", error)      once, after loading
                     (batch_id, True, outputs)  |  (batch_id, False, "Type: message")

A batch's arrays go through shared memory (``arena``): the parent copies them into the
worker's buffer and writes only their layout to the pipe, from the event loop, since the
socket's buffer takes it whole. Neither a pipe write nor a thread is in a batch's path:
a frame batch is megabytes and the pipe holds 64 KiB, so written through the pipe the
write lasted until the child had read it all (on the example plan at 20 req/s on two
cores, from the loop, a detector batch's write held it 12 ms at p99 and 47 ms at worst),
and from a thread each chunk of it waited for the GIL held by a loop parsing requests
(efficientnet-b0 at 160 req/s: p99 62-337 ms). Only a message carrying BYTES tensors
over 32 KiB is still written from a thread.

The placement's environment is set in the child before its backend is built and loaded;
a library the child imported before that (numpy's BLAS) keeps the thread count it read
from the parent's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.reduction import ForkingPickler
from typing import Any

from ridgeline.aio import signals_held
from ridgeline.clock import Clock, MonotonicClock
from ridgeline.errors import WorkerCrashed, WorkerError, WorkerStartError
from ridgeline.serve._child import child_main
from ridgeline.serve._futures import end_process, exit_text, fail, resolve, retrieve
from ridgeline.serve.affinity import Placement
from ridgeline.serve.arena import Arena
from ridgeline.serve.backend import Signature
from ridgeline.serve.backends import BackendConfig
from ridgeline.v2.tensors import Array

__all__ = ["Worker"]

_ON_LOOP_BYTES = 32 << 10
"""A message this small is written from the loop: the socket's buffer takes it whole."""


class Worker:
    """One backend in one process, bound to ``placement``; runs one batch at a time.

    ``busy_s`` (seconds inside ``run``), ``batches`` (batches sent) and ``restarts``
    (fresh processes after a crash) are for the frontend's metrics; ``signature`` is the
    backend's tensors once started. Use ``async with Worker(...) as w`` or
    ``start``/``stop``.
    """

    def __init__(
        self,
        backend: BackendConfig,
        placement: Placement | None = None,
        *,
        name: str = "worker",
        clock: Clock | None = None,
    ) -> None:
        self.backend = backend
        self.placement = placement or Placement()
        self.name = name
        self._clock = clock or MonotonicClock()
        self.signature: Signature | None = None
        self.busy_s = 0.0
        self.batches = 0
        self.restarts = 0
        self._process: _Process | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._down = "it is not started; await worker.start() first"
        self._stopping = False
        self._lock = asyncio.Lock()
        self._next_batch = 0

    @property
    def pid(self) -> int | None:
        """The process id of the worker's current process, if it has one."""
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Spawn the process and wait until its backend is loaded; raise why if it cannot be
        (the child's ConfigError as is, any other failure as WorkerStartError)."""
        if self._process is not None:
            raise WorkerError(f"worker {self.name!r} is already started; stop it first")
        self._stopping = False
        self._process = await self._spawn()

    async def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch; concurrent calls queue here. Raises WorkerError with the backend's
        error, or WorkerCrashed (after which the worker restarts itself)."""
        async with self._lock:
            if self._restarting is not None:
                await asyncio.wait([self._restarting])  # never raises, never cancels it
            process = self._process
            if process is None:
                raise WorkerError(f"worker {self.name!r} cannot run a batch: {self._down}")
            batch_id, self._next_batch = self._next_batch, self._next_batch + 1
            started = self._clock.now()
            try:
                return await process.run(batch_id, inputs)
            finally:
                self.busy_s += self._clock.now() - started
                self.batches += 1

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the process (a batch in flight fails with WorkerError): ask it to exit,
        terminate it after ``timeout_s``, kill it a second later."""
        self._stopping = True
        self._down = "it was stopped; await worker.start() to run it again"
        if self._restarting is not None and not self._restarting.done():
            self._restarting.cancel()
            await asyncio.wait([self._restarting])
        self._restarting = None
        process, self._process = self._process, None
        if process is not None:
            await process.close(timeout_s)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _spawn(self) -> _Process:
        process = _Process(self.name, self.backend, self.placement, self._on_exit)
        try:
            self.signature = await process.ready
        except BaseException:
            await process.close(timeout_s=1.0)
            raise
        return process

    def _on_exit(self, process: _Process) -> None:
        if process is not self._process or self._stopping:
            return
        self.restarts += 1
        self._restarting = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        self._process = None
        try:
            self._process = await self._spawn()
        except Exception as e:
            self._down = f"its process died and the restart failed: {e}"


class _Process:
    """The parent's handle on one worker process: its pipe, its exit, its batch in flight."""

    def __init__(
        self,
        name: str,
        backend: BackendConfig,
        placement: Placement,
        on_exit: Callable[[_Process], None],
    ) -> None:
        self.name = name
        self._on_exit_callback = on_exit
        self._loop = asyncio.get_running_loop()
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"ridgeline-send-{name}")
        self._process = context.Process(
            target=child_main, args=(child_conn, backend, placement), name=name, daemon=True
        )
        with signals_held():  # a stop mid-start left the child a half-written pipe
            self._process.start()
        child_conn.close()
        self.pid = self._process.pid
        assert self.pid is not None  # started
        self._arena = Arena(self._conn, self.pid)
        self.ready: asyncio.Future[Signature] = self._loop.create_future()
        self.exited: asyncio.Future[int | None] = self._loop.create_future()
        self.ready.add_done_callback(retrieve)
        self._reply: asyncio.Future[dict[str, Array]] | None = None
        self._batch_id = -1
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        self._loop.add_reader(self._process.sentinel, self._on_exit)
        # uvloop's add_reader makes the descriptor non-blocking; Connection.send and recv
        # need it blocking, or a batch bigger than the pipe's buffer fails half-sent
        os.set_blocking(self._conn.fileno(), True)

    async def run(self, batch_id: int, inputs: Mapping[str, Array]) -> dict[str, Array]:
        if self._reply is not None and not self._reply.done():
            await asyncio.wait([self._reply])  # a cancelled caller's batch is still running
        if self.exited.done():
            raise WorkerCrashed(
                f"worker {self.name!r} had died ({exit_text(self.exited.result())}) before "
                "a batch was sent; it is restarting, so retry the batch",
                self.exited.result(),
            )
        self._batch_id = batch_id
        self._reply = reply = self._loop.create_future()
        reply.add_done_callback(retrieve)
        try:
            message = ForkingPickler.dumps((batch_id, self._arena.pack(inputs)))
        except OSError:  # the process is gone (its pipe closed): _on_exit fails the reply
            return await asyncio.shield(reply)
        if len(message) <= _ON_LOOP_BYTES:
            self._send(message)
        else:  # BYTES tensors travel in the message: off the loop (the module's docstring)
            await asyncio.shield(self._loop.run_in_executor(self._sender, self._send, message))
        return await asyncio.shield(reply)

    def _send(self, message: bytes | memoryview) -> None:
        with contextlib.suppress(OSError):  # a dead process (or its closed pipe): _on_exit
            self._conn.send_bytes(message)

    async def close(self, timeout_s: float) -> None:
        """Fail what is pending, ask the process to exit, terminate it after ``timeout_s``,
        kill it a second later."""
        fail(self.ready, self._stopped("it loaded its backend"))
        fail(self._reply, self._stopped("a batch ran"))
        if self.exited.done():
            return
        stop = self._loop.run_in_executor(self._sender, self._send, ForkingPickler.dumps(None))
        await asyncio.wait([stop], timeout=timeout_s)
        await end_process(self._process, self.exited, timeout_s)

    def _stopped(self, during: str) -> WorkerError:
        return WorkerError(
            f"worker {self.name!r} was stopped while {during}; let batches finish before "
            "stop() when their answers matter"
        )

    def _on_readable(self) -> None:
        try:
            message = self._conn.recv()
        except (EOFError, OSError):  # the process is gone; _on_exit says how
            self._loop.remove_reader(self._conn.fileno())
            return
        self._dispatch(message)

    def _dispatch(self, message: Any) -> None:
        match message:
            case ("ready", Signature() as signature):
                resolve(self.ready, signature)
            case ("failed", error):
                fail(self.ready, self._start_error(error))
            case (int() as batch_id, True, outputs) if batch_id == self._batch_id:
                resolve(self._reply, outputs)
            case (int() as batch_id, False, text) if batch_id == self._batch_id:
                problem = f"worker {self.name!r}: its backend failed on a batch: {text}"
                fail(self._reply, WorkerError(problem))

    def _start_error(self, error: Any) -> BaseException:
        if isinstance(error, BaseException):
            error.add_note(f"(raised in worker {self.name!r} while loading its backend)")
            return error
        return WorkerStartError(f"worker {self.name!r} could not load its backend: {error}")

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._process.sentinel)
        with contextlib.suppress(EOFError, OSError):  # answers sent just before it exited
            while self._conn.poll():
                self._dispatch(self._conn.recv())
        self._loop.remove_reader(self._conn.fileno())
        self._conn.close()
        self._arena.close()
        self._sender.shutdown(wait=False)
        self._process.join()  # at once: the sentinel says it has exited
        code = self._process.exitcode
        self._process.close()
        how = exit_text(code)
        fail(
            self.ready,
            WorkerStartError(
                f"worker {self.name!r} exited with {how} while loading its backend; its "
                "stderr (above) says why"
            ),
        )
        if self._reply is not None:
            fail(
                self._reply,
                WorkerCrashed(
                    f"worker {self.name!r} died with a batch in flight: {how}; "
                    "it restarts itself, so the next batch runs on a fresh process",
                    code,
                ),
            )
        resolve(self.exited, code)
        self._on_exit_callback(self)
