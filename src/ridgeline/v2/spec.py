"""What a front end needs to know of a model: its tensors (``TensorSpec``, the one tensor
declaration of the package), the v2 datatypes (the one datatype table: ONNX and Triton
names), a model's signature (``Signature``), and its name and largest batch
(``ModelSpec``; ``ModelShape`` as a value).

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

ONNX_TYPES = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "UINT16": "UINT16",
    "UINT32": "UINT32",
    "UINT64": "UINT64",
    "INT8": "INT8",
    "INT16": "INT16",
    "INT32": "INT32",
    "INT64": "INT64",
    "FP16": "FLOAT16",
    "BF16": "BFLOAT16",
    "FP32": "FLOAT",
    "FP64": "DOUBLE",
    "BYTES": "STRING",
}
"""The datatype table: each Open Inference Protocol v2 datatype and its ONNX element type
(``onnx.TensorProto.DataType``'s name; onnxruntime writes ``tensor(float)``). Triton's
name is ``triton_type``'s, numpy's dtype ``v2.tensors.NUMPY_DTYPES``'s (numpy has no BF16)."""

DATATYPES = frozenset(ONNX_TYPES)
"""The Open Inference Protocol v2 tensor datatypes."""

_FROM_ONNX = {onnx: v2 for v2, onnx in ONNX_TYPES.items()}


def from_onnx(element_type: str) -> str | None:
    """The v2 datatype of an ONNX element type, named as onnx names it (``FLOAT``) or as
    onnxruntime does (``tensor(float)``); None when v2 cannot carry it."""
    name = element_type.upper()
    if name.startswith("TENSOR(") and name.endswith(")"):
        name = name[len("TENSOR(") : -1]
    return _FROM_ONNX.get(name)


def triton_type(datatype: str) -> str:
    """Triton's ``data_type`` for a v2 datatype (``TYPE_FP32``; BYTES is ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


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


@dataclass(frozen=True, slots=True)
class Signature:
    """A model's inputs and outputs, in the model's order (what a backend describes)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


class ModelSpec(Protocol):
    """What a front end needs of a model: its name, tensors and largest batch."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def max_batch_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A ``ModelSpec`` as a plain value, for where a model cannot go (a decoder process)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    @classmethod
    def of(cls, model: ModelSpec) -> ModelShape:
        return cls(model.name, tuple(model.inputs), tuple(model.outputs), model.max_batch_size)
