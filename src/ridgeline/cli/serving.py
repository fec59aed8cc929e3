"""``ridgeline serve``: run a plan on the serving runtime, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ridgeline.cli._common import (
    DropOption,
    HostOption,
    PlanArgument,
    ZooOption,
    emit,
    failing,
    port_option,
    with_server_options,
)
from ridgeline.errors import ConfigError


@with_server_options
def serve(
    plan: PlanArgument,
    port: Annotated[int, port_option("HTTP port (v2, /metrics)")] = 8000,
    grpc_port: Annotated[int | None, port_option("gRPC port")] = 8001,
    host: HostOption = "127.0.0.1",
    zoo: ZooOption = None,
    drop: DropOption = True,
    drop_holdout: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.99,
            help="share of requests never dropped, drawn at random in blocks of neighbours "
            "(0.5: one of each pair): an A/B holdout; the "
            "metric ridgeline_pipeline_slo_outcomes_total counts each arm's on_time, late "
            "and dropped, so you see whether dropping helps on this host and traffic",
        ),
    ] = 0.0,
    reconfigure: Annotated[
        bool,
        typer.Option(
            "--reconfigure",
            help="run the controller: re-plan (needs --spec and --profiles) when demand "
            "leaves the band around the plan's, and apply the difference live",
        ),
    ] = False,
    spec: Annotated[
        Path | None, typer.Option(help="the pipeline spec the plan was made from")
    ] = None,
    profiles: Annotated[
        Path | None, typer.Option(help="the profile table CSV the plan was made from")
    ] = None,
    gpus: Annotated[
        str, typer.Option(help="what a re-plan may use: COUNTxTYPE[,...] or Ncpu")
    ] = "",
    engine: Annotated[
        Literal["ridgeline", "ray"],
        typer.Option(
            help="ridgeline: this package's runtime; ray: the plan's Ray Serve export "
            "(`ridgeline export ray-serve`) on a local Ray, v2 over HTTP on --port only "
            "(no gRPC, dropping, --reconfigure, TLS or token)"
        ),
    ] = "ridgeline",
    decoders: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="processes that parse large v2 JSON bodies beside the event loop (default: "
            "one a core, at most 4); 0 parses every body on the loop",
        ),
    ] = None,
    *,
    security: dict[str, Any],
) -> None:
    """Serve a plan: a task-graph inference server with dynamic batching and early
    dropping, over the Open Inference Protocol v2 (HTTP and gRPC), until Ctrl-C. With
    --reconfigure the controller re-plans as demand moves and applies the change live.
    With a token (or $RIDGELINE_TOKEN) every route needs it; with --tls-cert/--tls-key
    both serve TLS. With --engine ray the plan runs on Ray Serve instead (needs
    `pip install 'ridgeline[ray]'`)."""
    import os

    from ridgeline.serve.runtime import serve_plan_forever

    options: dict[str, Any] = {
        "host": host,
        "http_port": port,
        "grpc_port": grpc_port,
        "zoo": zoo,
        "drop": drop,
        "drop_holdout": drop_holdout,
        "decoders": decoders,
        **security,
    }
    with failing():
        if engine == "ray":
            _serve_on_ray(
                plan,
                host,
                port,
                zoo,
                reconfigure=reconfigure,
                decoders=decoders,
                drop_holdout=drop_holdout,
                **security,
            )
            return
        if not reconfigure:
            serve_plan_forever(plan, **options)
            return
        if spec is None or profiles is None:
            raise ConfigError(
                "--reconfigure re-plans: give --spec (the pipeline spec) and --profiles (its "
                "profile table), the ones `ridgeline plan` made the plan from"
            )
        from ridgeline.cli.planning import available_for
        from ridgeline.pipeline.profiles import load_profiles
        from ridgeline.pipeline.spec import load_spec
        from ridgeline.serve.controller import planner_replan, serve_reconfiguring_forever

        pools = available_for(gpus or f"{os.cpu_count() or 1}cpu")
        replan = planner_replan(load_spec(spec), load_profiles(profiles), pools)
        serve_reconfiguring_forever(plan, replan, **options)


def _serve_on_ray(
    plan: Path,
    host: str,
    port: int,
    zoo: Path | None,
    *,
    reconfigure: bool,
    decoders: int | None,
    drop_holdout: float = 0.0,
    **security: Any,
) -> None:
    """``serve --engine ray``: refuse what Ray Serve's export does not do, then deploy."""
    from ridgeline.export.ray_serve import deploy
    from ridgeline.pipeline.plan import load_plan

    refused = [
        flag
        for flag, given in (
            ("--reconfigure", reconfigure),
            ("--decoders", decoders is not None),
            ("--drop-holdout", drop_holdout > 0.0),
            ("--tls-cert/--tls-key", security.get("tls") is not None),
            ("--token (or --token-file, $RIDGELINE_TOKEN)", security.get("token") is not None),
        )
        if given
    ]
    if refused:
        raise ConfigError(
            f"--engine ray does not support {', '.join(refused)}; drop them, or serve with "
            "--engine ridgeline"
        )
    deploy(load_plan(plan), plan_dir=plan.parent, zoo=zoo, host=host, port=port, announce=emit)
