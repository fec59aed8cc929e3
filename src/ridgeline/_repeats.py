"""The names a list holds more than once: what every "keep one each" check reports."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

N = TypeVar("N", bound=str)


def repeated(names: Iterable[N]) -> list[N]:
    """The names that stand more than once in ``names``, sorted, each once."""
    return sorted(name for name, count in Counter(names).items() if count > 1)
