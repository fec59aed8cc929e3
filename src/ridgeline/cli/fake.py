"""``ridgeline fake-server``: the configurable fake inference server, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import HostOption, ServerTokenOption, failing
from ridgeline.errors import RidgelineError


def fake_server(
    port: Annotated[int, typer.Option(help="HTTP port (v2, OpenAI, /metrics); 0: any")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port; 0 = any free")] = 8001,
    preset: Annotated[str | None, typer.Option(help="a built-in latency model")] = None,
    config: Annotated[Path | None, typer.Option(help="a latency model YAML file")] = None,
    host: HostOption = "127.0.0.1",
    token: ServerTokenOption = None,
) -> None:
    """Serve a configurable fake inference server (Open Inference Protocol v2 over HTTP and
    gRPC, OpenAI-compatible streaming, Prometheus metrics) until Ctrl-C."""
    from ridgeline.fakeserver import load_config, load_preset, serve_forever

    with failing():
        if preset and config:
            raise RidgelineError("give --preset or --config, not both")
        model = load_config(config) if config else load_preset(preset or "default")
        serve_forever(model, host=host, http_port=port, grpc_port=grpc_port, token=token)
