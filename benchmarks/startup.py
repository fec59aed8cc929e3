"""Start-up cost: `ridgeline --help` wall and CPU time, and what `import ridgeline` loads.

Measures this tree and an earlier revision (default: bfefd01, before the renovation of
issue 11) in the same run, alternating, so the machine's load hits both alike. The earlier
revision is checked out into a temporary git worktree and run from its `src/` with this
venv's Python (same interpreter, same packages).

    .venv/bin/python benchmarks/startup.py [--before REV] [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _doc import add_rows, ensure_section

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("grpc", "aiohttp", "highspy", "onnxruntime", "numpy", "onnx")
HEADING = "## Start-up (`benchmarks/startup.py`)"
INTRO = [
    "Command: `.venv/bin/python benchmarks/startup.py` (also in `make bench`). Wall time of",
    "`python -m ridgeline --help` for this tree and for an earlier revision (checked out in a",
    "temporary worktree, same interpreter and packages), alternating, median of 5 each, and",
    "its CPU time (user + system of the child; from 2026-12-05 on); and the modules",
    "`import ridgeline` loads (heavy ones: grpc, aiohttp, highspy, onnxruntime; numpy and",
    "onnx from 2026-12-05 on).",
    "",
    "| date | revision | `--help` median (runs): wall; CPU | `import ridgeline`: own modules, "
    "heavy ones |",
    "|---|---|---|---|",
]


def _help_seconds(src: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one `ridgeline --help` run from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ridgeline", "--help"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0, _children_cpu() - cpu0


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _import_census(src: Path) -> tuple[int, int, list[str]]:
    # the census of loaded modules comes before walk_packages, which imports subpackages
    code = (
        "import sys, ridgeline, pkgutil\n"
        "own = [m for m in sys.modules if m == 'ridgeline' or m.startswith('ridgeline.')]\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "every = [m.name for m in pkgutil.walk_packages(ridgeline.__path__, 'ridgeline.')]\n"
        "print(len(own), len(every) + 1, ','.join(heavy))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    heavy = out[2].split(",") if len(out) > 2 else []
    return int(out[0]), int(out[1]), heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="bfefd01", help="the earlier revision")
    parser.add_argument("--runs", type=int, default=5, help="runs of each (median)")
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args()
    after_rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    after_label = after_rev + (" + uncommitted" if dirty else "")
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(wt), args.before], cwd=ROOT, check=True
        )
        try:
            trees = {args.before: wt / "src", after_label: ROOT / "src"}
            for src in trees.values():  # warm the file cache and .pyc files once, untimed
                _help_seconds(src)
            times: dict[str, list[float]] = {label: [] for label in trees}
            cpu: dict[str, list[float]] = {label: [] for label in trees}
            for _ in range(args.runs):
                for label, src in trees.items():
                    wall, used = _help_seconds(src)
                    times[label].append(wall)
                    cpu[label].append(used)
            census = {label: _import_census(src) for label, src in trees.items()}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT, check=False)
    today = dt.date.today().isoformat()
    rows = []
    for label in trees:
        med = statistics.median(times[label])
        runs = ", ".join(f"{t:.2f}" for t in times[label])
        cpu_runs = ", ".join(f"{t:.2f}" for t in cpu[label])
        own, total, heavy = census[label]
        rows.append(
            f"| {today} | `{label}` | {med:.2f} s ({runs}); CPU "
            f"{statistics.median(cpu[label]):.2f} s ({cpu_runs}) | {own} of {total} modules; "
            f"heavy: {', '.join(heavy) or 'none'} |"
        )
    before_med = statistics.median(times[args.before])
    after_med = statistics.median(times[after_label])
    print("\n".join(rows))
    print(f"after / before: {after_med / before_med:.2f}")
    if not args.no_doc:
        ensure_section(HEADING, INTRO)
        machine = f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}"
        add_rows(
            HEADING,
            f"benchmarks/startup.py, {today}, {machine}, Python {platform.python_version()}, "
            f"after/before {after_med / before_med:.2f}",
            rows,
        )


if __name__ == "__main__":
    main()
