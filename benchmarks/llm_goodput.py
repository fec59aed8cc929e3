"""GuideLLM's goodput answer beside ridgeline's probe and the long-run truth (issue 15).
Not a test: `.venv/bin/python benchmarks/llm_goodput.py`.

The question both tools answer: how much load the `llm` engine (the fake server's, KV
cache of 16,384 tokens) serves with its first token within ``TTFT_MS`` and its time per
output token within ``TPOT_MS``.

* *GuideLLM 0.8.1* (``--profile kind=goodput``, on loopback against `ridgeline
  fake-server --config` with that engine): a closed-loop search on concurrency, each
  probe ``PROBE_S`` long, passing while at least ``ATTAINMENT`` of the requests meet both
  objectives (its "SLO attainment"). Its answer: the highest passing concurrency, with
  the throughput and goodput it measured there.
* *ridgeline* (``probe sim:…`` with the same engine in virtual time, CLI defaults, seeds
  1-3): an open-loop search on the request rate under ``ttft_p95<TTFT,tpot_p95<TPOT``:
  its capacity and the goodput of the step that set it.
* *Truths*, open-loop Poisson on the same simulated engine, each judged plainly over
  every request of 2 seeds × max(300 s, 10,000 requests), bisected to 0.5 %: the highest
  rate meeting ridgeline's percentile SLO (`study.truth`), and the highest at which
  at least ``ATTAINMENT`` of all requests sent meet both objectives (GuideLLM's
  criterion; computed here from each request's TTFT and TPOT, not by either tool).
  GuideLLM's answer is then checked open-loop: the attainment of Poisson arrivals at
  the throughput it reported.

* *ridgeline on loopback* (issue 34), on the same server process right after GuideLLM
  (the same hour): ``ridgeline probe openai+http://… --budget 15m`` under the percentile
  SLO, as a user would run it: its answer, interval, load and wall time, against the
  percentile truth of the same engine (computed in virtual time: the server runs that
  engine in real time). ``RIDGELINE_BENCH_GOODPUT_BUDGET`` sets the budget (seconds; 0
  leaves the loopback probe out).

GuideLLM runs from its own venv (`_llm_peers/setup.sh`; the GPT-2 tokenizer directory is
built there once); rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _doc import add_rows, ensure_section, machine
from llm_capacity import CLI_OPTIONS, _server, _today, cli_probe

from ridgeline.health import parse_slo
from ridgeline.probe.api import run_probe
from ridgeline.probe.drivers import SimDriver
from ridgeline.probe.orchestrator import ProbeConfig
from ridgeline.sim import SimPreset, load_sim_preset
from ridgeline.sim.llm import simulate_llm
from ridgeline.sim.presets import shapes_for
from ridgeline.study.truth import TruthConfig, true_capacity
from ridgeline.synthetic.llm import saturated_rps
from ridgeline.telemetry.records import Outcome
from ridgeline.telemetry.summary import good

PEERS = Path(os.environ.get("RIDGELINE_PEERS", "/work/peers"))
HEADING = "## Goodput: GuideLLM's answer beside ridgeline's and the truth (issue 15)"
TTFT_MS, TPOT_MS, ATTAINMENT = 300.0, 40.0, 0.95
SLO = f"ttft_p95<{TTFT_MS:g}ms,tpot_p95<{TPOT_MS:g}ms"
PROBE_S = float(os.environ.get("RIDGELINE_BENCH_GOODPUT_PROBE_S", "40"))
SEEDS = (1, 2, 3)
TRUTH = TruthConfig(requests=20_000, seeds=2, run_s=300.0)
BUDGET_S = float(os.environ.get("RIDGELINE_BENCH_GOODPUT_BUDGET", "900"))
LOOPBACK_HEADING = (
    "## A token-level probe on loopback beside GuideLLM, in the same hour (issue 34) "
    "(`benchmarks/llm_goodput.py`)"
)


def attainment(preset: SimPreset, rate: float, seed: int) -> float:
    """The share of all requests sent at Poisson ``rate`` (max(300 s, 10,000 requests))
    whose TTFT ≤ ``TTFT_MS`` and TPOT ≤ ``TPOT_MS`` (a failed request meets neither)."""
    n = max(10_000, math.ceil(rate * 300.0))
    gaps = np.random.default_rng([7, seed]).exponential(1.0 / rate, n)
    times = np.cumsum(gaps) - gaps[0]
    shapes = shapes_for(preset, n, seed)
    assert shapes is not None, "an LLM preset draws prompt and output tokens"
    rec, _ = simulate_llm(preset.model, times, shapes, seed=seed)
    sent = rec.outcome != int(Outcome.NOT_SENT)
    bounds = parse_slo(SLO).latency
    return float(good(rec, bounds)[sent].mean())


def attainment_truth(preset: SimPreset) -> float:
    """The highest Poisson rate at which both seeds' runs keep ``ATTAINMENT``, to 0.5 %."""

    def holds(rate: float) -> bool:
        return all(attainment(preset, rate, s) >= ATTAINMENT for s in (1, 2))

    assert preset.model.llm is not None
    hi = 2.0 * saturated_rps(preset.model.llm, 128, 64)  # the preset's lengths
    lo = hi / 2.0
    while not holds(lo):
        hi, lo = lo, lo / 2.0
    while hi / lo > 1.005:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


def guidellm(url: str, tokenizer: Path, workdir: Path) -> dict[str, Any]:
    """GuideLLM's goodput search against ``url``; its conclusion and, per probe, the
    throughput and goodput it measured."""
    report = workdir / "guidellm.json"
    metrics = {"kind": "generative", "slo": {"ttft_ms": TTFT_MS, "tpot_ms": TPOT_MS}}
    argv = [
        str(PEERS / "guidellm" / "bin" / "guidellm"), "run",
        "--backend", f"kind=openai_http,target={url},request_format=/v1/completions",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--profile", f"kind=goodput,target_attainment={ATTAINMENT},initial_streams=4,"
        "max_streams=512,tolerance=0.05",
        "--metrics", json.dumps(metrics),
        "--constraint", f"kind=max_duration,seconds={PROBE_S:g}",
        "--data", "kind=synthetic_text,prompt_tokens=128,output_tokens=64",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0 or not report.exists():
        raise RuntimeError(f"guidellm exited {out.returncode}: {out.stderr[-2000:]}")
    doc = json.loads(report.read_text())
    conclusion = doc["conclusions"][0]
    rates = []
    for b in doc["benchmarks"]:
        m = b["metrics"]
        goodput = m.get("request_goodput")
        rates.append(
            (
                float(m["requests_per_second"]["successful"]["mean"]),
                float(goodput["successful"]["mean"]) if goodput else None,
            )
        )
    return {"conclusion": conclusion, "rates": rates, "wall_s": wall}


def loopback(url: str, db: Path) -> dict[str, Any]:
    """``ridgeline probe`` of ``url`` under ``SLO`` with ``--budget BUDGET_S``, as a user
    runs it (the CLI, its JSON, no engine metrics), and the wall time it took."""
    return cli_probe(url, SLO, db, budget_s=BUDGET_S, metrics=False)


def main() -> None:
    preset = load_sim_preset("llm")
    tokenizer = PEERS / "tokenizer-gpt2"
    if not (tokenizer / "tokenizer.json").exists():
        build = [str(PEERS / "guidellm" / "bin" / "python"), str(Path(__file__).parent /
                 "_llm_peers" / "tokenizer_dir.py"), str(tokenizer)]  # fmt: skip
        subprocess.run(build, check=True)
    mine: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "llm.yaml"
        config.write_text(yaml.safe_dump(preset.model.model_dump(mode="json")))
        proc, url = _server(config)
        try:
            began = time.strftime("%H:%M", time.gmtime())
            g = guidellm(url, tokenizer, Path(tmp))
            if BUDGET_S > 0:
                mine = loopback(url, Path(tmp) / "runs.db")
            ended = time.strftime("%H:%M", time.gmtime())
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    c = g["conclusion"]
    probes = c["probes"]
    best = c["best_passing_streams"]
    at = next(i for i, p in enumerate(probes) if p["streams"] == best) if best else None
    g_rps, g_good = g["rates"][at] if at is not None else (float("nan"), None)
    trail = ", ".join(
        f"{p['streams']}: {p['attainment']:.3f}{'' if p['resolved'] else '?'}" for p in probes
    )
    print(f"GuideLLM: best {best} streams, {g_rps:.2f} req/s, goodput {g_good}, "
          f"{c['stop_reason']}, {g['wall_s']:.0f} s; {trail}", flush=True)  # fmt: skip

    t_pct = true_capacity(preset, SLO, cfg=TRUTH)
    t_att = attainment_truth(preset)
    checked = [attainment(preset, g_rps, s) for s in (1, 2)] if at is not None else []
    print(f"truth: percentile SLO {t_pct.capacity_rps} ({t_pct.broken_by}), "
          f"attainment {t_att:.2f}; GuideLLM's rate open-loop: {checked}", flush=True)  # fmt: skip

    estimates, goodputs, seconds = [], [], []
    for seed in SEEDS:
        cfg = ProbeConfig(slo=SLO, seed=seed, strategy_options=CLI_OPTIONS)
        result = run_probe(SimDriver(preset, label="llm"), cfg)
        estimates.append(result.capacity_rps or 0.0)
        at_cap = result.at_capacity
        goodputs.append(at_cap.goodput_rps if at_cap and at_cap.goodput_rps else float("nan"))
        seconds.append(result.test_seconds)
    print(f"ridgeline: {estimates}, goodput {goodputs}, test-s {seconds}", flush=True)

    truth_pct = t_pct.capacity_rps or float("nan")
    row = (
        f"| {_today()} | `{SLO}`; attainment ≥ {ATTAINMENT:g} of TTFT ≤ {TTFT_MS:g} ms and "
        f"TPOT ≤ {TPOT_MS:g} ms | {truth_pct:.2f} ({t_pct.broken_by}) | {t_att:.2f} | "
        f"{best} streams: {g_rps:.2f} req/s, goodput {g_good or float('nan'):.2f} "
        f"({len(probes)} probes of {PROBE_S:g} s, {c['stop_reason']}, {g['wall_s']:.0f} s; "
        f"attainment by streams {trail}) | "
        f"{', '.join(f'{a:.3f}' for a in checked) or 'n/a'} | "
        f"{', '.join(f'{e:.2f}' for e in estimates)} (goodput "
        f"{', '.join(f'{x:.2f}' for x in goodputs)}; {', '.join(f'{s:.0f}' for s in seconds)}"
        f" test-s) | {g_rps / t_att:.3f} | "
        f"{', '.join(f'{e / truth_pct:.3f}' for e in estimates)} |"
    )
    print(row)
    side = None
    if mine is not None:
        side = _loopback_row(mine, truth_pct, t_att, g_rps, g["wall_s"], began, ended)
        print(side)
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") == "1":
        return
    if side is not None:
        ensure_section(
            LOOPBACK_HEADING,
            [
                "Command: `.venv/bin/python benchmarks/llm_goodput.py` (method in its docstring).",
                "One `ridgeline fake-server` process with the `llm` preset's engine on",
                "loopback; GuideLLM's goodput search, then `ridgeline probe … --budget 15m`",
                "on it. Each answer against its own criterion's truth (the same engine in",
                "virtual time, long runs at fixed rates): GuideLLM's against the",
                "attainment truth, ridgeline's against the percentile truth.",
                "",
                "| date (UTC) | objectives | GuideLLM: answer, error, wall | ridgeline "
                "`--budget 15m`: answer [interval], error, load (test-s), wall | truths "
                "(percentile; attainment), req/s |",
                "|---|---|---|---|---|",
            ],
        )
        add_rows(LOOPBACK_HEADING, f"benchmarks/llm_goodput.py, {_today()}, {machine()}", [side])
    ensure_section(
        HEADING,
        [
            "Command: `.venv/bin/python benchmarks/llm_goodput.py` (method in its docstring).",
            "GuideLLM on loopback (closed loop, concurrency); ridgeline and the truths in",
            "virtual time on the same engine (open loop, request rate).",
            "",
            "| date | objectives | truth, percentile SLO (req/s) | truth, attainment "
            "(req/s) | GuideLLM's answer | attainment at GuideLLM's rate, Poisson (2 seeds) | "
            "ridgeline probe (req/s; goodput; load sent) | GuideLLM / attainment truth | "
            "ridgeline / percentile truth |",
            "|---|---|---|---|---|---|---|---|---|",
        ],
    )
    add_rows(HEADING, f"benchmarks/llm_goodput.py, {_today()}, {machine()}", [row])


def _loopback_row(
    mine: dict[str, Any],
    truth_pct: float,
    t_att: float,
    g_rps: float,
    g_wall: float,
    began: str,
    ended: str,
) -> str:
    cap, low, high = mine.get("capacity_rps"), mine.get("ci_low"), mine.get("ci_high")

    def n(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    err = "—" if cap is None else f"{cap / truth_pct - 1:+.1%}"
    holds = low is not None and high is not None and low <= truth_pct <= high
    return (
        f"| {_today()} {began}–{ended} | `{SLO}`; attainment ≥ {ATTAINMENT:g} | "
        f"{g_rps:.2f} req/s, {g_rps / t_att - 1:+.1%}, {g_wall:.0f} s | "
        f"{n(cap)} [{n(low)}–{n(high)}]{'' if holds else ' (the truth outside)'}, {err}, "
        f"{mine.get('test_seconds', 0.0):.0f} test-s, {mine['bench_wall_s']:.0f} s "
        f"(exit {mine['exit']}; {str(mine.get('reason', '')).replace('|', '/')}) | "
        f"{truth_pct:.2f}; {t_att:.2f} |"
    )


if __name__ == "__main__":
    main()
