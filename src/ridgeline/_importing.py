"""``package.module:Name`` references, as the python target and the python backend take
them."""

from __future__ import annotations

import importlib
from typing import Any


def import_attr(spec: str) -> Any:
    """The object ``spec`` names (``module:attr``, the attribute may be dotted:
    ``mod:Class.method``); ImportError when the module cannot be imported,
    AttributeError when it lacks the attribute."""
    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
