"""Input tensors for Open Inference Protocol v2 targets, and their cached encodings.

A ``TensorSpec`` (``ridgeline.v2.spec``) names one model input as the server's metadata
does (name, datatype, shape, with ``-1`` for a variable dimension). For a request of
``items`` rows the first ``-1`` becomes ``items`` and any other ``-1`` becomes 1; the data is a
deterministic pattern (``i % 16``, divided by 16 for floats), so every run sends the
same bytes. ``json_inputs`` builds the HTTP/JSON form, ``raw_inputs`` the bytes of the
gRPC ``raw_input_contents`` (little-endian, as the protocol requires).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ridgeline.v2.spec import TensorSpec
from ridgeline.v2.tensors import LITTLE_ENDIAN

_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


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
    return values.astype(LITTLE_ENDIAN[spec.datatype]).tobytes()
