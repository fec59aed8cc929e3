"""The continuous-batching LLM engine: exact step-by-step tests of the pure scheduler
(admission by KV blocks, preemption exactly when the cache is full, max_num_seqs, the
prefill budget, step durations from the cost terms, refusals), its laws under Hypothesis,
and the fake server running it on 127.0.0.1 (tokens streamed as the scheduler says, vLLM's
metrics, aborts on disconnect, GuideLLM's calls)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from yarl import URL

from _llm import TINY
from _timing import await_until
from conftest import StartFake
from ridgeline.fakeserver import FakeServer, load_preset, running_in_thread
from ridgeline.synthetic.llm import LlmScheduler, Refused, Step, output_length
from ridgeline.synthetic.model import LatencyModel, LlmEngine
from ridgeline.telemetry.scrape import parse_metrics


def tiny(**changes: Any) -> LlmEngine:
    return TINY.model_copy(update=changes)


def steps(s: LlmScheduler, limit: int = 1000) -> list[Step]:
    """Every step until idle, each started at 0 (the scheduler never reads time)."""
    out = []
    while (step := s.step(0.0)) is not None:
        out.append(step)
        assert len(out) < limit, "the engine never went idle"
    return out


# --- the schema ----------------------------------------------------------------------


def test_a_cache_smaller_than_a_block_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="holds no block"):
        LlmEngine(kv_cache_tokens=8, block_tokens=16)
    with pytest.raises(ValidationError, match="kv_cache_tokens"):
        LlmEngine(kv_cache_tokens=0)
    assert LlmEngine(kv_cache_tokens=100, block_tokens=16).blocks == 6


# --- one step at a time ----------------------------------------------------------------


def test_step_duration_is_the_sum_of_its_cost_terms() -> None:
    s = LlmScheduler(tiny(kv_cache_tokens=64))
    assert s.add(7, prompt=5, max_tokens=3) is None
    first, second, third = steps(s)
    # prefill: 8 + 1·5 prompt tokens + 0 decoded + 0.5·6 resident (prompt + first token)
    assert (first.end, first.tokens, first.prefilled, first.decoded) == (0.016, [7], 5, 0)
    assert first.resident == 6
    # decode: 8 + 2·1 sequence + 0.5·7 resident = 13.5 ms, then 8 + 2 + 0.5·8 = 14 ms
    assert (second.end, second.decoded, second.resident) == (0.0135, 1, 7)
    assert (third.end, third.finished) == (0.014, [7])
    assert s.idle and s.used_blocks == 0


def test_a_step_starts_when_told_and_slowdown_stretches_it() -> None:
    s = LlmScheduler(tiny(kv_cache_tokens=64))
    s.add(0, prompt=4, max_tokens=1)
    step = s.step(2.0, slowdown=2.0)
    assert step is not None and (step.start, step.end) == (2.0, 2.0 + 0.029)  # 14.5 ms · 2
    assert s.step(3.0) is None  # idle: nothing to run


def test_admission_waits_for_kv_blocks_first_come_first_served() -> None:
    s = LlmScheduler(TINY)  # 4 blocks of 4 tokens
    for rid in range(3):
        assert s.add(rid, prompt=7, max_tokens=1) is None  # 7 + 1 tokens: 2 blocks each
    first = s.step(0.0)
    assert first is not None and first.tokens == [0, 1] and first.finished == [0, 1]
    assert s.waiting == 1 and s.running == 0
    second = s.step(0.0)
    assert second is not None and second.tokens == [2]


def test_the_cache_full_shows_in_kv_usage() -> None:
    s = LlmScheduler(TINY)
    s.add(0, prompt=7, max_tokens=2)
    s.add(1, prompt=7, max_tokens=2)
    s.add(2, prompt=3, max_tokens=1)
    s.step(0.0)
    assert (s.running, s.waiting, s.used_blocks, s.kv_usage) == (2, 1, 4, 1.0)


def test_preemption_comes_exactly_when_a_block_is_needed_and_none_is_free() -> None:
    s = LlmScheduler(TINY)
    s.add(0, prompt=3, max_tokens=6)  # at most 9 tokens: 3 blocks, fits alone
    s.add(1, prompt=3, max_tokens=6)
    run = []
    for _ in range(5):
        step = s.step(0.0)
        assert step is not None
        run.append((step.tokens, step.preempted, s.used_blocks))
    # 4 tokens each after step 1 (1 block), 5..8 after steps 2-5 (2 blocks): full at 2
    assert run == [([0, 1], [], 2)] + [([0, 1], [], 4)] * 4
    sixth = s.step(0.0)  # request 0's 9th token needs a 3rd block: none free
    assert sixth is not None
    assert (sixth.preempted, sixth.tokens, sixth.finished) == ([1], [0], [0])
    assert s.preemptions == 1 and s.waiting == 1
    seventh = s.step(0.0)  # readmitted: its prompt and 5 tokens prefilled again
    assert seventh is not None
    assert (seventh.prefilled, seventh.tokens, seventh.finished) == (8, [1], [1])
    assert s.idle


def test_nobody_is_admitted_in_a_step_that_preempted() -> None:
    s = LlmScheduler(TINY)
    s.add(0, prompt=3, max_tokens=6)
    s.add(1, prompt=3, max_tokens=6)
    for _ in range(5):
        s.step(0.0)
    s.add(2, prompt=1, max_tokens=1)  # would fit in the block the preemption frees
    sixth = s.step(0.0)
    assert sixth is not None and sixth.preempted == [1] and 2 not in sixth.tokens
    seventh = s.step(0.0)
    assert seventh is not None and seventh.tokens == [1, 2]  # preempted one first


def test_max_num_seqs_bounds_the_running_batch() -> None:
    s = LlmScheduler(tiny(kv_cache_tokens=1024, max_num_seqs=2))
    for rid in range(3):
        s.add(rid, prompt=2, max_tokens=3)
    first = s.step(0.0)
    assert first is not None and first.tokens == [0, 1] and s.waiting == 1


def test_the_prefill_budget_bounds_the_prompts_of_one_step() -> None:
    s = LlmScheduler(tiny(kv_cache_tokens=1024, max_num_batched_tokens=10))
    s.add(0, prompt=6, max_tokens=2)
    s.add(1, prompt=6, max_tokens=2)
    s.add(2, prompt=30, max_tokens=1)  # over the budget: prefilled alone
    admitted = [step.tokens[: len(step.tokens) - step.decoded] for step in steps(s)]
    assert admitted[:3] == [[0], [1], [2]]


def test_a_request_the_cache_can_never_hold_is_refused_with_400() -> None:
    s = LlmScheduler(TINY)
    refused = s.add(0, prompt=10, max_tokens=7)
    assert isinstance(refused, Refused) and refused.status == 400
    assert refused.reason == (
        "prompt (10 tokens) + max_tokens (7) exceeds the KV cache (16 tokens); "
        "shorten the prompt or lower max_tokens"
    )
    assert s.add(1, prompt=9, max_tokens=7) is None and s.waiting == 1


def test_a_full_waiting_queue_refuses_with_503() -> None:
    s = LlmScheduler(TINY, max_waiting=1)
    assert s.add(0, prompt=1, max_tokens=1) is None
    assert s.add(1, prompt=1, max_tokens=1) == Refused(503, "queue full")


def test_abort_frees_the_blocks_and_the_slot() -> None:
    s = LlmScheduler(TINY)
    s.add(0, prompt=7, max_tokens=5)
    s.add(1, prompt=7, max_tokens=5)
    s.add(2, prompt=7, max_tokens=1)
    s.step(0.0)
    assert s.used_blocks == 4 and s.abort(0) and s.used_blocks == 2
    assert s.abort(2) and s.waiting == 0 and not s.abort(2)
    step = s.step(0.0)
    assert step is not None and step.tokens == [1]


def test_eos_ends_a_request_early_unless_ignored() -> None:
    eos = tiny(eos_mean_tokens=8.0)
    drawn = [output_length(eos, 100, ignore_eos=False, seed=3, index=i) for i in range(400)]
    assert drawn == [output_length(eos, 100, ignore_eos=False, seed=3, index=i) for i in range(400)]
    assert 6.0 < sum(drawn) / len(drawn) < 10.0 and max(drawn) < 100
    assert all(output_length(eos, 100, ignore_eos=True, index=i) == 100 for i in range(50))
    assert (
        min(output_length(eos, 100, ignore_eos=False, min_tokens=20, index=i) for i in range(50))
        == 20
    )
    assert output_length(TINY, 100, ignore_eos=False) == 100  # EOS off by default
    s = LlmScheduler(tiny(kv_cache_tokens=1024))
    s.add(0, prompt=2, max_tokens=10, target=3)
    assert [step.finished for step in steps(s)] == [[], [], [0]]


# --- laws ----------------------------------------------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> tuple[LlmEngine, list[tuple[int, int, int]]]:
    engine = LlmEngine(
        kv_cache_tokens=draw(st.integers(16, 256)),
        block_tokens=draw(st.sampled_from([1, 4, 16])),
        max_num_seqs=draw(st.integers(1, 12)),
        max_num_batched_tokens=draw(st.integers(1, 128)),
        step_ms=draw(st.floats(0.5, 20.0)),
        prefill_ms_per_token=draw(st.floats(0.0, 1.0)),
        decode_ms_per_seq=draw(st.floats(0.0, 2.0)),
        attention_ms_per_kv_token=draw(st.floats(0.0, 0.1)),
    )
    reqs = draw(
        st.lists(
            st.tuples(st.integers(0, 6), st.integers(1, 60), st.integers(1, 40)),
            max_size=30,
        )
    )
    return engine, reqs


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_laws_every_admitted_request_gets_exactly_its_tokens_within_the_cache(
    case: tuple[LlmEngine, list[tuple[int, int, int]]],
) -> None:
    """Requests join between steps (``after`` steps in); with no EOS each one taken
    produces exactly max_tokens tokens, tokens resident never exceed the cache, and no
    step yields more tokens than max_num_seqs, so tokens/s ≤ max_num_seqs / step_ms."""
    engine, reqs = case
    s = LlmScheduler(engine)
    cap = engine.blocks * engine.block_tokens
    taken: dict[int, int] = {}
    produced: dict[int, int] = {}
    at = busy = 0.0
    tokens = k = 0
    pending = sorted(enumerate(reqs), key=lambda r: r[1][0])
    while pending or not s.idle:
        while pending and pending[0][1][0] <= k:
            rid, (_, prompt, out) = pending.pop(0)
            refused = s.add(rid, prompt, out)
            assert (refused is None) == (s.blocks_for(prompt + out) <= engine.blocks)
            if refused is None:
                taken[rid] = out
        step = s.step(at)
        k += 1
        assert k < 10_000
        if step is None:
            continue
        assert step.resident <= cap and s.used_blocks <= engine.blocks
        assert 1 <= len(step.tokens) <= engine.max_num_seqs
        assert len(set(step.tokens)) == len(step.tokens)
        for rid in step.tokens:
            produced[rid] = produced.get(rid, 0) + 1
        busy += step.end - at
        tokens += len(step.tokens)
        at = step.end
    assert produced == taken and s.used_blocks == 0
    if tokens:
        assert tokens / busy <= engine.max_num_seqs * 1000.0 / engine.step_ms * (1 + 1e-9)


# --- the fake server ------------------------------------------------------------------

FREE = {"prefill_ms_per_token": 0.0, "decode_ms_per_seq": 0.0, "attention_ms_per_kv_token": 0.0}
SLOW = LatencyModel(
    name="llm",
    llm=LlmEngine(kv_cache_tokens=64, block_tokens=16, max_num_seqs=1, step_ms=40.0, **FREE),
)
"""One sequence at a time, every step 40 ms: timings a busy host can still tell apart."""

MakeServer = Callable[..., Awaitable[FakeServer]]


@pytest.fixture
def make_server(start_fake: StartFake) -> MakeServer:
    def make(model: LatencyModel = SLOW) -> Awaitable[FakeServer]:
        return start_fake(model, grpc_port=None)

    return make


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[list[float], list[dict[str, Any]]]:
    """Arrival times (from the send) and chunks of one streamed answer."""
    sent, times, chunks = time.perf_counter(), [], []
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                times.append(time.perf_counter() - sent)
                chunks.append(json.loads(line[6:]))
    return times, chunks


def vllm_metric(text: str, name: str) -> float:
    m = re.search(rf'^{re.escape(name)}\{{model_name="llm"\}} (\S+)$', text, re.M)
    assert m is not None, f"{name} missing from /metrics"
    return float(m.group(1))


async def scrape(session: aiohttp.ClientSession, server: FakeServer) -> str:
    async with session.get(server.metrics_url) as resp:
        return await resp.text()


async def test_the_server_streams_one_token_per_step_as_produced(
    make_server: MakeServer, session: aiohttp.ClientSession
) -> None:
    server = await make_server()
    body = {"model": "llm", "prompt": "three word prompt", "max_tokens": 4, "stream": True}
    body["stream_options"] = {"include_usage": True}
    times, chunks = await stream(session, f"{server.openai_url}/completions", body)
    texts = [c["choices"][0]["text"] for c in chunks[:4]]
    assert texts == [" the", " time", " of", " day"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None] * 3 + ["length"]
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    # the end of the prefill step, 40 ms on, less the event loop's clock resolution (it
    # runs a timer that early: 0.03999999999996362 was seen, 4 runs of 4)
    assert times[0] >= 0.04 - 1e-3
    assert times[3] - times[0] > 0.06  # streamed as produced (3 steps of 40 ms), not at the end
    text = await scrape(session, server)  # the engine's own (logical) token times
    assert vllm_metric(text, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.12)
    assert vllm_metric(text, "vllm:inter_token_latency_seconds_count") == 3
    # logical times: the prefill step ends 40 ms after arrival, to float rounding
    assert 0.04 - 1e-9 <= vllm_metric(text, "vllm:time_to_first_token_seconds_sum") < 0.2


async def test_without_include_usage_no_usage_chunk_and_chat_works(
    make_server: MakeServer, session: aiohttp.ClientSession
) -> None:
    server = await make_server()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2}
    _, chunks = await stream(
        session, f"{server.openai_url}/chat/completions", {**body, "stream": True}
    )
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": " the"},
        {"content": " time"},
    ]
    async with session.post(f"{server.openai_url}/chat/completions", json=body) as resp:
        doc = await resp.json()
    assert doc["object"] == "chat.completion" and doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


async def test_requests_queue_for_the_one_slot_and_metrics_say_so(
    make_server: MakeServer, session: aiohttp.ClientSession
) -> None:
    server = await make_server()
    url = f"{server.openai_url}/completions"
    body = {"model": "llm", "prompt": "a b", "max_tokens": 10, "stream": True}
    tasks = [asyncio.create_task(stream(session, url, body)) for _ in range(3)]

    async def queued() -> bool:
        text = await scrape(session, server)
        return (
            vllm_metric(text, "vllm:num_requests_running") == 1
            and vllm_metric(text, "vllm:num_requests_waiting") == 2
        )

    await await_until(queued, 10, "one running, two waiting")
    text = await scrape(session, server)
    assert vllm_metric(text, "vllm:kv_cache_usage_perc") == 0.25  # 1 block of 4
    values, counters = parse_metrics(text)  # as the probe's scraper reads them
    assert values['fakeserver_queue_length{model="llm"}'] == 2  # the LLM engine's queue
    assert values['nv_inference_pending_request_count{model="llm",version="1"}'] == 3
    assert values['vllm:num_requests_waiting{model_name="llm"}'] == 2
    assert 'vllm:num_preemptions_total{model_name="llm"}' in counters
    firsts = sorted(t[0] for t, _ in await asyncio.gather(*tasks))
    assert firsts[2] - firsts[0] >= 0.7  # each waits for the one before: 10 steps of 40 ms
    text = await scrape(session, server)
    assert vllm_metric(text, "vllm:generation_tokens_total") == 30
    assert vllm_metric(text, "vllm:prompt_tokens_total") == 6
    assert vllm_metric(text, "vllm:num_requests_running") == 0
    assert vllm_metric(text, "vllm:time_to_first_token_seconds_count") == 3
    assert vllm_metric(text, "vllm:inter_token_latency_seconds_count") == 27
    assert vllm_metric(text, "vllm:e2e_request_latency_seconds_count") == 3
    assert vllm_metric(text, "vllm:num_preemptions_total") == 0


async def test_preemptions_are_counted_on_metrics(
    make_server: MakeServer, session: aiohttp.ClientSession
) -> None:
    engine = LlmEngine(kv_cache_tokens=32, block_tokens=4, max_num_seqs=4, step_ms=5.0)
    server = await make_server(LatencyModel(name="llm", llm=engine))
    body = {"model": "llm", "prompt": "a b c", "max_tokens": 20, "stream": True}
    got = await asyncio.gather(
        *(stream(session, f"{server.openai_url}/completions", body) for _ in range(3))
    )
    assert [len(chunks) for _, chunks in got] == [20, 20, 20]  # none re-sent
    text = await scrape(session, server)
    assert vllm_metric(text, "vllm:num_preemptions_total") >= 1
    assert vllm_metric(text, "vllm:generation_tokens_total") == 60


async def test_a_client_that_goes_away_frees_its_kv(
    make_server: MakeServer, session: aiohttp.ClientSession
) -> None:
    server = await make_server()
    body = {"model": "llm", "prompt": "a", "max_tokens": 50, "stream": True}
    async with session.post(f"{server.openai_url}/completions", json=body) as resp:
        await resp.content.readline()
        resp.close()

    async def freed() -> bool:
        text = await scrape(session, server)
        return vllm_metric(text, "vllm:num_requests_running") == 0

    await await_until(freed, 10, "the aborted request's slot freed")
    assert vllm_metric(await scrape(session, server), "vllm:kv_cache_usage_perc") == 0.0


async def test_bad_and_impossible_requests_are_400_with_a_reason(
    make_server: MakeServer, session: aiohttp.ClientSession
) -> None:
    server = await make_server()
    cases = {
        "max_tokens": ({"prompt": "a", "max_tokens": 64}, "exceeds the KV cache (64 tokens)"),
        "min_tokens": ({"prompt": "a", "max_tokens": 2, "min_tokens": 3}, "min_tokens must be"),
        "ignore_eos": ({"prompt": "a", "ignore_eos": "yes"}, '"ignore_eos" must be true or false'),
        "stream_options": ({"prompt": "a", "stream_options": 1}, '"stream_options" must be'),
        # taken silently before (issue 33, fault 18)
        "n": ({"prompt": "a", "n": 3}, '"n": this server makes one choice a request'),
        "n of a string": ({"prompt": "a", "n": "2"}, '"n" must be a positive integer'),
        "best_of": ({"prompt": "a", "best_of": 0}, '"best_of" must be a positive integer'),
        "temperature": ({"prompt": "a", "temperature": 7}, '"temperature" must be a number in'),
        "temperature a string": ({"prompt": "a", "temperature": "hot"}, '"temperature" must'),
        "prompt a number": ({"prompt": 12345}, '"prompt" must be a string, a list of strings'),
        "prompt mixed": ({"prompt": ["a", 1]}, '"prompt" must be'),
    }
    chat = {
        "content a number": (
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content must be a string or a list of content parts",
        ),
        "message without a role": ({"messages": [{"content": "hi"}]}, "must be an object"),
    }
    for name, (body, said) in [*cases.items(), *chat.items()]:
        route = "chat/completions" if name in chat else "completions"
        async with session.post(f"{server.openai_url}/{route}", json=body) as resp:
            assert resp.status == 400, name
            assert said in (await resp.json())["error"]["message"], name
    # what the API allows still passes: token ids, lists of them, parts, null content
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    turns = [{"role": "assistant", "content": None}, {"role": "user", "content": "hi"}]
    fine = [
        ("completions", {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "n": 1}),
        ("completions", {"prompt": [[1, 2], [3]], "max_tokens": 1, "top_p": 0.9}),
        ("chat/completions", {"messages": parts, "max_completion_tokens": 1}),
        ("chat/completions", {"messages": turns, "max_completion_tokens": 1}),
    ]
    for route, body in fine:
        async with session.post(f"{server.openai_url}/{route}", json=body) as resp:
            assert resp.status == 200, (route, body, await resp.text())


async def test_guidellms_calls_work_against_the_llm_preset(
    session: aiohttp.ClientSession,
) -> None:
    """GuideLLM's backend: GET /health, GET /v1/models, then streaming completions with
    stream_options.include_usage and ignore_eos, reading usage from the last chunk."""
    server = FakeServer(load_preset("llm"), grpc_port=None)
    await server.start()
    try:
        async with session.get(f"{server.http_url}/health") as resp:
            assert resp.status == 200
        async with session.get(f"{server.openai_url}/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["fake-llm"]
        body = {
            "model": "fake-llm",
            "prompt": " ".join(["w"] * 128),
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        _, chunks = await stream(session, f"{server.openai_url}/completions", body)
        assert len(chunks) == 9
        assert chunks[-1]["usage"]["prompt_tokens"] == 128
        assert chunks[-1]["usage"]["completion_tokens"] == 8
    finally:
        await server.stop()


# --- any body: an answer, never a crash -----------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["llm", "other"]) | JSON,
        "prompt": st.text(max_size=30) | JSON,
        "messages": st.lists(st.fixed_dictionaries({"content": st.text(max_size=20)})) | JSON,
        "max_tokens": st.integers(-2, 70) | JSON,
        "max_completion_tokens": st.integers(-2, 70) | JSON,
        "min_tokens": st.integers(-2, 70) | JSON,
        "stream": st.booleans() | JSON,
        "ignore_eos": st.booleans() | JSON,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | JSON}) | JSON,
    },
)


@pytest.fixture(scope="module")
def quick_llm() -> Iterator[FakeServer]:
    engine = LlmEngine(kv_cache_tokens=64, block_tokens=4, max_num_seqs=4, step_ms=0.5, **FREE)
    with running_in_thread(LatencyModel(name="llm", llm=engine), grpc_port=None) as server:
        yield server


@settings(max_examples=80, deadline=None)
@given(body=FIELDS | JSON, chat=st.booleans())
def test_any_body_gets_an_answer_never_a_server_error(
    quick_llm: FakeServer, body: Any, chat: bool
) -> None:
    route = "/chat/completions" if chat else "/completions"
    req = urllib.request.Request(
        quick_llm.openai_url + route,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    assert status in (200, 400, 404), (status, text)
    if status != 200:
        message = json.loads(text)["error"]["message"]
        assert message and "\n" not in message


GLACIAL = LatencyModel(
    name="llm",
    llm=LlmEngine(kv_cache_tokens=64, block_tokens=16, max_num_seqs=1, step_ms=500.0, **FREE),
)
"""Every step 500 ms: 50 tokens take 25 s, longer than any wait below."""


def requests_total(text: str, outcome: str) -> float:
    m = re.search(rf'^fakeserver_requests_total\{{.*outcome="{outcome}".*\}} (\S+)$', text, re.M)
    return 0.0 if m is None else float(m.group(1))


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_request_whose_client_went_away_is_aborted_and_not_counted_ok(
    make_server: MakeServer, streamed: bool
) -> None:
    """Issue 33, faults 3 and 19: a client that goes away while its answer is generated
    frees its sequence at once (as vLLM aborts it), streamed or not: 60 non-streamed
    requests whose clients had gone filled the cache for the length of their answers.
    And it counts as an error on the server's metrics, not ``ok``."""
    server = await make_server(GLACIAL)
    body = {"model": "llm", "prompt": "a", "max_tokens": 50, "stream": streamed}
    async with aiohttp.ClientSession() as watcher:

        def running(n: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                text = await scrape(watcher, server)
                return vllm_metric(text, "vllm:num_requests_running") == n

            return check

        writer = await send_raw(server, body)
        await await_until(running(1), 10, "the request running")
        writer.close()  # the client goes away
        await writer.wait_closed()
        await await_until(running(0), 10, "the abandoned request aborted")
        text = await scrape(watcher, server)
        assert vllm_metric(text, "vllm:kv_cache_usage_perc") == 0.0
        await await_until(
            lambda: _counted(watcher, server, "error"), 10, "the request counted an error"
        )
        assert requests_total(await scrape(watcher, server), "ok") == 0.0


async def _counted(session: aiohttp.ClientSession, server: FakeServer, outcome: str) -> bool:
    return requests_total(await scrape(session, server), outcome) == 1.0


FIXED = LatencyModel(name="llm", base_ms=1.0, per_item_ms=0.0, ttft_ms=1.0, per_token_ms=500.0)
"""The fixed-timing OpenAI route (no LLM engine): a token every 500 ms."""


async def test_a_fixed_timing_stream_cut_by_its_client_counts_an_error(
    start_fake: StartFake,
) -> None:
    """Issue 33, fault 19: a stream the client cut was counted ``ok``."""
    server = await start_fake(FIXED, grpc_port=None)
    body = {"model": "llm", "prompt": "a", "max_tokens": 50, "stream": True}
    async with aiohttp.ClientSession() as watcher:
        url = f"{server.openai_url}/completions"
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as resp:
            await resp.content.readline()  # the first token came: cut the rest
            resp.close()
        await await_until(
            lambda: _counted(watcher, server, "error"), 10, "the cut stream counted an error"
        )
        assert requests_total(await scrape(watcher, server), "ok") == 0.0


async def test_a_stream_whose_client_left_before_its_headers_logs_no_traceback(
    start_fake: StartFake, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 33, fault 19: a client gone before the stream's headers (it waited for its
    batch, 2 s here) made aiohttp log a traceback for the failed ``prepare``."""
    slow = FIXED.model_copy(update={"base_ms": 2000.0})
    server = await start_fake(slow, grpc_port=None)
    body = {"model": "llm", "prompt": "a", "max_tokens": 5, "stream": True}
    async with aiohttp.ClientSession() as watcher:
        writer = await send_raw(server, body)
        writer.close()  # gone at once: the server reads the request, then finds it gone
        await writer.wait_closed()
        await await_until(
            lambda: _counted(watcher, server, "error"), 10, "the request counted an error"
        )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def send_raw(server: FakeServer, body: dict[str, Any]) -> asyncio.StreamWriter:
    """A completion request written on a socket of its own, which the caller closes to
    go away (an aiohttp client cancelled mid-request leaves its connection to the
    garbage collector)."""
    url = URL(server.openai_url)
    _, writer = await asyncio.open_connection(url.host, url.port)
    payload = json.dumps(body).encode()
    head = (
        f"POST {url.path}/completions HTTP/1.1\r\nHost: {url.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()
    return writer


async def test_a_prompt_past_the_bound_is_refused_uncounted_and_a_long_one_counted(
    start_fake: StartFake,
) -> None:
    """Issue 33, fault 2: a 10 MB prompt was tokenized in the event loop (20 s, every other
    request waiting) and took the server from 94 MB to 959. Past ``MAX_PROMPT_CHARS`` it
    is refused before any of it is counted; below, a long one is counted (in a thread)
    as a short one would be."""
    from ridgeline.fakeserver.openai import MAX_PROMPT_CHARS, THREAD_CHARS
    from ridgeline.workload.tokenizer import gpt2_available

    server = await start_fake(FIXED.model_copy(update={"per_token_ms": 1.0}), grpc_port=None)
    url = f"{server.openai_url}/completions"
    async with aiohttp.ClientSession() as s:
        too_long = {"model": "llm", "prompt": "x" * (MAX_PROMPT_CHARS + 1), "max_tokens": 1}
        raw = io.BytesIO(json.dumps(too_long).encode())  # aiohttp's way for a large body
        headers = {"Content-Type": "application/json"}
        async with s.post(url, data=raw, headers=headers) as resp:
            assert resp.status == 400
            said = (await resp.json())["error"]["message"]
        assert f"{MAX_PROMPT_CHARS + 1:,} characters" in said
        assert f"at most {MAX_PROMPT_CHARS:,}" in said
        repeats = THREAD_CHARS // 12 + 1000  # longer than is counted in the loop
        long = {"model": "llm", "prompt": "hello world " * repeats, "max_tokens": 1}
        async with s.post(url, json=long) as resp:
            assert resp.status == 200
            usage = (await resp.json())["usage"]
    # " hello" and " world" a token each; GPT-2 also makes the trailing space one
    trailing = 1 if gpt2_available() else 0
    assert usage["prompt_tokens"] == 2 * repeats + trailing
