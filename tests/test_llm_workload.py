"""A generative workload end to end: a step's prompts and lengths (``LlmWorkload``), the
body the OpenAI target sends for them, output tokens counted with the tokenizer when a
server gives no ``usage``, and ``ridgeline run --prompt-tokens`` against the fake LLM
server, all on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from _cli import RIDGELINE, ridgeline
from ridgeline.errors import ConfigError
from ridgeline.fakeserver import FakeServer, load_preset
from ridgeline.loadgen.schedule import from_arrival, from_trace, shaped
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.probe.drivers import NetworkDriver
from ridgeline.search.base import StepPlan
from ridgeline.targets import OpenAITarget
from ridgeline.workload import LlmWorkload, load_tokenizer, parse_size
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.payloads import RequestShape

GPT2 = load_tokenizer("gpt2")
SHAREGPT = [
    {
        "conversations": [
            {"from": "human", "value": "What is a knee?"},
            {"from": "gpt", "value": "The rate past which latency climbs."},
            {"from": "human", "value": "And goodput?"},
            {"from": "gpt", "value": "Requests a second that meet every bound."},
        ]
    }
]


def _workload(**fields: Any) -> LlmWorkload:
    for name in ("prompt_tokens", "output_tokens"):
        if isinstance(fields.get(name), str):
            fields[name] = parse_size(fields[name], name)
    return LlmWorkload(**fields)


# --- a step's shapes ---------------------------------------------------------------------


def test_fixed_lengths_give_exact_unique_prompts_and_the_output_asked() -> None:
    shapes = _workload(prompt_tokens="128", output_tokens="32").shapes(200, seed=4)
    assert shapes is not None
    assert {(s.prompt_tokens, s.output_tokens) for s in shapes} == {(128, 32)}
    assert {len(GPT2.encode(s.prompt or "")) for s in shapes} == {128}
    assert len({s.prompt for s in shapes}) == 200


def test_distributions_draw_per_request_and_each_prompt_is_exact() -> None:
    work = _workload(prompt_tokens="uniform:16-64", output_tokens="lognormal:mean=50,cv=1,max=90")
    shapes = work.shapes(300, seed=1)
    assert shapes is not None
    prompts = [s.prompt_tokens for s in shapes]
    assert min(prompts) >= 16 and max(prompts) <= 64 and len(set(prompts)) > 20
    assert max(s.output_tokens for s in shapes) <= 90
    assert all(len(GPT2.encode(s.prompt or "")) == s.prompt_tokens for s in shapes)


def test_a_trace_gives_the_lengths_the_workload_does_not_set() -> None:
    base = [RequestShape(1, 40, 7), RequestShape(1, 90, 3)]
    shapes = _workload(output_tokens="5").shapes(2, 0, base)
    assert shapes is not None
    assert [(s.prompt_tokens, s.output_tokens) for s in shapes] == [(40, 5), (90, 5)]
    assert [len(GPT2.encode(s.prompt or "")) for s in shapes] == [40, 90]


def test_a_trace_alone_gets_unique_prompts_exact_in_tokens(tmp_path: Path) -> None:
    """`run --trace` with no workload option: the trace's lengths, and prompts made to
    them (one word a token under GPT-2), not one repeated text per length."""
    path = tmp_path / "t.csv"
    path.write_text("time,prompt_tokens,output_tokens\n0,50,4\n1,50,4\n2,80,4\n")
    sched = shaped(from_trace(path), LlmWorkload(), 0)
    shapes = sched.shapes or []
    assert [len(GPT2.encode(s.prompt or "")) for s in shapes] == [50, 50, 80]
    assert len({s.prompt for s in shapes}) == 3


def test_nothing_set_leaves_the_targets_defaults() -> None:
    assert LlmWorkload().shapes(3, 0) is None
    sched = from_arrival(parse_arrival("constant", 10.0), 1.0)
    assert shaped(sched, LlmWorkload(), 0) is sched


def test_a_simulated_server_gets_lengths_without_text() -> None:
    shapes = _workload(prompt_tokens="64").shapes(3, 0, text=False)
    assert shapes is not None
    assert [(s.prompt_tokens, s.prompt) for s in shapes] == [(64, None)] * 3


def test_a_dataset_gives_prompts_in_file_order_counted_and_cycling(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [
        {"prompt": "Hello world", "output_tokens": 9},
        {"prompt": "a b c", "completion": "x y"},
    ]
    path.write_text("\n".join(map(json.dumps, lines)))
    shapes = _workload(dataset=str(path), output_tokens="4").shapes(3, 0)
    assert shapes == [
        RequestShape(1, 2, 9, "Hello world"),
        RequestShape(1, 3, 2, "a b c"),  # the answer's 2 tokens
        RequestShape(1, 2, 9, "Hello world"),
    ]


def test_multi_turn_history_grows_and_the_prompt_counts_it(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    first, second = _workload(dataset=str(path), multi_turn=True).shapes(2, 0) or []
    assert first.history == () and first.prompt == "What is a knee?"
    assert second.history == ("What is a knee?", "The rate past which latency climbs.")
    whole = "What is a knee?\n\nThe rate past which latency climbs.\n\nAnd goodput?"
    assert second.prompt_text() == whole
    assert second.prompt_tokens == len(GPT2.encode(whole)) > first.prompt_tokens
    assert second.output_tokens == len(GPT2.encode("Requests a second that meet every bound."))
    assert whole.startswith(first.prompt_text())  # turn 2 shares turn 1's prefix


def test_the_azure_trace_as_a_dataset_makes_prompts_of_its_lengths() -> None:
    shapes = _workload(dataset="azure").shapes(3, 0)
    assert shapes is not None
    assert [(s.prompt_tokens, s.output_tokens) for s in shapes] == [
        (4808, 10),
        (3180, 8),
        (110, 27),
    ]
    assert [len(GPT2.encode(s.prompt or "")) for s in shapes] == [4808, 3180, 110]


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"dataset": "azure", "prompt_tokens": "8"}, "leave out --prompt-tokens, or the dataset"),
        ({"multi_turn": True}, "--multi-turn replays a dataset's conversations"),
        ({"dataset": "azure", "shared_prefix": 4}, "a dataset's prompts are its own"),
        (
            {"prompt_tokens": "uniform:8-64", "shared_prefix": 9},
            "shortest prompt .* allows \\(8\\)",
        ),
    ],
)
def test_options_that_contradict_each_other(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _workload(**fields)


def test_a_shared_prefix_needs_prompt_lengths() -> None:
    with pytest.raises(ConfigError, match=r"these requests have no prompt length"):
        _workload(shared_prefix=4).shapes(3, 0)


def test_a_probes_steps_carry_the_workload_each_with_prompts_of_its_own() -> None:
    driver = NetworkDriver(
        "openai+http://127.0.0.1:1/v1",
        arrival="constant",
        workload=_workload(prompt_tokens="32", shared_prefix=8),
    )
    one = driver.schedule(StepPlan(20.0, 1.0), seed=1).shapes or []
    two = driver.schedule(StepPlan(20.0, 1.0), seed=2).shapes or []
    assert len(one) == len(two) == 20
    assert {s.prompt_tokens for s in one + two} == {32}
    assert not {s.prompt for s in one} & {s.prompt for s in two}
    assert len({tuple(GPT2.encode(s.prompt or "")[:8]) for s in one + two}) == 1


# --- the request body and the output count -----------------------------------------------


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-like server on 127.0.0.1 that records each body and answers "Hello
    world" (two GPT-2 tokens) in ONE chunk, with no ``usage``: a chunk count says 1."""
    seen: list[dict[str, Any]] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        seen.append(doc)
        chat = request.path.endswith("/chat/completions")
        if not doc.get("stream"):
            choice = {"message": {"content": "Hello world"}} if chat else {"text": "Hello world"}
            return web.json_response({"choices": [choice]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        choice = {"delta": {"content": "Hello world"}} if chat else {"text": "Hello world"}
        await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", seen
    finally:
        await runner.cleanup()


async def _send(target: OpenAITarget, shape: RequestShape) -> int:
    await target.connect(2)
    try:
        reply = await target.send(shape)
    finally:
        await target.close()
    assert reply.ok, reply.error
    return reply.output_tokens


async def test_the_body_asks_for_the_length_ignores_eos_and_asks_for_usage(
    recorder: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = recorder
    assert await _send(OpenAITarget(url), RequestShape(1, 2, 32, "two words")) == 2
    assert seen[-1] == {
        "model": "m",
        "prompt": "two words",
        "max_tokens": 32,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    await _send(OpenAITarget(url, ignore_eos=False), RequestShape(1, 2, 8, "two words"))
    assert "ignore_eos" not in seen[-1] and seen[-1]["max_tokens"] == 8


async def test_a_chat_body_carries_the_history_as_alternating_messages(
    recorder: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = recorder
    shape = RequestShape(1, 9, 4, "and now?", ("hi", "hello"))
    await _send(OpenAITarget(url, api="chat"), shape)
    assert seen[-1]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and now?"},
    ]
    await _send(OpenAITarget(url), shape)
    assert seen[-1]["prompt"] == "hi\n\nhello\n\nand now?"


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("stream", [True, False])
async def test_without_usage_output_tokens_are_the_text_counted_not_the_chunks(
    recorder: tuple[str, list[dict[str, Any]]], api: Any, stream: bool
) -> None:
    url, _ = recorder
    assert await _send(OpenAITarget(url, api=api, stream=stream), RequestShape(1, 1, 2)) == 2
    target = OpenAITarget(url, api=api, stream=stream, tokenizer="bytes")
    assert await _send(target, RequestShape(1, 1, 2)) == len("Hello world")


LLM = load_preset("llm")
"""The fake LLM server's preset, as `ridgeline fake-server --preset llm` serves it."""


async def test_a_step_against_the_fake_server_sends_exact_prompts_and_gets_the_length() -> None:
    """The fake counts prompt tokens as words; a made GPT-2 prompt is one token a word,
    so its ``usage`` must say exactly the 128 asked."""
    work = _workload(prompt_tokens="128", output_tokens="32")
    async with FakeServer(LLM, host="127.0.0.1", http_port=0, grpc_port=None) as srv:
        sched = shaped(from_arrival(parse_arrival("constant", 40.0), 0.5), work, 0)
        result = await measure_step("openai+" + srv.http_url + "/v1", sched, StepConfig())
    rec = result.records
    assert len(rec) == 20
    assert rec.prompt_tokens.tolist() == [128] * 20
    assert rec.output_tokens.tolist() == [32] * 20
    assert all(len(rec.gaps_of(i)) == 31 for i in range(20))
    assert np.isfinite(rec.first_token).all()


# --- the command line --------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm_server() -> Iterator[str]:
    """``ridgeline fake-server --preset llm`` on a port the kernel chose."""
    proc = subprocess.Popen(
        [*RIDGELINE, "fake-server", "--preset", "llm", "--port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={"PYTHONUNBUFFERED": "1", **_env()},
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "http://127.0.0.1:" in first, first
    port = first.split("http://127.0.0.1:")[1].split("/")[0]
    try:
        yield f"openai+http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_run_with_prompt_and_output_tokens_end_to_end(llm_server: str, tmp_path: Path) -> None:
    res = ridgeline(
        "run", llm_server, "--prompt-tokens", "128", "--output-tokens", "32",
        "--rate", "5", "--duration", "2", "--arrival", "constant", "--json",
        db=tmp_path / "r.db",
    )  # fmt: skip
    assert res.returncode in (0, 3), res.stderr
    summary = json.loads(res.stdout)
    assert summary["ok"] == summary["sent"] == 10
    # over the seconds to the last answer: the step's 2 s, and at most its slowest
    # answer's latency past them (a busy host's tail)
    slowest_s = summary["latency_ms"]["max"] / 1000.0
    assert 10 * 32 / (2.0 + slowest_s) <= summary["output_tokens_per_s"] <= 10 * 32 / 2.0
    assert summary["ttft_ms"]["p50"] < summary["latency_ms"]["p50"]


def test_run_with_a_sharegpt_dataset_in_chat(llm_server: str, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    res = ridgeline(
        "run", llm_server, "--dataset", str(path), "--multi-turn", "--openai-api", "chat",
        "--rate", "4", "--duration", "1", "--arrival", "constant", "--json",
        db=tmp_path / "r.db",
    )  # fmt: skip
    assert res.returncode in (0, 3), res.stderr
    summary = json.loads(res.stdout)
    assert summary["ok"] == 4
    answer = len(GPT2.encode("Requests a second that meet every bound."))
    knee = len(GPT2.encode("The rate past which latency climbs."))
    assert summary["output_tokens_per_s"] == pytest.approx((knee + answer) * 2 / 1.0)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "--prompt-tokens", "12k"], "--prompt-tokens '12k' does not parse; write N"),
        (["run", "--openai-api", "edits"], "unknown OpenAI API 'edits'"),
        (["probe", "--dataset", "/nonexistent/d.jsonl"], "cannot read dataset /nonexistent/d"),
        (["probe", "--tokenizer", "/nonexistent/tok"], "/nonexistent/tok is not a tokenizer"),
    ],
)
def test_bad_workload_options_are_one_line_and_exit_2(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    """Checked before any request: the target's port is closed and never contacted (the
    library's errors for every other bad input are tested in-process above and in
    test_datasets, test_tokenizer and test_payloads)."""
    command, *rest = args
    res = ridgeline(command, "openai+http://127.0.0.1:9/v1", *rest, db=tmp_path / "r.db")
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert fragment in " ".join(res.stderr.split()), res.stderr


def test_the_options_are_in_help() -> None:
    for command in ("run", "probe"):
        res = subprocess.run(
            [sys.executable, "-m", "ridgeline", command, "--help"],
            capture_output=True, text=True, timeout=60, env={**_env(), "COLUMNS": "200"},
        )  # fmt: skip
        flags = ("--prompt-tokens", "--output-tokens", "--dataset", "--multi-turn",
                 "--shared-prefix", "--tokenizer", "--no-ignore-eos", "--openai-api")  # fmt: skip
        for flag in flags:
            assert flag in res.stdout, (command, flag)
