"""The SQLite run store: runs, steps, windows, per-request records; WAL; bad locations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ridgeline.errors import StoreError
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows


def sample_records() -> Records:
    sched = np.arange(20) / 10.0
    rec = Records.empty(sched)
    rec.sent[:18] = sched[:18]
    rec.done[:18] = sched[:18] + 0.01
    rec.outcome[:18] = int(Outcome.OK)
    return rec


def test_a_run_round_trips_with_its_steps_windows_and_requests(tmp_path: Path) -> None:
    rec = sample_records()
    summary = summarize(
        rec, 2.0, valid=False, invalid_reason="interrupted before its end", interrupted=True
    )
    with RunStore(tmp_path / "runs.sqlite") as store:
        run_id = store.create_run("run", "null://", {"rate": 10})
        step_id = store.add_step(run_id, 0, summary, windows(rec, 2.0), rec)
        store.finish_run(run_id, "interrupted", "interrupted before its end")
        assert store.request_count(step_id) == 20
        run = store.get_run(run_id)
        listed = store.list_runs()
    assert run["status"] == "interrupted"
    assert run["config"] == {"rate": 10}
    assert len(run["steps"]) == 1
    step = run["steps"][0]
    assert step["summary"]["not_sent"] == 2
    assert step["summary"]["status"] == "interrupted"
    assert [w["offered"] for w in step["windows"]] == [10, 10]
    assert [(r["id"], r["steps"], r["status"]) for r in listed] == [(run_id, 1, "interrupted")]


def test_the_store_uses_a_wal_journal(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    RunStore(path).close()
    (mode,) = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()
    assert mode == "wal"


def test_unknown_run_and_bad_locations_say_what_to_do(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store, pytest.raises(StoreError, match="runs list"):
        store.get_run(42)
    with pytest.raises(StoreError, match="not supported"):
        RunStore("mysql://somewhere/db")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="--db"):
        RunStore(blocker / "sub" / "runs.sqlite")
