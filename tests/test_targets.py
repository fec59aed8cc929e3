"""Target adapters against real servers on loopback: the fake inference server, and a
small recording HTTP server for the generic target's bodies."""

from __future__ import annotations

import json
import pickle
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from aiohttp import web

import ridgeline.targets as targets
from ridgeline.errors import ConfigError, TargetError, TargetUnreachableError, UnknownKindError
from ridgeline.fakeserver import FakeServer
from ridgeline.policies.batching import BatchingConfig
from ridgeline.synthetic.model import LatencyModel
from ridgeline.targets import (
    OK,
    HttpTarget,
    InProcessTarget,
    OpenAITarget,
    Reply,
    Target,
    TargetOptions,
    TensorSpec,
    V2GrpcTarget,
    V2HttpTarget,
    make_target,
    null_target,
)
from ridgeline.targets.http import render
from ridgeline.targets.v2_grpc import failed_reply as failed_grpc_reply
from ridgeline.workload.payloads import RequestShape

FAST = LatencyModel(
    name="m",
    base_ms=0.0,
    per_item_ms=0.0,
    ttft_ms=0.0,
    per_token_ms=0.0,
    batching=BatchingConfig(max_batch_size=8),
)
DEFAULT_INPUTS = (TensorSpec("INPUT0", "FP32", (-1, 16)),)


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    async with FakeServer(FAST, host="127.0.0.1", http_port=0, grpc_port=0) as srv:
        yield srv


@pytest.fixture
async def failing_server() -> AsyncIterator[FakeServer]:
    model = FAST.model_copy(update={"error_rate": 1.0})
    async with FakeServer(model, host="127.0.0.1", http_port=0, grpc_port=0) as srv:
        yield srv


@pytest.fixture
def dead_port() -> int:
    """A port on which nothing listens: bound, noted, closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def roundtrip(target: Target, *shapes: RequestShape) -> list[Reply]:
    await target.connect(4)
    try:
        return [await target.send(shape) for shape in shapes]
    finally:
        await target.close()


# --- v2 over HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "kind"), [("model_url", V2HttpTarget), ("grpc_url", V2GrpcTarget)])
async def test_v2_learns_inputs_from_metadata_and_infers(
    server: FakeServer, url: str, kind: type[Target]
) -> None:
    target = make_target(getattr(server, url))
    assert isinstance(target, kind)
    replies = await roundtrip(target, RequestShape(items=1), RequestShape(items=3))
    assert target.inputs == DEFAULT_INPUTS  # type: ignore[attr-defined]
    assert replies == [OK, OK]


async def test_v2_http_with_given_inputs(server: FakeServer) -> None:
    target = V2HttpTarget(server.http_url, "m", inputs=DEFAULT_INPUTS)
    assert await roundtrip(target, RequestShape(items=2)) == [OK]


async def test_v2_http_injected_error_is_a_failed_reply(failing_server: FakeServer) -> None:
    replies = await roundtrip(make_target(failing_server.model_url), RequestShape())
    assert replies == [Reply(ok=False, error="HTTP 500: injected error")]


async def test_v2_http_unknown_model_is_unreachable(server: FakeServer) -> None:
    url = f"{server.http_url}/v2/models/nosuchmodel"
    with pytest.raises(TargetUnreachableError, match=r"nosuchmodel.*check the model name"):
        await make_target(url).connect(1)


async def test_v2_http_bearer_token() -> None:
    async with FakeServer(FAST, http_port=0, grpc_port=0, token="s3cret") as srv:
        with pytest.raises(TargetUnreachableError, match="HTTP 401"):
            await make_target(srv.model_url).connect(1)
        authorised = make_target(srv.model_url, TargetOptions(token="s3cret"))
        assert await roundtrip(authorised, RequestShape()) == [OK]


# --- v2 over gRPC ------------------------------------------------------------------------------


async def test_v2_grpc_round_robins_a_channel_pool(server: FakeServer) -> None:
    target = V2GrpcTarget(server.grpc_url.removeprefix("grpc://").split("/")[0], "m")
    await target.connect(400)
    try:
        assert [await target.send(RequestShape()) for _ in range(8)] == [OK] * 8
    finally:
        await target.close()


async def test_v2_grpc_injected_error_is_a_failed_reply(failing_server: FakeServer) -> None:
    replies = await roundtrip(make_target(failing_server.grpc_url), RequestShape())
    assert replies == [Reply(ok=False, error="gRPC INTERNAL: injected error")]


async def test_v2_grpc_bearer_token() -> None:
    async with FakeServer(FAST, http_port=0, grpc_port=0, token="s3cret") as srv:
        with pytest.raises(TargetUnreachableError, match="UNAUTHENTICATED"):
            await make_target(srv.grpc_url).connect(1)
        authorised = make_target(srv.grpc_url, TargetOptions(token="s3cret"))
        assert await roundtrip(authorised, RequestShape()) == [OK]


@pytest.mark.parametrize(
    ("code", "details", "reply"),
    [
        (
            grpc.StatusCode.UNAVAILABLE,
            "dropped: deadline",
            Reply(ok=False, dropped=True, error="gRPC UNAVAILABLE: dropped: deadline"),
        ),
        (
            grpc.StatusCode.UNAVAILABLE,
            "queue full",
            Reply(ok=False, error="gRPC UNAVAILABLE: queue full"),
        ),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "dropped",
            Reply(ok=False, error="gRPC RESOURCE_EXHAUSTED: dropped"),
        ),
    ],
)
def test_v2_grpc_error_replies(code: grpc.StatusCode, details: str, reply: Reply) -> None:
    error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
    assert failed_grpc_reply(error) == reply


# --- OpenAI-compatible -------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_openai_streaming_times_first_token_and_counts(
    server: FakeServer, api: targets.openai.OpenAIApi
) -> None:
    target = make_target("openai+" + server.http_url, TargetOptions(model="m", openai_api=api))
    await target.connect(2)
    try:
        before = time.perf_counter()
        reply = await target.send(RequestShape(prompt_tokens=5, output_tokens=7))
        after = time.perf_counter()
    finally:
        await target.close()
    assert (reply.ok, reply.error, reply.output_tokens) == (True, None, 7)
    assert reply.first_token_at is not None and before < reply.first_token_at < after


async def test_openai_learns_model_and_runs_without_streaming(server: FakeServer) -> None:
    target = make_target("openai+" + server.http_url + "/v1", TargetOptions(stream=False))
    assert isinstance(target, OpenAITarget)
    [reply] = await roundtrip(target, RequestShape(prompt_tokens=3, output_tokens=4))
    assert target.model == "m"
    assert reply == Reply(output_tokens=4, prompt_tokens=3)  # both from the usage


async def test_openai_a_model_the_server_does_not_list_fails_the_connect_check(
    server: FakeServer,
) -> None:
    target = make_target("openai+" + server.http_url + "/v1", TargetOptions(model="llama"))
    with pytest.raises(TargetUnreachableError, match=r"does not serve model 'llama'.*lists: m"):
        await target.connect(4)


async def test_openai_default_max_tokens(server: FakeServer) -> None:
    target = OpenAITarget(server.http_url + "/v1", default_max_tokens=3)
    [reply] = await roundtrip(target, RequestShape())
    assert (reply.ok, reply.output_tokens) == (True, 3)


async def test_openai_injected_error(failing_server: FakeServer) -> None:
    [reply] = await roundtrip(make_target("openai+" + failing_server.http_url), RequestShape())
    assert reply == Reply(ok=False, error="HTTP 500: injected error")


# --- generic HTTP ------------------------------------------------------------------------------

V2_TEMPLATE = (
    '{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [{items}, 16], '
    '"data": [' + ", ".join(["1.0"] * 16) + "]}]}"
)


async def test_http_template_reaches_the_v2_route(server: FakeServer) -> None:
    target = make_target(f"{server.model_url}/infer", TargetOptions(body=V2_TEMPLATE))
    assert isinstance(target, HttpTarget)  # a body template asks for the generic target
    assert await roundtrip(target, RequestShape(items=1)) == [OK]


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[tuple[str, str, str, bytes]]]]:
    """An HTTP server that records (method, path, content type, body) and answers by path."""
    seen: list[tuple[str, str, str, bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, request.content_type, await request.read()))
        if request.path == "/fail":
            return web.json_response({"error": "dropped: deadline"}, status=503)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_http_substitutes_each_shape(
    recorder: tuple[str, list[tuple[str, str, str, bytes]]],
) -> None:
    url, seen = recorder
    target = make_target(
        f"{url}/predict",
        TargetOptions(body='{"n": {items}, "p": "{prompt}", "max": {output_tokens}}'),
    )
    shapes = [RequestShape(2, 3, 4), RequestShape(1, 1, 8), RequestShape(2, 3, 4)]
    assert await roundtrip(target, *shapes) == [OK, OK, OK]
    assert seen == [
        ("POST", "/predict", "application/json", b'{"n": 1, "p": "the", "max": 0}'),  # the check
        ("POST", "/predict", "application/json", b'{"n": 2, "p": "the quick brown", "max": 4}'),
        ("POST", "/predict", "application/json", b'{"n": 1, "p": "the", "max": 8}'),
        ("POST", "/predict", "application/json", b'{"n": 2, "p": "the quick brown", "max": 4}'),
    ]


async def test_http_failure_and_drop(
    recorder: tuple[str, list[tuple[str, str, str, bytes]]],
) -> None:
    url, seen = recorder
    target = HttpTarget(f"{url}/fail", method="get", health_url=f"{url}/health")
    [reply] = await roundtrip(target, RequestShape())
    assert reply == Reply(ok=False, dropped=True, error="HTTP 503: dropped: deadline")
    assert [(m, p) for m, p, _, _ in seen] == [("GET", "/health"), ("GET", "/fail")]


async def test_http_a_path_the_server_refuses_fails_the_connect_check(
    recorder: tuple[str, list[tuple[str, str, str, bytes]]], server: FakeServer
) -> None:
    """A misspelt v2 path (``/v2/model/NAME``) is a generic endpoint the server answers
    404: the connect check says so, with the server's message, before any step."""
    target = make_target(server.http_url + "/v2/model/m")
    assert isinstance(target, HttpTarget)
    with pytest.raises(TargetUnreachableError, match=r"answered HTTP 404.*/v2/models/NAME"):
        await target.connect(4)
    url, seen = recorder
    ok = make_target(f"{url}/anything")
    await ok.connect(4)  # 2xx: it passes, and the check was one request
    await ok.close()
    assert [(m, p) for m, p, _, _ in seen] == [("POST", "/anything")]


def test_render_leaves_other_braces_alone() -> None:
    assert render('{"a": {items}, "b": {x}}', RequestShape(items=5)) == '{"a": 5, "b": {x}}'


def test_render_puts_a_prompts_text_in_json_quoted_and_in_one_pass() -> None:
    shape = RequestShape(prompt_tokens=3, prompt='say "{items}"\nnow', history=("hi", "yo"))
    body = render('{"p": {prompt_json}, "n": {items}}', shape)
    assert json.loads(body) == {"p": 'hi\n\nyo\n\nsay "{items}"\nnow', "n": 1}
    assert render("{prompt}", RequestShape(prompt_tokens=3)) == "the quick brown"


# --- in-process --------------------------------------------------------------------------------


async def test_in_process_sync_and_async_callables() -> None:
    calls: list[RequestShape] = []

    def sync_fn(shape: RequestShape) -> bool:
        calls.append(shape)
        return shape.items < 2

    async def async_fn(shape: RequestShape) -> Reply:
        calls.append(shape)
        return Reply(output_tokens=shape.output_tokens)

    small, big = RequestShape(items=1), RequestShape(items=2, output_tokens=9)
    assert await roundtrip(InProcessTarget(sync_fn), small, big) == [
        OK,
        Reply(ok=False, error="the in-process callable returned False"),
    ]
    assert await roundtrip(InProcessTarget(async_fn), big) == [Reply(output_tokens=9)]
    assert calls == [small, big, big]


async def test_null_target_returns_the_shared_ok() -> None:
    reply = (await roundtrip(null_target(), RequestShape()))[0]
    assert reply is OK


async def test_python_url_imports_the_callable() -> None:
    target = make_target("python://operator:truth")
    assert await roundtrip(target, RequestShape()) == [OK]


# --- unreachable -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/v2/models/m",
        "grpc://127.0.0.1:{port}/m",
        "openai+http://127.0.0.1:{port}/v1",
        "http://127.0.0.1:{port}/predict",
    ],
)
async def test_unreachable_target_fails_fast_naming_the_url(dead_port: int, url: str) -> None:
    target = make_target(url.format(port=dead_port))
    start = time.perf_counter()
    with pytest.raises(TargetUnreachableError, match=f"127.0.0.1:{dead_port}") as caught:
        await target.connect(1)
    assert time.perf_counter() - start < 2.0
    assert "check that the server is running" in str(caught.value)
    await target.close()


async def test_send_before_connect_says_so() -> None:
    with pytest.raises(TargetError, match="send was called before connect"):
        await V2HttpTarget("http://127.0.0.1:1", "m", inputs=DEFAULT_INPUTS).send(RequestShape())


# --- factory -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind", "where"),
    [
        ("http://h:8000/v2/models/resnet", V2HttpTarget, "http://h:8000/v2/models/resnet"),
        (
            "https://h/kserve/v2/models/bert/versions/3",
            V2HttpTarget,
            "https://h/kserve/v2/models/bert/versions/3",
        ),
        ("http://h:8000/v2/models/resnet/infer", V2HttpTarget, "http://h:8000/v2/models/resnet"),
        ("grpc://h:8001/resnet", V2GrpcTarget, "grpc://h:8001/resnet"),
        ("grpc://h:8001/v2/models/resnet/versions/2", V2GrpcTarget, "grpc://h:8001/resnet"),
        ("grpcs://h:443/resnet", V2GrpcTarget, "grpcs://h:443/resnet"),
        ("openai+http://h:8000", OpenAITarget, "http://h:8000/v1"),
        ("openai+https://h/api/v1/", OpenAITarget, "https://h/api/v1"),
        ("http://h:8080/predict?x=1", HttpTarget, "http://h:8080/predict?x=1"),
        ("https://h/", HttpTarget, "https://h/"),
    ],
)
def test_make_target_parses_urls(url: str, kind: type, where: str) -> None:
    target = make_target(url)
    assert type(target) is kind
    assert target.url == where  # type: ignore[attr-defined]


def test_make_target_model_option_completes_a_bare_url() -> None:
    v2 = make_target("http://h:8000/v2", TargetOptions(model="resnet"))
    grpc = make_target("grpc://h:8001", TargetOptions(model="resnet"))
    assert (v2.url, grpc.url) == ("http://h:8000/v2/models/resnet", "grpc://h:8001/resnet")  # type: ignore[attr-defined]


def test_target_options_arrive_whole_in_another_process() -> None:
    # a generator process or a Ray worker gets them pickled
    options = TargetOptions(
        model="m",
        headers={"X-Run": "1"},
        inputs=(TensorSpec("x", "FP32", (4,)),),
        openai_api="chat",
        token="s3cret",
        ca_file=Path("ca.pem"),
        tokenizer="gpt2",
    )
    assert pickle.loads(pickle.dumps(options)) == options


def test_make_target_null_and_python() -> None:
    assert type(make_target("null://")) is InProcessTarget
    assert type(make_target("python://operator:truth")) is InProcessTarget


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h:8000/v2/models/", r"names no model; write http://h:8000/v2/models/NAME"),
        ("grpc://h:8001", "names no model; write grpc://HOST:PORT/MODEL"),
        ("grpc://h/resnet", "has no port"),
        ("grpc://h:8001/a/b/c", "has path '/a/b/c'"),
        ("http://h:port/x", "has a bad port"),
        ("python://operator", "is not MODULE:FUNCTION"),
        ("python://no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("python://operator:nothing_here", "has no attribute 'nothing_here'"),
        ("python://math:pi", "is a float, not a callable"),
    ],
)
def test_make_target_explains_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_target(url)


def test_unknown_scheme_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownKindError) as caught:
        make_target("ftp://h/x")
    assert str(caught.value) == (
        "unknown target scheme 'ftp'; valid target schemes are: grpc, grpcs, http, https, "
        "null, openai+http, openai+https, python"
    )


def test_describe_target_urls_names_every_scheme() -> None:
    text = targets.describe_target_urls()
    for scheme in ("http(s)://", "grpc(s)://", "openai+http(s)://", "python://", "null://"):
        assert scheme in text


# --- tensors and the public names --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("INPUT0:FP32:-1,16", TensorSpec("INPUT0", "FP32", (-1, 16))),
        ("ids:int64:1,-1", TensorSpec("ids", "INT64", (1, -1))),
        ("s:BYTES:", TensorSpec("s", "BYTES", ())),
    ],
)
def test_tensor_spec_parse(text: str, spec: TensorSpec) -> None:
    assert TensorSpec.parse(text) == spec


def test_tensor_spec_concrete_shape() -> None:
    assert TensorSpec("x", "FP32", (-1, 3, -1)).concrete_shape(5) == [5, 3, 1]
    assert TensorSpec("x", "FP32", (2, -1)).concrete_shape(5) == [2, 1]


def test_tensor_spec_rejects_unknown_datatype() -> None:
    with pytest.raises(UnknownKindError, match="valid tensor datatypes are: BF16, BOOL, BYTES"):
        TensorSpec("x", "FP8", (1,))


def test_public_names() -> None:
    # fmt: off
    assert targets.__all__ == [
        "OK", "HttpTarget", "InProcessTarget", "OpenAITarget", "Reply", "Target", "TargetOptions",
        "TensorSpec", "V2GrpcTarget", "V2HttpTarget", "describe_target_urls", "make_target",
        "null_target",
    ]
    # fmt: on
