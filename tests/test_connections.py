"""Connections on loopback, as an attacker would hold them: idle sockets past the bound,
a slow-loris, a slow body, gRPC sockets that never speak; for the fake server (its fast
path and aiohttp) and ``ridgeline serve`` alike. Also the port check and the limits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from _serve_backends import doubler_plan_doc
from _timing import await_until
from ridgeline.errors import ConfigError
from ridgeline.fakeserver import FakeServer, load_preset
from ridgeline.pipeline.plan import Plan
from ridgeline.serve.runtime import PlanServer
from ridgeline.v2.limits import ConnectionLimits, check_port

MODEL = load_preset("fast")
FAST = ConnectionLimits(idle_timeout_s=1.5, header_timeout_s=1.0, body_timeout_s=1.0)
READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"


def _plan() -> Plan:
    return Plan.model_validate(doubler_plan_doc())


@contextlib.asynccontextmanager
async def fake(limits: ConnectionLimits, **kw: Any) -> AsyncIterator[tuple[int, str]]:
    async with FakeServer(MODEL, limits=limits, **kw) as s:
        yield s.http_port, "/v2/models/fake/infer"


@contextlib.asynccontextmanager
async def serve(limits: ConnectionLimits, **kw: Any) -> AsyncIterator[tuple[int, str]]:
    async with PlanServer(_plan(), Path("."), http_port=0, grpc_port=0, limits=limits, **kw) as s:
        assert s.http_port is not None
        yield s.http_port, "/v2/models/double/infer"


SERVERS = {"fake": fake, "serve": serve}
Server = Callable[..., contextlib.AbstractAsyncContextManager[tuple[int, str]]]


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _status(reader: asyncio.StreamReader, timeout: float) -> int:
    """The status of the next answer, or 0 when the server closed without one."""
    line = await asyncio.wait_for(reader.readline(), timeout)
    return int(line.split()[1]) if line else 0


async def _closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes the connection within ``timeout`` (all it sends read)."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("kind", SERVERS)
async def test_idle_sockets_past_the_bound_do_not_lock_out_a_new_client(kind: str) -> None:
    limits = FAST.model_copy(update={"max_connections": 4, "idle_timeout_s": 30.0})
    async with SERVERS[kind](limits) as (port, _):
        idle = [await _open(port) for _ in range(8)]  # twice the bound, saying nothing
        began = time.monotonic()
        reader, writer = await _open(port)
        writer.write(READY)
        assert await _status(reader, 10) == 200
        assert time.monotonic() - began < limits.idle_timeout_s  # not waiting them out
        # the oldest idle ones made room: at most the bound are still open
        still_open = [not await _closed_within(r, 0.2) for r, _ in idle]
        assert sum(still_open) <= limits.max_connections - 1
        assert still_open[-1]  # the newest idle one was kept
        for _, w in [*idle, (reader, writer)]:
            w.close()


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_slow_loris_is_answered_408_and_closed_after_the_header_timeout(
    kind: str,
) -> None:
    limits = FAST.model_copy(update={"header_timeout_s": 2.0})
    async with SERVERS[kind](limits) as (port, _):
        reader, writer = await _open(port)
        began = time.monotonic()
        sent = 0
        answer = asyncio.ensure_future(reader.read(65536))
        while not answer.done() and sent < len(READY) - 1:
            writer.write(READY[sent : sent + 1])  # one byte a second, never the whole
            sent += 1
            await asyncio.wait([answer], timeout=1.0)
        took = time.monotonic() - began
        first = answer.result() if answer.done() else b""
        assert first.startswith(b"HTTP/1.1 408"), first
        assert b"headers did not all come within 2 s" in first
        assert limits.header_timeout_s <= took < limits.header_timeout_s + 1.5
        assert sent < len(READY) - 1
        assert await _closed_within(reader, 2.0)
        writer.close()


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_slow_body_is_answered_408_and_closed_after_the_body_timeout(
    kind: str,
) -> None:
    async with SERVERS[kind](FAST) as (port, path):
        reader, writer = await _open(port)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        began = time.monotonic()
        writer.write(head.encode() + b'{"inputs"')  # and the rest never comes
        data = await asyncio.wait_for(reader.read(65536), 5.0)
        assert data.startswith(b"HTTP/1.1 408"), data
        assert b"body did not all come within 1 s" in data
        assert time.monotonic() - began >= FAST.body_timeout_s
        assert await _closed_within(reader, 2.0)
        writer.close()


@pytest.mark.parametrize("kind", SERVERS)
async def test_an_idle_keep_alive_connection_closes_after_the_idle_timeout(kind: str) -> None:
    async with SERVERS[kind](FAST) as (port, _):
        reader, writer = await _open(port)
        writer.write(READY)
        assert await _status(reader, 10) == 200
        began = time.monotonic()
        assert await _closed_within(reader, FAST.idle_timeout_s + 2.0)
        assert time.monotonic() - began >= FAST.idle_timeout_s - 0.3
        writer.close()


async def test_at_the_bound_the_slowest_body_makes_room_for_a_new_client() -> None:
    """Issue 33, fault 4: at the bound, connections whose bodies were still coming
    locked new clients out for the body timeout (30 s here). Now the one longest in its
    body is answered 503, naming why, and the new client is served."""
    limits = FAST.model_copy(update={"max_connections": 2, "body_timeout_s": 30.0})
    async with fake(limits) as (port, path):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n".encode()
        waiting = [await _open(port) for _ in range(2)]
        for _, w in waiting:
            w.write(head)  # headers in, body pending: not idle
        for _, w in waiting:
            await w.drain()
        reader, writer = await _open(port)
        writer.write(READY)
        assert await _status(reader, 10) == 200
        told = [await asyncio.wait_for(r.read(65536), 10) for r, _ in waiting[:1]]
        assert told[0].startswith(b"HTTP/1.1 503"), told
        assert b"bound of 2 connections and this one's body was the slowest" in told[0]
        for _, w in [*waiting, (reader, writer)]:
            w.close()


async def test_at_the_bound_with_every_connection_served_a_new_one_gets_503_naming_it() -> None:
    """Connections whose requests are being served (and whose clients read) are never
    closed to make room: a new connection then gets 503."""
    slow = MODEL.model_copy(update={"base_ms": 3000.0})  # one at a time, 3 s each
    limits = FAST.model_copy(update={"max_connections": 2})
    async with FakeServer(slow, limits=limits, grpc_port=None) as s:
        body = _infer_body("fake")
        infer = f"POST /v2/models/fake/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
        served = [await _open(s.http_port) for _ in range(2)]
        for _, w in served:
            w.write(f"{infer}\r\n\r\n".encode() + body)  # whole: being served
            await w.drain()
        reader, writer = await _open(s.http_port)
        data = await asyncio.wait_for(reader.read(65536), 5.0)
        assert data.startswith(b"HTTP/1.1 503"), data
        assert b"bound of 2 connections, none idle" in data
        for r, _ in served:  # both still answered
            assert await _status(r, 30) == 200
        for _, w in [*served, (reader, writer)]:
            w.close()


async def test_grpc_sockets_that_never_speak_are_closed_and_do_not_lock_out_a_client() -> None:
    limits = FAST.model_copy(update={"max_connections": 3, "idle_timeout_s": 5.0})
    async with FakeServer(MODEL, limits=limits) as s:
        silent = [await _open(s.grpc_port) for _ in range(6)]
        began = time.monotonic()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = await stub.ServerLive(
                service_pb2.ServerLiveRequest(), timeout=20, wait_for_ready=True
            )
        assert answer.live
        assert time.monotonic() - began < limits.idle_timeout_s
        for reader, _ in silent:  # past the bound, or past the handshake timeout: closed
            assert await _closed_within(reader, limits.header_timeout_s + 2.0)
        for _, w in silent:
            w.close()


@pytest.mark.parametrize("port", [70000, -1, 65536])
def test_a_port_out_of_range_is_a_config_error_for_every_server(port: int) -> None:
    with pytest.raises(ConfigError, match=f"HTTP port {port} is not a TCP port; give 0 to"):
        FakeServer(MODEL, http_port=port)
    with pytest.raises(ConfigError, match=f"gRPC port {port} is not a TCP port"):
        FakeServer(MODEL, grpc_port=port)
    with pytest.raises(ConfigError, match=f"HTTP port {port} is not a TCP port"):
        PlanServer(_plan(), Path("."), http_port=port, grpc_port=None)
    with pytest.raises(ConfigError, match=f"gRPC port {port} is not a TCP port"):
        PlanServer(_plan(), Path("."), http_port=0, grpc_port=port)


@given(st.integers() | st.booleans() | st.floats() | st.text())
def test_check_port_takes_0_to_65535_and_raises_only_config_error(value: Any) -> None:
    try:
        assert check_port(value) == value
    except ConfigError as e:
        assert "is not a TCP port; give 0 to 65535" in str(e)
        assert isinstance(value, bool) or not (isinstance(value, int) and 0 <= value <= 65535)


def test_the_connection_bound_never_exceeds_the_descriptor_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    bound = ConnectionLimits(max_connections=10**9).connection_bound()
    assert bound <= max(1, soft - 64) or soft == resource.RLIM_INFINITY
    assert ConnectionLimits(max_connections=3).connection_bound() == min(3, max(1, soft - 64))


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_client_in_use_outlives_every_timeout_on_one_connection(kind: str) -> None:
    """Requests every 0.4 s on one keep-alive connection, for longer than the header, body
    and idle timeouts together: each is answered, none is timed out."""
    limits = ConnectionLimits(idle_timeout_s=0.8, header_timeout_s=0.5, body_timeout_s=0.5)
    async with SERVERS[kind](limits) as (port, path):
        reader, writer = await _open(port)
        body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
        if kind == "fake":
            body = body.replace(b'"X"', b'"INPUT0"').replace(b"[1,4]", b"[1,16]")
            body = body.replace(b"[1,2,3,4]", b"[" + b",".join([b"1"] * 16) + b"]")
        infer = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        began = time.monotonic()
        for i in range(7):
            writer.write(READY if i % 2 else infer.encode() + body)
            assert await _status(reader, 10) == 200
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            await asyncio.sleep(0.4)  # the client's pace, not a synchronisation
        assert time.monotonic() - began > 2.5
        writer.close()


def _infer_body(kind: str) -> bytes:
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
    if kind == "fake":
        body = body.replace(b'"X"', b'"INPUT0"').replace(b"[1,4]", b"[1,16]")
        body = body.replace(b"[1,2,3,4]", b"[" + b",".join([b"1"] * 16) + b"]")
    return body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status = await _status(reader, 10)
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return status, await reader.readexactly(length)


@pytest.mark.parametrize("kind", SERVERS)
async def test_bodies_in_flight_past_their_byte_bound_are_refused_503(kind: str) -> None:
    """Issue 33, fault 5: four JSON bodies near the 64 MiB bound at once took 1.9 GB on
    ``serve``. The bytes of bodies held at once are bounded: a request whose body would
    pass the bound (here one held, its body still coming) is answered 503 naming it;
    once the first is answered, the next is served."""
    body = _infer_body(kind)
    bound = len(body) + len(body) // 2  # room for one body, not two
    limits = ConnectionLimits(max_body_bytes_in_flight=bound)
    async with SERVERS[kind](limits) as (port, path):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        held_r, held_w = await _open(port)
        held_w.write(head.encode() + body[:10])  # its headers: its bytes held from now
        await held_w.drain()
        refusals: list[bytes] = []

        async def refused() -> bool:
            reader, writer = await _open(port)
            writer.write(head.encode() + body)
            status, text = await _answer(reader)
            writer.close()
            if status == 503:
                refusals.append(text)
            return status == 503

        await await_until(refused, 10, "a second body refused while the first is held")
        assert b"--max-body-bytes-in-flight" in refusals[0]
        assert f"bound of {bound:,}".encode() in refusals[0]
        held_w.write(body[10:])  # the first body whole: served, and its bytes let go
        assert (await _answer(held_r))[0] == 200
        reader, writer = await _open(port)
        writer.write(head.encode() + body)
        assert (await _answer(reader))[0] == 200
        writer.close()
        held_w.close()
