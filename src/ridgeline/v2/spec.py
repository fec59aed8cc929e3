"""What a front end needs to know of a model: its tensors (``TensorSpec``, the one tensor
declaration of the package), the v2 datatypes, and a model's name and largest batch.

A ``TensorSpec`` names one input or output as a v2 server's metadata does: name, datatype
and shape, ``-1`` for a variable dimension (the first is the batch dimension wherever a
model batches). It is a frozen dataclass: ``TensorSpec("INPUT0", "FP32", (-1, 16))`` in
code, ``{name: INPUT0, datatype: FP32, shape: [-1, 16]}`` inside a pydantic config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ridgeline.errors import ConfigError, UnknownKindError

DATATYPES = frozenset(
    {
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "BF16",
        "FP32",
        "FP64",
        "BYTES",
    }
)
"""The Open Inference Protocol v2 tensor datatypes."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: ``TensorSpec("INPUT0", "FP32", (-1, 16))``."""

    name: str
    datatype: str = "FP32"
    shape: tuple[int, ...] = (-1, 16)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a tensor needs a name, e.g. INPUT0")
        if self.datatype not in DATATYPES:
            raise UnknownKindError("tensor datatype", self.datatype, DATATYPES)
        object.__setattr__(self, "shape", tuple(self.shape))
        if any(d < -1 for d in self.shape):
            raise ConfigError(
                f"tensor {self.name!r} has shape {list(self.shape)}; "
                "dimensions are sizes >= 0, or -1 for a variable size"
            )

    @classmethod
    def parse(cls, text: str) -> TensorSpec:
        """Read ``NAME:DATATYPE:D1,D2,...`` (e.g. ``INPUT0:FP32:-1,16``)."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ConfigError(
                f"input spec {text!r} is not NAME:DATATYPE:DIMS; write e.g. INPUT0:FP32:-1,16"
            )
        name, datatype, dims = parts
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise ConfigError(
                f"input spec {text!r} has dimensions {dims!r}; write integers "
                "separated by commas, -1 for a variable size (e.g. -1,16)"
            ) from None
        return cls(name, datatype.upper(), shape)

    def concrete_shape(self, items: int) -> list[int]:
        """The shape of this tensor in a request of ``items`` rows: the first -1 is
        ``items``, any other -1 is 1."""
        return [(items if i == 0 else 1) if d == -1 else d for i, d in enumerate(self.shape)]


class ModelSpec(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def max_batch_size(self) -> int: ...
