"""A generic HTTP endpoint: one method, one URL, a body template, success = 2xx.

The body template is a string in which ``{items}``, ``{prompt_tokens}``,
``{output_tokens}``, ``{prompt}`` (the shape's prompt text as it is, else that many words)
and ``{prompt_json}`` (the same text as a JSON string, quotes included: a dataset's
prompts hold quotes and newlines) are replaced per shape, in one pass; any other brace is
left alone, so JSON templates need no escaping. Each distinct shape's body is built once
and cached.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from ridgeline.errors import ConfigError, TargetUnreachableError
from ridgeline.targets._http import Get, checked_session, failed_reply, not_connected, parse_url
from ridgeline.targets.base import OK, Reply
from ridgeline.targets.openai import prompt_words
from ridgeline.workload.payloads import DEFAULT_SHAPE, RequestShape

PLACEHOLDERS = ("{items}", "{prompt_tokens}", "{output_tokens}", "{prompt}", "{prompt_json}")
_PLACEHOLDER = re.compile(r"\{(items|prompt_tokens|output_tokens|prompt|prompt_json)\}")

_REFUSED = {f"HTTP {code}" for code in (400, 401, 403, 404, 405, 422)}
"""Answers that say the request itself is wrong, whatever the load."""


def render(template: str, shape: RequestShape) -> str:
    """``template`` with the placeholders replaced by ``shape``'s values."""
    text = prompt_words(shape.prompt_tokens) if shape.prompt is None else shape.prompt_text()
    values = {
        "items": str(shape.items),
        "prompt_tokens": str(shape.prompt_tokens),
        "output_tokens": str(shape.output_tokens),
        "prompt": text,
        "prompt_json": json.dumps(text, ensure_ascii=False),
    }
    return _PLACEHOLDER.sub(lambda m: values[m[1]], template)


class HttpTarget:
    """``HttpTarget("http://host:8080/predict", body='{"n": {items}}')`` posts that body."""

    def __init__(
        self,
        url: str,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        body: str | None = None,
        health_url: str | None = None,
        ca_file: Path | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self._url = parse_url(url)
        self._ca_file = ca_file
        if self._url.host is None or self._url.scheme not in ("http", "https"):
            raise ConfigError(f"target URL {url!r} is not http(s)://HOST[:PORT]/PATH")
        self._method = method.upper()
        self._headers = dict(headers or {})
        if body is not None and not any(k.lower() == "content-type" for k in self._headers):
            self._headers["Content-Type"] = "application/json"
        self._template = body
        self._health_url = health_url
        self._connect_timeout = connect_timeout
        self._bodies: dict[RequestShape, bytes | None] = {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return str(self._url)

    async def connect(self, max_outstanding: int) -> None:
        await self.close()
        self._session = await checked_session(
            max_outstanding, self._headers, self._connect_timeout, self._check, self._ca_file
        )
        if self._health_url is not None:
            return  # the health URL given answered: the endpoint is checked as asked
        try:
            await self._first_answer()
        except BaseException:
            await self.close()
            raise

    async def _first_answer(self) -> None:
        """One request before the step (with no health URL, an open port is all the check
        had seen): an endpoint that refuses it as a client error (a wrong path, method,
        body or token) would fail every request of the step; it fails the connect check
        instead, with the server's own message."""
        try:
            async with asyncio.timeout(self._connect_timeout):
                reply = await self.send(DEFAULT_SHAPE)
        except TimeoutError:
            return  # slow is not refused: the step measures it
        except (aiohttp.ClientError, OSError) as exc:
            raise TargetUnreachableError(
                f"{self._method} {self.url} failed ({exc}); check that the server is running "
                "and that host, port and path are right"
            ) from exc
        status = reply.error.split(":", 1)[0] if reply.error else ""
        if status in _REFUSED:
            raise TargetUnreachableError(
                f"{self._method} {self.url} answered {reply.error}; check the URL path "
                "(a v2 model is at /v2/models/NAME), the method, the body and any token"
            )

    async def send(self, shape: RequestShape) -> Reply:
        try:
            body = self._bodies[shape]
        except KeyError:
            body = self._encode(shape)
        session = self._session
        if session is None:
            raise not_connected(self)
        async with session.request(self._method, self._url, data=body) as resp:
            answer = await resp.read()
            if 200 <= resp.status < 300:
                return OK
        return failed_reply(resp.status, answer)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _check(self, get: Get) -> None:
        if self._health_url is None:
            await self._check_port()
            return
        await get(
            self._health_url,
            purpose=f"health check of {self.url} failed",
            hint="check that the server is running and that the health URL is right",
        )

    async def _check_port(self) -> None:
        host, port = self._url.host, self._url.port
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, writer = await asyncio.open_connection(host, port)
        except TimeoutError as exc:
            raise TargetUnreachableError(
                f"{self.url}: no TCP answer from {host}:{port} within "
                f"{self._connect_timeout:g} s; check the host and any firewall"
            ) from exc
        except OSError as exc:
            raise TargetUnreachableError(
                f"{self.url}: cannot open a TCP connection to {host}:{port} ({exc}); "
                "check that the server is running and that host and port are right"
            ) from exc
        writer.close()
        await writer.wait_closed()

    def _encode(self, shape: RequestShape) -> bytes | None:
        body = None if self._template is None else render(self._template, shape).encode()
        self._bodies[shape] = body
        return body
