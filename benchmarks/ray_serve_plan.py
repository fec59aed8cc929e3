"""The example plan on two engines, probed the same way (issue 16). Not a test: run it
on a quiet machine.

`examples/plans/traffic-cpu.yaml` (detector → car and face classifiers, real ONNX models
from the local zoo, built if missing) is served by `ridgeline serve` (the runtime), then
by `ridgeline serve --engine ray` (the plan's Ray Serve export on a local Ray: a
deployment per task batched by `@serve.batch`, the graph composed by deployment
handles), each in its own process, one after the other, never both at once. Each is
probed by the very same `ridgeline probe` command: the plan's SLO ("p99<400ms,errors<1%"),
the adaptive strategy, steps of `STEP_S` seconds (at most `MAX_STEP_S`), a
confirmation of `CONFIRM` requests at the estimate. A row per engine: the capacity, the
p99 of the step that held at it, and the ratio to the runtime's capacity.

What differs is the engine only: the same models, the same batch sizes and queue
delays, the same instances. The Ray engine does no early dropping (a late request runs
to the end), where the runtime drops what cannot meet its deadline, so under overload
the runtime fails fast and Ray answers late: both count against the SLO.

Settings (environment): ``RIDGELINE_BENCH_STEP_S`` (default 10), ``RIDGELINE_BENCH_MAX_STEP_S``
(30), ``RIDGELINE_BENCH_CONFIRM`` (2000 requests), ``RIDGELINE_BENCH_MAX_RATE`` (200
req/s), ``RIDGELINE_BENCH_PRECISION`` (0.05: the relative width of the answer; near
the boundary a probe steps on until it is that sure). Rows go to docs/benchmarks.md
unless ``RIDGELINE_BENCH_NO_WRITE=1``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _doc import add_rows, ensure_section, machine

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "examples" / "plans" / "traffic-cpu.yaml"
SLO = "p99<400ms,errors<1%"
STEP_S = float(os.environ.get("RIDGELINE_BENCH_STEP_S", "10"))
MAX_STEP_S = float(os.environ.get("RIDGELINE_BENCH_MAX_STEP_S", "30"))
CONFIRM = int(os.environ.get("RIDGELINE_BENCH_CONFIRM", "2000"))
MAX_RATE = float(os.environ.get("RIDGELINE_BENCH_MAX_RATE", "200"))
PRECISION = float(os.environ.get("RIDGELINE_BENCH_PRECISION", "0.05"))
HEADING = "## Plans on other engines (issue 16) (`benchmarks/ray_serve_plan.py`)"
INTRO = [
    "Command: `.venv/bin/python benchmarks/ray_serve_plan.py`. The example plan",
    "(`examples/plans/traffic-cpu.yaml`, zoo models) served by `ridgeline serve` and by",
    "`ridgeline serve --engine ray` (its Ray Serve export on a local Ray), each in its own",
    "process, one after the other; both probed by the same `ridgeline probe` command",
    f"(SLO `{SLO}`, the plan's; adaptive; a confirmation at the estimate). The Ray engine",
    "does no early dropping. The ratio is each engine's capacity over the runtime's.",
    "",
    "| date | engine | capacity | p99 at it | ratio | probe | machine |",
    "|---|---|---|---|---|---|---|",
]


def zoo() -> Path:
    from ridgeline.serve.loading import zoo_dir
    from ridgeline.zoo import build_zoo

    where = zoo_dir()
    if not (where / "manifest.json").exists():
        build_zoo(where, ["detector", "classifier", "face"])
    return where


def probe_args() -> list[str]:
    return [
        "--slo", SLO, "--strategy", "adaptive", "--min-rate", "2", "--max-rate", f"{MAX_RATE:g}",
        "--step-duration", f"{STEP_S:g}", "--max-step-s", f"{MAX_STEP_S:g}",
        "--confirm-requests", str(CONFIRM), "--precision", f"{PRECISION:g}",
    ]  # fmt: skip


def served(engine: str, where: Path) -> tuple[subprocess.Popen[str], str]:
    """``ridgeline serve --engine ENGINE`` in its own process, and its pipeline's URL."""
    cmd = [sys.executable, "-m", "ridgeline", "serve", str(PLAN), "--engine", engine]
    cmd += ["--port", "0", "--grpc-port", "0", "--zoo", str(where)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"v2 HTTP (\S+)", line)
        if found:
            return proc, found.group(1)
    raise RuntimeError(f"ridgeline serve --engine {engine} ended before it served")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def probe(url: str, db: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ridgeline", "probe", url, *probe_args(), "--json"]
    done = subprocess.run(
        [*cmd, "--db", str(db)], capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode not in (0, 1, 3):
        raise RuntimeError(f"probe failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def row(day: str, engine: str, result: dict[str, Any], base: float | None) -> str:
    cap = result["capacity_rps"]
    at = result.get("at_capacity") or {}
    p99 = (at.get("e2e_ms") or {}).get("p99")
    held = f"**{cap:.1f} req/s**" if cap is not None else "none held"
    ratio = f"{cap / base:.2f}×" if cap is not None and base else "n/a"
    said = (
        f"{result['steps']} steps, {result['test_seconds']:.0f} s, confirmed "
        f"{result['confirmed']}, valid {result['valid']}"
    )
    p99_text = f"{p99:.1f} ms" if p99 is not None else "n/a"
    return f"| {day} | {engine} | {held} | {p99_text} | {ratio} | {said} | {machine()} |"


def main() -> None:
    # a SIGTERM unwinds like Ctrl-C, so the server process in flight is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    where = zoo()
    day = datetime.now(UTC).date().isoformat()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ridgeline-bench-") as tmp:
        for engine in ("ridgeline", "ray"):
            proc, url = served(engine, where)
            try:
                print(f"probing {engine} at {url}", flush=True)
                results[engine] = probe(url, Path(tmp) / "runs.sqlite")
            finally:
                stop(proc)
    base = results["ridgeline"]["capacity_rps"]
    names = {"ridgeline": "`ridgeline serve`", "ray": "`ridgeline serve --engine ray`"}
    rows = [row(day, names[e], r, base) for e, r in results.items()]
    print("\n".join(INTRO[-2:] + rows))
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
        ensure_section(HEADING, INTRO)
        settings = (
            f"step {STEP_S:g} s (max {MAX_STEP_S:g}), confirm {CONFIRM}, max rate "
            f"{MAX_RATE:g}, precision {PRECISION:g}"
        )
        add_rows(HEADING, f"benchmarks/ray_serve_plan.py, {day}, {settings}", rows)


if __name__ == "__main__":
    main()
