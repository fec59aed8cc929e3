"""The fake server's fast path: v2 infer requests answered straight from httptools.

A load generator spends most of a benchmark on one route, ``POST .../infer``, and a
general-purpose server's routing, request and response objects cost more per request
than the fake model itself. This asyncio protocol parses HTTP/1.1 with httptools
(llhttp), answers infer requests for the served model (the same ``FakeModel`` the v2
routes of ``v2.server`` serve, in its two steps, with their decoding, counts and error
answers), and hands every other request (metadata, metrics, OpenAI, a bad
token, a body over the bound, chunked bodies) to aiohttp: the connection's protocol
is swapped for aiohttp's and the request's bytes are replayed into it, so from then on
aiohttp serves that connection with every route and check it has.

Answers keep request order (pipelined infer requests are fine). One case is refused: a
non-infer request pipelined behind another on the same connection, whose bytes cannot be
separated from the one before; it gets a 400 naming the fix, and the connection closes.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from ridgeline.errors import InferFailed, InvalidRequest
from ridgeline.fakeserver.engine import SHUT_DOWN, Outcome
from ridgeline.fakeserver.model import FakeModel
from ridgeline.v2.connections import GuardedConnection
from ridgeline.v2.describe import VERSION
from ridgeline.v2.http_codec import (
    HEADER_LENGTH,
    Answer,
    InferRequest,
    decode_body,
    error_answer,
    infer_answer,
)
from ridgeline.v2.server import RequestLog, Served, failure_answer
from ridgeline.v2.tensors import Array

_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    413: b"Payload Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()


@dataclass(frozen=True, slots=True)
class InFlight:
    """An infer request handed to the engine, waiting for its batch."""

    req: InferRequest
    rows: int
    arrays: list[Array]
    began: float
    waiting: Outcome | asyncio.Future[Outcome]


class InferCore:
    """The v2 infer route without a server library, as ``v2.server``'s: a body decoded
    (or refused and counted), the model's request submitted, its outcome answered."""

    def __init__(self, model: FakeModel, served: Served) -> None:
        self.model, self.served, self.max_body = model, served, served.max_bytes

    def begin(self, body: bytes, header_length: str | None, began: float) -> Answer | InFlight:
        """An answer at once (a bad request), or the request in flight."""
        try:
            d = decode_body(self.model, body, header_length, self.max_body)
        except InvalidRequest as e:
            self.served.refused("invalid")
            return error_answer(str(e), 400)
        return InFlight(d.request, d.rows, d.arrays, began, self.model.submit(d.rows))

    def finish(self, flight: InFlight, outcome: Outcome) -> Answer:
        """The answer once the engine has decided ``outcome``."""
        try:
            outputs = self.model.answer(flight.rows, flight.arrays, outcome, flight.began)
        except InferFailed as e:
            return failure_answer(e)
        return infer_answer(self.model, flight.req, outputs, VERSION)


_TWO_AUTHORIZATIONS = b"\x00two Authorization headers"


class _HandOff(Exception):
    """Raised inside a parser callback to stop parsing and give the connection away."""


class _Slot:
    """One answer to send, in request order."""

    __slots__ = ("data", "held", "keep_alive")

    def __init__(self, keep_alive: bool, held: int = 0) -> None:
        self.keep_alive = keep_alive
        self.data: bytes | None = None
        self.held = held
        """Body bytes the guard holds for this request until its answer is made."""


class FastV2Protocol(asyncio.Protocol):
    """One client connection: infer requests here, anything else handed to aiohttp."""

    def __init__(
        self,
        core: InferCore,
        paths: frozenset[bytes],
        fallback: Callable[[], asyncio.Protocol],
        token: str | None,
        connection: GuardedConnection,
        log: RequestLog,
    ) -> None:
        self._core = core
        self._paths = paths
        self._fallback = fallback
        self._auth = None if token is None else f"Bearer {token}".encode()
        self._conn = connection
        """The guard in front (``v2.connections``): told when a request moves on."""
        self._log = log
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._slots: deque[_Slot] = deque()
        self._raw: list[bytes] | None = None
        """This request's bytes so far, when it began at the start of a read."""
        self._in_message = False
        self._headers_done = False
        self._completed_this_read = False
        self._url = b""
        self._body: list[bytes] = []
        self._header_length: str | None = None
        self._authorization = b""
        self._content_length: int | None = None
        self._plain = True
        """No header that asks for aiohttp (Expect, Transfer-Encoding, Upgrade)."""
        self._closed = False
        self._refused = False
        self._held = 0
        """Body bytes held for the request being read (its Content-Length)."""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._conn.guard.let_go(self._held)  # a body that never came whole
        self._held = 0

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_message:
            self._raw = [data]
        elif self._raw is not None:
            self._raw.append(data)
        self._completed_this_read = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, _HandOff):
                self._hand_off()
            else:  # a fault of ours in another callback: answered, logged, closed
                self._log.exception("error answering a request", exc_info=e.__context__)
                self._refuse(f"internal error ({type(e.__context__).__name__})", 500)
        except httptools.HttpParserError as e:
            self._refuse(f"malformed HTTP request: {e}")

    def close(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._in_message = True
        self._headers_done = False
        if self._completed_this_read:
            self._raw = None  # pipelined: began in the middle of a read
        self._url = b""
        self._body = []
        self._header_length = None
        self._authorization = b""
        self._content_length = None
        self._plain = True

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self._content_length = int(value) if value.isdigit() else None
        elif name == _HEADER_LENGTH:
            self._header_length = value.decode("latin-1")
        elif name == b"authorization":
            # two: matching neither, handed to the route, which refuses them (one
            # reading trusting the first and another the last is how a check is bypassed)
            self._authorization = value if not self._authorization else _TWO_AUTHORIZATIONS
        elif name in (b"expect", b"transfer-encoding", b"upgrade"):
            self._plain = False

    def on_headers_complete(self) -> None:
        path = self._url.partition(b"?")[0]
        length = self._content_length
        if (
            self._parser.get_method() != b"POST"
            or path not in self._paths
            or not self._plain
            or length is None
            or length > self._core.max_body
            or (self._auth is not None and not hmac.compare_digest(self._authorization, self._auth))
            or not self._conn.guard.hold(length)  # no room: the route answers 503
        ):
            raise _HandOff
        self._held = length
        self._headers_done = True
        self._conn.headers_in()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._completed_this_read = True
        self._conn.body_in()
        keep = self._parser.should_keep_alive() and not self._conn.guard.draining
        slot = _Slot(keep, self._held)
        self._held = 0
        self._slots.append(slot)
        try:
            step = self._core.begin(b"".join(self._body), self._header_length, time.perf_counter())
            if isinstance(step, Answer):
                answer = step
            elif isinstance(step.waiting, Outcome):
                answer = self._core.finish(step, step.waiting)
            else:
                step.waiting.add_done_callback(lambda f: self._done(slot, step, f))
                return
        except Exception as e:  # a fault of ours still gets its answer
            answer = self._fault(slot, e)
        self._answer(slot, answer)

    # answers
    def _done(self, slot: _Slot, step: InFlight, fut: asyncio.Future[Outcome]) -> None:
        outcome = SHUT_DOWN if fut.cancelled() else fut.result()
        try:
            answer = self._core.finish(step, outcome)
        except Exception as e:  # as in on_message_complete
            answer = self._fault(slot, e)
        self._answer(slot, answer)

    def _fault(self, slot: _Slot, error: Exception) -> Answer:
        """A fault of the server's own: logged (its traceback once per exception type),
        answered 500 in its turn, and the connection closed after it; never a connection
        dropped without an answer, nor one left waiting."""
        self._log.exception("error answering a request", exc_info=error)
        slot.keep_alive = False
        return error_answer(f"internal error ({type(error).__name__}); see the server's log", 500)

    def _answer(self, slot: _Slot, answer: Answer) -> None:
        self._conn.guard.let_go(slot.held)
        slot.held = 0
        if self._conn.guard.draining:
            slot.keep_alive = False  # the server is stopping: closed once answered
        head = [
            b"HTTP/1.1 %d %s\r\n" % (answer.status, _REASONS.get(answer.status, b"Error")),
            b"Content-Type: %s\r\n" % answer.content_type.encode(),
            b"Content-Length: %d\r\n" % len(answer.body),
        ]
        if answer.header_length is not None:
            head.append(b"%s: %d\r\n" % (HEADER_LENGTH.encode(), answer.header_length))
        if not slot.keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        slot.data = b"".join([*head, answer.body])
        self._flush()

    def _flush(self) -> None:
        slots, transport = self._slots, self._transport
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            if self._closed or transport is None:
                continue
            transport.write(cast(bytes, slot.data))
            if not slot.keep_alive:
                self.close()
        if not slots:
            if not self._in_message:
                self._conn.idle()
            elif self._headers_done:
                self._conn.headers_in()
            else:
                self._conn.heading()

    def _hand_off(self) -> None:
        if self._raw is None or self._slots or self._transport is None:
            self._refuse(
                "a non-infer request pipelined behind another; send it on its own "
                "connection or wait for the previous answer"
            )
            return
        raw, self._raw = b"".join(self._raw), None
        self._conn.replace(self._fallback(), raw)

    def _refuse(self, message: str, status: int = 400) -> None:
        self._refused = True
        slot = _Slot(keep_alive=False)
        self._slots.append(slot)
        self._answer(slot, error_answer(message, status))
