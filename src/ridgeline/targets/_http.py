"""Pieces the HTTP targets share: the pooled session, connect checks, error replies."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yarl

from ridgeline.errors import ConfigError, TargetError, TargetUnreachableError
from ridgeline.targets.base import Reply
from ridgeline.v2.security import check_token, client_context

_MAX_ERROR_TEXT = 300


def parse_url(url: str) -> yarl.URL:
    """``url`` as the HTTP client will read it; one it refuses (yarl raises ValueError for,
    e.g., a backslash in the host part) is a ConfigError naming it."""
    try:
        return yarl.URL(url)
    except ValueError as e:
        raise ConfigError(
            f"target URL {url!r} cannot be read ({e}); write http(s)://HOST:PORT/PATH"
        ) from None


def new_session(
    max_outstanding: int, headers: Mapping[str, str], ca_file: Path | None = None
) -> aiohttp.ClientSession:
    """One keep-alive pool of at most ``max_outstanding`` connections, with no timeout;
    https servers are verified against the system's CAs and ``ca_file``'s.

    The replayer times requests out itself, so the session has no total timeout.
    """
    if max_outstanding < 1:
        raise ConfigError(f"max_outstanding is {max_outstanding}; it must be at least 1")
    tls: Any = True if ca_file is None else client_context(ca_file)
    connector = aiohttp.TCPConnector(limit=max_outstanding, keepalive_timeout=60.0, ssl=tls)
    return aiohttp.ClientSession(
        connector=connector, headers=dict(headers), timeout=aiohttp.ClientTimeout(total=None)
    )


async def fetch(
    session: aiohttp.ClientSession, url: str, *, purpose: str, hint: str, timeout: float
) -> bytes:
    """GET ``url`` for a connect check; any failure or non-2xx is TargetUnreachableError."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = await resp.read()
    except TimeoutError as exc:
        raise TargetUnreachableError(
            f"{purpose}: GET {url} got no answer within {timeout:g} s; {hint}"
        ) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise TargetUnreachableError(f"{purpose}: GET {url} failed ({exc}); {hint}") from exc
    if not 200 <= resp.status < 300:
        raise TargetUnreachableError(
            f"{purpose}: GET {url} answered HTTP {resp.status}: {error_text(body)}; {hint}"
        )
    return body


class Get(Protocol):
    """A connect check's GET on the checking session, within the connect timeout."""

    async def __call__(self, url: str, *, purpose: str, hint: str) -> bytes:
        """The body of a 2xx answer; any failure is TargetUnreachableError (see ``fetch``)."""
        ...


async def checked_session(
    max_outstanding: int,
    headers: Mapping[str, str],
    timeout: float,
    check: Callable[[Get], Awaitable[None]],
    ca_file: Path | None = None,
) -> aiohttp.ClientSession:
    """A ``new_session`` on which ``check`` passed: its GETs share the session and
    ``timeout``; the session is closed again when the check fails."""
    session = new_session(max_outstanding, headers, ca_file)

    async def get(url: str, *, purpose: str, hint: str) -> bytes:
        return await fetch(session, url, purpose=purpose, hint=hint, timeout=timeout)

    try:
        await check(get)
    except BaseException:
        await session.close()
        raise
    return session


def parse_json(body: bytes, url: str) -> Any:
    """The JSON document a connect check returned."""
    try:
        return json.loads(body)
    except ValueError:
        raise TargetUnreachableError(
            f"GET {url} answered {body[:80]!r}, which is not JSON; "
            "check that the URL points at the right kind of server"
        ) from None


def error_text(body: bytes) -> str:
    """The server's error message: ``{"error": "..."}``, ``{"error": {"message": ...}}`` or text."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            return error
    return body.decode("utf-8", "replace").strip()[:_MAX_ERROR_TEXT]


def failed_reply(status: int, body: bytes) -> Reply:
    """The reply for a non-success HTTP answer; an error text starting "dropped" is a drop."""
    text = error_text(body)
    return Reply(ok=False, dropped=text.startswith("dropped"), error=f"HTTP {status}: {text}")


def not_connected(target: object) -> TargetError:
    return TargetError(
        f"{type(target).__name__}.send was called before connect(); "
        "await target.connect(max_outstanding) first"
    )


def with_token(headers: Mapping[str, str] | None, token: str | None) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer <token>`` when a token is given."""
    merged = dict(headers or {})
    if token:
        merged["Authorization"] = f"Bearer {check_token(token)}"
    return merged


class JsonHttpTarget:
    """What the JSON-over-HTTP targets share: the URL they report, the URL they post
    requests to (read once, here), their headers (JSON's content type, the user's laid
    over it), the connect timeout and CA bundle, and a connect that opens a session on
    which the target's own ``_check`` passed."""

    def __init__(
        self,
        url: str,
        post_url: str,
        headers: Mapping[str, str] | None,
        ca_file: Path | None,
        connect_timeout: float,
    ) -> None:
        self._reported_url = url
        self._post_url = parse_url(post_url)
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._ca_file = ca_file
        self._connect_timeout = connect_timeout

    @property
    def url(self) -> str:
        return self._reported_url

    async def close(self) -> None:
        raise NotImplementedError

    async def _check(self, get: Get) -> None:
        raise NotImplementedError

    async def _checked_session(self, max_outstanding: int) -> aiohttp.ClientSession:
        """What was open closed, then a new session the target's ``_check`` passed on."""
        await self.close()
        return await checked_session(
            max_outstanding, self._headers, self._connect_timeout, self._check, self._ca_file
        )
