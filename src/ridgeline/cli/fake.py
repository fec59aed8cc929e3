"""``ridgeline fake-server``: the configurable fake inference server, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import (
    DEFAULT_LIMITS,
    BodyTimeoutOption,
    HeaderTimeoutOption,
    HostOption,
    IdleTimeoutOption,
    MaxConnectionsOption,
    ServerTokenOption,
    TlsCertOption,
    TlsKeyOption,
    TokenFileOption,
    failing,
    port_option,
    server_security,
)
from ridgeline.errors import RidgelineError


def fake_server(
    port: Annotated[int, port_option("HTTP port (v2, OpenAI, /metrics)")] = 8000,
    grpc_port: Annotated[int | None, port_option("gRPC port")] = 8001,
    preset: Annotated[str | None, typer.Option(help="a built-in latency model")] = None,
    config: Annotated[Path | None, typer.Option(help="a latency model YAML file")] = None,
    host: HostOption = "127.0.0.1",
    token: ServerTokenOption = None,
    token_file: TokenFileOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    idle_timeout: IdleTimeoutOption = DEFAULT_LIMITS.idle_timeout_s,
    header_timeout: HeaderTimeoutOption = DEFAULT_LIMITS.header_timeout_s,
    body_timeout: BodyTimeoutOption = DEFAULT_LIMITS.body_timeout_s,
    max_connections: MaxConnectionsOption = DEFAULT_LIMITS.max_connections,
) -> None:
    """Serve a configurable fake inference server (Open Inference Protocol v2 over HTTP and
    gRPC, OpenAI-compatible streaming, Prometheus metrics) until Ctrl-C. With a token (or
    $RIDGELINE_TOKEN) every route needs it; with --tls-cert/--tls-key both serve TLS."""
    from ridgeline.fakeserver import load_config, load_preset, serve_forever

    with failing():
        if preset and config:
            raise RidgelineError("give --preset or --config, not both")
        model = load_config(config) if config else load_preset(preset or "default")
        serve_forever(
            model,
            host=host,
            http_port=port,
            grpc_port=grpc_port,
            **server_security(
                token,
                token_file,
                tls_cert,
                tls_key,
                idle_timeout_s=idle_timeout,
                header_timeout_s=header_timeout,
                body_timeout_s=body_timeout,
                max_connections=max_connections,
            ),
        )
