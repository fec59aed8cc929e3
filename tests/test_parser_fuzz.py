"""Every public parser, given any text or bytes: it returns a value, or raises one of the
project's own errors (``ridgeline.errors``) — never a pydantic ``ValidationError``, a
``UnicodeDecodeError``, a ``_csv.Error``, a ``RecursionError`` or a bare ``ValueError``."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ridgeline._yaml_config import parse_mapping
from ridgeline.cli.planning import available_for
from ridgeline.errors import ConfigError, RidgelineError
from ridgeline.health.slo import parse_slo
from ridgeline.pipeline.gpu import parse_gpus
from ridgeline.pipeline.plan import load_plan
from ridgeline.pipeline.profiles import ProfileTable, load_profiles
from ridgeline.pipeline.spec import load_spec
from ridgeline.targets.factory import make_target
from ridgeline.workload import read_trace
from ridgeline.workload.arrivals import arrival_from_dict, parse_arrival

FUZZ = settings(max_examples=300)


def only_our_errors() -> suppress[RidgelineError]:
    """The law: what escapes is a ``RidgelineError`` (a return passes too); anything else
    fails the test."""
    return suppress(RidgelineError)


@contextmanager
def _file(name: str, data: bytes) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        yield path


def reads_only_our_errors(read: Callable[[Path], Any], name: str, data: bytes) -> None:
    with _file(name, data) as path, only_our_errors():
        read(path)


def tokens(*words: str) -> st.SearchStrategy[str]:
    """Text made of the parser's own words and symbols, mixed with stray characters: far
    more often close to valid than random text."""
    piece = st.sampled_from(words) | st.text(max_size=3)
    return st.lists(piece, max_size=12).map("".join)


SLO_WORDS = (
    "p50", "p99", "p99.9", "p999", "max", "mean", "errors", "error", "attainment", "<", "<=",
    ">", ">=", ",", "ms", "us", "µs", "Μs", "mſ", "s", "%", "0", "1", "100", ".5", "1e400",
    "1e-400", "e9", " ",
)  # fmt: skip


@FUZZ
@given(tokens(*SLO_WORDS))
@example("p99<1e400ms")  # inf: pydantic's ValidationError escaped
@example("p99<100mſ")  # IGNORECASE matches the long s; the unit table had no key for it
@example("errors<1e400%")
def test_parse_slo_raises_only_our_errors(text: str) -> None:
    with only_our_errors():
        parse_slo(text)


ARRIVAL_WORDS = (
    "constant", "poisson", "gamma", "ramp", "steps", "diurnal", ":", ",", "=", "/", "rate",
    "cv", "from", "to", "rates", "step", "amplitude", "period", "phase", "0", "1", "-1",
    "nan", "inf", "1e400", "2.5", " ",
)  # fmt: skip


@FUZZ
@given(
    tokens(*ARRIVAL_WORDS),
    st.none() | st.floats(allow_nan=True, allow_infinity=True),
)
def test_parse_arrival_raises_only_our_errors(text: str, rate: float | None) -> None:
    with only_our_errors():
        parse_arrival(text, rate)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["kind", "rate", "cv", "start_rate", "end_rate", "rates", "x"]), JSONISH
    )
    | JSONISH
)
def test_arrival_from_dict_raises_only_our_errors(spec: Any) -> None:
    with only_our_errors():
        arrival_from_dict(spec)


TRACE_WORDS = (
    "timestamp", "time_ms", "prompt_tokens", "output_tokens", ",", "\n", "\r\n", '"', "0",
    "1.5", "-3", "1e400", "nan", "2023-11-16 18:17:03.97", "9999-01-01", "\x00", "\xe9",
)  # fmt: skip


@FUZZ
@given(
    st.binary(max_size=200) | tokens(*TRACE_WORDS).map(lambda t: t.encode("utf-8")),
    st.sampled_from(["t.csv", "t.jsonl"]),
)
def test_read_trace_raises_only_our_errors(data: bytes, name: str) -> None:
    reads_only_our_errors(read_trace, name, data)


JSONL_WORDS = (
    '{"timestamp": ', '{"time_ms": ', '"prompt_tokens": ', "}", "\n", ", ", "[", "]", "0",
    "1e400", "123456789" * 600, "true", "null", '"x"', "-1",
)  # fmt: skip


@FUZZ
@given(tokens(*JSONL_WORDS))
def test_read_trace_jsonl_records_raise_only_our_errors(text: str) -> None:
    reads_only_our_errors(read_trace, "t.jsonl", text.encode("utf-8"))


PROFILE_HEADER = "variant,pool,segment,batch,latency_ms,throughput_rps,source\n"
PROFILE_WORDS = (
    "yolov5n", "cpu", "cpu1", "A100-80GB", "1g.10gb", "1g.10gb@1/2", "measured", "modelled",
    ",", "\n", '"', "0", "1", "-1", "2.5", "inf", "nan", "1e400", "true", "x" * 140_000,
)  # fmt: skip


@FUZZ
@given(st.text(max_size=200) | tokens(*PROFILE_WORDS).map(PROFILE_HEADER.__add__))
def test_profile_table_raises_only_our_errors(text: str) -> None:
    with only_our_errors():
        ProfileTable.from_csv(text)


@settings(max_examples=100)
@given(st.binary(max_size=200))
def test_load_profiles_raises_only_our_errors(data: bytes) -> None:
    reads_only_our_errors(load_profiles, "p.csv", data)


def _yaml_documents(fields: list[str]) -> st.SearchStrategy[bytes]:
    """Random bytes, or YAML mappings of the model's own field names over any values."""
    values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-5, 5000)
        | st.floats()
        | st.sampled_from(["cpu", "a", "fake", "1g.10gb", ".inf", "x"]),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(fields), inner, max_size=4)
        ),
        max_leaves=12,
    )
    mapping = st.dictionaries(st.sampled_from(fields), values, max_size=6)
    return st.binary(max_size=200) | mapping.map(lambda m: yaml.safe_dump(m).encode())


PLAN_FIELDS = [
    "name", "slo_ms", "tasks", "edges", "demand_rps", "variant", "artifact", "synthetic",
    "segment", "kind", "cores", "batch_size", "instances", "latency_budget_ms", "source",
    "target", "factor", "base_ms", "per_item_ms", "a", "b",
]  # fmt: skip
SPEC_FIELDS = [
    "name", "slo_ms", "accuracy_floor", "demand_rps", "tasks", "edges", "variants",
    "accuracy", "gflops", "mbytes", "source", "target", "factor", "synthetic", "a", "b",
]  # fmt: skip


@FUZZ
@given(_yaml_documents(PLAN_FIELDS))
def test_load_plan_raises_only_our_errors(data: bytes) -> None:
    reads_only_our_errors(load_plan, "plan.yaml", data)


@FUZZ
@given(_yaml_documents(SPEC_FIELDS))
def test_load_spec_raises_only_our_errors(data: bytes) -> None:
    reads_only_our_errors(load_spec, "spec.yaml", data)


URL_WORDS = (
    "http://", "https://", "grpc://", "grpcs://", "openai+http://", "null://", "127.0.0.1",
    "[", "]", "::1", ":", "8000", "99999", "-1", "/v2", "/models/", "fake", "/versions/",
    "/infer", "@", "%", "?", "#", " ",
)  # fmt: skip


@FUZZ
@given(st.text(max_size=60) | tokens(*URL_WORDS))
@example("http://[::1/v2/models/fake")  # ValueError('Invalid IPv6 URL') escaped
@example("HTTP://\x80")  # UnicodeError (IDNA) from yarl escaped the generic target
@example("HTTP://\\")  # yarl raises ValueError for a backslash in the host part
@example("openai+http://\\")
@example("http://\\/v2/models/fake")
def test_make_target_raises_only_our_errors(url: str) -> None:
    if url.lower().startswith("python://"):  # would import whatever module it names
        return
    with only_our_errors():
        make_target(url)


GPU_WORDS = ("8", "x", "A100-80GB", "H100-80GB", "cpu", ",", "0", "²", "9" * 5000, " ")


@FUZZ
@given(tokens(*GPU_WORDS))
@example("²xA100-80GB")  # '²'.isdigit() is true; int('²') raised ValueError
@example("²cpu")
def test_gpus_option_raises_only_our_errors(text: str) -> None:
    with only_our_errors():
        parse_gpus(text)
    with only_our_errors():
        available_for(text)


def test_aliases_are_counted_expanded_and_a_bomb_is_refused_before_it_is_walked() -> None:
    """A config may use aliases (a shared mapping); what it may not do is stand for more
    than ``MAX_NODES`` values once they are expanded. Counted on the composed graph,
    each node once: 9 levels of 9 aliases (9^9 strings) are refused at once."""
    shared = "base: &b {x: 1, y: [1, 2]}\nuse: [*b, *b, *b]\n"
    assert parse_mapping(shared, "t", "fields")["use"][2] == {"x": 1, "y": [1, 2]}
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    pairs = zip("abcdefgh", "bcdefghi", strict=True)
    levels += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in pairs]
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to more than 1,000,000 values"):
        parse_mapping("\n".join(levels), "bomb.yaml", "fields")
    assert time.perf_counter() - start < 5.0
    # six levels (9^6 = 531,441 strings) stay within the bound and load
    assert len(parse_mapping("\n".join(levels[:6]), "t", "fields")) == 6
