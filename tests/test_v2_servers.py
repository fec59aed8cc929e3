"""Malformed v2 requests against real servers on loopback: the fake server (its httptools
fast path and its aiohttp route) and ``ridgeline serve``'s ``PlanServer``, over HTTP and
gRPC. Each gets a 4xx (INVALID_ARGUMENT) naming what was wrong, the server goes on
serving, its log holds no traceback, and a request that declares more than it carries
leaves the server's peak memory where it was."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import pytest
from tritonclient.grpc import service_pb2

from _timing import running_process
from ridgeline.fakeserver import FakeServer, running_in_process
from ridgeline.pipeline.plan import Plan, dump_plan
from ridgeline.policies.batching import BatchingConfig
from ridgeline.serve.runtime import PlanServer
from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2.spec import TensorSpec

TEXT = TensorSpec("TEXT", "BYTES", (-1, -1))
WIDE = TensorSpec("INPUT0", "FP32", (-1, -1))
SPECS = (WIDE, TEXT)
FAKE = LatencyModel(
    base_ms=0.0,
    per_item_ms=0.0,
    inputs=SPECS,
    outputs=(dataclasses.replace(WIDE, name="OUTPUT0"), dataclasses.replace(TEXT, name="ECHO")),
    batching=BatchingConfig(max_batch_size=8),
)
SYNTHETIC = {
    "base_ms": 0,
    "per_item_ms": 0,
    "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in SPECS],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "ECHO", "datatype": "BYTES", "shape": [-1, -1]},
    ],
}
PLAN = {
    "name": "plan",
    "slo_ms": 10_000,
    "tasks": {
        "fake": {  # a task is a model too: the fake server's name, so one table fits both
            "segment": {"kind": "cpu", "cores": 1},
            "latency_budget_ms": 10_000,
            "variant": "synthetic",
            "synthetic": SYNTHETIC,
            "batch_size": 8,
        }
    },
}


def tensors(number: Any = None, text: Any = None, **extra: Any) -> bytes:
    """A request for both inputs; ``number``/``text`` replace a tensor's fields."""
    x = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
    t = {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}
    return orjson.dumps({"inputs": [{**x, **(number or {})}, {**t, **(text or {})}], **extra})


GOOD = tensors()
MALFORMED = [
    # item 1: a BYTES element given as an integer once became bytes(n)
    (tensors(text={"data": [1_000_000_000]}), "data holds a number (1000000000); BYTES"),
    # a declared shape far over the body bound, with little data
    (tensors(number={"shape": [1, 10**9]}), "1000000000 FP32 elements"),
    (tensors(text={"shape": [1, 10**9]}), "1000000000 BYTES elements"),
    # item 3: malformed outputs
    (tensors(outputs=5), '"outputs" must be a list of objects'),
    (tensors(outputs=True), '"outputs" must be a list of objects'),
    (tensors(outputs=[{"name": []}]), 'output 0 must be an object with a "name" string'),
    (tensors(outputs=[{"parameters": 3}]), 'output 0 must be an object with a "name" string'),
    (tensors(outputs=[{"name": "ECHO", "parameters": 3}]), '"parameters" must be an object'),
    (tensors(parameters={"binary_data_output": "yes"}), "must be true or false"),
    (tensors(id={"a": 1}), 'request "id" must be a string'),
    # item 11: null is not NaN
    (tensors(number={"data": [None, 1.0]}), "data holds null; FP32 elements are numbers"),
    (tensors(number={"data": ["1", "2"]}), "data holds a string ('1')"),
    (tensors(number={"datatype": 5}), 'needs a "datatype" string'),
    (tensors(number={"shape": "1,2"}), 'needs a "shape", a list of integers'),
    (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
]


async def post(session: aiohttp.ClientSession, url: str, body: bytes, chunked: bool) -> Any:
    async def chunks() -> AsyncIterator[bytes]:
        yield body

    data: Any = chunks() if chunked else body
    async with session.post(url, data=data) as resp:
        return resp.status, await resp.read()


async def assert_each_is_a_400_and_serving_goes_on(url: str, *, chunked: bool = False) -> None:
    async with aiohttp.ClientSession() as session:
        for raw, says in MALFORMED:
            status, answer = await post(session, url, raw, chunked)
            assert status == 400, (raw[:80], answer)
            message = orjson.loads(answer)["error"]
            assert says in message and "\n" not in message, (raw[:80], message)
            status, answer = await post(session, url, GOOD, chunked)
            assert status == 200, answer
            echo = {o["name"]: o["data"] for o in orjson.loads(answer)["outputs"]}
            assert echo == {"OUTPUT0": [2.0, 4.0], "ECHO": ["hi"]}


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    async with FakeServer(FAKE) as server:
        yield server


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[PlanServer]:
    async with PlanServer(Plan.model_validate(PLAN), tmp_path, http_port=0, grpc_port=0) as s:
        yield s


async def test_the_fake_servers_fast_path_answers_every_malformed_request(
    fake: FakeServer,
) -> None:
    await assert_each_is_a_400_and_serving_goes_on(f"{fake.model_url}/infer")


async def test_the_fake_servers_aiohttp_route_answers_every_malformed_request(
    fake: FakeServer,
) -> None:
    """A chunked body is handed from the fast path to aiohttp's route."""
    await assert_each_is_a_400_and_serving_goes_on(f"{fake.model_url}/infer", chunked=True)


async def test_serve_answers_every_malformed_request(served: PlanServer) -> None:
    await assert_each_is_a_400_and_serving_goes_on(f"{served.model_url('fake')}/infer")


# --- gRPC -------------------------------------------------------------------------------


def grpc_request(**fields: Any) -> bytes:
    r = service_pb2.ModelInferRequest(model_name="fake")
    x = r.inputs.add(name="INPUT0", datatype="FP32", shape=fields.get("shape", [1, 2]))
    x.contents.fp32_contents.extend([1.0, 2.0])
    t = r.inputs.add(name="TEXT", datatype=fields.get("text", "BYTES"), shape=[1, 1])
    t.contents.bytes_contents.append(b"hi")
    for name in fields.get("outputs", []):
        r.outputs.add(name=name)
    raw: bytes = r.SerializeToString()
    return raw


GRPC_MALFORMED = [
    (b"\xff\xff\xff", "not a valid protobuf message"),
    (b"\x0a\x05fak", "not a valid protobuf message"),
    (grpc_request(shape=[1, 10**9]), "1000000000 FP32 elements"),
    (grpc_request(shape=[1, -3]), "has shape [1, -3]"),
    (grpc_request(text="FP32"), "has datatype FP32; the model expects BYTES"),
    (grpc_request(outputs=["nope"]), "unknown outputs ['nope']"),
]


def assert_each_grpc_request_is_invalid_and_serving_goes_on(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for raw, says in GRPC_MALFORMED:
            with pytest.raises(grpc.RpcError) as caught:
                infer(raw, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            assert says in caught.value.details()
            answer = service_pb2.ModelInferResponse.FromString(infer(grpc_request(), timeout=10))
            assert [o.name for o in answer.outputs] == ["OUTPUT0", "ECHO"]


async def test_the_fake_server_answers_every_malformed_grpc_request(fake: FakeServer) -> None:
    await asyncio.to_thread(assert_each_grpc_request_is_invalid_and_serving_goes_on, fake.grpc_port)


async def test_serve_answers_every_malformed_grpc_request(served: PlanServer) -> None:
    assert served.grpc_port is not None
    await asyncio.to_thread(
        assert_each_grpc_request_is_invalid_and_serving_goes_on, served.grpc_port
    )


# --- the log --------------------------------------------------------------------------

BAD_HTTP = [
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
    b"POST /v2/models/fake/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


async def send_raw(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


@pytest.fixture(params=["fake server", "serve"])
async def http_port(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[int]:
    if request.param == "serve":
        plan = Plan.model_validate(PLAN)
        async with PlanServer(plan, tmp_path, http_port=0, grpc_port=None) as served:
            yield served.http_port
    else:
        async with FakeServer(FAKE, grpc_port=None) as fake:
            yield fake.http_port


async def test_a_malformed_http_request_logs_one_debug_line_and_no_traceback(
    http_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for raw in BAD_HTTP * 3:
        status_line = (await send_raw(http_port, raw)).split(b"\r\n")[0]
        assert re.fullmatch(rb"HTTP/1\.[01] 400 .*", status_line), status_line
    async with aiohttp.ClientSession() as session:
        assert (
            await post(session, f"http://127.0.0.1:{http_port}/v2/models/fake/infer", GOOD, False)
        )[0] == 200
    http = [r for r in caplog.records if r.name.startswith(("aiohttp", "ridgeline.v2"))]
    assert all(r.exc_info is None and r.levelno <= logging.DEBUG for r in http), [
        (r.name, r.levelname, r.getMessage()) for r in http
    ]
    assert len(http) <= len(BAD_HTTP) * 3
    assert all("\n" not in r.getMessage() for r in http)


# --- memory ---------------------------------------------------------------------------


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak since the last reset) of a process, in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+)


ATTACKS = [
    tensors(text={"data": [1_000_000_000]}),  # once bytes(10**9): a 1 GB answer
    tensors(text={"shape": [1, 10**9], "data": ["a"] * 4}),
    tensors(number={"shape": [1, 10**9], "data": [0.0] * 4}),
    tensors(text={"data": [[1_000_000_000]]}),
]


async def peak_over_idle_mib(pid: int, url: str, grpc_port: int) -> float:
    """How far the server's peak RSS rises over its idle RSS while it answers ATTACKS
    (each 400) and their gRPC twins (each INVALID_ARGUMENT)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm: every code path the attacks take has run once
            assert (await post(session, url, GOOD, False))[0] == 200
            assert (await post(session, url, ATTACKS[0], False))[0] == 400
        reset_peak(pid)
        idle = memory_kib(pid)["VmRSS"]
        for raw in ATTACKS * 3:
            status, answer = await post(session, url, raw, False)
            assert status == 400, answer
    await asyncio.to_thread(assert_each_grpc_request_is_invalid_and_serving_goes_on, grpc_port)
    return (memory_kib(pid)["VmHWM"] - idle) / 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
async def test_the_fake_servers_peak_memory_stays_within_50_mb_of_idle() -> None:
    with running_in_process(FAKE) as urls:
        (child,) = [p for p in multiprocessing.active_children() if p.name == "fakeserver-fake"]
        assert child.pid is not None and urls.grpc_port is not None
        rise = await peak_over_idle_mib(child.pid, f"{urls.model_url}/infer", urls.grpc_port)
    assert rise < 50, f"peak RSS rose {rise:.0f} MiB over idle"


@contextlib.contextmanager
def serving_in_process(tmp_path: Path) -> Iterator[tuple[int, str, int]]:
    """``ridgeline serve`` on PLAN in its own process: (pid, infer URL, gRPC port)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(dump_plan(Plan.model_validate(PLAN)))
    cmd = [sys.executable, "-m", "ridgeline", "serve", str(plan), "--port", "0", "--grpc-port", "0"]
    with running_process(cmd) as (proc, stdout):
        http = re.search(r"v2 HTTP (http://[^/]+)", stdout.wait_for("v2 HTTP", timeout=120))
        grpc_line = re.search(r"v2 gRPC\s+\S+:(\d+)", stdout.wait_for("v2 gRPC", timeout=10))
        assert http is not None and grpc_line is not None
        yield proc.pid, f"{http.group(1)}/v2/models/fake/infer", int(grpc_line.group(1))


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
async def test_serves_peak_memory_stays_within_50_mb_of_idle(tmp_path: Path) -> None:
    with serving_in_process(tmp_path) as (pid, url, grpc_port):
        rise = await peak_over_idle_mib(pid, url, grpc_port)
    assert rise < 50, f"peak RSS rose {rise:.0f} MiB over idle"


INFER = "POST /v2/models/fake/infer HTTP/1.1\r\nHost: x\r\n"
CLOSE = "Connection: close\r\nContent-Length: 2\r\n"
RAW_ATTACKS = [  # each read to its close: the framing ones close, the rest ask to
    f"{INFER}Content-Length: {'9' * 5000}\r\n\r\n".encode(),
    f"{INFER}Content-Length: 99999999999999999999\r\n\r\n".encode(),
    f"{INFER}Content-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}".encode(),
    f"{INFER}{CLOSE}Inference-Header-Content-Length: {'9' * 5000}\r\n\r\n{{}}".encode(),
    f"{INFER}{CLOSE}Inference-Header-Content-Length: \xff\r\n\r\n{{}}".encode("latin-1"),
]


async def test_the_fast_path_answers_malformed_http_framing_with_a_400(fake: FakeServer) -> None:
    for raw in RAW_ATTACKS:
        status_line = (await send_raw(fake.http_port, raw)).split(b"\r\n")[0]
        assert re.fullmatch(rb"HTTP/1\.[01] 400 .*", status_line), (raw[:60], status_line)
    async with aiohttp.ClientSession() as session:
        assert (await post(session, f"{fake.model_url}/infer", GOOD, False))[0] == 200


OPENAI_MALFORMED = [
    ({"prompt": "hi", "stream": "yes"}, '"stream" must be true or false'),
    ({"prompt": "hi", "model": ["fake"]}, '"model" must be a string'),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens must be an integer"),
    (b"[" * 5000 + b"]" * 5000, "request body must be a JSON object"),
]


async def test_the_fake_openai_routes_answer_malformed_requests(fake: FakeServer) -> None:
    url = f"{fake.openai_url}/completions"
    deep = b'{"max_tokens": 1, "prompt": ' + b"[" * 1000 + b'"word"' + b"]" * 1000 + b"}"
    async with aiohttp.ClientSession() as session:
        for doc, says in OPENAI_MALFORMED:
            raw = doc if isinstance(doc, bytes) else orjson.dumps(doc)
            async with session.post(url, data=raw) as resp:
                assert resp.status == 400
                assert says in (await resp.json())["error"]["message"]
        # a prompt nested 1,000 deep is no shape the API takes (issue 33, fault 18): refused,
        # read without recursion, and the server goes on answering
        async with session.post(url, data=deep) as resp:
            assert resp.status == 400
            assert '"prompt" must be a string' in (await resp.json())["error"]["message"]
        async with session.post(url, json={"max_tokens": 1, "prompt": ["word"]}) as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["prompt_tokens"] == 1
