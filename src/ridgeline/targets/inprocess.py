"""An in-process callable as a target: for tests, and to benchmark the load generator.

``fn(shape)`` may be sync or async and returns a ``Reply``, a bool, or None (ok). The
hot path is the call and nothing more: success returns the shared ``OK`` reply.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ridgeline._importing import import_attr
from ridgeline.errors import ConfigError, TargetError
from ridgeline.targets.base import OK, Reply
from ridgeline.workload.payloads import RequestShape

ReplyLike = Reply | bool | None
TargetFn = Callable[[RequestShape], ReplyLike] | Callable[[RequestShape], Awaitable[ReplyLike]]

_FALSE_ERROR = "the in-process callable returned False"


class InProcessTarget:
    """``InProcessTarget(fn)`` calls ``fn(shape)`` (awaiting it when it is async)."""

    __slots__ = ("_fn", "_is_async", "name")

    def __init__(self, fn: TargetFn, *, name: str | None = None) -> None:
        self._fn: Callable[[RequestShape], Any] = fn
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__  # an object with an async __call__
        )
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)

    async def connect(self, max_outstanding: int) -> None:
        return None

    async def send(self, shape: RequestShape) -> Reply:
        result = self._fn(shape)
        if self._is_async:
            result = await result
        if result is None or result is True:
            return OK
        if isinstance(result, Reply):
            return result
        if result is False:
            return Reply(ok=False, error=_FALSE_ERROR)
        raise TargetError(
            f"in-process target {self.name} returned {type(result).__name__}; "
            "return a Reply, a bool or None"
        )

    async def close(self) -> None:
        return None


async def _do_nothing(shape: RequestShape) -> None:
    return None


def null_target() -> InProcessTarget:
    """A target that answers at once: measures the load generator's own overhead."""
    return InProcessTarget(_do_nothing, name="null")


def load_callable(spec: str) -> TargetFn:
    """Import ``package.module:function`` (the attribute may be dotted: ``mod:Class.method``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"python target {spec!r} is not MODULE:FUNCTION; write e.g. python://mypkg.bench:infer"
        )
    try:
        obj: Any = import_attr(spec)
    except (ImportError, TypeError, ValueError) as exc:  # a relative or empty module name
        raise ConfigError(
            f"cannot import module {module_name!r} for python target {spec!r} ({exc}); "
            "check the name and that it is on PYTHONPATH"
        ) from exc
    except AttributeError:
        raise ConfigError(
            f"module {module_name!r} has no attribute {attr!r} for python target {spec!r}"
        ) from None
    if not callable(obj):
        raise ConfigError(f"python target {spec!r} is a {type(obj).__name__}, not a callable")
    fn: TargetFn = obj
    return fn
