"""``_same_named.same_named``: records built from other records' same-named fields."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from ridgeline._same_named import same_named


@dataclass(frozen=True)
class _Source:
    a: int
    b: str
    extra: float = 0.0

    @property
    def c(self) -> str:  # a property is never copied
        return "property"


class _Other(BaseModel):
    b: str
    c: str


class _Row(BaseModel):
    a: int
    b: str
    c: str = "default"


@dataclass(frozen=True)
class _Plain:
    a: int
    b: str


def test_copies_the_declared_fields_both_share_a_later_source_and_given_ones_win() -> None:
    src = _Source(1, "src", 2.5)
    assert same_named(_Row, src) == _Row(a=1, b="src")
    assert same_named(_Row, src, _Other(b="other", c="o")) == _Row(a=1, b="other", c="o")
    assert same_named(_Row, src, b="given") == _Row(a=1, b="given")
    assert same_named(_Plain, _Row(a=3, b="x", c="y")) == _Plain(3, "x")


def test_a_source_that_declares_no_fields_is_refused() -> None:
    with pytest.raises(TypeError, match="neither"):
        same_named(_Row, object())
