"""The ``python`` backend: any importable Backend class or factory, built in the worker."""

from __future__ import annotations

from typing import Any

from ridgeline._importing import import_attr
from ridgeline.errors import BackendConfigError
from ridgeline.serve.backend import Backend


def load_python_backend(target: str, options: dict[str, Any]) -> Backend:
    """Import ``package.module:Name`` and call it with ``options``; BackendConfigError
    saying how to fix a target that cannot be imported or does not make a Backend."""
    module_name, _, attr = target.partition(":")
    try:
        factory: Any = import_attr(target)
    except ImportError as e:
        raise BackendConfigError(
            f"backend target {target!r}: cannot import {module_name!r} ({e}); install "
            "it, or put its folder on PYTHONPATH of the serving process"
        ) from e
    except AttributeError:
        factory = None
    if not callable(factory):
        raise BackendConfigError(
            f"backend target {target!r}: {module_name} has no callable {attr!r}; "
            "name a Backend class or a function returning one"
        )
    backend: Backend = factory(**options)
    lacking = [m for m in ("load", "run", "describe") if not callable(getattr(backend, m, None))]
    if lacking:
        raise BackendConfigError(
            f"backend target {target!r} made a {type(backend).__name__}, which lacks "
            f"{', '.join(lacking)}; a Backend needs load(), run(inputs) and describe()"
        )
    return backend
