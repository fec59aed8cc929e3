"""The SQLite run store: runs, steps, windows, per-request records; WAL; bad locations."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _records import answered
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


def _full(store: RunStore) -> None:
    """The store's disk is full from now on: SQLite's page quota at the pages it has
    gives the error a full disk gives ("database or disk is full")."""
    db = store._db  # the one connection the store writes through
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count={pages}")


def big_records(n: int = 2_000) -> Records:
    return answered(n)


@pytest.mark.parametrize("full_from", ["the step", "the run's creation"])
def test_a_full_disk_keeps_the_step_and_writes_it_when_space_returns(
    tmp_path: Path, full_from: str
) -> None:
    path = tmp_path / "runs.sqlite"
    rec = big_records()
    summary = summarize(rec, 20.0, valid=True, invalid_reason=None)
    with RunStore(path) as store:
        if full_from == "the run's creation":
            _full(store)
        run_id = store.create_run("run", "null://", {"rate": 100})
        _full(store)
        store.add_step(run_id, 0, summary, windows(rec, 20.0), rec)
        store.finish_run(run_id, "complete", None, summary.model_dump())
        told = store.unsaved
    assert told is not None and "database or disk is full" in told
    (journal,) = tmp_path.glob("runs.sqlite.unsaved-*.jsonl")
    assert str(journal) in told and "next time" in told
    with RunStore(path) as store:  # room again (no quota): the journal is replayed
        (run,) = store.list_runs()
        stored = store.get_run(run["id"])
        requests = store.request_count(stored["steps"][0]["id"])
    assert (run["status"], run["steps"]) == ("complete", 1)
    assert stored["steps"][0]["summary"]["ok"] == 2_000 and requests == 2_000
    assert stored["summary"]["sent"] == 2_000
    assert not journal.exists()


def test_a_journal_still_being_written_is_left_to_its_store(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    rec = big_records()
    summary = summarize(rec, 20.0, valid=True, invalid_reason=None)
    with RunStore(path) as writer:
        run_id = writer.create_run("probe", "null://", {})
        _full(writer)
        writer.add_step(run_id, 0, summary, windows(rec, 20.0), rec)
        with RunStore(path) as reader:  # `runs list` while the probe runs
            assert [(r["status"], r["steps"]) for r in reader.list_runs()] == [("running", 0)]
        writer.finish_run(run_id, "complete")
        assert len(list(tmp_path.glob("runs.sqlite.unsaved-*.jsonl"))) == 1  # still its
    with RunStore(path) as reader:  # the writer closed: its journal is the store's now
        assert [(r["status"], r["steps"]) for r in reader.list_runs()] == [("complete", 1)]
    assert list(tmp_path.glob("runs.sqlite.unsaved-*.jsonl")) == []


def _killed_mid_run(path: Path, then: str = "") -> int:
    """A process that opens a run in ``path``, runs ``then`` (``s`` the store, ``run``
    the run's id) and is killed with SIGKILL; the run's id."""
    code = (
        "import os, signal, sys\n"
        "from ridgeline.telemetry.store import RunStore\n"
        f"s = RunStore({str(path)!r})\n"
        "run = s.create_run('probe', 'null://', {})\n"
        "print(run, flush=True)\n"
        f"{then}\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return int(proc.stdout)


def test_a_run_whose_process_was_killed_is_marked_interrupted_on_the_next_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite"
    dead = _killed_mid_run(path)
    with RunStore(path) as mine:
        assert mine.recovered == [dead]
        alive = mine.create_run("run", "null://", {})  # this process's: still running
        with RunStore(path) as store:
            assert store.recovered == []
            runs = {r["id"]: r for r in store.list_runs()}
    assert runs[dead]["status"] == "interrupted"
    assert "ended without finishing" in runs[dead]["status_reason"]
    assert runs[alive]["status"] == "running"


def test_a_store_made_before_runs_recorded_their_process_gains_the_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
        "target TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, status_reason "
        "TEXT, summary TEXT, started_at REAL NOT NULL, finished_at REAL);"
        "INSERT INTO runs (kind, target, config, status, started_at) "
        "VALUES ('run', 'null://', '{}', 'running', 0);"
    )
    old.commit()
    old.close()
    with RunStore(path) as store:
        run_id = store.create_run("run", "null://", {})
        assert store.recovered == []  # no pid recorded: nothing to judge it by
        assert [r["status"] for r in store.list_runs()] == ["running", "running"]
        assert run_id == 2


def test_a_store_made_before_requests_kept_their_tokens_gains_the_columns(
    tmp_path: Path,
) -> None:
    """Its old rows read as no prompt tokens and no gaps; new rows keep both."""
    path = tmp_path / "old.sqlite"
    with RunStore(path) as store:  # the tables, then the requests table as it was
        run_id = store.create_run("run", "null://", {})
    old = sqlite3.connect(path)
    old.executescript(
        "DROP TABLE requests; CREATE TABLE requests (step_id INTEGER NOT NULL, i INTEGER "
        "NOT NULL, scheduled REAL NOT NULL, sent REAL, done REAL, outcome INTEGER NOT NULL, "
        "first_token REAL, output_tokens INTEGER NOT NULL, PRIMARY KEY (step_id, i));"
        "INSERT INTO requests VALUES (7, 0, 0.0, 0.0, 0.01, 0, NULL, 0);"
    )
    old.commit()
    old.close()
    rec = answered(3)
    rec.prompt_tokens[:] = [5, 6, 7]
    with RunStore(path) as store:
        step = store.add_step(
            run_id, 0, summarize(rec, 1.0, valid=True, invalid_reason=None), [], rec
        )
        before, now = store.records(7), store.records(step)
    assert (before.prompt_tokens.tolist(), before.gap_start.tolist()) == ([0], [0, 0])
    assert now.prompt_tokens.tolist() == [5, 6, 7]


def test_a_step_run_on_a_full_disk_is_returned_kept_and_finished_later(tmp_path: Path) -> None:
    from ridgeline.loadgen.schedule import from_arrival
    from ridgeline.loadgen.step import StepConfig, run_step
    from ridgeline.workload.arrivals import parse_arrival

    path = tmp_path / "runs.sqlite"
    schedule = from_arrival(parse_arrival("constant", 500.0), 1.0, seed=0)
    with RunStore(path) as store:
        _full(store)
        result = run_step("null://", schedule, StepConfig(store_requests=True), store=store)
        assert store.unsaved is not None and "unsaved" in store.unsaved
    assert result.summary.ok == 500  # measured and returned, whatever the store did
    with RunStore(path) as store:
        (run,) = store.list_runs()
        stored = store.get_run(run["id"])
    assert (run["status"], run["steps"]) == ("complete", 1)
    assert stored["steps"][0]["summary"]["ok"] == 500


def test_a_journal_left_by_a_killed_process_is_replayed_and_its_run_marked(
    tmp_path: Path,
) -> None:
    """A full disk, then ``kill -9``: the step the journal kept reaches the store, and
    the run its process never finished is marked interrupted."""
    path = tmp_path / "runs.sqlite"
    step = (
        "import numpy as np\n"
        "from ridgeline.telemetry.records import Records\n"
        "from ridgeline.telemetry.summary import summarize\n"
        "rec = Records.empty(np.arange(500) / 100.0)\n"
        "(pages,) = s._db.execute('PRAGMA page_count').fetchone()\n"
        "s._db.execute(f'PRAGMA max_page_count={pages}')\n"
        "summary = summarize(rec, 5.0, valid=True, invalid_reason=None)\n"
        "s.add_step(run, 0, summary, [], rec)\n"
        "assert s.unsaved is not None\n"
    )
    dead = _killed_mid_run(path, step)
    assert len(list(tmp_path.glob("runs.sqlite.unsaved-*.jsonl"))) == 1
    with RunStore(path) as store:
        assert store.recovered == [dead]
        (run,) = store.list_runs()
        requests = store.request_count(store.get_run(dead)["steps"][0]["id"])
    assert (run["status"], run["steps"], requests) == ("interrupted", 1, 500)
    assert list(tmp_path.glob("runs.sqlite.unsaved-*.jsonl")) == []
