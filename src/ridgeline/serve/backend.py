"""The backend contract: what runs one batch inside a worker process.

A backend meets ``Backend``: ``load()`` once, then ``run(inputs)`` per batch, and
``describe()`` for its tensors (a ``Signature``: ``v2.spec``'s, the one signature type,
named here too). Implementations (``_onnx``, ``_synthetic``, any Python class) import this
module; their typed configs live in ``backends``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ridgeline.v2.spec import Signature
from ridgeline.v2.tensors import Array

__all__ = ["Backend", "Signature"]


class Backend(Protocol):
    """Runs batches of one model, one at a time, inside one worker process."""

    def load(self) -> None:
        """Open the model and get ready to run; called once, before any batch."""
        ...

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """One batch: outputs by name for inputs by name, batch dimension first."""
        ...

    def describe(self) -> Signature:
        """The model's tensors; valid after ``load``."""
        ...
