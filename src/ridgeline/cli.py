"""The ``ridgeline`` command: a thin layer over the library (each command a few lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from ridgeline.display import live_progress, runs_table, step_table
from ridgeline.errors import RidgelineError, RunInterrupted
from ridgeline.loadgen.replayer import Progress, ReplayConfig
from ridgeline.loadgen.schedule import Schedule, from_arrival, from_trace
from ridgeline.loadgen.step import StepConfig, run_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.telemetry.store import RunStore, default_store_path
from ridgeline.workload.arrivals import parse_arrival

app = typer.Typer(
    help="ridgeline: what is the least GPU that serves demand D within my SLO, and does it "
    "really? Open-loop load, capacity search, planning and serving for ML inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
runs_app = typer.Typer(help="Runs kept in the run store.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

out = Console()
err = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"run store: a SQLite file path (default {default_store_path()}, or $RIDGELINE_DB)",
    ),
]


def _fail(exc: RidgelineError) -> NoReturn:
    err.print(f"[red]error:[/] {exc}", highlight=False)
    raise typer.Exit(130 if isinstance(exc, RunInterrupted) else 2)


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
    duration: Annotated[float, typer.Option(help="seconds of load")] = 5.0,
    db: DbOption = None,
) -> None:
    """Start the built-in fake server and drive it open-loop at 70 % of its capacity."""
    from ridgeline.demo import run_demo

    try:
        run_demo(duration_s=duration, db=db, console=out)
    except RidgelineError as exc:
        _fail(exc)


def main() -> None:
    app(prog_name="ridgeline")


if __name__ == "__main__":  # pragma: no cover
    main()
