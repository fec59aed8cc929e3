"""A batch's inputs handed to its worker process through shared memory, not the pipe.

The parent copies a batch's arrays into one shared buffer (``Arena``) and sends only their
layout, a few hundred bytes; the child maps the same buffer (``ArenaView``) and gives the
backend views of it. The buffer is an anonymous memory file (``memfd``; elsewhere an
unlinked file in ``/dev/shm`` or the temporary directory) whose descriptor is passed over
the worker's socket pair, so nothing has a name to leak if a process is killed.

Why: a frame batch is megabytes and the pipe holds 64 KiB. Written from a thread, each of
the write's dozens of chunks had to take the GIL back from an event loop busy parsing
requests: with the default 5 ms switch interval one batch's write took up to a hundred
milliseconds (efficientnet-b0 at 160 req/s on two cores: p99 62-337 ms, where with the
layout alone on the pipe it is the parse time). One batch is in flight per worker, so one
buffer serves it; the parent writes a batch only after the last one's answer came.

Arrays of Python objects (BYTES tensors) cannot live in shared memory: they travel in the
message itself (``inline``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import numpy as np

from ridgeline.v2.tensors import Array

__all__ = ["Arena", "ArenaView", "Grown", "Layout"]

ALIGN = 64
GROW_TO = 1 << 20  # a new buffer is a whole number of MiB


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one input lies in the buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class Layout:
    """A batch's inputs: the arrays in the buffer, and those sent in the message."""

    slots: tuple[Slot, ...]
    inline: dict[str, Array]
    buffer: int = 0
    """Which of the sender's buffers holds them (a sender may keep several in flight)."""


@dataclass(frozen=True, slots=True)
class Grown:
    """The message before a new buffer's descriptor: map ``size`` bytes of it as buffer
    number ``buffer``."""

    size: int
    buffer: int = 0


def _round_up(n: int, unit: int = ALIGN) -> int:
    return -(-n // unit) * unit


def _memory_file(size: int) -> int:
    """A descriptor of ``size`` bytes of anonymous shared memory."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("ridgeline-batch", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryFile(dir=where) as f:
            fd = os.dup(f.fileno())
    os.ftruncate(fd, size)
    return fd


class Arena:
    """The parent's side: ``pack`` copies a batch in and says where each array lies,
    first sending the child a bigger buffer when the batch does not fit."""

    def __init__(self, conn: Connection, child_pid: int, buffer: int = 0) -> None:
        self._conn = conn
        self._pid = child_pid
        self._buffer = buffer
        self._map: mmap.mmap | None = None

    def pack(self, inputs: Mapping[str, Array]) -> Layout:
        shared = {k: a for k, a in inputs.items() if not a.dtype.hasobject}
        offsets, end = {}, 0
        for name, a in shared.items():
            offsets[name] = end
            end = _round_up(end + a.nbytes)
        if end > (0 if self._map is None else len(self._map)):
            self._grow(end)
        slots = []
        for name, a in shared.items():
            if a.nbytes:
                view = np.ndarray(a.shape, a.dtype, buffer=self._map, offset=offsets[name])
                np.copyto(view, a, casting="no")
            slots.append(Slot(name, a.dtype.str, a.shape, offsets[name]))
        inline = {k: a for k, a in inputs.items() if k not in shared}
        return Layout(tuple(slots), inline, self._buffer)

    def _grow(self, needed: int) -> None:
        size = _round_up(max(needed, 2 * len(self._map) if self._map is not None else 0), GROW_TO)
        fd = _memory_file(size)
        try:
            new = mmap.mmap(fd, size)
            self._conn.send(Grown(size, self._buffer))
            send_handle(self._conn, fd, self._pid)
        finally:
            os.close(fd)
        self.close()
        self._map = new

    def close(self) -> None:
        _release(self._map)
        self._map = None


class ArenaView:
    """The child's side: maps each buffer the parent sends, and reads batches from it."""

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}

    def take(self, conn: Connection, grown: Grown) -> None:
        """Map the buffer whose descriptor follows ``grown`` on ``conn``."""
        fd = recv_handle(conn)
        try:
            new = mmap.mmap(fd, grown.size)
        finally:
            os.close(fd)
        _release(self._maps.get(grown.buffer))
        self._maps[grown.buffer] = new

    def receive(self, conn: Connection) -> Any:
        """The next message that is not a new buffer (those it maps); None when the
        parent says stop (None) or is gone."""
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the parent is gone
                return None
            if not isinstance(message, Grown):
                return message
            self.take(conn, message)  # a bigger buffer: its descriptor comes next

    def unpack(self, layout: Layout) -> dict[str, Array]:
        """The batch's inputs (views of the buffer: valid until the answer is sent)."""
        mapped = self._maps.get(layout.buffer)
        arrays = {
            s.name: np.ndarray(s.shape, np.dtype(s.dtype), buffer=mapped, offset=s.offset)
            for s in layout.slots
        }
        return arrays | layout.inline

    def close(self) -> None:
        for mapped in self._maps.values():
            _release(mapped)
        self._maps.clear()


def _release(buffer: mmap.mmap | None) -> None:
    """Unmap ``buffer`` now, or when the last array viewing it goes (a backend that kept
    one)."""
    if buffer is not None:
        with contextlib.suppress(BufferError):
            buffer.close()
