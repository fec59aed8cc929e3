"""Per-request shapes: from traces, fixed, and seeded draws; and the package's exports."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ridgeline.workload
from ridgeline.errors import ConfigError, RidgelineError, UnknownKindError
from ridgeline.workload import (
    DEFAULT_SHAPE,
    FixedSize,
    LognormalSize,
    RequestShape,
    UniformSize,
    bundled_trace_path,
    fixed_shapes,
    parse_size,
    read_trace,
    sampled_shapes,
    shapes_from_trace,
)

SIZE_WORDS = ("uniform", "lognormal", "fixed", ":", "-", ",", "=", "mean", "cv", "min", "max",
              "1", "0", "9" * 30, "1e400", "nan", ".5", "-1", " ", "²")  # fmt: skip


def test_a_shape_with_its_prompt_and_history_is_frozen_and_hashable() -> None:
    a = RequestShape(1, 9, 4, "and now?", ("hi", "hello"))
    assert {a: 1}[RequestShape(1, 9, 4, "and now?", ("hi", "hello"))] == 1
    assert hash(a) != hash(RequestShape(1, 9, 4, "and now?", ("hi",)))
    with pytest.raises(AttributeError):
        a.prompt = "x"  # type: ignore[misc]


def test_default_shape_is_one_item_without_tokens() -> None:
    assert RequestShape(items=1, prompt_tokens=0, output_tokens=0) == DEFAULT_SHAPE


def test_shapes_from_the_bundled_trace_follow_its_rows() -> None:
    shapes = shapes_from_trace(read_trace(bundled_trace_path()))
    assert len(shapes) == 8_819
    assert shapes[:2] == [RequestShape(1, 4808, 10), RequestShape(1, 3180, 8)]


def test_shapes_from_a_trace_follow_time_order_and_default_missing_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("ts,batch_size,note\n2,4,b\n1,2,a\n3,8,c\n")
    assert shapes_from_trace(read_trace(path)) == [
        RequestShape(items=2),
        RequestShape(items=4),
        RequestShape(items=8),
    ]


def test_fixed_shapes_repeat_one_shape() -> None:
    shape = RequestShape(items=3, prompt_tokens=7)
    assert fixed_shapes(3, shape) == [shape, shape, shape]
    assert fixed_shapes(2) == [DEFAULT_SHAPE, DEFAULT_SHAPE]
    assert fixed_shapes(0) == []


@given(seed=st.integers(0, 2**32), n=st.integers(0, 50))
def test_sampled_shapes_are_fixed_by_the_seed(seed: int, n: int) -> None:
    sizes = {"items": UniformSize(low=1, high=8), "prompt_tokens": LognormalSize(mean=500, cv=1)}
    first = sampled_shapes(n, seed, **sizes)
    assert len(first) == n
    assert first == sampled_shapes(n, seed, **sizes)


def test_another_seed_gives_other_sizes() -> None:
    spec = LognormalSize(mean=500, cv=1)
    assert sampled_shapes(50, 1, prompt_tokens=spec) != sampled_shapes(50, 2, prompt_tokens=spec)


def test_each_field_draws_from_its_own_stream() -> None:
    prompt = LognormalSize(mean=300, cv=0.5)
    plain = sampled_shapes(200, 7, prompt_tokens=prompt)
    with_outputs = sampled_shapes(
        200, 7, prompt_tokens=prompt, output_tokens=UniformSize(low=1, high=99)
    )
    assert [s.prompt_tokens for s in plain] == [s.prompt_tokens for s in with_outputs]
    assert {s.output_tokens for s in plain} == {0}


def test_constant_sizes() -> None:
    assert (
        sampled_shapes(3, 0, items=2, prompt_tokens=FixedSize(value=9), output_tokens=5)
        == [RequestShape(2, 9, 5)] * 3
    )


def test_uniform_sizes_cover_the_closed_range() -> None:
    items = [
        s.items for s in sampled_shapes(2_000, 3, items={"kind": "uniform", "low": 2, "high": 5})
    ]
    assert set(items) == {2, 3, 4, 5}


def test_lognormal_sizes_have_the_requested_mean_and_stay_clipped() -> None:
    spec = LognormalSize(mean=400, cv=0.5, low=1)
    prompts = np.array([s.prompt_tokens for s in sampled_shapes(20_000, 5, prompt_tokens=spec)])
    # The sample mean's spread is 400·0.5/√20000 ≈ 1.4 tokens; 3 % is 12 tokens.
    assert prompts.mean() == pytest.approx(400, rel=0.03)
    capped = LognormalSize(mean=400, cv=2, low=10, high=900)
    outputs = [s.output_tokens for s in sampled_shapes(5_000, 5, output_tokens=capped)]
    assert min(outputs) == 10 and max(outputs) == 900


@pytest.mark.parametrize(
    ("sizes", "error", "fragment"),
    [
        ({"items": 0}, ConfigError, "items must be ≥ 1"),
        ({"items": {"kind": "uniform", "low": 0, "high": 3}}, ConfigError, "items must be ≥ 1"),
        ({"prompt_tokens": {"kind": "uniform", "low": 5, "high": 1}}, ConfigError, "≥ low (5)"),
        ({"prompt_tokens": {"kind": "zipf"}}, UnknownKindError, "fixed, lognormal, uniform"),
        ({"output_tokens": {"kind": "lognormal", "mean": 0, "cv": 1}}, ConfigError, "mean"),
        ({"output_tokens": True}, ConfigError, "an integer or a size spec"),
    ],
)
def test_bad_size_specs_say_what_is_wrong(
    sizes: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        sampled_shapes(3, 0, **sizes)  # type: ignore[arg-type]
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("256", FixedSize(value=256)),
        (" fixed:0 ", FixedSize(value=0)),
        ("uniform:64-512", UniformSize(low=64, high=512)),
        ("Uniform:5-5", UniformSize(low=5, high=5)),
        ("lognormal:mean=256,cv=0.5", LognormalSize(mean=256, cv=0.5)),
        ("lognormal:cv=2,mean=100,max=2048,min=4", LognormalSize(mean=100, cv=2, low=4, high=2048)),
    ],
)
def test_a_size_as_the_command_line_writes_it(text: str, spec: object) -> None:
    assert parse_size(text, "prompt_tokens") == spec


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "--prompt-tokens '' does not parse; write N, fixed:N, uniform:LOW-HIGH"),
        ("12k", "does not parse"),
        ("uniform:64", "does not parse"),
        ("uniform:a-b", "does not parse"),
        ("lognormal:mean=256", "cv: Field required"),
        ("lognormal:mean=1,cv=1,cv=2", "does not parse"),
        ("lognormal:mean=1,sd=2", "does not parse"),
        ("lognormal:mean=nan,cv=1", "mean"),
        ("uniform:9-3", "≥ low (9)"),
        ("zipf:1.2", "does not parse"),
    ],
)
def test_a_size_that_does_not_parse_says_how_to_write_one(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_size(text, "prompt_tokens")
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


@given(st.text(max_size=40) | st.lists(st.sampled_from(SIZE_WORDS), max_size=10).map("".join))
def test_only_our_errors_escape_the_size_parser(text: str) -> None:
    with suppress(RidgelineError):
        parse_size(text, "output_tokens")


def test_workload_exports_are_pinned() -> None:
    assert sorted(ridgeline.workload.__all__) == [
        "ARRIVAL_KINDS", "ArrivalProcess", "ArrivalSpec", "ConstantArrivals", "DEFAULT_SHAPE",
        "DiurnalArrivals", "FixedSize", "GammaArrivals", "LlmWorkload", "LognormalSize",
        "PoissonArrivals", "RampArrivals", "RequestShape", "SizeSpec", "StepArrivals", "Trace",
        "UniformSize", "arrival_from_dict", "bundled_trace_path", "fixed_shapes",
        "load_tokenizer", "make_prompts", "parse_arrival", "parse_size", "read_dataset",
        "read_trace", "sampled_shapes", "shapes_from_trace",
    ]  # fmt: skip
    for name in ridgeline.workload.__all__:
        assert hasattr(ridgeline.workload, name), name
