"""OpenAI-compatible routes on the fake server's aiohttp app.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream`` true or false) and
``GET /v1/models``, and ``GET /health`` (vLLM's liveness route). A request goes through
the batching engine like any other (one row; queueing, batching, stalls, injected errors
and queue-full all apply); its first token comes ``ttft_ms`` after the engine completes
it, then one token every ``per_token_ms``,
``max_tokens`` tokens in all (default 16), scheduled on absolute times. Streaming sends
one Server-Sent Event per token, ``usage`` in the last one, then ``data: [DONE]``.
Prompt tokens are counted as whitespace-separated words.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import orjson
from aiohttp import web

from ridgeline.clock import Clock
from ridgeline.fakeserver.engine import BatchingEngine, Status
from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2.connections import ConnectionGuard, body_in
from ridgeline.v2.tensors import describe_value

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 1_000_000
_WORDS = (" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit")


def _error(message: str, status: int, kind: str = "invalid_request_error") -> web.Response:
    doc = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(doc, status=status)


class _BadRequest(Exception):
    pass


def _words(value: Any) -> int:
    """Prompt tokens, one a word: in a string, a list (a non-text element is one), or
    the ``text`` and ``content`` of an object; walked without recursion, so a prompt
    nested as deep as JSON allows costs no stack."""
    words, todo = 0, [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            words += len(v.split())
        elif isinstance(v, list):
            todo.extend(v)
            words += sum(1 for x in v if not isinstance(x, str | list | dict))
        elif isinstance(v, dict):
            todo.extend((v.get("text", ""), v.get("content", "")))
    return words


class _OpenAIRoutes:
    def __init__(
        self, model: LatencyModel, engine: BatchingEngine, guard: ConnectionGuard | None
    ) -> None:
        self.model, self.engine, self.clock, self.guard = model, engine, engine.clock, guard
        self._ids = itertools.count()
        self._created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 with an empty body, as vLLM answers (GuideLLM asks first)."""
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        entry = {"id": self.model.name, "object": "model", "created": self._created}
        return web.json_response({"object": "list", "data": [{**entry, "owned_by": "ridgeline"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _parse(self, doc: Any, chat: bool) -> tuple[int, int, bool]:
        if not isinstance(doc, dict):
            raise _BadRequest("request body must be a JSON object")
        n = doc.get("max_completion_tokens") if chat else None
        n = doc.get("max_tokens", DEFAULT_MAX_TOKENS) if n is None else n
        if type(n) is not int or not 1 <= n <= MAX_TOKENS_LIMIT:
            raise _BadRequest(f"max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}, not {n!r}")
        if chat and not isinstance(doc.get("messages"), list):
            raise _BadRequest('chat completions need a "messages" list')
        prompt = _words(doc.get("messages") if chat else doc.get("prompt", ""))
        stream = doc.get("stream", False)
        if type(stream) is not bool:
            raise _BadRequest(f'"stream" must be true or false, not {describe_value(stream)}')
        name = doc.get("model", self.model.name)
        if not isinstance(name, str):
            raise _BadRequest(f'"model" must be a string, not {describe_value(name)}')
        return n, prompt, stream

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        began = time.perf_counter()
        stats = self.engine.stats
        try:
            doc = orjson.loads(await request.read())  # nested past 1024: an error, not a crash
        except ValueError:
            doc = None
        except ConnectionError:  # closed by the body timeout: nobody is left to answer
            return _error("the request's body came too slowly", 408)
        body_in(request, self.guard)
        try:
            max_tokens, prompt_tokens, stream = self._parse(doc, chat)
        except _BadRequest as e:
            stats.finish("invalid")
            return _error(str(e), 400)
        name = doc.get("model", self.model.name)
        if name != self.model.name:
            stats.finish("not_found")
            return _error(f"the model {name!r} does not exist; serving {self.model.name!r}", 404)
        outcome = await self.engine.submit(1)
        if outcome.status is not Status.OK:
            stats.finish(outcome.status.value, time.perf_counter() - began)
            status = 503 if outcome.status is Status.REJECTED else 500
            return _error(outcome.detail, status, "server_error")
        first = outcome.done_at + self.model.ttft_ms / 1000.0
        gap = self.model.per_token_ms / 1000.0
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model.name,
        }
        if stream:
            resp = await self._stream(request, head, chat, max_tokens, first, gap, usage)
        else:
            await _sleep_until(self.clock, first + (max_tokens - 1) * gap)
            text = "".join(_WORDS[i % len(_WORDS)] for i in range(max_tokens))
            if chat:
                choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
                head["object"] = "chat.completion"
            else:
                choice = {"text": text, "logprobs": None}
            choice = {"index": 0, **choice, "finish_reason": "length"}
            resp = web.json_response({**head, "choices": [choice], "usage": usage})
        stats.finish("ok", time.perf_counter() - began)
        return resp

    async def _stream(
        self,
        request: web.Request,
        head: dict[str, Any],
        chat: bool,
        n: int,
        first: float,
        gap: float,
        usage: dict[str, int],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(request)
        try:
            for i in range(n):
                await _sleep_until(self.clock, first + i * gap)
                word = _WORDS[i % len(_WORDS)]
                last = i == n - 1
                if chat:
                    delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
                    choice: dict[str, Any] = {"index": 0, "delta": delta}
                else:
                    choice = {"index": 0, "text": word, "logprobs": None}
                choice["finish_reason"] = "length" if last else None
                chunk = {**head, "choices": [choice]}
                if last:
                    chunk["usage"] = usage
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away; nothing to tell it
        return resp


async def _sleep_until(clock: Clock, t: float) -> None:
    delay = t - clock.now()
    if delay > 0:
        await asyncio.sleep(delay)


def add_routes(
    app: web.Application,
    model: LatencyModel,
    engine: BatchingEngine,
    guard: ConnectionGuard | None = None,
) -> None:
    """Register the OpenAI routes for ``model`` on ``app`` (``guard``: see ``build_app``)."""
    r = _OpenAIRoutes(model, engine, guard)
    app.router.add_get("/health", r.health)
    app.router.add_get("/v1/models", r.models)
    app.router.add_post("/v1/completions", r.completions)
    app.router.add_post("/v1/chat/completions", r.chat)
