"""A record built from the same-named fields of other records: ``same_named(Row, result,
task, wall_s=...)`` instead of ``Row(capacity_rps=result.capacity_rps, ...)`` field by
field. Records are pydantic models or dataclasses; only declared fields are copied (never
a property or method of the same name)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T")
_DECLARED: dict[type, frozenset[str]] = {}


def declared(cls: type) -> frozenset[str]:
    """The field names of a pydantic model or dataclass (looked up once per class)."""
    if cls not in _DECLARED:
        if issubclass(cls, BaseModel):
            _DECLARED[cls] = frozenset(cls.model_fields)
        elif dataclasses.is_dataclass(cls):
            _DECLARED[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        else:
            raise TypeError(f"{cls.__name__} is neither a pydantic model nor a dataclass")
    return _DECLARED[cls]


def same_named(cls: type[T], *sources: object, **given: Any) -> T:
    """A ``cls`` with every field it shares by name with ``sources`` (a later source's
    value wins) and ``given`` (which wins over them)."""
    wanted = declared(cls)
    values = {n: getattr(s, n) for s in sources for n in declared(type(s)) & wanted}
    return cls(**{**values, **given})
