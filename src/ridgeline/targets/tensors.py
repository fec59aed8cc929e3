"""Input tensors for Open Inference Protocol v2 targets, and their cached encodings.

A ``TensorSpec`` names one model input as the server's metadata does (name, datatype,
shape, with ``-1`` for a variable dimension). For a request of ``items`` rows the
first ``-1`` becomes ``items`` and any other ``-1`` becomes 1; the data is a
deterministic pattern (``i % 16``, divided by 16 for floats), so every run sends the
same bytes. ``json_inputs`` builds the HTTP/JSON form, ``raw_inputs`` the bytes of the
gRPC ``raw_input_contents`` (little-endian, as the protocol requires).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ridgeline.errors import ConfigError, UnknownKindError

_NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})
DATATYPES = frozenset({*_NUMPY_DTYPES, "BF16", "BYTES"})
"""The v2 tensor datatypes ridgeline can fill."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input: ``TensorSpec("INPUT0", "FP32", (-1, 16))``."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in DATATYPES:
            raise UnknownKindError("tensor datatype", self.datatype, DATATYPES)
        if any(d < -1 for d in self.shape):
            raise ConfigError(
                f"input {self.name!r} has shape {list(self.shape)}; "
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
        """The shape of this input in a request of ``items`` rows."""
        return [(items if i == 0 else 1) if d == -1 else d for i, d in enumerate(self.shape)]


def _pattern(datatype: str, count: int) -> npt.NDArray[Any]:
    base = np.arange(count, dtype=np.int64) % 16
    if datatype == "BOOL":
        odd: npt.NDArray[np.bool_] = base % 2 == 1
        return odd
    if datatype in _FLOATS:
        floats: npt.NDArray[np.float64] = base / 16.0
        return floats
    return base


def json_inputs(specs: Sequence[TensorSpec], items: int) -> list[dict[str, Any]]:
    """The ``inputs`` list of a v2 JSON infer request of ``items`` rows."""
    inputs = []
    for spec in specs:
        shape = spec.concrete_shape(items)
        values = _pattern(spec.datatype, math.prod(shape))
        data: list[Any] = (
            [str(v) for v in values.tolist()] if spec.datatype == "BYTES" else values.tolist()
        )
        inputs.append({"name": spec.name, "datatype": spec.datatype, "shape": shape, "data": data})
    return inputs


def raw_bytes(spec: TensorSpec, items: int) -> bytes:
    """The little-endian contents of one input of ``items`` rows, as gRPC sends it."""
    values = _pattern(spec.datatype, math.prod(spec.concrete_shape(items)))
    if spec.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(s)) + s for s in (str(v).encode() for v in values))
    if spec.datatype == "BF16":  # the upper half of each FP32 (exact for the pattern's values)
        return (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return values.astype(_NUMPY_DTYPES[spec.datatype]).tobytes()
