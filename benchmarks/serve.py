"""Serving-runtime benchmark (issue: ridgeline serve vs MLServer, Ray Serve and Triton,
and perf_analyzer). Not a test: `.venv/bin/python benchmarks/serve.py [--peers LIST]
[--quick]`.

1. The same ONNX model (efficientnet-b0 from the zoo) served by ridgeline serve, by
   MLServer (a custom runtime on the same onnxruntime session), by Ray Serve (a
   deployment on the same session) and by Triton (``tritonserver`` 2.51 with a
   Python-backend model on the same session, Triton's dynamic batcher), one server up at
   a time, in the same run; each gets one worker process running one session (CPU, 1
   intra-op thread) and dynamic batching of at most 8 requests within 5 ms
   (``_serve_peers/servers.py``).
2. For each: the maximum throughput at p99 ≤ 50 ms (from the schedule) and errors <
   0.1 %, found by ridgeline's probe (binary search, Poisson arrivals, warmup, a long
   confirmation) over v2 HTTP with the same JSON request — goals: ridgeline ≥ 1.5×
   MLServer, ridgeline ≥ Triton.
3. perf_analyzer (tritonclient 2.48) driving ridgeline serve over HTTP and gRPC at the
   rate ridgeline's probe found, beside ridgeline's own step at that rate.

The peers live in their own venvs, made on first use: `.bench-venv/` for MLServer, Ray
Serve and perf_analyzer (``_serve_peers/venv.py`` says what goes in and why), and
`.triton-venv/` for Triton (``_serve_peers/triton_env.py``: it needs numpy<2 and the base
interpreter); a peer that cannot be installed or started here is reported in the rows
with the reason, and the others are still measured. Rows go to docs/benchmarks.md unless
RIDGELINE_BENCH_NO_WRITE=1 or ``--quick``.

``--peers ridgeline,triton`` measures those only (default: all four, or
RIDGELINE_BENCH_PEERS); ``--in-turn`` starts them all at once and runs their probes
together, one step at a time in rotation (``_serve_peers/turns.py``), so that the host's
drift over minutes charges every server alike (no perf_analyzer then); ``--quick`` is a
smoke pass, 1-3 min a server, not a measurement:
3 s steps, 10 % precision, a confirmation of three steps, warmup ≤ 15 s, no
perf_analyzer, nothing written.

Settings: RIDGELINE_BENCH_DURATION (step length, s; default 10);
RIDGELINE_BENCH_CONFIRM_REQUESTS (a confirmation's requests at least; default 3000, 0:
three step lengths; the probe's own default is 10000); RIDGELINE_BENCH_WARMUP_MAX_S
(default 90; 0: no warmup); RIDGELINE_BENCH_PEERS (default ridgeline,mlserver,ray,triton);
RIDGELINE_BENCH_LOOP (ridgeline's event loop: uvloop, the default, as `ridgeline serve`
runs, or asyncio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from _doc import DOC, add_rows, ensure_section, machine
from _serve_peers import servers
from _serve_peers.perf_analyzer import PaResult, PerfAnalyzer, find_perf_analyzer, run_rate
from _serve_peers.procs import PeerFailed, log_tail
from _serve_peers.settle import SettlingDriver
from _serve_peers.triton_env import GROUP as TRITON
from _serve_peers.triton_env import TritonEnv, ensure_triton_venv
from _serve_peers.turns import InTurn
from _serve_peers.venv import BenchEnv, ensure_bench_venv

from ridgeline.aio import run_coroutine
from ridgeline.errors import RidgelineError
from ridgeline.health.warmup import WarmupConfig
from ridgeline.loadgen.replayer import ReplayConfig
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.probe.drivers import NetworkDriver
from ridgeline.probe.orchestrator import ProbeConfig, ProbeResult, probe
from ridgeline.search.base import StepPlan, StepVerdict
from ridgeline.targets.options import TargetOptions
from ridgeline.targets.tensors import json_inputs
from ridgeline.telemetry.summary import StepSummary
from ridgeline.v2.spec import TensorSpec
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.zoo import build_zoo

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
HEADING = "## Serving runtime (`benchmarks/serve.py`)"
MODEL = "efficientnet-b0"
SLO = "p99<50ms,errors<0.1%"
BATCH, DELAY_MS, THREADS = 8, 5.0, 1
MIN_RATE, MAX_RATE, PRECISION = 10.0, 2000.0, 0.03
WARMUP_RATE = 20.0  # 20 requests a window: a steady p50 is seen as steady
CONFIRM_RETRIES = 3
ALL_PEERS = "ridgeline,mlserver,ray,triton"
LOOP = os.environ.get("RIDGELINE_BENCH_LOOP", "uvloop")
PA_INTERVAL_MS = 3000
PA_FRACTION = 0.8  # of ridgeline's capacity: at the edge perf_analyzer never stabilises
REPLAY = ReplayConfig(timeout_s=5.0)
# A step counts when the generator's p99 send lateness is ≤ 5 ms: 1 ms (the default) does
# not hold beside a server on the same 2 cores sending 395 kB bodies. Latency is timed
# from the schedule, so lateness counts against the server measured, never for it.
VALIDITY = ValidityConfig(lateness_p99_bound_s=0.005)
LABELS = {"ridgeline": "ridgeline", "mlserver": "MLServer", "ray": "Ray Serve", "triton": "Triton"}
# peer → (its distribution in the versions, the goal for ridgeline against it)
GOALS = {
    "mlserver": ("mlserver", " (goal ≥ 1.5×)"),
    "ray": ("ray", ""),
    "triton": ("tritonserver", " (goal ≥ 1×)"),
}


@dataclass(frozen=True)
class Run:
    """How long and how closely each server is measured, and what else is done."""

    peers: tuple[str, ...]
    step_s: float = float(os.environ.get("RIDGELINE_BENCH_DURATION", "10"))
    confirm_requests: int = int(os.environ.get("RIDGELINE_BENCH_CONFIRM_REQUESTS", "3000"))
    warmup_max_s: float = float(os.environ.get("RIDGELINE_BENCH_WARMUP_MAX_S", "90"))
    precision: float = PRECISION
    perf_analyzer: bool = True
    write: bool = os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1"
    in_turn: bool = False
    """All servers up at once, their probes' steps taking turns (no perf_analyzer)."""


def parse_run(argv: list[str] | None = None) -> Run:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--peers",
        default=os.environ.get("RIDGELINE_BENCH_PEERS", ALL_PEERS),
        help=f"comma-separated servers to measure, of {ALL_PEERS} (default: all)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke pass (3 s steps, 10%% precision, short confirmation, no"
        " perf_analyzer, nothing written): shows every server answers and is probed",
    )
    p.add_argument(
        "--in-turn",
        action="store_true",
        help="start every server at once and probe them together, their steps taking"
        " turns (A B A B), so that a host whose speed drifts charges all alike; no"
        " perf_analyzer",
    )
    args = p.parse_args(argv)
    peers = tuple(k.strip() for k in args.peers.split(",") if k.strip())
    unknown = [k for k in peers if k not in LABELS]
    if unknown or not peers:
        p.error(f"--peers: unknown {', '.join(unknown) or '(none given)'}; choose of {ALL_PEERS}")
    run = Run(peers, in_turn=args.in_turn, perf_analyzer=not args.in_turn)
    if args.quick:
        run = replace(
            run,
            step_s=3.0,
            confirm_requests=0,
            warmup_max_s=15.0,
            precision=0.1,
            perf_analyzer=False,
            write=False,
        )
    return run


INTRO = [
    "Command: `.venv/bin/python benchmarks/serve.py` (on first use it builds the peers' own",
    "virtual environments: `.bench-venv/` with MLServer, Ray Serve, onnxruntime, and",
    "perf_analyzer from the tritonclient 2.48 wheel; `.triton-venv/` with nvidia-pytriton 0.7,",
    "whose `tritonserver` 2.51 runs on CPU, onnxruntime and numpy<2).",
    "",
    "- *Model*: efficientnet-b0 from the zoo (`build_zoo`, classifier family), input `images`",
    "  FP32 [-1, 3, 136, 136], output `logits` [-1, 1000]. Each request is one row, the v2",
    "  JSON body ridgeline's v2 HTTP target sends (≈ 395 kB): the same bytes to every server.",
    "- *The same work*: every server runs one onnxruntime session (CPU, 1 intra-op and 1",
    "  inter-op thread, default graph optimisation: the settings of ridgeline's `onnx`",
    "  backend) in one worker process beside its HTTP front end, with dynamic batching of at",
    "  most 8 requests within 5 ms. ridgeline serve: `PlanServer` on a one-task plan, early",
    "  dropping off (neither peer drops), the worker pinned to a core. MLServer: a custom",
    "  `MLModel` runtime, `parallel_workers: 1`, adaptive batching (`max_batch_size: 8`,",
    "  `max_batch_time: 0.005`). Ray Serve: one replica (`num_cpus: 1`) with",
    "  `@serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)`, the batch run in a thread,",
    "  Ray's workers at nice 0 (`RAY_worker_niceness`; Ray's default is 15), behind a small",
    "  adapter answering the v2 health, metadata and JSON infer routes. Triton: `tritonserver`",
    "  on a model repository of one Python-backend model running the session, one instance",
    "  (`KIND_CPU`), `dynamic_batching { max_queue_delay_microseconds: 5000 }`,",
    "  `max_batch_size: 8`; Triton's C++ front end parses the v2 JSON.",
    "- *Measured*: ridgeline's probe (`ProbeConfig`, binary strategy, precision 3 %, Poisson",
    "  arrivals, 10 s steps, warmup at 20/s, then a confirmation run of ≥ 3 steps and ≥ 3,000",
    "  requests with at most 3 back-offs; the probe's default of 10,000 requests would take",
    "  6 minutes a run at 30/s): the highest rate whose p99 from the schedule is ≤ 50 ms with",
    "  errors < 0.1 %. One server up at a time, all in the same run, the load generator on the",
    "  same 2 cores; a step counts when the generator's p99 send lateness is ≤ 5 ms (not 1 ms:",
    "  395 kB bodies beside a busy server; latency from the schedule charges any lateness to",
    "  the server). After a step with timeouts the next waits until a lone request is",
    "  answered about as fast as on the idle server: no server cancels the work of a client",
    "  that has gone, and the search should not measure the last step's backlog.",
    "- *perf_analyzer*: against ridgeline serve at 80 % of the rate its probe found",
    "  (`--async --request-rate-range R`, 3 s windows until stable, `--input-data` holding the",
    "  tensor ridgeline sends; over HTTP `--input-tensor-format json`, as ridgeline), over HTTP",
    "  and gRPC, beside a ridgeline step at the same constant rate over the same protocol.",
    "  perf_analyzer's p99 is from the actual send.",
    "",
    "| date | bench | what | ridgeline | peers, ratio |",
    "|---|---|---|---|---|",
]


def show_step(index: int, plan: StepPlan, v: StepVerdict, label: str = "") -> None:
    p99 = f"{v.p99_ms:.1f} ms" if v.p99_ms is not None else "-"
    print(
        f"  {label}{plan.purpose or 'step'} {plan.rate:,.1f}/s for {plan.duration_s:.0f} s: "
        f"{v.state.value}, p99 {p99}, achieved {v.achieved_rps:,.1f}/s, score {v.score:.2f}"
        + ("" if v.valid else f" (invalid: {v.reason})"),
        flush=True,
    )


def shown(key: str) -> Callable[[int, StepPlan, StepVerdict], None]:
    """``show_step`` naming the server: steps of servers in turn interleave in the log."""
    return lambda index, plan, v: show_step(index, plan, v, f"{LABELS[key]}: ")


def stoppable(make: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> T:
    """Run ``make(stop)`` with Ctrl-C (or SIGTERM) setting ``stop`` — the probe and the
    replayer end their step cleanly on it — then raise KeyboardInterrupt, so that the
    servers' ``finally`` blocks stop them."""

    async def main() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            result = await make(stop)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if stop.is_set():
            raise KeyboardInterrupt
        return result

    return run_coroutine(main())


def probe_config(run: Run) -> ProbeConfig:
    """The probe's settings, the same for every server."""
    return ProbeConfig(
        slo=SLO,
        strategy="binary",
        strategy_options={
            "min_rate": MIN_RATE,
            "max_rate": MAX_RATE,
            "step_duration_s": run.step_s,
            "precision": run.precision,
        },
        warmup=run.warmup_max_s > 0,
        warmup_config=WarmupConfig(rate=WARMUP_RATE, max_s=max(run.warmup_max_s, 1.0)),
        confirm_requests=run.confirm_requests,
        confirm_retries=CONFIRM_RETRIES,
    )


def settling(url: str, inputs: tuple[TensorSpec, ...]) -> SettlingDriver:
    """The driver every server is probed through."""
    network = NetworkDriver(
        url,
        StepConfig(replay=REPLAY, validity=VALIDITY),
        arrival="poisson",
        target_options=TargetOptions(inputs=inputs),
        batching_delay_s=DELAY_MS / 1000,  # the same windows for all (peers have no config)
    )
    return SettlingDriver(network, inputs)


def capacity(url: str, inputs: tuple[TensorSpec, ...], run: Run) -> ProbeResult:
    """The probe's highest sustainable rate under SLO, the same procedure for every server."""
    driver, cfg = settling(url, inputs), probe_config(run)
    return stoppable(lambda stop: probe(driver, cfg, stop=stop, on_step=show_step))


def capacities_in_turn(
    eps: dict[str, servers.Endpoint], inputs: tuple[TensorSpec, ...], run: Run
) -> dict[str, ProbeResult | str]:
    """Every server's probe at once, their steps taking turns (``_serve_peers/turns.py``):
    each server is measured in the same minutes as the others."""
    turn = asyncio.Lock()
    cfg = probe_config(run)

    async def one(key: str, ep: servers.Endpoint, stop: asyncio.Event) -> ProbeResult | str:
        driver = InTurn(settling(ep.model_url, inputs), turn)
        try:
            return await probe(driver, cfg, stop=stop, on_step=shown(key))
        except RidgelineError as e:  # the server stopped answering: the others go on
            return f"failed during the run: {e}; {log_tail(ep.log)}"

    async def all_of(stop: asyncio.Event) -> dict[str, ProbeResult | str]:
        found = await asyncio.gather(*(one(key, ep, stop) for key, ep in eps.items()))
        return dict(zip(eps, found, strict=True))

    return stoppable(all_of)


def at_rate(url: str, rate: float, inputs: tuple[TensorSpec, ...], step_s: float) -> StepSummary:
    """One ridgeline step at a constant ``rate`` (perf_analyzer's gaps are uniform too)."""
    schedule = from_arrival(parse_arrival("constant", rate), step_s)
    cfg = StepConfig(replay=REPLAY, validity=VALIDITY)
    opts = TargetOptions(inputs=inputs)
    step = stoppable(lambda stop: measure_step(url, schedule, cfg, target_options=opts, stop=stop))
    return step.summary


def versus_perf_analyzer(
    pa: PerfAnalyzer,
    ep: servers.Endpoint,
    rate: float,
    inputs: tuple[TensorSpec, ...],
    out: Path,
    step_s: float,
) -> dict[str, tuple[StepSummary, PaResult | str]]:
    # the values ridgeline's target sends, one row: perf_analyzer sends the same tensor
    row = json_inputs(inputs, 1)[0]
    data = out / "perf_analyzer_data.json"
    data.write_text(
        json.dumps({"data": [{row["name"]: {"content": row["data"], "shape": row["shape"][1:]}}]})
    )
    urls = {"http": ep.model_url, "grpc": f"grpc://127.0.0.1:{ep.grpc_port}/{ep.model}"}
    ports = {"http": ep.http_port, "grpc": ep.grpc_port or 0}
    found = {}
    for protocol in ("http", "grpc"):
        print(f"perf_analyzer vs ridgeline over {protocol}, {rate:,.0f}/s", flush=True)
        ours = at_rate(urls[protocol], rate, inputs, step_s)
        print(f"  ridgeline: {ours.achieved_rps:,.1f}/s, p99 {ours.latency_ms.p99} ms", flush=True)
        theirs = run_rate(pa, protocol, ports[protocol], ep.model, rate, data, PA_INTERVAL_MS, out)
        print(f"  perf_analyzer: {theirs}", flush=True)
        found[protocol] = (ours, theirs)
    return found


def outcome(result: ProbeResult | str) -> str:
    if isinstance(result, str):  # a reason from outside: keep the table's cells apart
        return result.replace("|", "/").replace("\n", " ")
    if result.capacity_rps is None:
        return f"no sustainable rate at or above {MIN_RATE:g}/s ({result.reason})"
    confirmed = "" if result.confirmed is not False else ", not confirmed"
    return f"{result.capacity_rps:,.0f}/s{confirmed}"


def rate_of(result: ProbeResult | str | None) -> float | None:
    return None if result is None or isinstance(result, str) else result.capacity_rps


def rows_for(
    date: str,
    results: dict[str, ProbeResult | str],
    versions: dict[str, str],
    pa: PerfAnalyzer | str | None,
    vs_pa: dict[str, tuple[StepSummary, PaResult | str]],
    run: Run,
) -> list[str]:
    ours = rate_of(results.get("ridgeline"))
    peers = []
    for key, (dist, goal) in GOALS.items():
        if key not in results:
            continue
        name = f"{LABELS[key]} {versions[dist]}" if dist in versions else LABELS[key]
        if isinstance(results[key], str):
            peers.append(f"{name}: {outcome(results[key])}")
            continue
        theirs = rate_of(results[key])
        ratio = f": **{ours / theirs:.2f}×**{goal}" if ours and theirs else ""
        peers.append(f"{name} {outcome(results[key])}{ratio}")
    ort = version("onnxruntime")
    theirs_ort = sorted({v for k, v in versions.items() if k.startswith("onnxruntime")} - {ort})
    if theirs_ort:
        ort = f"{ort} (ridgeline), {', '.join(theirs_ort)} (peers)"
    confirm = f"≥ {run.confirm_requests:,} requests" if run.confirm_requests else "3 steps"
    what = (
        f"{MODEL} (zoo), v2 HTTP/JSON, max throughput at `{SLO}` (probe: binary, Poisson,"
        f" {run.step_s:g} s steps, confirmed by {confirm}); each"
        f" server 1 worker × {THREADS} onnxruntime thread (onnxruntime {ort}), batches ≤ {BATCH}"
        f" within {DELAY_MS:g} ms"
        + (
            "; all servers up at once, their probes' steps in turn (`--in-turn`)"
            if run.in_turn
            else ""
        )
    )
    ridgeline = outcome(results["ridgeline"]) if "ridgeline" in results else "not measured"
    rows = [f"| {date} | serve | {what} | {ridgeline} | {'; '.join(peers) or '-'} |"]
    if isinstance(pa, str):
        rows.append(f"| {date} | serve | perf_analyzer → ridgeline serve | - | {outcome(pa)} |")
    for protocol, (step, pa_result) in vs_pa.items():
        mine = (
            f"{step.achieved_rps:,.1f}/s, p99 {step.latency_ms.p99 or 0:.1f} ms from schedule"
            f" ({step.latency_from_send_ms.p99 or 0:.1f} from send), errors {step.error_rate:.1%}"
        )
        if isinstance(pa_result, str):
            peer = f"perf_analyzer: {outcome(pa_result)}"
        else:
            agree = pa_result.throughput / step.achieved_rps if step.achieved_rps else float("nan")
            peer = (
                f"perf_analyzer {pa_result.throughput:,.1f} infer/s, p99 {pa_result.p99_ms:.1f} ms:"
                f" throughput ratio **{agree:.3f}**"
            )
        body = " (JSON tensors, both)" if protocol == "http" else ""
        rows.append(
            f"| {date} | serve | perf_analyzer 2.48 → ridgeline serve, v2 {protocol.upper()}"
            f"{body}, constant {step.offered_rps:,.1f}/s | {mine} | {peer} |"
        )
    return rows


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def environments(run: Run) -> tuple[BenchEnv | None, TritonEnv | None, dict[str, str]]:
    """The peers' environments that ``run`` needs (made or updated), and for each peer
    that cannot run here, why."""
    bench = triton = None
    problems: dict[str, str] = {}
    if {"mlserver", "ray"} & set(run.peers) or (run.perf_analyzer and "ridgeline" in run.peers):
        bench = ensure_bench_venv(ROOT / ".bench-venv")
        for key, group in (("mlserver", "MLServer"), ("ray", "Ray Serve")):
            problem = bench.problems.get(group) or bench.problems.get("onnxruntime")
            if problem is not None:
                problems[key] = problem
    if "triton" in run.peers:
        triton = ensure_triton_venv(ROOT / ".triton-venv")
        if TRITON in triton.problems:
            problems["triton"] = triton.problems[TRITON]
    for env in (bench, triton):
        for group, why in (env.problems if env else {}).items():
            print(f"{group}: {why}", flush=True)
    return bench, triton, problems


def serving_in(work: Path) -> tuple[servers.Serving, tuple[TensorSpec, ...]]:
    """What every server serves (the zoo's model built under ``work``), and its inputs."""
    variant = build_zoo(work / "zoo", ["classifier"]).variant(MODEL)
    serving = servers.Serving(
        model=MODEL,
        onnx=work / "zoo" / variant.path,
        zoo=work / "zoo",
        inputs=[asdict(t) for t in variant.inputs],
        outputs=[asdict(t) for t in variant.outputs],
        batch=BATCH,
        delay_ms=DELAY_MS,
        threads=THREADS,
        work=work,
    )
    return serving, variant.inputs


def up(key: str, ep: servers.Endpoint, versions: dict[str, str]) -> None:
    print(f"  up: {ep.model_url} ({ep.config})", flush=True)
    if ep.version:
        versions[GOALS[key][0] if key in GOALS else key] = ep.version


def unless_exited(ep: servers.Endpoint, result: ProbeResult | str) -> ProbeResult | str:
    """``result``, unless the server exited during the run: then why."""
    if ep.process.poll() is None:
        return result
    return f"the server exited (code {ep.process.returncode}) during the run: {log_tail(ep.log)}"


def told(key: str, r: ProbeResult | str) -> None:
    spent = "" if isinstance(r, str) else f" ({r.steps} steps, {r.test_seconds:.0f} test-s)"
    print(f"  {LABELS[key]}: {outcome(r)}{spent}", flush=True)


def in_turn(
    starters: dict[str, Callable[[], AbstractContextManager[servers.Endpoint]]],
    keys: list[str],
    run: Run,
    inputs: tuple[TensorSpec, ...],
    versions: dict[str, str],
) -> dict[str, ProbeResult | str]:
    """The servers ``keys`` up at once, probed together, steps in turn."""
    results: dict[str, ProbeResult | str] = {}
    with ExitStack() as stack:
        eps: dict[str, servers.Endpoint] = {}
        for key in keys:
            print(f"== {LABELS[key]}", flush=True)
            try:
                eps[key] = stack.enter_context(starters[key]())
            except PeerFailed as e:
                results[key] = f"failed to start here: {e}"
                continue
            up(key, eps[key], versions)
        print("== probing " + ", ".join(LABELS[k] for k in eps) + ", steps in turn", flush=True)
        found = capacities_in_turn(eps, inputs, run)
        for key, ep in eps.items():
            results[key] = unless_exited(ep, found[key])
            told(key, results[key])
    return results


def main(argv: list[str] | None = None) -> None:
    started = time.time()
    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: the servers are stopped
    run = parse_run(argv)
    bench, triton, problems = environments(run)
    versions = dict(bench.versions) if bench else {}
    if triton:
        versions["nvidia-pytriton"] = triton.versions.get("nvidia-pytriton", "?")
        versions["onnxruntime (Triton)"] = triton.versions.get("onnxruntime", "?")
    pa: PerfAnalyzer | str | None = None  # not run: --quick, or ridgeline not measured
    if bench and run.perf_analyzer and "ridgeline" in run.peers:
        pa = find_perf_analyzer(bench)
        print(f"perf_analyzer: {pa if isinstance(pa, str) else pa.version}", flush=True)
    results: dict[str, ProbeResult | str] = {}
    vs_pa: dict[str, tuple[StepSummary, PaResult | str]] = {}
    with tempfile.TemporaryDirectory(prefix="rl-serve-") as tmp:
        work = Path(tmp)
        serving, inputs = serving_in(work)
        starters: dict[str, Callable[[], AbstractContextManager[servers.Endpoint]]] = {
            "ridgeline": lambda: servers.ridgeline(serving, LOOP),
        }
        if bench:
            starters["mlserver"] = lambda: servers.mlserver(serving, bench)
            starters["ray"] = lambda: servers.ray_serve(serving, bench)
        if triton:
            starters["triton"] = lambda: servers.triton(serving, triton)
        results |= {k: problems[k] for k in run.peers if k in problems}
        keys = [k for k in run.peers if k not in problems]
        if run.in_turn:
            results |= in_turn(starters, keys, run, inputs, versions)
        else:
            for key in keys:
                print(f"== {LABELS[key]}", flush=True)
                try:
                    with starters[key]() as ep:
                        up(key, ep, versions)
                        results[key] = capacity(ep.model_url, inputs, run)
                        rate = rate_of(results[key])
                        if key == "ridgeline" and isinstance(pa, PerfAnalyzer) and rate:
                            try:
                                vs_pa = versus_perf_analyzer(
                                    pa, ep, PA_FRACTION * rate, inputs, work, run.step_s
                                )
                            except RidgelineError as e:
                                pa = f"run against ridgeline serve failed: {e}"
                        results[key] = unless_exited(ep, results[key])
                except PeerFailed as e:
                    results[key] = f"failed to start here: {e}"
                except RidgelineError as e:  # the server stopped answering mid-run
                    results[key] = f"failed during the run: {e}; {log_tail(work / f'{key}.log')}"
                told(key, results[key])
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    rows = rows_for(date, results, versions, pa, vs_pa, run)
    print("\n".join(rows))
    print(json.dumps({k: outcome(r) for k, r in results.items()} | {"versions": versions}))
    print(f"took {time.time() - started:.0f} s")
    if run.write and DOC.exists():
        ensure_section(HEADING, INTRO)
        add_rows(HEADING, f"benchmarks/serve.py, {date}, {machine()}", rows)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: every server stopped, no rows written", flush=True)
        raise SystemExit(130) from None
