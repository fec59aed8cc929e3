"""The ``ridgeline`` command: a thin layer over the library (each command a few lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ridgeline._cli_common import DbOption, err, out
from ridgeline._cli_common import fail as _fail
from ridgeline._cli_common import out as out_console
from ridgeline.aio import run_coroutine
from ridgeline.capacity.cli import allocate_command, registry_app
from ridgeline.display import live_progress, runs_table, step_table
from ridgeline.errors import RidgelineError
from ridgeline.loadgen.replayer import Progress, ReplayConfig
from ridgeline.loadgen.schedule import Schedule, from_arrival, from_trace
from ridgeline.loadgen.step import StepConfig, run_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.pipeline.plan_cli import plan_command
from ridgeline.pipeline.profile_cli import profile_command
from ridgeline.report.cli import report_command
from ridgeline.telemetry.store import RunStore
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.zoo.cli import app as zoo_app

app = typer.Typer(
    help="ridgeline: what is the least GPU that serves demand D within my SLO, and does it "
    "really? Open-loop load, capacity search, planning and serving for ML inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
runs_app = typer.Typer(help="Runs kept in the run store.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.command("allocate")(allocate_command)
app.add_typer(registry_app, name="registry")
app.command("report")(report_command)
app.add_typer(zoo_app, name="models", help="The local model zoo: real ONNX model families.")
app.command("profile")(profile_command)
app.command("plan")(plan_command)


def _target_options(model: str | None, header: list[str], token: str | None) -> dict[str, Any]:
    headers: dict[str, str] = {}
    for h in header:
        if ":" not in h:
            raise typer.BadParameter(f"--header {h!r} must look like 'Name: value'")
        k, v = h.split(":", 1)
        headers[k.strip()] = v.strip()
    opts: dict[str, Any] = {}
    if headers:
        opts["headers"] = headers
    if token:
        opts["token"] = token
    if model:
        opts["model"] = model
    return opts


@app.command()
def run(
    target: Annotated[
        str,
        typer.Argument(
            help="endpoint URL, e.g. http://127.0.0.1:8000/v2/"
            "models/NAME, grpc://127.0.0.1:8001/NAME, "
            "openai+http://127.0.0.1:8000/v1, null://"
        ),
    ],
    rate: Annotated[float | None, typer.Option(help="mean offered rate, requests/s")] = None,
    duration: Annotated[float, typer.Option(help="step length, seconds")] = 10.0,
    arrival: Annotated[
        str,
        typer.Option(
            help="constant | poisson | gamma:cv=2 | ramp:from=10,to=100 | steps:rates=10/20,step=5"
            " | diurnal:amplitude=0.5,period=60"
        ),
    ] = "poisson",
    trace: Annotated[Path | None, typer.Option(help="replay a recorded trace (CSV/JSONL)")] = None,
    target_rate: Annotated[
        float | None,
        typer.Option(help="time-scale the trace to this mean rate, keeping its relative gaps"),
    ] = None,
    trace_start: Annotated[float, typer.Option(help="start of the trace window, s")] = 0.0,
    seed: Annotated[int, typer.Option(help="seed of the arrival schedule")] = 0,
    processes: Annotated[int, typer.Option(help="local generator processes")] = 1,
    timeout: Annotated[float, typer.Option(help="per-request timeout, s")] = 30.0,
    max_outstanding: Annotated[int, typer.Option(help="requests in flight at most")] = 10_000,
    lateness_bound_ms: Annotated[
        float, typer.Option(help="p99 send lateness above which the step is invalid")
    ] = 1.0,
    window: Annotated[float, typer.Option(help="telemetry window, s")] = 1.0,
    metrics_url: Annotated[
        str | None, typer.Option(help="Prometheus endpoint of the server, scraped beside the load")
    ] = None,
    model: Annotated[str | None, typer.Option(help="model name (OpenAI targets)")] = None,
    header: Annotated[list[str], typer.Option(help="extra header 'Name: value'")] = [],  # noqa: B006
    token: Annotated[str | None, typer.Option(help="bearer token for the endpoint")] = None,
    store_requests: Annotated[bool, typer.Option(help="store one row per request")] = False,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Run one open-loop step against TARGET and print its result."""
    try:
        schedule = _schedule(rate, duration, arrival, trace, target_rate, trace_start, seed)
        cfg = StepConfig(
            processes=processes,
            window_s=window,
            metrics_url=metrics_url,
            store_requests=store_requests,
            replay=ReplayConfig(timeout_s=timeout, max_outstanding=max_outstanding),
            validity=ValidityConfig(lateness_p99_bound_s=lateness_bound_ms / 1000.0),
        )
        progress = Progress()
        with RunStore(db) as store, live_progress(progress, err, err.is_terminal):
            result = run_step(
                target,
                schedule,
                cfg,
                store=store,
                target_options=_target_options(model, header, token),
                progress=progress,
            )
    except RidgelineError as exc:
        _fail(exc)
    except ValueError as exc:  # pydantic validation of the options
        _fail(RidgelineError(str(exc)))
    if as_json:
        print(result.summary.model_dump_json(indent=2))
    else:
        out.print(step_table(result.summary, f"{target} — {schedule.description}"))


def _schedule(
    rate: float | None,
    duration: float,
    arrival: str,
    trace: Path | None,
    target_rate: float | None,
    trace_start: float,
    seed: int,
) -> Schedule:
    if trace is not None:
        return from_trace(
            trace, target_rate=target_rate or rate, start_s=trace_start, duration_s=duration
        )
    return from_arrival(parse_arrival(arrival, rate), duration, seed)


@app.command()
def probe(
    target: Annotated[
        str,
        typer.Argument(
            help="endpoint URL (as for `run`), or sim:PRESET / sim:FILE.yaml for a simulated "
            "server in virtual time (presets: recommendation, ranking, vision, nlp, "
            "vision-warmup)"
        ),
    ],
    slo: Annotated[
        str | None,
        typer.Option(
            help="e.g. 'p99<100ms,errors<0.1%'; default: the sim preset's, else "
            "'p99<100ms,errors<1%'"
        ),
    ] = None,
    strategy: Annotated[
        str, typer.Option(help="adaptive | binary | sweep | stability")
    ] = "adaptive",
    min_rate: Annotated[float, typer.Option(help="lowest rate to try, req/s")] = 1.0,
    max_rate: Annotated[float | None, typer.Option(help="highest rate to try")] = None,
    start_rate: Annotated[float | None, typer.Option(help="first rate (default min-rate)")] = None,
    rate: Annotated[float | None, typer.Option(help="the rate, for --strategy stability")] = None,
    step_duration: Annotated[float, typer.Option(help="seconds per step")] = 10.0,
    precision: Annotated[float, typer.Option(help="relative width of the answer")] = 0.02,
    warmup: Annotated[bool, typer.Option(help="warmup phase and steady-state exclusion")] = True,
    confirm: Annotated[bool, typer.Option(help="a stability run at the estimate")] = True,
    confirm_margin: Annotated[
        float,
        typer.Option(
            help="re-run a confirmation failing within this of the SLO (besides the band "
            "its own noise sets); the majority of 3 decides"
        ),
    ] = 0.0,
    arrival: Annotated[str, typer.Option(help="arrival process of every step")] = "poisson",
    trace: Annotated[
        Path | None,
        typer.Option(help="replay this trace in every step, time-scaled to the step's rate"),
    ] = None,
    processes: Annotated[int, typer.Option(help="local generator processes")] = 1,
    window: Annotated[float, typer.Option(help="health window, s")] = 1.0,
    metrics_url: Annotated[
        str | None, typer.Option(help="Prometheus endpoint of the server (batch sizes, queue, GPU)")
    ] = None,
    gpu_metrics_url: Annotated[
        str | None,
        typer.Option(
            help="a DCGM exporter or Triton metrics endpoint, when NVML cannot see the GPU "
            "(a remote server)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the schedules")] = 0,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Find the maximum sustainable throughput of TARGET under an SLO."""
    from ridgeline.display import probe_line, probe_table
    from ridgeline.probe.api import default_slo, make_driver, run_probe
    from ridgeline.probe.orchestrator import ProbeConfig
    from ridgeline.telemetry.gpu import detect_gpu_monitor

    options: dict[str, Any] = {
        "min_rate": min_rate,
        "step_duration_s": step_duration,
        "precision": precision,
    }
    if max_rate is not None:
        options["max_rate"] = max_rate
    if start_rate is not None:
        options["start_rate"] = start_rate
    if rate is not None:
        options["rate"] = rate
    try:
        cfg = ProbeConfig(
            slo=slo or default_slo(target) or "p99<100ms,errors<1%",
            strategy=strategy,
            strategy_options=options,
            warmup=warmup,
            confirm=confirm,
            confirm_margin=confirm_margin,
            seed=seed,
        )
        step = StepConfig(processes=processes, window_s=window, metrics_url=metrics_url)
        driver = make_driver(target, step=step, arrival=arrival, trace=trace)
        with RunStore(db) as store:
            gpu = None if target.startswith("sim:") else detect_gpu_monitor(gpu_metrics_url)
            if gpu is not None and not as_json:
                err.print(f"GPU: {gpu.describe()}", highlight=False)
            result = run_probe(
                driver, cfg, store=store, gpu=gpu, on_step=None if as_json else probe_line(err)
            )
    except RidgelineError as exc:
        _fail(exc)
    except ValueError as exc:
        _fail(RidgelineError(str(exc)))
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        out.print(probe_table(result))
    if result.status != "complete":
        raise typer.Exit(130 if result.status == "interrupted" else 1)


@app.command("fake-server")
def fake_server(
    port: Annotated[int, typer.Option(help="HTTP port (v2, OpenAI, /metrics); 0: any")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port; 0 = any free")] = 8001,
    preset: Annotated[str | None, typer.Option(help="a built-in latency model")] = None,
    config: Annotated[Path | None, typer.Option(help="a latency model YAML file")] = None,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(help="require this bearer token")] = None,
) -> None:
    """Serve a configurable fake inference server (Open Inference Protocol v2 over HTTP and
    gRPC, OpenAI-compatible streaming, Prometheus metrics) until Ctrl-C."""
    from ridgeline.fakeserver import load_config, load_preset, serve_forever

    try:
        if preset and config:
            raise RidgelineError("give --preset or --config, not both")
        model = load_config(config) if config else load_preset(preset or "default")
        serve_forever(model, host=host, http_port=port, grpc_port=grpc_port, token=token)
    except RidgelineError as exc:
        _fail(exc)


@app.command()
def serve(
    plan: Annotated[Path, typer.Argument(help="the plan YAML (hand-written or from `plan`)")],
    port: Annotated[int, typer.Option(help="HTTP port (v2, /metrics); 0: any")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port; 0: any")] = 8001,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(help="require this bearer token")] = None,
    zoo: Annotated[
        Path | None, typer.Option(help="model zoo directory (default $RIDGELINE_ZOO or cache)")
    ] = None,
    drop: Annotated[bool, typer.Option(help="drop requests that cannot meet the SLO")] = True,
) -> None:
    """Serve a plan: a task-graph inference server with dynamic batching and early
    dropping, over the Open Inference Protocol v2 (HTTP and gRPC), until Ctrl-C."""
    from ridgeline.serve.runtime import serve_plan_forever

    try:
        serve_plan_forever(
            plan, host=host, http_port=port, grpc_port=grpc_port, token=token, zoo=zoo, drop=drop
        )
    except RidgelineError as exc:
        _fail(exc)


@app.command()
def verify(
    plan: Annotated[Path, typer.Argument(help="the plan YAML the server runs")],
    target: Annotated[
        str, typer.Argument(help="its pipeline's v2 URL, e.g. http://127.0.0.1:8000/v2/models/NAME")
    ],
    seconds: Annotated[float, typer.Option(help="length of the step at the demand, s")] = 10.0,
    max_fail: Annotated[
        float, typer.Option(help="largest share of errors, timeouts and drops that passes")
    ] = 0.01,
    search: Annotated[bool, typer.Option(help="also measure the capacity (the margin)")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Probe a served plan at its planned demand: pass or fail against its SLO, and the
    margin its measured capacity leaves. Exit status 1 when it fails."""
    from ridgeline.pipeline.plan import load_plan
    from ridgeline.verify import verify as verify_plan

    try:
        result = run_coroutine(
            verify_plan(load_plan(plan), target, seconds=seconds, max_fail=max_fail, search=search)
        )
    except RidgelineError as exc:
        _fail(exc)
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        out.print(result.summary())
    if not result.passed:
        raise typer.Exit(1)


@runs_app.command("list")
def runs_list(
    db: DbOption = None, limit: Annotated[int, typer.Option(help="newest N runs")] = 20
) -> None:
    """List the newest runs."""
    try:
        with RunStore(db) as store:
            out.print(runs_table(store.list_runs(limit)))
    except RidgelineError as exc:
        _fail(exc)


@runs_app.command("show")
def runs_show(
    run_id: int, db: DbOption = None, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Show one run: its steps and their windows."""
    from ridgeline.telemetry.summary import StepSummary

    try:
        with RunStore(db) as store:
            run_ = store.get_run(run_id)
    except RidgelineError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(run_, indent=2))
        return
    reason = f" ({run_['status_reason']})" if run_["status_reason"] else ""
    out.print(f"run {run_['id']} [{run_['kind']}] {run_['target']}: {run_['status']}{reason}")
    for step in run_["steps"]:
        summary = StepSummary.model_validate(step["summary"])
        out.print(step_table(summary, f"step {step['index']}"))


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="where the plan, profiles and report go")] = Path(
        "ridgeline-demo"
    ),
    zoo: Annotated[
        Path | None, typer.Option(help="model zoo directory (default $RIDGELINE_ZOO or cache)")
    ] = None,
    short: Annotated[bool, typer.Option(help="a quick pass: fewer points, shorter phases")] = False,
    db: DbOption = None,
) -> None:
    """The whole loop on this machine: profile the example pipeline on CPU, plan it, serve
    it, verify it at its demand, move the demand up and back down while it reconfigures
    live, and write one HTML report."""
    from ridgeline.demo import SHORT, run_demo

    try:
        result, _ = run_demo(out, zoo=zoo, cfg=SHORT if short else None, console=out_console, db=db)
    except RidgelineError as exc:
        _fail(exc)
    if not result.verified.passed or result.lost:
        raise typer.Exit(1)


def main() -> None:
    app(prog_name="ridgeline")


if __name__ == "__main__":  # pragma: no cover
    main()
