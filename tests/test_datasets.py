"""Prompt datasets read from small files written here: JSONL, ShareGPT JSON, a trace CSV
and the bundled Azure trace; every malformed input is one line naming the file and line."""

from __future__ import annotations

import json
import tempfile
from contextlib import suppress
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ridgeline.errors import DatasetError, RidgelineError, UnknownKindError
from ridgeline.workload.datasets import Turn, read_dataset

SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "What is a knee?"},
            {"from": "gpt", "value": "The rate past which latency climbs."},
            {"from": "human", "value": "And goodput?"},
            {"from": "gpt", "value": "Requests a second that meet every bound."},
        ],
    },
    {"id": "b", "conversations": [{"from": "gpt", "value": "an opening with no question"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "Unanswered?"}]},
]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_prompts_and_their_output_lengths_under_any_alias(tmp_path: Path) -> None:
    lines = [
        {"prompt": "one", "output_tokens": 5},
        {"prompt": "two", "max_tokens": 6},
        {"input": "three", "output_len": 7},
        {"text": "four", "completion": "an answer"},
        {"prompt": "five"},
    ]
    path = _write(tmp_path, "d.jsonl", "\n".join(map(json.dumps, lines[:2])) + "\n\n")
    path.write_text(path.read_text() + "\n".join(map(json.dumps, lines[2:])) + "\n")
    data = read_dataset(path)
    assert [c[0] for c in data.conversations] == [
        Turn("one", output_tokens=5),
        Turn("two", output_tokens=6),
        Turn("three", output_tokens=7),
        Turn("four", answer="an answer"),
        Turn("five"),
    ]


def test_sharegpt_pairs_each_human_turn_with_the_gpt_answer_after_it(tmp_path: Path) -> None:
    data = read_dataset(_write(tmp_path, "s.json", json.dumps(SHAREGPT)))
    assert data.conversations == (
        (
            Turn("What is a knee?", answer="The rate past which latency climbs."),
            Turn("And goodput?", answer="Requests a second that meet every bound."),
        ),
        (Turn("Unanswered?"),),  # the conversation with no human turn is left out
    )


def test_multi_turn_history_grows_by_each_turn_and_its_answer(tmp_path: Path) -> None:
    data = read_dataset(_write(tmp_path, "s.json", json.dumps(SHAREGPT)))
    assert [(t.prompt, h) for t, h in data.requests(multi_turn=False)] == [
        ("What is a knee?", ()),
        ("Unanswered?", ()),
    ]
    assert [(t.prompt, h) for t, h in data.requests(multi_turn=True)] == [
        ("What is a knee?", ()),
        ("And goodput?", ("What is a knee?", "The rate past which latency climbs.")),
        ("Unanswered?", ()),
    ]


def test_a_jsonl_line_may_hold_a_whole_conversation(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.jsonl", json.dumps(SHAREGPT[0]) + "\n")
    assert len(read_dataset(path).conversations[0]) == 2


def test_a_trace_csv_and_the_bundled_azure_trace_give_token_counts(tmp_path: Path) -> None:
    csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,10\n0.5,2000,0\n"
    data = read_dataset(_write(tmp_path, "t.csv", csv))
    assert [c[0] for c in data.conversations] == [Turn(None, 100, 10), Turn(None, 2000, None)]
    azure = read_dataset("azure")
    assert len(azure.conversations) == 8819
    assert azure.conversations[0][0] == Turn(None, 4808, 10)  # the file's first row


def test_the_bundled_trace_is_not_read_as_another_format() -> None:
    """``--dataset azure --dataset-format sharegpt`` read the CSV trace in silence."""
    with pytest.raises(DatasetError, match=r"is the bundled Azure trace .* not sharegpt"):
        read_dataset("azure", "sharegpt")
    assert read_dataset("azure", "trace").conversations


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("e.jsonl", "", r"e.jsonl holds no prompts"),
        ("e.jsonl", "\n  \n", r"e.jsonl holds no prompts"),
        ("e.json", "[]", r"e.json holds no prompts"),
        ("b.jsonl", '{"prompt": "a"}\n{"prompt": \n', r"b.jsonl, line 2: not JSON"),
        ("b.jsonl", '{"prompt": "a"}\n[1]\n', r"line 2: a line must be a JSON object, not list"),
        ("b.jsonl", '{"question": "a"}\n', r"line 1: no prompt text \(looked for prompt"),
        ("b.jsonl", '{"prompt": "a", "max_tokens": 0}\n', r"line 1: the output length must"),
        ("b.jsonl", '{"prompt": "a", "max_tokens": 2.5}\n', r"whole number in 1..1,048,576, got"),
        # 10^11 output tokens was taken, and asked of the server (issue 33, fault 18)
        ("b.jsonl", '{"prompt": "a", "max_tokens": 100000000000}\n', r"in 1..1,048,576, got 1"),
        ("t.csv", "time,prompt_tokens,output_tokens\n1,5,5\n2,5,100000000000\n", r"request 1"),
        ("b.txt", "hello\n", r"b.txt is neither JSONL .* nor ShareGPT JSON"),
        ("b.json", "[1]", r"b.json, conversation 0: expected an object"),
        ("b.json", '[{"conversations": 3}]', r'"conversations" must be a list'),
        ("b.json", '[{"conversations": [{"from": "human"}]}]', r"message 0: needs \"from\""),
        ("b.json", '{"conversations": [', r"b.json, line 1: not JSON"),
        ("t.csv", "time\n1\n2\n", r"no prompt token column"),
        ("b.jsonl", '{"prompt": "a\\ud800"}', r"line 1: the text holds a lone surrogate"),
        ("b.json", '[{"conversations": [{"from": "gpt", "value": "\\udfff"}]}]', r"lone surr"),
    ],
)
def test_a_bad_dataset_is_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(DatasetError, match=message) as caught:
        read_dataset(path)
    assert "\n" not in str(caught.value)


def test_a_missing_file_and_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"cannot read dataset .*nope.jsonl"):
        read_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(UnknownKindError, match=r"unknown dataset format 'csv'"):
        read_dataset(tmp_path / "x", "csv")  # type: ignore[arg-type]


def test_a_format_named_overrides_the_guess(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.data", json.dumps(SHAREGPT))
    assert len(read_dataset(path, "sharegpt").conversations) == 2
    with pytest.raises(DatasetError, match=r"line 1: a line must be a JSON object, not list"):
        read_dataset(path, "jsonl")


PIECES = (
    "{", "}", "[", "]", ",", ":", '"prompt"', '"conversations"', '"from"', '"value"',
    '"human"', '"gpt"', '"max_tokens"', '"completion"', '"x"', "0", "-1", "2.5", "1e400",
    "null", "true", "\n", " ", "\\u0000", "\\ud800", "\ud800",
)  # fmt: skip
"""JSON's own symbols and a dataset's keys: text that is often nearly a dataset."""


@settings(max_examples=300, deadline=None)
@example(data=b"[" * 5000, name="d.json", fmt="auto")
@example(data=b'{"prompt": "\\ud800"}', name="d.jsonl", fmt="auto")
@given(
    data=st.binary(max_size=200)
    | st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=30).map(
        lambda parts: "".join(parts).encode("utf-8", "surrogatepass")
    ),
    name=st.sampled_from(["d.jsonl", "d.json", "d.csv", "d.txt"]),
    fmt=st.sampled_from(["auto", "jsonl", "sharegpt", "trace"]),
)
def test_only_our_errors_escape_the_dataset_readers(data: bytes, name: str, fmt: str) -> None:
    with tempfile.TemporaryDirectory() as d, suppress(RidgelineError):
        path = Path(d) / name
        path.write_bytes(data)
        dataset = read_dataset(path, fmt)  # type: ignore[arg-type]
        for multi_turn in (False, True):
            for turn, history in dataset.requests(multi_turn):
                assert turn.prompt is None or isinstance(turn.prompt, str)
                assert all(isinstance(h, str) for h in history)
