"""How long a v2 server waits on a client, and how many clients it holds at once.

``ConnectionLimits`` is the one declaration of the servers' connection settings (the
fake server's and ``serve``'s, HTTP and gRPC alike; the CLI's ``--idle-timeout`` and
friends read it); ``check_port`` is the one check of a port a server binds.
"""

from __future__ import annotations

import resource

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import MAX_PORT, Seconds
from ridgeline.errors import ConfigError

RESERVED_DESCRIPTORS = 64
"""Descriptors kept for everything but client connections (files, pipes, workers)."""


class ConnectionLimits(BaseModel):
    """Timeouts and the connection bound of a server (HTTP and gRPC)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_timeout_s: Seconds = Field(
        60.0,
        description="close a connection that has no request in progress for this long, s "
        "(keep-alive; a new connection that sends nothing, too)",
    )
    header_timeout_s: Seconds = Field(
        10.0,
        description="a request's headers (gRPC: the connection's HTTP/2 and TLS handshake) "
        "must arrive within this long of its first byte, s; else 408 and close",
    )
    body_timeout_s: Seconds = Field(
        60.0,
        description="an HTTP request's body must arrive within this long of its headers, s; "
        "else 408 and close",
    )
    max_connections: int = Field(
        10_000,
        ge=1,
        description="client connections held at once (each of HTTP and gRPC); at the bound "
        "a new one closes the longest-idle one, or is refused (503) when none is idle; never "
        f"more than the descriptor limit (ulimit -n) less {RESERVED_DESCRIPTORS}. The default "
        "is a load generator's default requests in flight: one connection each",
    )

    max_body_bytes_in_flight: int = Field(
        128 * 1024 * 1024,
        ge=1,
        description="bytes of HTTP request bodies held at once, all requests together, from "
        "their headers to their answers (a 64 MiB JSON tensor takes some ten times its size "
        "to decode); a request whose body would pass it is answered 503, to retry",
    )

    def connection_bound(self) -> int:
        """``max_connections``, lowered to what the process's descriptor limit allows."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - RESERVED_DESCRIPTORS))


def check_port(port: int, what: str = "port") -> int:
    """``port`` when it is one a server can bind (0 to 65535; 0: any free one)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise ConfigError(
            f"{what} {port!r} is not a TCP port; give 0 to {MAX_PORT} (0: any free port)"
        )
    return port
