"""The command line, run for real as a subprocess against loopback servers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from _cli import ridgeline
from _timing import wait_until
from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.telemetry.store import RunStore
from ridgeline.workload import bundled_trace_path, read_trace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_json_against_the_fake_server_over_http_and_grpc(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    with running_in_process(load_preset("default")) as srv:
        for url in (srv.model_url, srv.grpc_url):
            assert url is not None
            res = ridgeline(
                "run",
                url,
                "--rate",
                "100",
                "--duration",
                "2",
                "--json",
                "--metrics-url",
                srv.metrics_url,
                db=db,
            )
            # 3: a step this busy host's generator fell behind in, marked INVALID
            assert res.returncode in (0, 3), res.stderr
            out = json.loads(res.stdout)
            assert res.returncode == (0 if out["valid"] else 3)
            keys = {"offered_rps", "achieved_rps", "latency_ms", "error_rate", "lateness_ms"}
            assert keys | {"valid", "invalid_reason", "run_id"} <= set(out)
            assert set(out["latency_ms"]) >= {"p50", "p90", "p99", "max"}
            assert set(out["lateness_ms"]) >= {"p50", "p99"}
            assert out["error_rate"] == 0.0
            assert out["sent"] == out["scheduled"] == out["ok"]
            assert out["offered_rps"] == out["scheduled"] / 2.0
    with RunStore(db) as store:
        runs = store.list_runs()
        assert [r["status"] for r in runs] == ["complete", "complete"]
        windows = store.get_run(runs[0]["id"])["steps"][0]["windows"]
        # server metrics scraped beside the load reached the windows
        assert any(any(k.startswith("nv_inference_count") for k in w["server"]) for w in windows)
    listed = ridgeline("runs", "list", db=db)
    assert listed.returncode == 0 and "complete" in listed.stdout
    shown = ridgeline("runs", "show", str(runs[0]["id"]), db=db)
    assert shown.returncode == 0 and "from schedule" in shown.stdout


def test_a_recorded_trace_replays_time_scaled(tmp_path: Path) -> None:
    res = ridgeline(
        "run",
        "null://",
        "--trace",
        str(bundled_trace_path()),
        "--target-rate",
        "200",
        "--duration",
        "2",
        "--json",
        db=tmp_path / "r.sqlite",
    )
    assert res.returncode in (0, 3), res.stderr  # 3: INVALID, on a host too busy to send
    out = json.loads(res.stdout)
    expected = read_trace(bundled_trace_path()).scaled_to_rate(200.0).window(0.0, 2.0)
    assert out["scheduled"] == len(expected) > 0  # the CLI replays the library's window
    assert out["ok"] == out["scheduled"]


def test_an_unreachable_target_fails_before_the_step(tmp_path: Path) -> None:
    port = free_port()
    t = time.perf_counter()
    res = ridgeline(
        "run",
        f"http://127.0.0.1:{port}/v2/models/m",
        "--rate",
        "10",
        "--duration",
        "1",
        db=tmp_path / "r.sqlite",
    )
    assert res.returncode == 2
    assert f"127.0.0.1:{port}" in res.stderr
    assert time.perf_counter() - t < 20
    with RunStore(tmp_path / "r.sqlite") as store:
        assert store.list_runs() == []


def test_bad_inputs_name_what_was_wrong(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    res = ridgeline("run", "null://", "--rate", "10", "--arrival", "zipf", db=db)
    assert res.returncode == 2
    assert "zipf" in res.stderr and "poisson" in res.stderr and "gamma" in res.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:04.0,x,3\n"
    )
    res = ridgeline("run", "null://", "--trace", str(bad), db=db)
    assert res.returncode == 2
    assert "bad.csv" in res.stderr and "line 3" in res.stderr and "ContextTokens" in res.stderr
    res = ridgeline("run", "ftp://127.0.0.1/x", "--rate", "10", db=db)
    assert res.returncode == 2 and "grpc" in res.stderr


def answered(metrics_url: str) -> float:
    """Requests the fake server has answered, from its Prometheus text."""
    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(r"^nv_inference_request_success\S* (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "how"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_ctrl_c_stores_the_partial_step_marked_interrupted(
    tmp_path: Path, sig: signal.Signals, how: str
) -> None:
    """Ctrl-C, and the SIGTERM `timeout`, systemd and Kubernetes send, alike."""
    db = tmp_path / "r.sqlite"
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ridgeline",
                "run",
                srv.model_url,
                "--rate",
                "50",
                "--duration",
                "30",
                "--json",
                "--db",
                str(db),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        wait_until(  # the step is under way: the server has answered some of it
            lambda: answered(srv.metrics_url) >= 20, 60, "20 answers before Ctrl-C"
        )
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert f"interrupted by {how}" in stderr and "runs show" in stderr
    with RunStore(db) as store:
        (run,) = store.list_runs()
        assert run["status"] == "interrupted"
        step = store.get_run(run["id"])["steps"][0]["summary"]
    assert step["status"] == "interrupted" and not step["valid"]
    assert 0 < step["sent"] < step["scheduled"]
    assert step["ok"] == step["sent"]  # in-flight requests were waited for, not dropped


@pytest.mark.timeout(120)
def test_json_reaches_a_busy_reader_whole_through_a_non_blocking_pipe(tmp_path: Path) -> None:
    """O_NONBLOCK belongs to a pipe's open file, shared by every process holding it: on
    a non-blocking stdout a probe's JSON once reached a reader that was busy as its first
    64 KiB, and the command still exited 0. The reader here starts only once the pipe is
    full (or the command has ended)."""
    import fcntl
    import termios

    r, w = os.pipe()
    os.set_blocking(w, False)
    # vision's JSON is some 79 KB, past a full pipe, for a fifth of nlp's probing time
    args = ["probe", "sim:vision", "--strategy", "binary", "--json", "--db", str(tmp_path / "r.db")]
    with subprocess.Popen([sys.executable, "-m", "ridgeline", *args], stdout=w) as p:
        os.close(w)

        def queued() -> int:
            buf = bytearray(4)
            fcntl.ioctl(r, termios.FIONREAD, buf)
            return int.from_bytes(buf, sys.byteorder)

        wait_until(lambda: queued() >= 65_536 or p.poll() is not None, 100, "a full pipe")
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
        assert p.wait() == 0
    os.close(r)
    out = json.loads(b"".join(chunks))
    assert out["capacity_rps"] > 0 and len(b"".join(chunks)) > 65_536


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_starts_is_one_line_and_exit_130(sig: int) -> None:
    """Issue 33, fault 12: a signal in a command's first moments (its imports) ended it
    with a ``KeyboardInterrupt`` traceback or a silent exit 143. Sent while the CLI's
    imports run: one ``error:`` line, exit 130."""
    # the console command's own first lines (``_entry``), then a word when they have run:
    # the signal lands in the CLI's imports, some 0.4 s
    starts = (
        "import sys, ridgeline._entry as e; e.install(); print('up', flush=True); "
        "sys.argv = ['ridgeline', 'plan', 'examples/specs/traffic-cpu.yaml']; "
        "from ridgeline.cli import main; main()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", starts], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), err
    assert "Traceback" not in err
