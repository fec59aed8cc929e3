"""What a run store could not write (a full disk, a read-only file), kept until it can.

A store write that fails is not a measurement lost: the write is appended to a JSON Lines
journal beside the store (``runs.sqlite.unsaved-PID-N.jsonl``), or in the temporary
directory when that cannot be written either, and every later write of the same run
follows it there, in order. The store that writes a journal holds a lock on it until it
closes; the next time the store is opened with room, every journal no one holds is
replayed into it (runs it created get their ids then) and deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Op = dict[str, Any]
"""One write: ``{"op": "create_run" | "add_step" | "finish_run", "run": id, ...}``."""


def _places(store: Path) -> tuple[Path, Path]:
    """Where a store's journals go, as the stem their names start with: beside it, else
    in the temporary directory (named after the store's path: two stores never share)."""
    digest = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:12]
    beside = store.with_name(store.name + ".unsaved")
    return beside, Path(tempfile.gettempdir()) / f"ridgeline-{digest}.unsaved"


class Journal:
    """One store's journal of the writes it could not make, locked while it is open.

    Each line is written unbuffered, whole or not at all as far as the journal knows: a
    write that fails (the disk beside the store filled up after the journal opened
    there) moves the journal to the next place, where that line and every later one
    go; the lines already written stay where they are (a torn last line is skipped on
    replay), and the places are replayed in order. When no place takes a line, it and
    the later ones are kept in ``lost`` (in memory: the caller prints its results)."""

    def __init__(self, store: Path) -> None:
        self._store = store
        self._fd: int | None = None
        self._places = list(_places(store))
        self.path: Path | None = None
        self.lost: list[Op] = []
        """The writes no place could take, in order."""

    def append(self, op: Op) -> Path:
        """Append ``op``; the file it went to. Raises OSError when no place can be
        written (``op`` is then in ``lost``)."""
        line = (json.dumps(op, separators=(",", ":")) + "\n").encode()
        errors: list[OSError] = []
        while not self.lost:
            if self._fd is None:
                try:
                    self._fd, self.path = self._open()
                except OSError as exc:
                    errors.append(exc)
                    break
            try:
                if os.write(self._fd, line) == len(line):
                    assert self.path is not None
                    return self.path
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a short write
            except OSError as exc:
                errors.append(exc)
                self.close()  # this place is full: the next one, from this line on
                self._places = self._places[1:]
        self.lost.append(op)
        raise errors[-1] if errors else OSError(errno.ENOSPC, "no place took an earlier write")

    def _open(self) -> tuple[int, Path]:
        errors: list[OSError] = []
        for stem in self._places:
            path = stem.with_name(f"{stem.name}-{os.getpid()}-{time.time_ns()}.jsonl")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                errors.append(exc)
                self._places = self._places[1:]
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file no one else knows: at once
            return fd, path
        raise errors[-1] if errors else OSError(errno.ENOSPC, "no place left for a journal")

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # and the lock with it
            self._fd = None


def replay(store: Path, apply: Callable[[list[Op]], None]) -> None:
    """Hand each journal of ``store`` that no open store holds to ``apply`` (one
    transaction), then delete it; one ``apply`` fails on is left for the next time.
    Raises what ``apply`` raises."""
    for stem in _places(store):
        for path in sorted(stem.parent.glob(f"{stem.name}-*.jsonl")):
            try:
                f = path.open("r", encoding="utf-8")
            except OSError:
                continue
            with f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # still being written
                ops = [op for line in f.read().splitlines() if (op := _decoded(line))]
                apply(ops)
                path.unlink(missing_ok=True)


def _decoded(line: str) -> Op | None:
    """One journal line; None for a blank one or one torn by the full disk it was
    written on (the writes before it still count)."""
    try:
        op = json.loads(line)
    except ValueError:
        return None
    return op if isinstance(op, dict) else None
