"""Decoder processes: v2 infer bodies parsed beside the event loop (``serve.decoders``),
in real spawned processes. A body comes back as the arrays it was made from, a bad body
as the same 400 the loop would give, and a decoder that dies fails only its own body and
is replaced."""

from __future__ import annotations

import asyncio
import multiprocessing.spawn
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest

from _serve_backends import doubler_plan_doc
from ridgeline.errors import ConfigError, InferFailed, InvalidRequest
from ridgeline.pipeline.plan import Plan
from ridgeline.serve.decoders import DEFAULT_INLINE_BELOW, DecoderPool
from ridgeline.serve.runtime import PlanServer
from ridgeline.v2.http_codec import decode_body
from ridgeline.v2.spec import TensorSpec

MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Model:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] = (TensorSpec("y", "FP32", (-1, 10)),)
    max_batch_size: int = 8


IMAGE = Model("image", (TensorSpec("images", "FP32", (-1, 3, 64, 64)),))
MIXED = Model(
    "mixed",
    (
        TensorSpec("ids", "INT64", (-1, 5)),
        TensorSpec("mask", "BOOL", (-1, 5)),
        TensorSpec("text", "BYTES", (-1, 1)),
        TensorSpec("half", "FP16", (-1, 4)),
    ),
)


def _json_body(
    arrays: dict[str, np.ndarray], datatypes: dict[str, str], output: str = "y"
) -> bytes:
    inputs = []
    for name, a in arrays.items():
        data = [x.decode() for x in a.reshape(-1)] if a.dtype == object else a.tolist()
        inputs.append(
            {"name": name, "datatype": datatypes[name], "shape": list(a.shape), "data": data}
        )
    return orjson.dumps({"id": "r1", "inputs": inputs, "outputs": [{"name": output}]})


def _binary_body(name: str, a: np.ndarray) -> tuple[bytes, str]:
    raw = a.astype("<f4").tobytes()
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "FP32",
                    "shape": list(a.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return head + raw, str(len(head))


async def test_bodies_come_back_as_the_arrays_they_were_made_from() -> None:
    """JSON numbers (one row, and a batch large enough to grow both shared buffers),
    Triton's binary extension, and every other kind of input: each decoded in a process
    equals the array it was written from, in the model's order, with the request's id
    and asked-for outputs kept."""
    rng = np.random.default_rng(3)
    one = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    many = rng.standard_normal((8, 3, 64, 64)).astype(np.float32)  # 390 kB of arrays
    mixed = {
        "half": np.arange(8, dtype=np.float16).reshape(2, 4) / 4,
        "ids": rng.integers(-(2**40), 2**40, (2, 5)),
        "mask": rng.random((2, 5)) > 0.5,
        "text": np.array([[b"cat"], [b"dog"]], dtype=object),
    }
    types = {"images": "FP32", "ids": "INT64", "mask": "BOOL", "text": "BYTES", "half": "FP16"}
    async with DecoderPool(2, inline_below=0) as pool:
        for model, arrays in (
            (IMAGE, {"images": one}),
            (IMAGE, {"images": many}),
            (IMAGE, {"images": one}),
            (MIXED, mixed),
        ):
            got = await asyncio.wait_for(
                pool(model, _json_body(arrays, types), None, MAX_BYTES), 30
            )
            assert got.rows == next(iter(arrays.values())).shape[0]
            assert got.request.id == "r1" and got.request.outputs == [(0, False)]
            assert len(got.arrays) == len(model.inputs)
            for spec, a in zip(model.inputs, got.arrays, strict=True):
                want = arrays[spec.name]
                assert a.shape == want.shape and np.array_equal(a, want), spec.name
        body, header_length = _binary_body("images", many)
        got = await asyncio.wait_for(pool(IMAGE, body, header_length, MAX_BYTES), 30)
        assert np.array_equal(got.arrays[0], many)
        assert pool.decoded_off_loop == 5 and pool.decoded_inline == 0


async def test_bodies_in_flight_together_each_get_their_own_arrays() -> None:
    """One decoder holds two bodies at a time, each in its own pair of buffers; a burst
    of differing bodies (some growing the buffers) each comes back as its own."""
    rng = np.random.default_rng(5)
    frames = [
        rng.standard_normal((rows, 3, 64, 64)).astype(np.float32) for rows in (1, 4, 2, 8, 1, 3)
    ]
    bodies = [_json_body({"images": f}, {"images": "FP32"}) for f in frames]
    async with DecoderPool(1, inline_below=0) as pool:
        got = await asyncio.wait_for(
            asyncio.gather(*(pool(IMAGE, b, None, MAX_BYTES) for b in bodies)), 60
        )
    for frame, decoded in zip(frames, got, strict=True):
        assert np.array_equal(decoded.arrays[0], frame)


async def test_a_bad_body_is_refused_with_the_loops_own_message() -> None:
    bad = [
        b"{not json",
        orjson.dumps({"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3]}]}),
        orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "images",
                        "datatype": "FP32",
                        "shape": [1, 3, 64, 64],
                        "data": ["a"] * (3 * 64 * 64),
                    }
                ]
            }
        ),
    ]
    async with DecoderPool(1, inline_below=0) as pool:
        for body in bad:
            with pytest.raises(InvalidRequest) as inline:
                decode_body(IMAGE, body, None, MAX_BYTES)
            with pytest.raises(InvalidRequest) as off_loop:
                await asyncio.wait_for(pool(IMAGE, body, None, MAX_BYTES), 30)
            assert str(off_loop.value) == str(inline.value)
        assert pool.decoded_off_loop == 3


async def test_small_bodies_are_decoded_on_the_loop_and_zero_decoders_decode_all_there() -> None:
    small = _json_body({"images": np.zeros((1, 3, 64, 64), np.float32)}, {"images": "FP32"})
    async with DecoderPool(1, inline_below=len(small) + 1) as pool:
        await pool(IMAGE, small, None, MAX_BYTES)
        assert (pool.decoded_inline, pool.decoded_off_loop) == (1, 0)
    async with DecoderPool(0, inline_below=0) as pool:
        got = await pool(IMAGE, small, None, MAX_BYTES)
        assert got.arrays[0].shape == (1, 3, 64, 64)
        assert (pool.decoded_inline, pool.decoded_off_loop) == (1, 0)
    with pytest.raises(ValueError, match="decoders is -1"):
        DecoderPool(-1)


def _pids(pool: DecoderPool) -> set[int]:
    return {d.pid for d in pool._all}


async def test_a_decoder_killed_mid_body_fails_that_body_and_is_replaced() -> None:
    """The decoder is stopped (SIGSTOP) before the body is sent, then killed: the body
    was certainly in its hands. Its caller gets 503's ``unavailable`` naming the death;
    a fresh decoder takes the next body."""
    body = _json_body({"images": np.ones((1, 3, 64, 64), np.float32)}, {"images": "FP32"})
    async with DecoderPool(1, inline_below=0) as pool:
        (pid,) = _pids(pool)
        os.kill(pid, signal.SIGSTOP)
        call = asyncio.ensure_future(pool(IMAGE, body, None, MAX_BYTES))
        await asyncio.sleep(0)  # the body is sent
        assert not call.done()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(InferFailed) as died:
            await asyncio.wait_for(call, 30)
        assert died.value.kind == "unavailable" and "SIGKILL" in str(died.value)
        got = await asyncio.wait_for(pool(IMAGE, body, None, MAX_BYTES), 60)
        assert np.array_equal(got.arrays[0], np.ones((1, 3, 64, 64), np.float32))
        assert pool.restarts == 1 and pid not in _pids(pool) and len(_pids(pool)) == 1


async def test_a_decoder_that_died_idle_costs_no_request() -> None:
    body = _json_body({"images": np.ones((1, 3, 64, 64), np.float32)}, {"images": "FP32"})
    async with DecoderPool(1, inline_below=0) as pool:
        (pid,) = _pids(pool)
        (decoder,) = pool._all
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.shield(decoder.exited), 30)
        got = await asyncio.wait_for(pool(IMAGE, body, None, MAX_BYTES), 60)
        assert got.rows == 1 and pool.restarts == 1


async def test_with_no_decoder_left_the_loop_decodes_even_the_bodies_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one decoder holds two bodies (stopped, SIGSTOP) and a third waits for it; it
    is killed and its replacement cannot start (the interpreter path is gone). The two
    it held fail with ``unavailable``; the waiting body and the next are decoded on the
    loop, exactly, instead of waiting forever for a decoder."""
    x = np.arange(3 * 64 * 64, dtype=np.float32).reshape(1, 3, 64, 64)
    body = _json_body({"images": x}, {"images": "FP32"})
    async with DecoderPool(1, inline_below=0) as pool:
        (pid,) = _pids(pool)
        os.kill(pid, signal.SIGSTOP)
        calls = [asyncio.ensure_future(pool(IMAGE, body, None, MAX_BYTES)) for _ in range(3)]
        await asyncio.sleep(0)  # two bodies are sent, the third waits for a place
        assert pool.decoded_off_loop == 2 and not any(c.done() for c in calls)
        monkeypatch.setattr(multiprocessing.spawn, "_python_exe", os.fsencode("/nonexistent/py"))
        os.kill(pid, signal.SIGKILL)
        for held in calls[:2]:
            with pytest.raises(InferFailed) as died:
                await asyncio.wait_for(held, 30)
            assert died.value.kind == "unavailable"
        waited = await asyncio.wait_for(calls[2], 30)
        after = await asyncio.wait_for(pool(IMAGE, body, None, MAX_BYTES), 30)
        for got in (waited, after):
            assert np.array_equal(got.arrays[0], x)
        assert (pool.restarts, pool.failed_starts, pool.alive) == (1, 1, 0)
        assert (pool.decoded_off_loop, pool.decoded_inline) == (2, 2)


async def test_a_cancelled_caller_leaves_its_decoder_to_finish_and_serve_the_next() -> None:
    body = _json_body({"images": np.ones((8, 3, 64, 64), np.float32)}, {"images": "FP32"})
    async with DecoderPool(1, inline_below=0) as pool:
        call = asyncio.ensure_future(pool(IMAGE, body, None, MAX_BYTES))
        await asyncio.sleep(0)
        call.cancel()
        got = await asyncio.wait_for(pool(IMAGE, body, None, MAX_BYTES), 30)
        assert got.rows == 8 and pool.restarts == 0


def test_plan_server_refuses_a_negative_decoder_count() -> None:
    with pytest.raises(ConfigError, match="decoders is -2; give 0"):
        PlanServer(Plan.model_validate(doubler_plan_doc()), decoders=-2)


async def test_the_plan_server_decodes_large_bodies_in_its_decoders(tmp_path: Path) -> None:
    """Over HTTP: a JSON body over the inline bound is answered from a decoder's arrays,
    a bad one gets the protocol's 400, a small one is decoded on the loop, and /metrics
    counts each."""
    import aiohttp

    doc = doubler_plan_doc()
    doc["tasks"]["double"]["python"]["options"] = {"width": 20_000}
    doc["tasks"]["double"]["batch_size"] = 4
    plan = Plan.model_validate(doc)
    x = np.arange(40_000, dtype=np.float32).reshape(2, 20_000) / 7
    body = _json_body({"X": x}, {"X": "FP32"}, output="Y")
    assert len(body) > DEFAULT_INLINE_BELOW
    async with (
        PlanServer(plan, tmp_path, http_port=0, grpc_port=None, decoders=1) as server,
        aiohttp.ClientSession() as s,
    ):
        url = f"{server.model_url('double')}/infer"
        async with s.post(url, data=body) as r:
            assert r.status == 200, await r.text()
            answer = orjson.loads(await r.read())
        (y,) = answer["outputs"]
        assert y["shape"] == [2, 20_000] and answer["id"] == "r1"
        np.testing.assert_array_equal(np.array(y["data"], np.float32).reshape(2, -1), 2 * x)
        async with s.post(url, data=body.replace(b'"FP32"', b'"FP16"')) as r:
            assert r.status == 400
            assert "has datatype FP16; the model expects FP32" in (await r.json())["error"]
        async with s.post(url, data=b"{}") as r:
            assert r.status == 400
        async with s.get(f"{server.http_url}/metrics") as r:
            metrics = await r.text()
    assert 'ridgeline_request_bodies_decoded{where="decoder"} 2.0' in metrics
    assert 'ridgeline_request_bodies_decoded{where="loop"} 1.0' in metrics
