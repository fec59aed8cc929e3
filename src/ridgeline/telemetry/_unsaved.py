"""What a run store could not write (a full disk, a read-only file), kept until it can.

A store write that fails is not a measurement lost: the write is appended to a JSON Lines
journal beside the store (``runs.sqlite.unsaved-PID-N.jsonl``), or in the temporary
directory when that cannot be written either, and every later write of the same run
follows it there, in order. The store that writes a journal holds a lock on it until it
closes; the next time the store is opened with room, every journal no one holds is
replayed into it (runs it created get their ids then) and deleted.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

Op = dict[str, Any]
"""One write: ``{"op": "create_run" | "add_step" | "finish_run", "run": id, ...}``."""


def _places(store: Path) -> tuple[Path, Path]:
    """Where a store's journals go, as the stem their names start with: beside it, else
    in the temporary directory (named after the store's path: two stores never share)."""
    digest = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:12]
    beside = store.with_name(store.name + ".unsaved")
    return beside, Path(tempfile.gettempdir()) / f"ridgeline-{digest}.unsaved"


class Journal:
    """One store's journal of the writes it could not make, locked while it is open."""

    def __init__(self, store: Path) -> None:
        self._store = store
        self._file: IO[str] | None = None
        self.path: Path | None = None

    def append(self, op: Op) -> Path:
        """Append ``op``; the file it went to. Raises OSError when no place can be
        written."""
        line = json.dumps(op, separators=(",", ":")) + "\n"
        if self._file is None:
            self._file, self.path = self._open()
        self._file.write(line)
        self._file.flush()
        assert self.path is not None
        return self.path

    def _open(self) -> tuple[IO[str], Path]:
        errors: list[OSError] = []
        for stem in _places(self._store):
            path = stem.with_name(f"{stem.name}-{os.getpid()}-{time.time_ns()}.jsonl")
            try:
                f = path.open("a", encoding="utf-8")
            except OSError as exc:
                errors.append(exc)
                continue
            fcntl.flock(f, fcntl.LOCK_EX)  # a new file no one else knows: at once
            return f, path
        raise errors[-1]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # and the lock with it
            self._file = None


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
