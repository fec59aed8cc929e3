"""``ridgeline serve``: run a plan on the serving runtime, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import HostOption, ServerTokenOption, ZooOption, failing


def serve(
    plan: Annotated[Path, typer.Argument(help="the plan YAML (hand-written or from `plan`)")],
    port: Annotated[int, typer.Option(help="HTTP port (v2, /metrics); 0: any")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port; 0: any")] = 8001,
    host: HostOption = "127.0.0.1",
    token: ServerTokenOption = None,
    zoo: ZooOption = None,
    drop: Annotated[bool, typer.Option(help="drop requests that cannot meet the SLO")] = True,
) -> None:
    """Serve a plan: a task-graph inference server with dynamic batching and early
    dropping, over the Open Inference Protocol v2 (HTTP and gRPC), until Ctrl-C."""
    from ridgeline.serve.runtime import serve_plan_forever

    with failing():
        serve_plan_forever(
            plan, host=host, http_port=port, grpc_port=grpc_port, token=token, zoo=zoo, drop=drop
        )
