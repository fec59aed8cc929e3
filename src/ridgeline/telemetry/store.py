"""The run store: runs, steps, windows and (when asked) per-request records.

SQLite by default: one file, WAL journal, safe to read while a run writes. Everything
is written as it happens, so a run that is interrupted or whose server dies leaves its
partial results stored and marked.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import StoreError
from ridgeline.telemetry._sqlite import Connected, open_db, transaction
from ridgeline.telemetry.records import Records
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
    finished_at REAL
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
    PRIMARY KEY (step_id, i)
);
"""


def default_store_path() -> Path:
    """``$RIDGELINE_DB``, else ``$XDG_DATA_HOME/ridgeline/runs.sqlite`` (~/.local/share)."""
    env = os.environ.get("RIDGELINE_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ridgeline" / "runs.sqlite"


def _nullable(a: NDArray[np.float64]) -> list[float | None]:
    return [None if not np.isfinite(x) else float(x) for x in a.tolist()]


class RunStore(Connected):
    def __init__(self, location: str | Path | None = None) -> None:
        text = str(location) if location is not None else str(default_store_path())
        if "://" in text and not text.startswith("sqlite:///"):
            scheme = text.split("://", 1)[0]
            raise StoreError(
                f"run store URL scheme {scheme!r} is not supported in this version; "
                "give a file path or sqlite:///PATH"
            )
        path = Path(text.removeprefix("sqlite:///")) if text.startswith("sqlite:") else Path(text)
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = open_db(path, SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the run store at {path}: {exc}; pass --db with a writable path"
            ) from exc

    def create_run(self, kind: str, target: str, config: dict[str, Any]) -> int:
        cur = self._db.execute(
            "INSERT INTO runs (kind, target, config, status, started_at) VALUES (?,?,?,?,?)",
            (kind, target, json.dumps(config, default=str), "running", time.time()),
        )
        return int(cur.lastrowid or 0)

    def finish_run(
        self,
        run_id: int,
        status: str,
        reason: str | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        self._db.execute(
            "UPDATE runs SET status=?, status_reason=?, summary=?, finished_at=? WHERE id=?",
            (
                status,
                reason,
                json.dumps(summary) if summary is not None else None,
                time.time(),
                run_id,
            ),
        )

    def add_step(
        self,
        run_id: int,
        index: int,
        summary: StepSummary,
        windows: list[Window],
        records: Records | None = None,
    ) -> int:
        with transaction(self._db):
            cur = self._db.execute(
                "INSERT INTO steps (run_id, idx, offered_rps, achieved_rps, valid, invalid_reason,"
                " status, summary, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    index,
                    summary.offered_rps,
                    summary.achieved_rps,
                    int(summary.valid),
                    summary.invalid_reason,
                    summary.status,
                    summary.model_dump_json(),
                    time.time(),
                ),
            )
            step_id = int(cur.lastrowid or 0)
            self._db.executemany(
                "INSERT INTO windows (step_id, idx, start_s, end_s, data) VALUES (?,?,?,?,?)",
                [(step_id, w.index, w.start_s, w.end_s, w.model_dump_json()) for w in windows],
            )
            if records is not None:
                self._db.executemany(
                    "INSERT INTO requests VALUES (?,?,?,?,?,?,?,?)",
                    zip(
                        [step_id] * len(records),
                        range(len(records)),
                        records.scheduled.tolist(),
                        _nullable(records.sent),
                        _nullable(records.done),
                        records.outcome.tolist(),
                        _nullable(records.first_token),
                        records.output_tokens.tolist(),
                        strict=True,
                    ),
                )
        return step_id

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

    def request_count(self, step_id: int) -> int:
        (n,) = self._db.execute(
            "SELECT COUNT(*) FROM requests WHERE step_id=?", (step_id,)
        ).fetchone()
        return int(n)
