"""One way to choose a kind by name: a ``Registry`` of values, each under its name.

Every kind a user names (an arrival process, a search strategy, a target scheme, a
serving backend, a segment) is declared once, and its registry gives the rest: the
value for a name (``get``: an unknown one raises ``UnknownKindError`` listing the valid
ones), the sorted names for help text (``names``, ``help``). Two ways to fill one:

* ``@STRATEGIES.register("adaptive")`` over a class or function, or ``add(name, value)``;
* ``Registry.of_union("arrival kind", ArrivalSpec)``: each class of a pydantic union
  discriminated by ``kind``, under its ``kind`` (the union stays the one declaration,
  and the type a checker reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, get_args

from ridgeline.errors import UnknownKindError

T = TypeVar("T")


class Registry(Generic[T]):
    """Values by name; ``what`` names the kind in errors (``"arrival kind"``)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    @classmethod
    def of_union(cls, what: str, union: Any, field: str = "kind") -> Registry[type[Any]]:
        """The classes of a discriminated union (``Annotated[A | B, Field(...)]`` or
        ``A | B``), each under the default of its ``field``."""
        members = get_args(union)
        if members and not isinstance(members[0], type):  # Annotated: the union comes first
            members = get_args(members[0])
        found: Registry[type[Any]] = Registry(what)
        for member in members:
            found.add(str(member.model_fields[field].default), member)
        return found

    def add(self, name: str, value: T) -> T:
        """Register ``value`` under ``name``; a name given twice is a programming error."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = value
        return value

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator registering what it decorates under ``name``."""

        def decorate(value: T) -> T:
            return self.add(name, value)

        return decorate

    def get(self, name: str) -> T:
        """The value registered under ``name``; ``UnknownKindError`` listing the valid
        names when there is none."""
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def unknown(self, name: str) -> UnknownKindError:
        """The error for ``name``, which is none of these: it lists the valid names."""
        return UnknownKindError(self.what, name, self._entries)

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        return tuple(sorted(self._entries))

    def help(self, sep: str = " | ") -> str:
        """The names for command-line help: ``adaptive | binary | stability | sweep``."""
        return sep.join(self.names())

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, value) in the order registered."""
        return iter(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
