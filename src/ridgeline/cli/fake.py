"""``ridgeline fake-server``: the configurable fake inference server, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ridgeline.cli._common import HostOption, failing, port_option, with_server_options
from ridgeline.errors import RidgelineError


@with_server_options
def fake_server(
    port: Annotated[int, port_option("HTTP port (v2, OpenAI, /metrics)")] = 8000,
    grpc_port: Annotated[int | None, port_option("gRPC port")] = 8001,
    preset: Annotated[str | None, typer.Option(help="a built-in latency model")] = None,
    config: Annotated[Path | None, typer.Option(help="a latency model YAML file")] = None,
    host: HostOption = "127.0.0.1",
    *,
    security: dict[str, Any],
) -> None:
    """Serve a configurable fake inference server (Open Inference Protocol v2 over HTTP and
    gRPC, OpenAI-compatible streaming, Prometheus metrics) until Ctrl-C. With a token (or
    $RIDGELINE_TOKEN) every route needs it; with --tls-cert and --tls-key, both serve TLS."""
    from ridgeline.fakeserver import load_config, load_preset, serve_forever

    with failing():
        if preset and config:
            raise RidgelineError("give --preset or --config, not both")
        model = load_config(config) if config else load_preset(preset or "default")
        serve_forever(model, host=host, http_port=port, grpc_port=grpc_port, **security)
