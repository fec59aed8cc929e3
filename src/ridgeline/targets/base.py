"""The contract every target adapter meets: connect, send, close.

A target turns one ``RequestShape`` into one request on the wire and returns a
``Reply``. It raises ``TargetUnreachableError`` from ``connect`` when the endpoint does
not answer; from ``send`` it may raise any exception (the replayer counts it as an
error, with its type as the reason) or return ``Reply(ok=False, error=...)`` for an
error answered by the server. Timeouts are the replayer's business, not the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ridgeline.workload.payloads import RequestShape


@dataclass(slots=True)
class Reply:
    """What came back for one request."""

    ok: bool = True
    dropped: bool = False
    """The server answered at once that the request cannot meet its SLO."""
    error: str | None = None
    first_token_at: float | None = None
    """``time.perf_counter()`` when the first streamed token arrived (streaming targets)."""
    output_tokens: int = 0
    """Tokens received (streaming targets): the server's ``usage`` count when it sends one."""
    prompt_tokens: int | None = None
    """The prompt's tokens as the server counted them (``usage``), when it said."""
    chunk_times: list[float] | None = None
    """``time.perf_counter()`` of every streamed chunk that carried content, the first
    included: their differences are the answer's inter-token gaps."""


OK = Reply()
"""A shared success reply, for targets with nothing to say beyond success."""


class Target(Protocol):
    """One inference endpoint, with keep-alive pooling sized for ``max_outstanding``."""

    async def connect(self, max_outstanding: int) -> None:
        """Open pools and check the endpoint answers; raise TargetUnreachableError if not."""
        ...

    async def send(self, shape: RequestShape) -> Reply:
        """Send one request and wait for its whole answer."""
        ...

    async def close(self) -> None:
        """Release pools and connections."""
        ...
