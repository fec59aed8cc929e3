"""Capacity under token-level SLOs against the long-run truth (issue 15). Not a test:
`make bench`.

*Virtual time* (every case, seconds each): `ridgeline probe sim:…` with the CLI's
defaults (adaptive search, confirmation on), seeds 1-3, against `study.truth`'s long-run
truth of the same simulated server: the highest constant rate whose Poisson runs
(2 seeds × 300 s or 20,000 requests) meet the SLO judged plainly over every request and
every gap, bisected to 0.5 %. The dev case is the `llm` preset with its own SLO (what the
preset and the probe's LLM defaults were looked at on); the held-out cases change the KV
cache, the lengths, the SLO's terms and the hardware speed, and were not looked at
before this benchmark ran.

*Loopback* (`--loopback`, minutes): `ridgeline fake-server` with the same engine in a
process of its own, `ridgeline probe openai+http://…` with the CLI's defaults, then the
truth's bracket measured on the same server: long constant-rate runs (`LONG_S` each,
the benchmark process as the load generator) at 0.95× and 1.05× the estimate, judged
plainly as above. The estimate is within 5 % of the loopback truth when the lower run
holds and the upper one breaks; each run's verdict and the bound it broke are recorded.
Two KV cache sizes: the knee must move with them.

Rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from _doc import add_rows, ensure_section, machine

from ridgeline.aio import run_coroutine
from ridgeline.health import parse_slo
from ridgeline.loadgen.schedule import Schedule, from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.probe.api import run_probe
from ridgeline.probe.drivers import SimDriver
from ridgeline.probe.orchestrator import ProbeConfig
from ridgeline.sim import SimPreset, load_sim_preset
from ridgeline.study.truth import TruthConfig, broken_records, true_capacity
from ridgeline.targets.options import TargetOptions
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.payloads import RequestShape

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HEADING = "## Token-level capacity against the long-run truth (issue 15)"
SEEDS = (1, 2, 3)
TRUTH = TruthConfig(requests=20_000, seeds=2, run_s=300.0)
CLI_OPTIONS = {"min_rate": 1.0, "step_duration_s": 10.0, "precision": 0.02}
"""What `ridgeline probe` passes the strategy when given no options."""
LONG_S = float(os.environ.get("RIDGELINE_BENCH_LLM_LONG_S", "150"))


@dataclass(frozen=True)
class Case:
    name: str
    split: str
    preset: SimPreset
    slo: str


def _llm(preset: SimPreset, **engine: Any) -> SimPreset:
    assert preset.model.llm is not None
    llm = preset.model.llm.model_copy(update=engine)
    return preset.model_copy(update={"model": preset.model.model_copy(update={"llm": llm})})


def cases() -> list[Case]:
    base = load_sim_preset("llm")
    slo = base.slo
    lengths = SimPreset.model_validate(
        {
            **base.model_dump(),
            "prompt_tokens": {"kind": "lognormal", "mean": 256, "cv": 0.8, "low": 16, "high": 2048},
            "output_tokens": {"kind": "uniform", "low": 16, "high": 128},
        }
    )
    return [
        Case("llm (its own SLO)", "dev", base, slo),
        Case("KV cache 8192", "held-out", _llm(base, kv_cache_tokens=8192), slo),
        Case("KV cache 32768", "held-out", _llm(base, kv_cache_tokens=32768), slo),
        Case("lognormal prompts, uniform outputs", "held-out", lengths, slo),
        Case("TTFT + TPOT SLO", "held-out", base, "ttft_p99<200ms,tpot_p99<40ms,errors<0.1%"),
        Case("TTFT p95 + ITL p99.9", "held-out", base, "ttft_p95<250ms,itl_p99.9<120ms"),
        Case("1.5x faster GPU", "held-out", base.model_copy(update={"speed": 1.5}), slo),
    ]


def virtual() -> list[str]:
    rows = []
    for case in cases():
        t0 = time.perf_counter()
        truth = true_capacity(case.preset, case.slo, cfg=TRUTH)
        assert truth.capacity_rps is not None, case.name
        estimates = []
        for seed in SEEDS:
            cfg = ProbeConfig(slo=case.slo, seed=seed, strategy_options=CLI_OPTIONS)
            result = run_probe(SimDriver(case.preset, label=case.name), cfg)
            estimates.append(result.capacity_rps or 0.0)
        ratios = [e / truth.capacity_rps for e in estimates]
        within = sum(abs(r - 1) <= 0.05 for r in ratios)
        print(f"{case.name}: truth {truth.capacity_rps:.2f} ({truth.broken_by}), "
              f"estimates {estimates}, {time.perf_counter() - t0:.0f} s")  # fmt: skip
        rows.append(
            f"| {_today()} | virtual | {case.split} | {case.name} | `{case.slo}` | "
            f"{truth.capacity_rps:.2f} ({truth.broken_by}) | "
            f"{', '.join(f'{e:.2f}' for e in estimates)} | "
            f"{', '.join(f'{r:.3f}' for r in ratios)} | {within}/{len(ratios)} |"
        )
    return rows


BUDGET_HEADING = (
    "## A token-level probe under a budget (issue 34) (`benchmarks/llm_capacity.py --budget 900`)"
)


def budgeted(budget_s: float) -> list[str]:
    """Every case probed as `ridgeline probe sim:… --budget` (seeds 1-3, virtual time)
    beside the same truth as ``virtual``: the answer, its interval (does it hold the
    truth?), within 5 % or not, and the load it spent."""
    rows = []
    for case in cases():
        truth = true_capacity(case.preset, case.slo, cfg=TRUTH).capacity_rps
        assert truth is not None, case.name
        runs = []
        for seed in SEEDS:
            cfg = ProbeConfig(
                slo=case.slo, seed=seed, strategy_options=CLI_OPTIONS, budget_s=budget_s
            )
            r = run_probe(SimDriver(case.preset, label=case.name), cfg)
            runs.append(r)
        seen = [(r.capacity_rps, r.ci_low, r.ci_high, r.test_seconds) for r in runs]
        print(f"{case.name}: truth {truth:.2f}, {seen}", flush=True)

        def answer(r: Any, truth: float = truth) -> str:
            lo = "—" if r.ci_low is None else f"{r.ci_low:.2f}"
            hi = "—" if r.ci_high is None else f"{r.ci_high:.2f}"
            got = "none" if r.capacity_rps is None else f"{r.capacity_rps:.2f}"
            holds = (r.ci_low is None or r.ci_low <= truth) and (
                r.ci_high is None or truth <= r.ci_high
            )
            return f"{got} [{lo}–{hi}]{'' if holds else ' ✗'}"

        within = sum(
            r.capacity_rps is not None and abs(r.capacity_rps / truth - 1) <= 0.05 for r in runs
        )
        errors = [f"{r.capacity_rps / truth - 1:+.1%}" for r in runs if r.capacity_rps]
        rows.append(
            f"| {_today()} | {case.split} | {case.name} | `{case.slo}` | {truth:.2f} | "
            f"{'; '.join(answer(r) for r in runs)} | {', '.join(errors) or '—'} | "
            f"{within}/{len(runs)} | {max(r.test_seconds for r in runs):,.0f} |"
        )
    return rows


COST_HEADING = "## What a token-level probe costs (issue 15)"


def cost() -> list[str]:
    """The load each probe of the loopback cases sends, in virtual time (the same search
    a loopback probe runs, without the host's noise): test-seconds and requests, seeds
    1-3, for the `llm` engine at ×1 and ×4 speed and KV caches of 16,384 and 8,192."""
    preset = load_sim_preset("llm")
    rows = []
    for speed in (1.0, 4.0):
        slo = scaled_slo(preset.slo, speed)
        for kv in (16384, 8192):
            sim = faster(preset, speed, kv)
            runs = []
            for seed in SEEDS:
                cfg = ProbeConfig(slo=slo, seed=seed, strategy_options=CLI_OPTIONS)
                r = run_probe(SimDriver(sim, label=f"kv{kv}"), cfg)
                runs.append((r.capacity_rps or 0.0, r.test_seconds, r.requests_sent, r.steps))
            print(f"speed {speed:g} KV {kv}: {runs}", flush=True)
            rows.append(
                f"| {_today()} | ×{speed:g} | {kv} | `{slo}` | "
                + ", ".join(f"{c:.2f}" for c, *_ in runs)
                + " | "
                + ", ".join(f"{t:,.0f} s ({n:,} requests, {k} steps)" for _, t, n, k in runs)
                + " |"
            )
    return rows


# --- loopback ------------------------------------------------------------------------


def _server(config: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(BIN / "ridgeline"), "fake-server", "--config", str(config), "--port", "0",
         "--grpc-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            m = re.search(r"OpenAI\s+(http://127\.0\.0\.1:\d+/v1)", line)
            if m:
                return proc, m[1]
        raise RuntimeError("the fake server printed no OpenAI URL")
    except BaseException:
        proc.kill()
        raise


def cli_probe(
    url: str, slo: str, db: Path, *, budget_s: float | None = None, metrics: bool = True
) -> dict[str, Any]:
    """``ridgeline probe`` of the fake LLM server at ``url`` (its OpenAI base) under
    ``slo``, as a user runs it (the CLI, its JSON): with the engine's ``/metrics`` when
    ``metrics``, within ``--budget`` when ``budget_s``; the JSON with its exit status
    and the wall time it took (``bench_wall_s``)."""
    argv = [
        str(BIN / "ridgeline"), "probe", url.replace("http://", "openai+http://"),
        "--model", "fake-llm", "--slo", slo, "--prompt-tokens", "128",
        "--output-tokens", "64", "--db", str(db), "--json",
    ]  # fmt: skip
    if metrics:
        argv += ["--metrics-url", url.removesuffix("/v1") + "/metrics"]
    if budget_s is not None:
        argv += ["--budget", f"{budget_s:g}s"]
    timeout = 4500.0 if budget_s is None else budget_s * 2 + 600
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    if not out.stdout.strip():
        raise RuntimeError(f"ridgeline probe exited {out.returncode}: {out.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(out.stdout)
    doc["exit"], doc["bench_wall_s"] = out.returncode, wall
    return doc


def _long_run(url: str, rate: float, slo: str, seed: int) -> tuple[str, float, float]:
    """A ``LONG_S`` Poisson run at ``rate``: the bound it broke judged plainly ("holds"
    if none), the TTFT p99 and the ITL p99 over the whole run, ms."""
    sched = from_arrival(parse_arrival("poisson", rate), LONG_S, seed=seed)
    shapes = [RequestShape(prompt_tokens=128, output_tokens=64)] * len(sched.times)
    step = Schedule(sched.times, shapes, sched.duration_s, "truth")
    target = url.replace("http://", "openai+http://")
    result = run_coroutine(
        measure_step(target, step, StepConfig(), target_options=TargetOptions(model="fake-llm"))
    )
    why = broken_records(result.records, parse_slo(slo))
    s = result.summary
    ttft = s.ttft_ms.p99 if s.ttft_ms else float("nan")
    itl = s.itl_ms.p99 if s.itl_ms else float("nan")
    return why or "holds", float(ttft or 0.0), float(itl or 0.0)


def scaled_slo(slo: str, speed: float) -> str:
    """``slo`` with every latency bound divided by ``speed``: the same SLO relative to a
    server ``speed`` times faster (error bounds unchanged)."""

    def scale(m: re.Match[str]) -> str:
        return f"{float(m[1]) / speed:g}ms"

    return re.sub(r"(\d+(?:\.\d+)?)ms", scale, slo)


def faster(preset: SimPreset, speed: float, kv: int) -> SimPreset:
    """The preset's engine with ``kv`` KV cache tokens and every cost divided by
    ``speed`` (a faster GPU, on the real clock: the fake server has no speed factor)."""
    llm = preset.model.llm
    assert llm is not None
    return _llm(
        preset,
        kv_cache_tokens=kv,
        step_ms=llm.step_ms / speed,
        prefill_ms_per_token=llm.prefill_ms_per_token / speed,
        decode_ms_per_seq=llm.decode_ms_per_seq / speed,
        attention_ms_per_kv_token=llm.attention_ms_per_kv_token / speed,
    )


def loopback(speed: float, kvs: list[int]) -> list[str]:
    preset = load_sim_preset("llm")
    slo = scaled_slo(preset.slo, speed)
    rows = []
    for kv in kvs:
        sim = faster(preset, speed, kv)
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "llm.yaml"
            config.write_text(yaml.safe_dump(sim.model.model_dump(mode="json")))
            proc, url = _server(config)
            try:
                t0 = time.perf_counter()
                doc = cli_probe(url, slo, Path(tmp) / "probe.sqlite")
                probe_s = time.perf_counter() - t0
                print(json.dumps({k: doc.get(k) for k in ("capacity_rps", "steps",
                      "test_seconds", "confirmed", "reason", "exit")}), flush=True)  # fmt: skip
                estimate = float(doc.get("capacity_rps") or 0.0)
                low = _long_run(url, 0.95 * estimate, slo, seed=11)
                print("0.95x", low, flush=True)
                high = _long_run(url, 1.05 * estimate, slo, seed=12)
                print("1.05x", high, flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        sim_truth = true_capacity(sim, slo, cfg=TRUTH).capacity_rps or 0.0
        within = low[0] == "holds" and high[0] != "holds"
        print(f"KV {kv}: probe {estimate} ({probe_s:.0f} s, exit {doc['exit']}), "
              f"0.95x {low}, 1.05x {high}, sim truth {sim_truth:.2f}")  # fmt: skip
        engine = f"the `llm` engine{f' ×{speed:g} faster' if speed != 1 else ''}"
        rows.append(
            f"| {_today()} | loopback | {'dev' if kv == 16384 else 'held-out'} | "
            f"KV cache {kv} (`fake-server --config`, {engine}) | `{slo}` | "
            f"sim {sim_truth:.2f}; 0.95×: {low[0]} "
            f"(TTFT p99 {low[1]:.0f}, ITL p99 {low[2]:.0f} ms), 1.05×: {high[0]} "
            f"(TTFT p99 {high[1]:.0f}, ITL p99 {high[2]:.0f} ms) | {estimate:.2f} "
            f"(exit {doc['exit']}, {probe_s:.0f} s, {doc.get('steps')} steps) | "
            f"{estimate / sim_truth:.3f} vs sim | {'yes' if within else 'no'} |"
        )
    return rows


def _today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loopback", action="store_true", help="also the loopback runs")
    parser.add_argument("--no-virtual", action="store_true", help="skip the virtual cases")
    parser.add_argument("--cost", action="store_true", help="only the probes' cost table")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="loopback engine speed (SLO scaled by it)"
    )
    parser.add_argument(
        "--kv", type=int, nargs="+", default=[16384, 8192], help="loopback KV cache sizes"
    )
    parser.add_argument(
        "--budget", type=float, help="only the virtual cases, each probe under this budget (s)"
    )
    args = parser.parse_args()
    if args.budget is not None:
        rows = budgeted(args.budget)
        print("\n".join(rows))
        if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
            ensure_section(
                BUDGET_HEADING,
                [
                    "Command: `.venv/bin/python benchmarks/llm_capacity.py --budget 900`: each",
                    "case of the token-level table above probed as `ridgeline probe sim:… "
                    "--budget 15m`",
                    "(seeds 1-3, virtual time) beside the same truth, computed apart. Per probe",
                    "its answer and interval (✗: the interval misses the truth); the answers'",
                    "errors (+: an over-estimate); how many are within 5 %; the most",
                    "test-seconds a probe spent.",
                    "",
                    "| date | split | case | SLO | truth (req/s) | answers [interval] | "
                    "error | within 5 % | test-s (max) |",
                    "|---|---|---|---|---|---|---|---|---|",
                ],
            )
            add_rows(BUDGET_HEADING, f"llm_capacity.py --budget {args.budget:g}, {_today()}, "
                     f"{machine()}", rows)  # fmt: skip
        return
    if args.cost:
        costs = cost()
        print("\n".join(costs))
        if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
            ensure_section(
                COST_HEADING,
                [
                    "Command: `.venv/bin/python benchmarks/llm_capacity.py --cost`: the load",
                    "`ridgeline probe` (CLI defaults) sends before it answers, in virtual",
                    "time on the `llm` engine (scaled: costs ÷ speed, SLO bounds ÷ speed).",
                    "",
                    "| date | speed | KV cache | SLO | capacity (req/s) | load sent |",
                    "|---|---|---|---|---|---|",
                ],
            )
            add_rows(COST_HEADING, f"llm_capacity.py --cost, {_today()}, {machine()}", costs)
        return
    rows = [] if args.no_virtual else virtual()
    if args.loopback:
        rows += loopback(args.speed, args.kv)
    for row in rows:
        print(row)
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") == "1" or not rows:
        return
    ensure_section(
        HEADING,
        [
            "Command: `.venv/bin/python benchmarks/llm_capacity.py [--loopback]` (method in",
            "its docstring). Virtual: the probe (CLI defaults, seeds 1-3) against",
            "`study.truth` (Poisson, 2 × 300 s or 20,000 requests per rate, judged plainly",
            "over every request and gap). Loopback: the probe against `ridgeline",
            "fake-server` with the same engine, then long runs at 0.95× and 1.05× its",
            "estimate judged plainly (within 5 %: the lower holds, the upper breaks).",
            "",
            "| date | where | split | case | SLO | truth (req/s, what broke it) | "
            "estimates (req/s) | estimate / truth | within 5 % |",
            "|---|---|---|---|---|---|---|---|---|",
        ],
    )
    add_rows(HEADING, f"benchmarks/llm_capacity.py, {_today()}, {machine()}", rows)


if __name__ == "__main__":
    main()
