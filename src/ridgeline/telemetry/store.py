"""The run store: runs, steps, windows and (when asked) per-request records.

SQLite by default: one file, WAL journal, safe to read while a run writes. Everything
is written as it happens, so a run that is interrupted or whose server dies leaves its
partial results stored and marked.

Nothing measured is lost to the store: a write that fails (a full disk) goes to a
journal beside it (``_unsaved``), replayed the next time the store is opened with room
(``unsaved`` says where, for the command to tell). Each run records the process that
owns it (pid and host); a run left ``running`` by a process that no longer exists (one
killed with ``kill -9``, a machine that stopped) is marked ``interrupted`` the next time
the store is opened on that host.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import StoreError
from ridgeline.telemetry import _unsaved
from ridgeline.telemetry._sqlite import Connected, default_store_path, open_db, transaction
from ridgeline.telemetry.records import Records, gaps_from
from ridgeline.telemetry.summary import StepSummary
from ridgeline.telemetry.windows import Window

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,              -- running | complete | interrupted | failed
    status_reason TEXT,
    summary TEXT,
    started_at REAL NOT NULL,
    finished_at REAL,
    pid INTEGER,                       -- the process that owns a running run
    host TEXT
);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    idx INTEGER NOT NULL,
    offered_rps REAL NOT NULL,
    achieved_rps REAL NOT NULL,
    valid INTEGER NOT NULL,
    invalid_reason TEXT,
    status TEXT NOT NULL,
    summary TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS windows (
    step_id INTEGER NOT NULL REFERENCES steps(id),
    idx INTEGER NOT NULL,
    start_s REAL NOT NULL,
    end_s REAL NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (step_id, idx)
);
CREATE TABLE IF NOT EXISTS requests (
    step_id INTEGER NOT NULL REFERENCES steps(id),
    i INTEGER NOT NULL,
    scheduled REAL NOT NULL,
    sent REAL,
    done REAL,
    outcome INTEGER NOT NULL,
    first_token REAL,
    output_tokens INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    gaps BLOB,                         -- float32 LE seconds between content chunks
    PRIMARY KEY (step_id, i)
);
"""
_REQUEST_COLUMNS = (
    "step_id, i, scheduled, sent, done, outcome, first_token, output_tokens, prompt_tokens, gaps"
)
_GAPS = np.dtype("<f4")


def _nullable(a: NDArray[np.float64]) -> list[float | None]:
    return [None if not np.isfinite(x) else float(x) for x in a.tolist()]


def _request_rows(records: Records) -> list[list[Any]]:
    """Per-request rows, as the ``requests`` table holds them (less step and index), as
    the journal can hold them too: the gaps as base64 text (``_gaps_blob`` stores it)."""
    gaps = [
        base64.b64encode(records.gaps_of(i).astype(_GAPS).tobytes()).decode("ascii") if n else None
        for i, n in enumerate(records.gap_counts().tolist())
    ]
    return [
        list(row)
        for row in zip(
            records.scheduled.tolist(),
            _nullable(records.sent),
            _nullable(records.done),
            records.outcome.tolist(),
            _nullable(records.first_token),
            records.output_tokens.tolist(),
            records.prompt_tokens.tolist(),
            gaps,
            strict=True,
        )
    ]


def _stored_row(step_id: int, i: int, row: list[Any]) -> tuple[Any, ...]:
    """A journaled row as the table takes it; a journal written before the token columns
    holds six values."""
    scheduled, sent, done, outcome, first, output, prompt, gaps = [*row, 0, None][:8]
    blob = None if gaps is None else base64.b64decode(gaps)
    return (step_id, i, scheduled, sent, done, outcome, first, output, prompt, blob)


def _add_columns(db: sqlite3.Connection) -> None:
    """A store made before runs recorded their process, or requests their prompt tokens
    and gaps, gets the columns."""
    for table, columns in (
        ("runs", (("pid", "INTEGER"), ("host", "TEXT"))),
        ("requests", (("prompt_tokens", "INTEGER NOT NULL DEFAULT 0"), ("gaps", "BLOB"))),
    ):
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})").fetchall()}
        for column, kind in columns:
            if column not in have:
                try:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc):  # another process added it first
                        raise


HOST = socket.gethostname()
"""The host a run's pid belongs to: a pid is only checked on its own host."""

_STEP = (
    "INSERT INTO steps (run_id, idx, offered_rps, achieved_rps, valid, invalid_reason,"
    " status, summary, created_at) VALUES (?,?,?,?,?,?,?,?,?)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _full(path: Path, exc: BaseException) -> str:
    """``exc`` in words, saying so when the disk that holds ``path`` is full (SQLite
    says "disk I/O error" for a write that found no room)."""
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    except OSError:
        return str(exc)
    return f"the disk is full ({free:,} bytes free; SQLite: {exc})" if free < FULL else str(exc)


FULL = 1 << 20
"""A disk with less free than this (1 MiB) is called full: a store's page and its WAL
frames need some room, and a write that failed with less is for want of it."""


MAX_RUN_ID = 2**63 - 1
"""The largest id SQLite can hold (a signed 64-bit integer)."""


class RunStore(Connected):
    def __init__(self, location: str | Path | None = None, *, readonly: bool = False) -> None:
        """The store at ``location`` (``default_store_path`` when None). ``readonly``:
        opened only to read (a store on read-only media, or in another user's folder):
        nothing replayed, nothing marked, and a write fails."""
        text = str(location) if location is not None else str(default_store_path())
        if "://" in text and not text.startswith("sqlite:///"):
            scheme = text.split("://", 1)[0]
            raise StoreError(
                f"run store URL scheme {scheme!r} is not supported in this version; "
                "give a file path or sqlite:///PATH"
            )
        path = Path(text.removeprefix("sqlite:///")) if text.startswith("sqlite:") else Path(text)
        self.path = path
        self.readonly = readonly
        try:
            if readonly:
                self._db = open_db(path, SCHEMA, readonly=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._db = open_db(path, SCHEMA)
                _add_columns(self._db)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the run store at {path}: {_full(path, exc)}; free some space, "
                "or pass --db with a writable path"
            ) from exc
        self.unsaved: str | None = None
        """What this store could not write and where it went instead, as a sentence for
        the user; None while every write reached the store."""
        self._deferred: set[int] = set()
        self._placeholders = 0
        self._journal = _unsaved.Journal(path)
        self.recovered: list[int] = []
        """Runs found ``running`` whose process had ended, marked ``interrupted`` now."""
        if readonly:
            return
        with contextlib.suppress(sqlite3.Error):  # still no room: it waits for the next time
            _unsaved.replay(path, self._apply)
        self.recovered = self._mark_stale()

    def close(self) -> None:
        self._journal.close()
        try:
            super().close()
        except sqlite3.Error as exc:  # what was committed is in the file (or its WAL)
            self.unsaved = self.unsaved or f"the run store {self.path} did not close: {exc}"

    def create_run(self, kind: str, target: str, config: dict[str, Any]) -> int:
        op = {
            "op": "create_run",
            "kind": kind,
            "target": target,
            "config": json.dumps(config, default=str),
            "started_at": time.time(),
            "pid": os.getpid(),
            "host": HOST,
        }
        try:
            return self._create(op)
        except sqlite3.Error as exc:
            self._placeholders += 1
            run_id = -self._placeholders  # its id comes when the journal is replayed
            self._defer({**op, "run": run_id}, exc)
            return run_id

    def finish_run(
        self,
        run_id: int,
        status: str,
        reason: str | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        op = {
            "op": "finish_run",
            "run": run_id,
            "status": status,
            "reason": reason,
            "summary": json.dumps(summary) if summary is not None else None,
            "finished_at": time.time(),
        }
        self._write(op)

    def add_step(
        self,
        run_id: int,
        index: int,
        summary: StepSummary,
        windows: list[Window],
        records: Records | None = None,
    ) -> int:
        """The step's id in the store (0 when it went to the journal instead)."""
        op = {
            "op": "add_step",
            "run": run_id,
            "step": [
                index,
                summary.offered_rps,
                summary.achieved_rps,
                int(summary.valid),
                summary.invalid_reason,
                summary.status,
                summary.model_dump_json(),
                time.time(),
            ],
            "windows": [[w.index, w.start_s, w.end_s, w.model_dump_json()] for w in windows],
            "requests": None if records is None else _request_rows(records),
        }
        return self._write(op)

    def _write(self, op: _unsaved.Op) -> int:
        """Apply one write, or journal it when the store cannot take it (or already
        journaled an earlier write of the same run: the order is kept)."""
        if op["run"] not in self._deferred:
            try:
                with transaction(self._db):
                    return self._apply_one(op, {})
            except sqlite3.Error as exc:
                self._defer(op, exc)
                return 0
        self._defer(op, None)
        return 0

    def _defer(self, op: _unsaved.Op, exc: sqlite3.Error | None) -> None:
        self._deferred.add(int(op["run"]))
        try:
            journal = self._journal.append(op)
        except OSError as lost:
            self.unsaved = (
                f"the run store {self.path} could not be written "
                f"({_full(self.path, exc) if exc else 'see above'}), nor could its journal, "
                f"beside it or in {tempfile.gettempdir()} ({lost}): the results printed here "
                "are the only copy; free some space, or pass --db with another path"
            )
            return
        if exc is not None or self.unsaved is None:
            self.unsaved = (
                f"the run store {self.path} could not be written "
                f"({_full(self.path, exc) if exc else 'see above'}); "
                f"the results are kept in {journal} and are written to the store the next "
                "time ridgeline opens it with room (free some space, or pass --db with "
                "another path)"
            )

    def _create(self, op: _unsaved.Op) -> int:
        cur = self._db.execute(
            "INSERT INTO runs (kind, target, config, status, started_at, pid, host)"
            " VALUES (?,?,?,?,?,?,?)",
            (
                op["kind"],
                op["target"],
                op["config"],
                "running",
                op["started_at"],
                op["pid"],
                op["host"],
            ),
        )
        return int(cur.lastrowid or 0)

    def _apply_one(self, op: _unsaved.Op, ids: dict[int, int]) -> int:
        """One write, inside a transaction; ``ids`` maps a journaled run's placeholder id
        to the id the store gave it."""
        kind = op["op"]
        if kind == "create_run":
            ids[int(op["run"])] = self._create(op)
            return ids[int(op["run"])]
        run_id = ids.get(int(op["run"]), int(op["run"]))
        if kind == "finish_run":
            self._db.execute(
                "UPDATE runs SET status=?, status_reason=?, summary=?, finished_at=? WHERE id=?",
                (op["status"], op["reason"], op["summary"], op["finished_at"], run_id),
            )
            return run_id
        cur = self._db.execute(_STEP, (run_id, *op["step"]))
        step_id = int(cur.lastrowid or 0)
        self._db.executemany(
            "INSERT INTO windows (step_id, idx, start_s, end_s, data) VALUES (?,?,?,?,?)",
            [(step_id, *w) for w in op["windows"]],
        )
        if op["requests"] is not None:
            self._db.executemany(
                f"INSERT INTO requests ({_REQUEST_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [_stored_row(step_id, i, row) for i, row in enumerate(op["requests"])],
            )
        return step_id

    def _apply(self, ops: list[_unsaved.Op]) -> None:
        """A journal replayed, in one transaction: all of it reaches the store, or none."""
        ids: dict[int, int] = {}
        with transaction(self._db, "IMMEDIATE"):
            for op in ops:
                self._apply_one(op, ids)

    def _mark_stale(self) -> list[int]:
        try:
            rows = self._db.execute(
                "SELECT id, pid FROM runs WHERE status='running' AND host=? AND pid IS NOT NULL",
                (HOST,),
            ).fetchall()
            stale = [(int(i), int(pid)) for i, pid in rows if not _alive(int(pid))]
            for run_id, pid in stale:
                self._db.execute(
                    "UPDATE runs SET status='interrupted', status_reason=?, finished_at=?"
                    " WHERE id=? AND status='running'",
                    (
                        f"its process (pid {pid} on {HOST}) ended without finishing it "
                        "(killed, or the machine stopped); what it measured is kept",
                        time.time(),
                        run_id,
                    ),
                )
        except sqlite3.Error:
            return []  # read-only or full: the runs stay as they are until the next open
        return [run_id for run_id, _ in stale]

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT r.id, r.kind, r.target, r.status, r.status_reason, r.started_at,"
            " r.finished_at, COUNT(s.id) FROM runs r LEFT JOIN steps s ON s.run_id = r.id"
            " GROUP BY r.id ORDER BY r.id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        keys = (
            "id",
            "kind",
            "target",
            "status",
            "status_reason",
            "started_at",
            "finished_at",
            "steps",
        )
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def get_run(self, run_id: int) -> dict[str, Any]:
        if not 0 < run_id <= MAX_RUN_ID:  # SQLite's integers: 2^70 is no run, not a crash
            raise StoreError(
                f"no run {run_id} in {self.path}: run ids are 1 to {MAX_RUN_ID}; "
                "`ridgeline runs list` shows them"
            )
        row = self._db.execute(
            "SELECT id, kind, target, config, status, status_reason, summary, started_at,"
            " finished_at FROM runs WHERE id=?",
            (run_id,),
        ).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.path}; `ridgeline runs list` shows them")
        keys = (
            "id",
            "kind",
            "target",
            "config",
            "status",
            "status_reason",
            "summary",
            "started_at",
            "finished_at",
        )
        run = dict(zip(keys, row, strict=True))
        run["config"] = json.loads(run["config"])
        run["summary"] = json.loads(run["summary"]) if run["summary"] else None
        steps = []
        for sid, idx, summary in self._db.execute(
            "SELECT id, idx, summary FROM steps WHERE run_id=? ORDER BY idx", (run_id,)
        ).fetchall():
            wins = [
                json.loads(d)
                for (d,) in self._db.execute(
                    "SELECT data FROM windows WHERE step_id=? ORDER BY idx", (sid,)
                ).fetchall()
            ]
            steps.append({"id": sid, "index": idx, "summary": json.loads(summary), "windows": wins})
        run["steps"] = steps
        return run

    def records(self, step_id: int) -> Records:
        """The requests stored for step ``step_id`` (``--store-requests``), as records:
        gaps as stored (float32); error reasons and generator counts are not kept."""
        rows = self._db.execute(
            "SELECT scheduled, sent, done, outcome, first_token, output_tokens,"
            " prompt_tokens, gaps FROM requests WHERE step_id=? ORDER BY i",
            (step_id,),
        ).fetchall()

        def column(k: int, dtype: Any) -> Any:
            return np.array([np.nan if r[k] is None else r[k] for r in rows], dtype=dtype)

        gaps, start = gaps_from([np.frombuffer(r[7] or b"", dtype=_GAPS) for r in rows])
        return Records(
            scheduled=column(0, np.float64),
            sent=column(1, np.float64),
            done=column(2, np.float64),
            outcome=column(3, np.int8),
            first_token=column(4, np.float64),
            output_tokens=column(5, np.int32),
            errors={},
            prompt_tokens=column(6, np.int32),
            gaps=gaps,
            gap_start=start,
        )

    def request_count(self, step_id: int) -> int:
        (n,) = self._db.execute(
            "SELECT COUNT(*) FROM requests WHERE step_id=?", (step_id,)
        ).fetchone()
        return int(n)
