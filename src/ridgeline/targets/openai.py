"""OpenAI-compatible completions and chat completions (vLLM, TGI, SGLang, llama.cpp).

Streaming (the default) reads the server-sent events line by line: the first content
token sets ``Reply.first_token_at``, and the reply returns after ``data: [DONE]``.
Output tokens are the server's ``usage`` figure when it sends one (``stream_options``
asks for it), else the streamed text counted with the run's tokenizer (never the number
of chunks: a server may send several tokens a chunk); a whole answer likewise.

The request body is encoded once per distinct shape: the shape's prompt text (a
conversation's history as earlier messages, or joined before it for completions), else
``prompt_tokens`` words (at least one); ``max_tokens`` the shape's ``output_tokens`` or
a default; ``ignore_eos: true`` (vLLM, SGLang, TGI) unless turned off, so the server
generates the length asked rather than stopping at its end-of-sequence token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ridgeline.errors import TargetError, TargetUnreachableError, UnknownKindError
from ridgeline.targets._http import Get, JsonHttpTarget, failed_reply, not_connected, parse_json
from ridgeline.targets.base import Reply
from ridgeline.targets.options import OpenAIApi
from ridgeline.workload.payloads import TURN_SEPARATOR, RequestShape
from ridgeline.workload.tokenizer import Tokenizer, load_tokenizer

_ROUTES: dict[str, str] = {"completions": "/completions", "chat": "/chat/completions"}
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again")


def prompt_words(count: int) -> str:
    """A deterministic prompt of ``count`` words (at least one)."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(max(1, count)))


class OpenAITarget(JsonHttpTarget):
    """``OpenAITarget("http://127.0.0.1:8000/v1", model="llama")`` streams completions."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api: OpenAIApi = "completions",
        stream: bool = True,
        headers: Mapping[str, str] | None = None,
        default_max_tokens: int = 16,
        extra_body: Mapping[str, Any] | None = None,
        ca_file: Path | None = None,
        connect_timeout: float = 10.0,
        ignore_eos: bool = True,
        tokenizer: str | None = None,
    ) -> None:
        self._ignore_eos = ignore_eos
        self._tokenizer_spec = tokenizer
        self._tokenizer: Tokenizer | None = None
        if api not in _ROUTES:
            raise UnknownKindError("OpenAI API", api, _ROUTES)
        self._base = base_url.rstrip("/")
        super().__init__(self._base, self._base + _ROUTES[api], headers, ca_file, connect_timeout)
        self._chat = api == "chat"
        self._stream = stream
        self._default_max_tokens = default_max_tokens
        self._extra_body = dict(extra_body or {})
        self.model = model
        """The model asked for: given, or the first the server lists at connect."""
        self._bodies: dict[RequestShape, bytes] = {}
        self._session: aiohttp.ClientSession | None = None

    async def connect(self, max_outstanding: int) -> None:
        session = await self._checked_session(max_outstanding)
        self._bodies.clear()
        self._tokenizer = load_tokenizer(self._tokenizer_spec)  # once per process and spec
        self._session = session

    async def _check(self, get: Get) -> None:
        """The server lists its models; with no model given, use the first."""
        models_url = f"{self._base}/models"
        body = await get(
            models_url,
            purpose=f"OpenAI-compatible server at {self._base} does not answer",
            hint="check that the server is running, that host and port are right "
            "and that the URL ends in the API root (usually /v1)",
        )
        if self.model is None:
            self.model = _first_model(parse_json(body, models_url), models_url)
            return
        served = _listed_models(parse_json(body, models_url))
        if served is not None and self.model not in served:
            raise TargetUnreachableError(
                f"the server at {self._base} does not serve model {self.model!r} (GET "
                f"{models_url} lists: {', '.join(served) or 'none'}); pass one of those "
                "with --model, or leave it out to use the first"
            )

    async def send(self, shape: RequestShape) -> Reply:
        body = self._bodies.get(shape)
        if body is None:
            body = self._encode(shape)
        session = self._session
        if session is None:
            raise not_connected(self)
        async with session.post(self._post_url, data=body) as resp:
            if resp.status != 200:
                return failed_reply(resp.status, await resp.read())
            if not self._stream:
                return self._whole_reply(await resp.read())
            return await self._read_stream(resp.content)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _read_stream(self, content: aiohttp.StreamReader) -> Reply:
        times: list[float] = []
        reply = Reply(chunk_times=times)
        texts: list[str] = []
        usage: int | None = None
        async for line in content:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == b"[DONE]":
                await content.read()  # the rest (normally nothing), so the connection is reused
                reply.output_tokens = self._count(texts) if usage is None else usage
                return reply
            chunk = json.loads(data)
            if chunk.get("error"):
                return Reply(ok=False, error=f"stream error: {_message(chunk['error'])}")
            text = self._content(chunk)
            if text:
                now = time.perf_counter()
                if reply.first_token_at is None:
                    reply.first_token_at = now
                times.append(now)
                texts.append(text)
            counted = chunk.get("usage") or {}
            tokens = counted.get("completion_tokens")
            if isinstance(tokens, int):
                usage = tokens
            prompt = counted.get("prompt_tokens")
            if isinstance(prompt, int):
                reply.prompt_tokens = prompt
        return Reply(
            ok=False, error="stream ended without data: [DONE]", output_tokens=self._count(texts)
        )

    def _content(self, chunk: dict[str, Any]) -> str:
        """The text a streamed chunk carries ("" for none)."""
        choices = chunk.get("choices")
        if not choices:
            return ""
        if self._chat:
            delta = choices[0].get("delta") or {}
            return _text(delta.get("content")) + _text(delta.get("reasoning_content"))
        return _text(choices[0].get("text"))

    def _count(self, texts: Sequence[str]) -> int:
        """Output tokens the server did not count: its text under the run's tokenizer."""
        if not texts:
            return 0
        tokenizer = self._tokenizer or load_tokenizer(self._tokenizer_spec)
        return len(tokenizer.encode("".join(texts)))

    def _whole_reply(self, body: bytes) -> Reply:
        doc = json.loads(body)
        counted = doc.get("usage") or {}
        tokens, prompt = counted.get("completion_tokens"), counted.get("prompt_tokens")
        if not isinstance(tokens, int):
            choices = doc.get("choices") or [{}]
            answer = (choices[0].get("message") or {}) if self._chat else choices[0]
            tokens = self._count([_text(answer.get("content" if self._chat else "text"))])
        return Reply(
            output_tokens=tokens, prompt_tokens=prompt if isinstance(prompt, int) else None
        )

    def _encode(self, shape: RequestShape) -> bytes:
        if self.model is None:
            raise not_connected(self)
        doc: dict[str, Any] = {"model": self.model}
        text = prompt_words(shape.prompt_tokens) if shape.prompt is None else shape.prompt
        turns = (*shape.history, text)
        if self._chat:
            roles = ("user", "assistant")
            doc["messages"] = [{"role": roles[k % 2], "content": t} for k, t in enumerate(turns)]
        else:
            doc["prompt"] = TURN_SEPARATOR.join(turns)
        doc["max_tokens"] = shape.output_tokens or self._default_max_tokens
        if self._ignore_eos:
            doc["ignore_eos"] = True
        doc["stream"] = self._stream
        if self._stream:
            doc["stream_options"] = {"include_usage": True}
        doc.update(self._extra_body)
        body = orjson.dumps(doc)
        self._bodies[shape] = body
        return body


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


def _listed_models(doc: Any) -> list[str] | None:
    """The model ids a ``/models`` answer lists; None when it is not the usual form."""
    try:
        return [str(m["id"]) for m in doc["data"]]
    except (KeyError, TypeError):
        return None


def _first_model(doc: Any, url: str) -> str:
    try:
        return str(doc["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise TargetError(
            f"GET {url} lists no models; pass the model name explicitly (model=...)"
        ) from None
