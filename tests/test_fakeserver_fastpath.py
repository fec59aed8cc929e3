"""The fake server's HTTP fast path, over raw sockets: infer answered by httptools, every
other request handed to aiohttp mid-connection, answers in request order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httptools
import pytest

from _timing import await_until
from ridgeline.fakeserver import FakeServer, load_preset
from ridgeline.synthetic.model import LatencyModel

MODEL = load_preset("fast")
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
).encode()


def infer(rid: str, *, extra_headers: str = "", path: str = "/v2/models/fake/infer") -> bytes:
    body = BODY.replace(b'{"inputs"', b'{"id":"%s","inputs"' % rid.encode())
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra_headers}\r\n"
    ).encode() + body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


class Answers:
    """Parse a stream of HTTP answers from one connection."""

    def __init__(self) -> None:
        self.done: list[tuple[int, dict[str, str], bytes]] = []
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.done.append((status, self._headers, b"".join(self._body)))
        self._headers, self._body = {}, []


async def exchange(port: int, *requests: bytes, expect: int) -> tuple[Answers, bool]:
    """Send ``requests`` in one write; read until ``expect`` answers; and say whether the
    server then closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = Answers()
    writer.write(b"".join(requests))
    await writer.drain()
    while len(answers.done) < expect:
        chunk = await asyncio.wait_for(reader.read(65536), 5.0)
        if not chunk:
            break
        answers.parser.feed_data(chunk)
    try:
        closed = await asyncio.wait_for(reader.read(1), 0.3) == b""
    except TimeoutError:
        closed = False
    writer.close()
    return answers, closed


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    async with FakeServer(MODEL, grpc_port=None) as s:
        yield s


async def test_pipelined_infers_come_back_in_order(server: FakeServer) -> None:
    answers, closed = await exchange(
        server.http_port, *(infer(f"r{i}") for i in range(5)), expect=5
    )
    assert [json.loads(b)["id"] for _, _, b in answers.done] == [f"r{i}" for i in range(5)]
    assert json.loads(answers.done[0][2])["outputs"][0]["data"] == [2.0] * 16
    assert closed is False


async def test_infer_then_metadata_on_one_connection_hands_over_to_aiohttp(
    server: FakeServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    answers = Answers()
    for request in (infer("a"), get("/v2/models/fake"), infer("b"), get("/metrics")):
        writer.write(request)
        n = len(answers.done) + 1
        while len(answers.done) < n:
            answers.parser.feed_data(await asyncio.wait_for(reader.read(65536), 5.0))
    writer.close()
    statuses = [s for s, _, _ in answers.done]
    assert statuses == [200, 200, 200, 200]
    assert json.loads(answers.done[1][2])["name"] == "fake"
    assert json.loads(answers.done[2][2])["id"] == "b"
    assert b"nv_inference_request_success" in answers.done[3][2]


async def test_non_infer_pipelined_behind_an_infer_is_refused_with_the_fix(
    server: FakeServer,
) -> None:
    answers, closed = await exchange(server.http_port, infer("a"), get("/v2/models/fake"), expect=2)
    assert [s for s, _, _ in answers.done] == [200, 400]
    assert "own connection" in json.loads(answers.done[1][2])["error"]
    assert closed is True


async def test_connection_close_is_honoured(server: FakeServer) -> None:
    answers, closed = await exchange(
        server.http_port, infer("a", extra_headers="Connection: close\r\n"), expect=1
    )
    assert answers.done[0][0] == 200
    assert answers.done[0][1]["connection"] == "close"
    assert closed is True


async def test_bad_json_is_400_from_the_fast_path_and_serving_goes_on(server: FakeServer) -> None:
    bad = b"POST /v2/models/fake/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{x}"
    answers, closed = await exchange(server.http_port, bad, infer("ok"), expect=2)
    assert [s for s, _, _ in answers.done] == [400, 200]
    assert "not valid JSON" in json.loads(answers.done[0][2])["error"]
    assert closed is False


async def test_malformed_http_is_400_and_closed(server: FakeServer) -> None:
    answers, closed = await exchange(
        server.http_port, b"POST / HTTP/1.1\r\nHost x\r\n\r\n", expect=1
    )
    assert answers.done[0][0] == 400
    assert closed is True


async def test_token_and_body_bound_still_hold_on_the_fast_path() -> None:
    async with FakeServer(MODEL, grpc_port=None, token="s3cret", max_body_bytes=64) as s:
        answers, _ = await exchange(s.http_port, infer("a"), expect=1)
        assert answers.done[0][0] == 401
        auth = "Authorization: Bearer s3cret\r\n"
        answers, _ = await exchange(s.http_port, infer("b", extra_headers=auth), expect=1)
        assert answers.done[0][0] == 413
    async with FakeServer(MODEL, grpc_port=None, token="s3cret") as s:
        answers, _ = await exchange(s.http_port, infer("c", extra_headers=auth), expect=1)
        assert answers.done[0][0] == 200


async def test_two_authorization_headers_are_refused_whichever_comes_first() -> None:
    """Issue 33, fault 14: the fast path trusted the last of two ``Authorization``
    headers and every other route the first, so a proxy checking one could be walked
    past with the other. A request with two is refused, in either order."""
    right, wrong = "Authorization: Bearer s3cret\r\n", "Authorization: Bearer wrong\r\n"
    async with FakeServer(MODEL, grpc_port=None, token="s3cret") as s:
        for i, headers in enumerate((right + wrong, wrong + right, right + right)):
            answers, _ = await exchange(s.http_port, infer(str(i), extra_headers=headers), expect=1)
            status, _, body = answers.done[0]
            assert status == 401 and "two Authorization headers" in json.loads(body)["error"]


async def test_requests_waiting_when_the_server_stops_are_answered_503() -> None:
    slow = LatencyModel(name="fake", base_ms=5000.0)
    server = FakeServer(slow, grpc_port=None)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    writer.write(infer("a") + infer("b"))
    await writer.drain()
    engine = server.engine
    await await_until(lambda: engine.pending == 2, 10, "both requests in the engine")
    await server.stop()
    answers = Answers()
    while len(answers.done) < 2:
        chunk = await asyncio.wait_for(reader.read(65536), 5.0)
        if not chunk:
            break
        answers.parser.feed_data(chunk)
    writer.close()
    assert [s for s, _, _ in answers.done] == [503, 503]
    assert "shutting down" in json.loads(answers.done[0][2])["error"]
