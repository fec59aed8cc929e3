"""What a front end needs to know of a model: its name, tensors and largest batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class TensorLike(Protocol):
    """One input or output: a v2 datatype name ("FP32", "BYTES", ...) and a shape whose
    first dimension is the batch (-1 for any)."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(self) -> str: ...

    @property
    def shape(self) -> Sequence[int]: ...


class ModelSpec(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> Sequence[TensorLike]: ...

    @property
    def outputs(self) -> Sequence[TensorLike]: ...

    @property
    def max_batch_size(self) -> int: ...
