"""perf_analyzer (from the tritonclient 2.48 wheel) against a v2 server: made runnable
here, run at one request rate, its CSV read back.

It needs two shared libraries this machine lacks: ``libcudart.so.12`` (from PyPI's
``nvidia-cuda-runtime-cu12``, in the peers' venv; found through LD_LIBRARY_PATH) and
``libb64.so.0d`` (Debian's ``libb64-0d``, installed with apt-get when running as root,
as ``make bench`` installs wrk). Whatever stays missing is reported, not hidden.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from _serve_peers.venv import BenchEnv

DEBIAN = {"libb64.so.0d": "libb64-0d"}


@dataclass(frozen=True)
class PerfAnalyzer:
    exe: Path
    env: dict[str, str]
    version: str


@dataclass(frozen=True)
class PaResult:
    rate: float
    throughput: float
    p50_ms: float
    p99_ms: float


def find_perf_analyzer(bench: BenchEnv) -> PerfAnalyzer | str:
    """perf_analyzer ready to run, or why it cannot run here."""
    if "perf_analyzer" in bench.problems:
        return bench.problems["perf_analyzer"]
    exe = bench.bin("perf_analyzer")
    if not exe.exists():
        return f"the tritonclient wheel installed put no perf_analyzer in {exe.parent}"
    libs = sorted(str(p) for p in bench.root.glob("lib/python*/site-packages/nvidia/*/lib"))
    path = ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]).strip(":")
    env = {**os.environ, "LD_LIBRARY_PATH": path}
    missing = _missing_libs(exe, env)
    wanted = [DEBIAN[lib] for lib in missing if lib in DEBIAN]
    if wanted and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"perf_analyzer needs {', '.join(wanted)}: apt-get install", flush=True)
        apt = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted]
        if subprocess.run(apt, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            subprocess.run(apt, capture_output=True)
        missing = _missing_libs(exe, env)
    if missing:
        hints = [f"{lib} (Debian: {DEBIAN[lib]})" if lib in DEBIAN else lib for lib in missing]
        return f"cannot run here: missing shared libraries {', '.join(hints)}"
    done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env)
    if done.returncode != 0:  # a glibc too old for it says so here
        return f"cannot run here: {(done.stderr.strip() or done.stdout.strip())[-300:]}"
    return PerfAnalyzer(exe, env, (done.stdout + done.stderr).strip())


def _missing_libs(exe: Path, env: dict[str, str]) -> list[str]:
    out = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, env=env).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def run_rate(
    pa: PerfAnalyzer,
    protocol: str,
    port: int,
    model: str,
    rate: float,
    data: Path,
    interval_ms: int,
    out_dir: Path,
) -> PaResult | str:
    """perf_analyzer at ``rate`` requests/s (async, uniform gaps), over ``protocol``,
    sending the input in ``data`` (its JSON input-data file); over HTTP as JSON tensors,
    as ridgeline's v2 HTTP target does. Its result, or why it failed. ``-x 1``: it finds
    no model version of its own otherwise."""
    out = out_dir / f"perf_analyzer_{protocol}.csv"
    cmd = [
        str(pa.exe),
        *("-m", model, "-x", "1", "-u", f"127.0.0.1:{port}", "-i", protocol, "--async"),
        *("--request-rate-range", str(round(rate)), "--measurement-interval", str(interval_ms)),
        *("--input-data", str(data), "--percentile", "99", "-f", str(out)),
    ]
    if protocol == "http":
        cmd += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    print("  $", " ".join(cmd[1:]), flush=True)
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=pa.env, timeout=interval_ms / 1000 * 12 + 60
        )
    except subprocess.TimeoutExpired:
        return "did not finish in time"
    if done.returncode != 0 or not out.exists():
        lines = (done.stdout + done.stderr).strip().splitlines()
        return f"failed (exit {done.returncode}): {lines[-1] if lines else 'no output'}"
    with open(out) as f:
        row = next(csv.DictReader(f))
    return PaResult(
        rate=float(row["Request Rate"]),
        throughput=float(row["Inferences/Second"]),
        p50_ms=float(row["p50 latency"]) / 1000,
        p99_ms=float(row["p99 latency"]) / 1000,
    )
