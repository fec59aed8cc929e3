"""The whole loop (what `make demo` runs), on a short preset with synthetic variants so it
takes seconds: profile, plan, serve, verify, a demand step up and back down with live
reconfiguration, and the report — opened in headless Chromium when it is installed."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from _timing import watch
from ridgeline.errors import ConfigError
from ridgeline.loop.demo import REPORT, demo_spec, run_demo
from ridgeline.loop.run import LoopConfig, LoopResult
from ridgeline.pipeline.spec import PipelineSpec
from ridgeline.report.loop_html import FIGURES, write_loop_report
from ridgeline.report.terminal import demo_summary
from ridgeline.serve.reconfig import ReconfigConfig
from ridgeline.telemetry.store import RunStore


def synthetic(base_ms: float, per_item_ms: float) -> dict[str, float]:
    return {"base_ms": base_ms, "per_item_ms": per_item_ms}


SPEC = PipelineSpec.model_validate(
    {
        "name": "traffic",
        "slo_ms": 400,
        "accuracy_floor": 0.8,
        "demand_rps": 40,
        "tasks": {
            "detect": {
                "variants": [
                    {"name": "small", "accuracy": 30, "synthetic": synthetic(5, 6)},
                    {"name": "large", "accuracy": 36, "synthetic": synthetic(5, 5)},
                ]
            },
            "car": {"variants": [{"name": "cls", "accuracy": 80, "synthetic": synthetic(2, 1)}]},
        },
        "edges": [{"source": "detect", "target": "car", "factor": 2}],
    }
)
QUICK = LoopConfig(
    batches=(1, 4),
    profile_s=0.5,
    cores=2.0,
    verify_s=2.0,
    verify_search=False,
    phases=((1.0, 3.0), (4.0, 5.0), (1.0, 8.0)),  # the shipped default's trace-shaped phases
    reconfig=ReconfigConfig(window_s=1.5, band=0.3, cooldown_s=2.0, stabilize_s=3.0),
    settle_s=2.5,
)


def test_the_embedded_spec_is_the_example_pipeline() -> None:
    spec = demo_spec()
    assert set(spec.tasks) == {"detect", "car", "face"}
    assert spec.tasks["detect"].variant("yolov5s").accuracy == 37.4


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoopResult, Path, list[str]]:
    out = tmp_path_factory.mktemp("demo")
    text = io.StringIO()
    console = Console(file=text, width=400)
    result = run_demo(out, spec=SPEC, zoo=out / "zoo", cfg=QUICK, say=console.print)
    report = write_loop_report(result, out / REPORT)
    return result, report, [*text.getvalue().splitlines(), *demo_summary(result, report)]


@pytest.mark.slow
def test_the_loop_verifies_reconfigures_live_and_loses_nothing(
    demo: tuple[LoopResult, Path, list[str]],
) -> None:
    result, report, lines = demo
    assert result.verified.passed, result.verified.summary()
    assert result.sent > 0 and result.lost == 0
    # the surge is followed up, and once it is over the plan comes back down; every phase
    # replays the recorded trace's bursts and idle gaps (time-scaled to its rate), so the
    # last one may burst again at its end: "down" is after the peak, not at the very end
    detect = [e.instances["detect"] for e in result.events]
    peak = detect.index(max(detect))
    assert max(detect) >= 2 and min(detect[peak:]) < max(detect), result.events
    assert lines[-6].startswith("plan: ") and lines[-1] == f"report: {report}"
    counts = (
        f"{result.sent} sent: {result.served} served, {result.dropped} dropped (could not "
        f"make the SLO), {result.failed} failed, 0 lost (no answer)"
    )
    assert lines[-3] == f"requests: {counts}"
    m = result.misses  # the phases judged outside their settling seconds, as the verdict says
    assert lines[-2].startswith(f"verdict: {result.verdict}: {m.missed} of {m.judged} requests")
    assert m.judged + m.settling == result.sent and m.judged > 0
    assert result.served + result.dropped + result.failed == result.sent
    page = report.read_text()
    assert all(f'id="{f}"' in page for f in FIGURES)
    assert counts in page


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed")
def test_the_report_renders_in_headless_chromium_without_console_errors(
    demo: tuple[LoopResult, Path, list[str]],
) -> None:
    _, report, _ = demo
    run = subprocess.run(
        [
            "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    for figure in FIGURES:  # every plot drawn: plotly put its SVG inside the div
        found = re.search(rf'<div id="{figure}"[^>]*>(.*?)</div></div></div>', run.stdout, re.S)
        assert found is not None and 'class="main-svg"' in found.group(1), figure


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "how"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_stops_the_demo_cleanly_and_marks_its_run(
    tmp_path: Path, sig: signal.Signals, how: str
) -> None:
    """Ctrl-C, or the SIGTERM `timeout`, systemd and Kubernetes send, in the profiling
    stage. The child starts with SIGINT ignored, as a shell's background job does (and
    as `make test &` ran this test): Python's KeyboardInterrupt never comes then, and
    the demo must stop by its own handler."""
    db = tmp_path / "runs.sqlite"
    cmd = [sys.executable, "-m", "ridgeline", "demo", "--short", "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(
        [*cmd, "--zoo", str(tmp_path / "zoo"), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    stdout, stderr = watch(proc)
    stdout.wait_for("[1/6] profiling", timeout=120)  # in the profiling stage
    proc.send_signal(sig)
    proc.wait(timeout=60)
    out, err = stdout.text(), stderr.text()
    assert proc.returncode == 130, f"the demo did not stop on {how}:\n{out}\n{err}"
    assert "interrupted during [1/6] profiling" in out + err, out + err
    assert "the servers are stopped" in out + err
    with sqlite3.connect(db) as con:
        status, reason = con.execute("SELECT status, status_reason FROM runs").fetchone()
    assert status == "interrupted" and reason.startswith(f"{how} during [1/6] profiling")


def test_a_demo_that_ends_in_an_error_leaves_its_run_failed_not_running(tmp_path: Path) -> None:
    """Issue 33, fault 7: an error (here the zoo's folder is a file) used to leave the
    demo's run ``running``, and the next command to open the store called it killed. It
    is stored failed, naming the stage and the error, and the error still reaches the
    caller."""
    not_a_folder = tmp_path / "zoo"
    not_a_folder.write_text("a file where the zoo's folder should be")
    with RunStore(str(tmp_path / "runs.sqlite")) as store:
        with pytest.raises(ConfigError, match="cannot create the zoo directory"):
            run_demo(tmp_path / "out", zoo=not_a_folder, store=store, say=lambda _: None)
        (run,) = store.list_runs()
    assert run["kind"] == "demo" and run["status"] == "failed"
    assert run["status_reason"].startswith("ConfigError during [1/6] profiling")


def test_a_demo_the_host_cannot_plan_is_inconclusive_not_an_error(tmp_path: Path) -> None:
    """Issue 33, fault 8: on a loaded host the demo's profiles came out slow, the plan
    needed 4 cores of its 3, and the demo ended with exit 2 (an error) at planning. The
    profiles measured here leave no plan: the host's fault, said as INCONCLUSIVE (its
    run stored complete with that verdict), never a bad-input error. Here a demand no
    2-core budget serves stands for the slow host."""
    from ridgeline.errors import HostTooSmall

    huge = SPEC.model_copy(update={"demand_rps": 1e6})
    with RunStore(str(tmp_path / "runs.sqlite")) as store:
        with pytest.raises(HostTooSmall, match=r"leave no plan of 1e\+06 req/s within 2 cores"):
            run_demo(tmp_path / "out", spec=huge, cfg=QUICK, store=store, say=lambda _: None)
        (run,) = store.list_runs()
    assert (run["kind"], run["status"]) == ("demo", "complete")
    assert run["status_reason"].startswith("INCONCLUSIVE during [2/6] planning")
