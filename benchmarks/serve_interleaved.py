"""ridgeline serve and Triton at the same fixed rates, interleaved (A B A B), so a host
whose speed drifts over minutes charges both alike. Not a test:
`.venv/bin/python benchmarks/serve_interleaved.py [--rates 200,240] [--rounds 2]
[--step-s 15] [--peers ridgeline,triton]`.

The servers, model and settings are `benchmarks/serve.py`'s (`_serve_peers/servers.py`):
efficientnet-b0, v2 HTTP/JSON, one worker, batches ≤ 8 within 5 ms. Each round starts
each server afresh, sends a 5 s warm-up at 20/s, then one Poisson step per rate, and
prints the step's p50/p99 (from the schedule), errors, the generator's p99 lateness and
each of the server's processes' CPU (cores, from /proc). Prints only: rows in
docs/benchmarks.md are copied by hand with the command.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from _serve_peers import servers
from _serve_peers.triton_env import ensure_triton_venv
from serve import REPLAY, ROOT, VALIDITY, serving_in

from ridgeline.aio import run_coroutine
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.targets.options import TargetOptions
from ridgeline.workload.arrivals import parse_arrival


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    found = [pid]
    for _ in range(3):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in found:
                try:
                    parent = int(
                        Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]
                    )
                except (OSError, IndexError, ValueError):
                    continue
                if parent in found:
                    found.append(int(entry))
    return found


def _cpu_s(pid: int) -> tuple[str, float]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?", 0.0
    name = stat.split("(", 1)[1].rsplit(")", 1)[0]
    fields = stat.rsplit(")", 1)[1].split()
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _steps(url: str, pid: int, rates: list[float], step_s: float, inputs: tuple) -> Iterator[str]:
    cfg = StepConfig(replay=REPLAY, validity=VALIDITY)
    opts = TargetOptions(inputs=inputs)
    warm = from_arrival(parse_arrival("poisson", 20.0), 5.0)
    run_coroutine(measure_step(url, warm, cfg, target_options=opts))
    for rate in rates:
        procs = _tree(pid)
        before = {p: _cpu_s(p)[1] for p in procs}
        began = time.monotonic()
        schedule = from_arrival(parse_arrival("poisson", rate), step_s)
        s = run_coroutine(measure_step(url, schedule, cfg, target_options=opts)).summary
        wall = time.monotonic() - began
        cpu = " ".join(
            f"{_cpu_s(p)[0][:12]}:{(_cpu_s(p)[1] - before[p]) / wall:.2f}" for p in procs
        )
        yield (
            f"{rate:g}/s: achieved {s.achieved_rps:.1f}, p50 {s.latency_ms.p50:.1f} ms, p99 "
            f"{s.latency_ms.p99:.1f} ms, errors {s.errors}+{s.timeouts} timeouts, lateness p99 "
            f"{s.lateness_ms.p99:.1f} ms; CPU {cpu}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rates", default="200,240", help="comma-separated requests/s")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step-s", type=float, default=15.0)
    p.add_argument("--peers", default="ridgeline,triton", help="of ridgeline,triton")
    args = p.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="rl-interleaved-") as tmp:
        work = Path(tmp)
        serving, inputs = serving_in(work)
        triton = ensure_triton_venv(ROOT / ".triton-venv") if "triton" in args.peers else None
        for round_ in range(1, args.rounds + 1):
            for key in args.peers.split(","):
                server: AbstractContextManager[servers.Endpoint] = (
                    servers.triton(serving, triton)
                    if key == "triton" and triton is not None
                    else servers.ridgeline(serving, "uvloop")
                )
                with server as ep:
                    for line in _steps(ep.model_url, ep.process.pid, rates, args.step_s, inputs):
                        print(f"round {round_} {key} {line}", flush=True)


if __name__ == "__main__":
    main()
