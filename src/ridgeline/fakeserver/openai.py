"""OpenAI-compatible routes on the fake server's aiohttp app.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream`` true or false),
``GET /v1/models`` and ``GET /health`` (vLLM's liveness route). Two ways to answer:

* With an ``llm:`` engine in the model, the request goes to the continuous-batching LLM
  engine (``fakeserver.llm``): its first token comes at the end of the step that prefilled
  it, then one per decode step; ``max_tokens`` (or ``max_completion_tokens``) tokens, or
  fewer at a seeded natural EOS unless ``ignore_eos`` is true (never fewer than
  ``min_tokens``). A request the KV cache could never hold is refused with 400, one over
  ``max_queue`` waiting with 503. Streaming sends one Server-Sent Event per token as it is
  produced, then (with ``stream_options.include_usage``) a chunk with no choices and the
  ``usage``, then ``data: [DONE]``, as vLLM does.
* Otherwise it goes through the batching engine like any other (one row; queueing,
  batching, stalls, injected errors and queue-full all apply); its first token comes
  ``ttft_ms`` after the engine completes it, then one token every ``per_token_ms``,
  ``max_tokens`` tokens in all (default 16), scheduled on absolute times, ``usage`` in
  the last token's chunk.

Prompt tokens are counted with GPT-2's tokenizer (words without it; at least one for the
engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from aiohttp import web

from ridgeline.clock import Clock
from ridgeline.fakeserver.engine import BatchingEngine, Status
from ridgeline.fakeserver.llm import LlmRunner, TokenStream
from ridgeline.synthetic.llm import Refused
from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2.connections import ConnectionGuard, body_in, held_for
from ridgeline.v2.tensors import describe_value
from ridgeline.workload.tokenizer import gpt2_available, load_tokenizer

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 1_000_000
_WORDS = (" the", " time", " of", " day", " and", " a", " new", " way")
"""The answer's words, one GPT-2 token each: a client that counts the streamed text with
a tokenizer (AIPerf without server counts, ridgeline without ``usage``) counts what
``usage`` says."""


def _error(message: str, status: int, kind: str = "invalid_request_error") -> web.Response:
    doc = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(doc, status=status)


class _BadRequest(Exception):
    pass


async def _prompt_tokens(value: Any) -> int:
    """Prompt tokens: the text in a string, a list (a non-text element, such as a token
    id, is one), or the ``text`` and ``content`` of an object, counted with GPT-2's
    tokenizer (one a word without it); walked without recursion, so a prompt nested as
    deep as JSON allows costs no stack. Text past ``MAX_PROMPT_CHARS`` is refused
    before any is counted; text past ``THREAD_CHARS`` is counted off the event loop
    (a 10 MB prompt counted in it stalled every other request for 20 s)."""
    texts, tokens, todo = [], 0, [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            texts.append(v)
        elif isinstance(v, list):
            todo.extend(v)
            tokens += sum(1 for x in v if not isinstance(x, str | list | dict))
        elif isinstance(v, dict):
            todo.extend((v.get("text", ""), v.get("content", "")))
    chars = sum(map(len, texts))
    if chars > MAX_PROMPT_CHARS:
        raise _BadRequest(
            f"the prompt's text is {chars:,} characters; this server takes at most "
            f"{MAX_PROMPT_CHARS:,} (some 250,000 tokens, past any model's context)"
        )
    count = _count_text()
    if chars <= THREAD_CHARS:
        return tokens + sum(map(count, texts))
    return tokens + await asyncio.to_thread(lambda: sum(map(count, texts)))


MAX_PROMPT_CHARS = 1 << 20
"""The most prompt text one request may carry (1 MiB of characters): longer than any
model's context (128k tokens are about half a megabyte of English), and counting it
costs a second of CPU and some 250 MB of the tokenizer's memory."""
THREAD_CHARS = 1 << 14
"""Prompt text longer than this (16 KiB) is counted in a worker thread."""


def _check_prompt(value: Any) -> None:
    """A completions ``prompt`` as the API takes it: a string, a list of strings, a list
    of token ids, or a list of such lists; anything else (``12345``) is refused, not
    counted as something."""
    if isinstance(value, str):
        return
    if isinstance(value, list) and (
        all(isinstance(x, str) for x in value)
        or all(type(x) is int for x in value)
        or all(isinstance(x, list) and all(type(t) is int for t in x) for x in value)
    ):
        return
    raise _BadRequest(
        '"prompt" must be a string, a list of strings, a list of token ids or a list of '
        f"lists of them, not {describe_value(value)}"
    )


def _check_messages(messages: list[Any]) -> None:
    """Chat ``messages``: objects with a string ``role`` and a ``content`` that is a
    string, a list of parts (objects; a text part's ``text`` a string), or absent/null
    (an assistant turn with tool calls); ``content: 5`` is refused."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _BadRequest(f'messages[{i}] must be an object with a string "role"')
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        parts_ok = isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
        )
        if not parts_ok:
            raise _BadRequest(
                f"messages[{i}].content must be a string or a list of content parts, not "
                f"{describe_value(content)}"
            )


_SAMPLING: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def _check_sampling(doc: dict[str, Any]) -> None:
    """The sampling settings a client may send, in the API's ranges (they change nothing
    here, but a wrong one is an error the real server would give); ``n`` and
    ``best_of`` other than 1: this server makes one choice, and says so rather than
    answering one of three."""
    for key, (low, high) in _SAMPLING.items():
        value = doc.get(key)
        if value is None:
            continue
        if type(value) not in (int, float) or not low <= value <= high:
            raise _BadRequest(f'"{key}" must be a number in [{low:g}, {high:g}], not {value!r}')
    for key in ("n", "best_of"):
        value = doc.get(key)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise _BadRequest(f'"{key}" must be a positive integer, not {value!r}')
        if value != 1:
            raise _BadRequest(
                f'"{key}": this server makes one choice a request; send 1, not {value}'
            )


@lru_cache(maxsize=1)
def _count_text() -> Callable[[str], int]:
    if not gpt2_available():
        return lambda text: len(text.split())
    tokenizer = load_tokenizer("gpt2")
    return lambda text: len(tokenizer.encode(text))


@dataclass(frozen=True, slots=True)
class _Ask:
    """What one completions request asks for."""

    max_tokens: int
    prompt: int
    stream: bool
    ignore_eos: bool
    min_tokens: int
    include_usage: bool


def _flag(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if type(value) is not bool:
        raise _BadRequest(f'"{key}" must be true or false, not {describe_value(value)}')
    return value


class _OpenAIRoutes:
    def __init__(
        self,
        model: LatencyModel,
        engine: BatchingEngine,
        guard: ConnectionGuard | None,
        llm: LlmRunner | None,
    ) -> None:
        self.model, self.engine, self.clock, self.guard = model, engine, engine.clock, guard
        self.llm = llm
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

    async def _parse(self, doc: Any, chat: bool) -> _Ask:
        if not isinstance(doc, dict):
            raise _BadRequest("request body must be a JSON object")
        n = doc.get("max_completion_tokens") if chat else None
        n = doc.get("max_tokens", DEFAULT_MAX_TOKENS) if n is None else n
        if type(n) is not int or not 1 <= n <= MAX_TOKENS_LIMIT:
            raise _BadRequest(f"max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}, not {n!r}")
        least = doc.get("min_tokens", 0)
        if type(least) is not int or not 0 <= least <= n:
            raise _BadRequest(
                f"min_tokens must be an integer in 0..max_tokens ({n}), not {least!r}"
            )
        if chat and not isinstance(doc.get("messages"), list):
            raise _BadRequest('chat completions need a "messages" list')
        if chat:
            _check_messages(doc["messages"])
        else:
            _check_prompt(doc.get("prompt", ""))
        _check_sampling(doc)
        prompt = await _prompt_tokens(doc.get("messages") if chat else doc.get("prompt", ""))
        options = doc.get("stream_options") or {}
        if not isinstance(options, dict):
            raise _BadRequest(f'"stream_options" must be an object, not {describe_value(options)}')
        name = doc.get("model", self.model.name)
        if not isinstance(name, str):
            raise _BadRequest(f'"model" must be a string, not {describe_value(name)}')
        return _Ask(
            n,
            prompt,
            _flag(doc, "stream"),
            _flag(doc, "ignore_eos"),
            least,
            _flag(options, "include_usage"),
        )

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        began = time.perf_counter()
        stats = self.engine.stats
        if self.guard is not None:
            unknown = self.guard.limits.max_body_bytes_in_flight  # no length: all of it
            if (refused := held_for(request, self.guard, unknown)) is not None:
                stats.finish("rejected")
                return _error(orjson.loads(refused.body)["error"], 503, "server_error")
        try:
            doc = orjson.loads(await request.read())  # nested past 1024: an error, not a crash
        except ValueError:
            doc = None
        except ConnectionError:  # closed by the body timeout: nobody is left to answer
            return _error("the request's body came too slowly", 408)
        body_in(request, self.guard)
        try:
            ask = await self._parse(doc, chat)
        except _BadRequest as e:
            stats.finish("invalid")
            return _error(str(e), 400)
        name = doc.get("model", self.model.name)
        if name != self.model.name:
            stats.finish("not_found")
            return _error(f"the model {name!r} does not exist; serving {self.model.name!r}", 404)
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model.name,
        }
        if self.llm is not None:
            return await self._generate(request, self.llm, ask, head, chat, began)
        max_tokens, prompt_tokens, stream = ask.max_tokens, ask.prompt, ask.stream
        outcome = await self.engine.submit(1)
        if outcome.status is not Status.OK:
            stats.finish(outcome.status.value, time.perf_counter() - began)
            status = 503 if outcome.status is Status.REJECTED else 500
            return _error(outcome.detail, status, "server_error")
        first = outcome.done_at + self.model.ttft_ms / 1000.0
        gap = self.model.per_token_ms / 1000.0
        usage = _usage(prompt_tokens, max_tokens)
        whole = True
        if stream:
            resp, whole = await self._stream(request, head, chat, max_tokens, first, gap, usage)
        else:
            await _sleep_until(self.clock, first + (max_tokens - 1) * gap)
            resp = _whole(head, chat, max_tokens, "length", usage)
        stats.finish("ok" if whole else "error", time.perf_counter() - began)
        return resp

    async def _generate(
        self,
        request: web.Request,
        llm: LlmRunner,
        ask: _Ask,
        head: dict[str, Any],
        chat: bool,
        began: float,
    ) -> web.StreamResponse:
        """A request through the LLM engine, streamed token by token as produced."""
        stats = self.engine.stats
        prompt = max(ask.prompt, 1)
        got = llm.submit(
            prompt, ask.max_tokens, ignore_eos=ask.ignore_eos, min_tokens=ask.min_tokens
        )
        if isinstance(got, Refused):
            stats.finish("invalid" if got.status == 400 else "rejected")
            kind = "invalid_request_error" if got.status == 400 else "server_error"
            return _error(got.reason, got.status, kind)
        try:
            if ask.stream:
                resp = await self._stream_tokens(request, got, head, chat, ask.include_usage)
            elif not await _finished_or_gone(request, got):
                # the client went away: its request is aborted below, as vLLM aborts it,
                # not generated to its end in a KV cache others wait for
                stats.finish("error", time.perf_counter() - began)
                return web.Response(status=499)  # nobody reads it
            else:
                n = len(got.times)
                resp = _whole(head, chat, n, _reason(got), _usage(prompt, n))
        finally:
            llm.abort(got)  # a no-op once finished; frees the KV of a request cut short
        whole = got.finished and not got.closed  # not cut short by the client or a stop
        stats.finish("ok" if whole else "error", time.perf_counter() - began)
        return resp

    async def _stream_tokens(
        self,
        request: web.Request,
        got: TokenStream,
        head: dict[str, Any],
        chat: bool,
        include_usage: bool,
    ) -> web.StreamResponse:
        resp: web.StreamResponse = web.Response(status=499)  # if it goes before its headers
        sent = 0
        try:
            resp = await _open_stream(request)
            while True:
                await got.event.wait()
                got.event.clear()
                ready, last = len(got.times), got.finished
                out = []
                while sent < ready:
                    reason = _reason(got) if last and sent == ready - 1 else None
                    out.append(_event({**head, "choices": [_token(chat, sent, reason)]}))
                    sent += 1
                if last and include_usage:
                    usage = _usage(got.prompt, sent)
                    out.append(_event({**head, "choices": [], "usage": usage}))
                if out:
                    await resp.write(b"".join(out))
                if last:
                    break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            got.closed = True  # the client went away: aborted, and not counted whole
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
    ) -> tuple[web.StreamResponse, bool]:
        """The stream, and whether it reached its client whole."""
        resp: web.StreamResponse = web.Response(status=499)  # if it goes before its headers
        try:
            resp = await _open_stream(request)
            for i in range(n):
                await _sleep_until(self.clock, first + i * gap)
                last = i == n - 1
                chunk = {**head, "choices": [_token(chat, i, "length" if last else None)]}
                if last:
                    chunk["usage"] = usage
                await resp.write(_event(chunk))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            return resp, False  # the client went away; nothing to tell it
        return resp, True


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _reason(got: TokenStream) -> str:
    if got.closed:
        return "abort"
    return "length" if got.length_limited else "stop"


def _token(chat: bool, i: int, finish_reason: str | None) -> dict[str, Any]:
    """The choice of token ``i``'s chunk."""
    word = _WORDS[i % len(_WORDS)]
    if chat:
        delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
        return {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return {"index": 0, "text": word, "logprobs": None, "finish_reason": finish_reason}


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


GONE_POLL_S = 0.05
"""How often a non-streamed request waiting for its tokens looks whether its client is
still connected (aiohttp cancels no handler when one goes away)."""


async def _finished_or_gone(request: web.Request, got: TokenStream) -> bool:
    """Wait for ``got`` to finish: True; False as soon as its client has gone away."""
    while not got.finished:
        transport = request.transport
        if transport is None or transport.is_closing():
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got.event.wait(), GONE_POLL_S)
        got.event.clear()
    return True


def _whole(
    head: dict[str, Any], chat: bool, n: int, finish_reason: str, usage: dict[str, int]
) -> web.Response:
    """A whole (not streamed) answer of ``n`` tokens."""
    text = "".join(_WORDS[i % len(_WORDS)] for i in range(n))
    if chat:
        choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
        head = {**head, "object": "chat.completion"}
    else:
        choice = {"text": text, "logprobs": None}
    choice = {"index": 0, **choice, "finish_reason": finish_reason}
    return web.json_response({**head, "choices": [choice], "usage": usage})


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.headers["Cache-Control"] = "no-cache"
    await resp.prepare(request)
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
    llm: LlmRunner | None = None,
) -> None:
    """Register the OpenAI routes for ``model`` on ``app`` (``guard``: times their
    connections, as the v2 routes'; ``llm``: the LLM engine that answers them, when the
    model has one)."""
    r = _OpenAIRoutes(model, engine, guard, llm)
    app.router.add_get("/health", r.health)
    app.router.add_get("/v1/models", r.models)
    app.router.add_post("/v1/completions", r.completions)
    app.router.add_post("/v1/chat/completions", r.chat)
