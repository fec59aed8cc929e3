"""What a user sees of a run, run for real as subprocesses against loopback servers: a
signal stops it and keeps what it measured; a process killed outright leaves a run the
next command marks; a wrong model name or path fails at the connect check; the exit
status tells the outcomes apart."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from _cli import RIDGELINE, ridgeline
from _timing import wait_until
from ridgeline.cli._exit import ExitCode, loop_code, verify_code
from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.loadgen.step import StepResult
from ridgeline.loop.run import STEP_DOWN, busiest_window, highest_rate, loop_verdict, phase_misses
from ridgeline.loop.verify import VerifyResult
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import summarize


def started(*args: str, db: Path) -> subprocess.Popen[str]:
    """A command started as a shell's background job is: SIGINT ignored."""
    return subprocess.Popen(
        [*RIDGELINE, *args, "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def steps_stored(db: Path) -> int:
    if not db.exists():
        return 0
    with RunStore(db) as store:
        return sum(r["steps"] for r in store.list_runs())


def probe_under_way(url: str, db: Path) -> subprocess.Popen[str]:
    """``ridgeline probe`` of ``url``, once it has stored a step."""
    args = ("probe", url, "--no-warmup", "--step-duration", "2", "--min-rate", "20", "--json")
    proc = started(*args, db=db)
    try:
        wait_until(lambda: steps_stored(db) >= 1, 90, "a probe step stored")
    except BaseException:  # not left running into the next test (and failing it there)
        proc.kill()
        proc.communicate(timeout=60)
        raise
    return proc


def test_sigterm_stops_a_probe_and_keeps_its_steps(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        proc = probe_under_way(srv.model_url, db)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    result = json.loads(stdout)
    assert result["status"] == "interrupted" and "SIGTERM" in result["reason"]
    with RunStore(db) as store:
        (run,) = store.list_runs()
    assert run["status"] == "interrupted" and run["steps"] >= 1


def test_a_probe_killed_outright_leaves_a_run_the_next_command_marks(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        proc = probe_under_way(srv.model_url, db)
        proc.kill()
        proc.communicate(timeout=60)
    listed = ridgeline("runs", "list", db=db)
    assert listed.returncode == 0, listed.stderr
    assert "marked interrupted" in listed.stderr
    with RunStore(db) as store:
        (run,) = store.list_runs()
    assert run["status"] == "interrupted" and f"pid {proc.pid}" in run["status_reason"]


def test_a_wrong_model_or_path_fails_at_the_connect_check_with_the_servers_word(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.sqlite"
    with running_in_process(load_preset("llm")) as srv:
        assert srv.grpc_url is not None
        root = srv.model_url.split("/v2/")[0]
        cases = {
            "openai --model llama": (
                ["openai+" + srv.openai_url, "--model", "llama"],
                "does not serve model 'llama'",
            ),
            "v2 model": ([f"{root}/v2/models/llama"], "HTTP 404"),
            "v2 path": ([f"{root}/v2/model/fake-llm"], "HTTP 404"),
            "grpc model": ([srv.grpc_url.rsplit("/", 1)[0] + "/llama"], "llama"),
        }
        for name, (target, said) in cases.items():
            t = time.perf_counter()
            res = ridgeline("run", *target, "--rate", "20", "--duration", "30", db=db)
            assert res.returncode == 2, (name, res.stderr)
            assert said in res.stderr, (name, res.stderr)
            assert time.perf_counter() - t < 25, name  # not a 30 s step of errors
    with RunStore(db) as store:
        assert store.list_runs() == []


def test_exit_status_tells_a_pass_a_missed_slo_and_an_invalid_step_apart(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.sqlite"
    passed = ridgeline("probe", "sim:vision", "--strategy", "binary", "--json", db=db)
    assert passed.returncode == 0, passed.stderr
    assert json.loads(passed.stdout)["valid"]
    missed = ridgeline("probe", "sim:nlp", "--slo", "p99<0.01ms", "--json", db=db)
    assert missed.returncode == 1, missed.stderr
    assert json.loads(missed.stdout)["capacity_rps"] is None
    late = ridgeline(
        "run", "null://", "--rate", "200", "--duration", "1", "--lateness-bound-ms", "1e-9",
        "--json", db=db,
    )  # fmt: skip
    assert late.returncode == 3, late.stderr
    assert not json.loads(late.stdout)["valid"]
    good = ridgeline(
        "run", "null://", "--rate", "200", "--duration", "1", "--lateness-bound-ms", "1e4",
        "--json", db=db,
    )  # fmt: skip
    assert good.returncode == 0 and json.loads(good.stdout)["valid"], good.stderr
    bad = ridgeline("run", "null://", "--rate", "10", "--arrival", "zipf", db=db)
    assert bad.returncode == 2


@pytest.mark.parametrize("command", [[], ["run", "--help"], ["probe", "--help"]])
def test_help_documents_the_exit_status(command: list[str], tmp_path: Path) -> None:
    res = subprocess.run(
        [*RIDGELINE, *command, "--help"] if not command else [*RIDGELINE, *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == 0
    assert "Exit status" in res.stdout and "130" in res.stdout


def verified(**changed: object) -> VerifyResult:
    """A verify at 100 req/s under 50 ms that missed it: p99 80 ms from the schedule."""
    base: dict[str, object] = {
        "demand_rps": 100.0,
        "slo_ms": 50.0,
        "sent": 1000,
        "ok": 990,
        "dropped": 6,
        "failed": 4,
        "p99_ms": 80.0,
        "fail_rate": 0.01,
        "passed": False,
    }
    return VerifyResult(**{**base, **changed})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changed", "verdict", "code"),
    [
        ({"passed": True, "p99_ms": 40.0}, "PASS", 0),
        ({}, "FAIL", 1),  # the step measured the server, and it missed
        # the generator fell behind, but the server, timed from each send, missed too
        ({"invalid_reason": "late sends"}, "FAIL", 1),
        # the generator fell behind and the server held the SLO from each send
        ({"invalid_reason": "late sends", "server_missed": False}, "INCONCLUSIVE", 3),
        # the capacity search held 150 req/s after the step missed 100: a busy host
        ({"capacity_rps": 150.0}, "INCONCLUSIVE", 3),
    ],
)
def test_verify_tells_a_missed_slo_from_a_host_too_busy_to_measure(
    changed: dict[str, object], verdict: str, code: int
) -> None:
    result = verified(**changed)
    assert result.verdict == verdict
    assert verify_code(result) == code
    summary = result.summary()
    assert summary.startswith(f"{verdict}: 100 req/s")
    assert "990 answered, 6 dropped, 4 failed or lost of 1000" in summary
    assert ("quieter host" in summary) == (verdict == "INCONCLUSIVE")


def _phase(latency_s: list[float], outcome: list[int], *, valid: bool = True) -> StepResult:
    """A demand phase of one request a second, each answered after ``latency_s``."""
    n = len(latency_s)
    rec = Records.empty(np.arange(n, dtype=np.float64))
    rec.sent = rec.scheduled.copy()
    rec.done = rec.scheduled + np.array(latency_s)
    rec.outcome = np.array(outcome, dtype=np.int8)
    summary = summarize(rec, float(n), valid=valid, invalid_reason=None if valid else "late")
    return StepResult(summary, [], rec, False)


def test_the_demo_judges_its_demand_phases_outside_the_settling_seconds() -> None:
    ok, drop, err = int(Outcome.OK), int(Outcome.DROPPED), int(Outcome.ERROR)
    steady = _phase([0.1] * 10, [ok] * 10)
    # 4x the demand: its first 3 s settle (a drop, a late answer there are not judged);
    # after them one answer at 0.5 s, over the 0.4 s SLO, and one error
    surge = _phase([0.1, 0.9, 0.1, 0.1, 0.5, 0.1, 0.1, 0.1], [drop, ok, ok, ok, ok, err, ok, ok])
    m = phase_misses([(10.0, steady), (40.0, surge)], 10.0, 400.0, 3.0)
    assert (m.judged, m.missed, m.settling, m.invalid) == (15, 2, 3, None)
    # the same demand again: nothing settles, the drop and the late answer count
    assert phase_misses([(10.0, surge)], 10.0, 400.0, 3.0).missed == 4
    assert loop_verdict("PASS", 0, m) == "FAIL"  # 2 of 15 missed, over the 1 %
    assert loop_verdict("PASS", 0, phase_misses([(10.0, steady)], 10.0, 400.0, 3.0)) == "PASS"
    busy = _phase([0.1, 0.9], [ok, ok], valid=False)
    late = phase_misses([(10.0, busy)], 10.0, 400.0, 3.0)
    assert late.invalid is not None and loop_verdict("PASS", 0, late) == "INCONCLUSIVE"
    assert loop_verdict("INCONCLUSIVE", 0, phase_misses([], 10.0, 400.0, 3.0)) == "INCONCLUSIVE"
    # a request lost without an answer fails the demo whatever verify said
    assert loop_verdict("PASS", 1, phase_misses([], 10.0, 400.0, 3.0)) == "FAIL"
    assert loop_code("FAIL") == ExitCode.SLO_MISSED and loop_code("INCONCLUSIVE") == 3


def test_a_run_shows_the_servers_metrics_at_the_terminals_width(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    wide = {**os.environ, "COLUMNS": "120"}
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        args = ["run", srv.model_url, "--rate", "50", "--duration", "2"]
        res = subprocess.run(
            [*RIDGELINE, *args, "--metrics-url", srv.metrics_url, "--db", str(db)],
            capture_output=True, text=True, timeout=60, env=wide,
        )  # fmt: skip
    assert res.returncode in (0, 3), res.stderr
    lines = res.stdout.splitlines()
    counts = next(line for line in lines if line.startswith("offered "))
    assert counts.rstrip().endswith("run 1")  # one line: not wrapped at the table's width
    assert f"server metrics from {srv.metrics_url}" in res.stdout
    assert "nv_inference_count" in res.stdout
    shown = subprocess.run(
        [*RIDGELINE, "runs", "show", "1", "--db", str(db)],
        capture_output=True, text=True, timeout=60, env=wide,
    )  # fmt: skip
    assert any(line.startswith("step 1 — ") for line in shown.stdout.splitlines())
    assert "nv_inference_count" in shown.stdout
    report = tmp_path / "report.html"
    made = ridgeline("report", "1", "--out", str(report), db=db)
    assert made.returncode == 0, made.stderr
    page = report.read_text()
    assert "<h2>Server metrics</h2>" in page and "nv_inference_count" in page


def test_a_probes_live_steps_are_numbered_as_runs_show_and_the_report_number_them(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.sqlite"
    res = ridgeline("probe", "sim:nlp", "--strategy", "binary", "--precision", "0.2", db=db)
    assert res.returncode == 0, res.stderr
    live = sorted({int(n) for n in re.findall(r"^step +(\d+) ", res.stderr, re.M)})
    with RunStore(db) as store:
        (run,) = store.list_runs()
    shown = ridgeline("runs", "show", str(run["id"]), db=db)
    listed = sorted(int(n) for n in re.findall(r"^step (\d+) — ", shown.stdout, re.M))
    report = tmp_path / "report.html"
    assert ridgeline("report", str(run["id"]), "--out", str(report), db=db).returncode == 0
    rows = [int(n) for n in re.findall(r"<tr><td>(\d+)</td>", report.read_text())]
    assert live[0] == 1 and "warmup" in res.stderr  # the warmup steps are steps 1, 2, ...
    assert live == listed == rows == list(range(1, run["steps"] + 1))


def test_sigterm_stops_verify_with_the_interrupted_status(tmp_path: Path) -> None:
    import yaml

    from test_cli import answered

    plan = tmp_path / "plan.yaml"
    synthetic = {"base_ms": 2, "per_item_ms": 1}
    task = {
        "variant": "v",
        "segment": {"kind": "cpu", "cores": 1},
        "batch_size": 4,
        "latency_budget_ms": 400,
        "synthetic": synthetic,
    }
    doc = {"name": "fake", "slo_ms": 400, "demand_rps": 50, "tasks": {"t": task}}
    plan.write_text(yaml.safe_dump(doc))
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        proc = subprocess.Popen(
            [*RIDGELINE, "verify", str(plan), srv.model_url, "--seconds", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until(lambda: answered(srv.metrics_url) >= 20, 60, "verify under way")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "verify interrupted by SIGTERM" in stderr


def test_sigterm_stops_the_fake_server_as_ctrl_c_does() -> None:
    """The servers stop on SIGTERM as on Ctrl-C (``aio.serve_until_signal``), even
    started as a background job is, with SIGINT ignored."""
    proc = subprocess.Popen(
        [*RIDGELINE, "fake-server", "--port", "0", "--grpc-port", "0", "--preset", "fast"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "http://127.0.0.1:" in first, first
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr


def test_the_demos_step_up_keeps_its_busiest_second_within_the_capacity_verify_measured() -> None:
    """Four times 30 req/s with a busiest second of 2.5 times the rate, on a host whose
    verify measured 120: the step goes down by 5 % at a time to the first rate whose
    busiest second asks at most 120 requests (48.0 is the first at or below 120 / 2.5),
    said; measured at 500, or not searched, the step is as asked; never below the demand."""
    said: list[str] = []
    phases = ((1.0, 12.0), (4.0, 18.0), (1.0, 18.0))
    asked_at: list[float] = []

    def busiest(rate: float) -> int:
        asked_at.append(rate)
        return math.ceil(2.5 * rate)

    top = highest_rate(30.0, phases, 120.0, said.append, busiest)
    assert top == pytest.approx(120.0 * STEP_DOWN**18)  # 47.7: 2.5 x 47.7 = 119.2
    assert busiest(top) <= 120 < busiest(top / STEP_DOWN)
    assert said == [
        "      this host served up to 120.0 req/s (verify): the step goes to 47.7 req/s, "
        "not 120, so that its busiest 1 s asks at most 120 requests"
    ]
    assert highest_rate(30.0, phases, 500.0, said.append, busiest) == 120.0
    assert highest_rate(30.0, phases, None, said.append, busiest) == 120.0
    assert highest_rate(30.0, phases, 20.0, said.append, busiest) == 30.0  # never below
    assert len(said) == 2


def test_the_busiest_window_counts_the_most_arrivals_in_any_window() -> None:
    times = [0.0, 0.25, 0.5, 1.6, 1.7, 1.8, 1.9, 3.0]
    assert busiest_window(times, 1.0) == 4  # 1.6-1.9; the first second holds 3
    assert busiest_window(times, 2.0) == 7  # 0.0-1.9
    assert busiest_window([], 1.0) == 0


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["runs", "show", "1"], ["analyze", "1"], ["report", "1"]]
)
def test_a_damaged_store_is_one_line_naming_the_file_and_the_way_out(
    command: list[str], tmp_path: Path
) -> None:
    """Issue 33, fault 10: a store with a damaged page gave a ``DatabaseError``
    traceback on the reading commands. One line names the file, what SQLite said, and
    how to recover what can be read."""
    db = tmp_path / "runs.sqlite"
    made = ridgeline("run", "null://", "--rate", "5", "--duration", "0.2", db=db)
    assert made.returncode in (0, 3), made.stderr  # 3: stored, its generator late (busy host)
    with sqlite3.connect(db) as con:  # every page in the file, none left in the WAL
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")  # the header's page size
    data[page:] = b"\x07" * (len(data) - page)  # every page but the first, the schema's root
    db.write_bytes(bytes(data))
    done = ridgeline(*command, db=db)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: the run store {db} is damaged")
    assert ".recover" in lines[0]


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["runs", "show", "1"], ["analyze", "1"], ["report", "1"]]
)
def test_a_read_only_store_is_read_by_the_reading_commands(
    command: list[str], tmp_path: Path
) -> None:
    """Issue 33, fault 11: a store the user may only read (read-only media, another
    user's folder) could not be read at all: opening it wrote to it first. The reading
    commands now open it read-only. As root a file mode does not stop a write; the
    folder and the file are made immutable (``chattr +i``) instead, where the file
    system and the process allow it."""
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "runs.sqlite"
    made = ridgeline("run", "null://", "--rate", "5", "--duration", "0.2", db=db)
    assert made.returncode in (0, 3), made.stderr  # 3: stored, its generator late (busy host)
    with sqlite3.connect(db) as con:  # every page in the file, the WAL empty
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    for extra in folder.glob("runs.sqlite-*"):
        extra.unlink()
    frozen = subprocess.run(["chattr", "+i", str(db), str(folder)], capture_output=True)
    if frozen.returncode != 0:
        pytest.skip(f"chattr +i is not allowed here: {frozen.stderr.decode().strip()}")
    try:
        assert (
            not os.access(db, os.W_OK)
            or subprocess.run(["sh", "-c", f"echo x >> {db}"], capture_output=True).returncode != 0
        )  # it really cannot be written
        out = tmp_path / "report.html"
        done = ridgeline(*command, *(["--out", str(out)] if command[0] == "report" else []), db=db)
    finally:
        subprocess.run(["chattr", "-i", str(db), str(folder)], check=True)
    if command[0] == "analyze":  # it read run 1, and says why it cannot analyze it
        assert done.stderr.strip() == (
            "error: run 1 (run, complete) has no capacity: give probe runs that found one"
        )
        return
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr
    if command[:2] == ["runs", "list"]:
        assert "null://" in done.stdout


def test_a_run_logged_not_shown_on_a_terminal_says_what_it_sends_when_it_starts(
    tmp_path: Path,
) -> None:
    """Issue 33, fault 25: ``run`` was silent for its whole step (up to a minute) when its
    stderr was a log, not a terminal; it says what it sends once the first request goes."""
    done = ridgeline("run", "null://", "--rate", "20", "--duration", "1", db=tmp_path / "r.db")
    # 3: the step is invalid, its generator fell behind (make test-busy's host, once)
    assert done.returncode in (0, 3), done.stderr
    (line,) = [s for s in done.stderr.splitlines() if s.startswith("run: ")]
    assert re.fullmatch(r"run: sending \d+ requests over 1 s to null://; the table follows", line)
