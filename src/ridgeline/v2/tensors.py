"""Protocol-neutral tensor handling shared by every HTTP and gRPC front end (the fake
server's, the serving runtime's): decode and validate a request's inputs against a
model's specs, and encode outputs.

A request's tensors arrive as ``WireTensor``: name, datatype, shape, and data either as a
sequence of elements (JSON ``data``, gRPC typed contents, possibly nested) or as raw
little-endian bytes (Triton's binary extension, gRPC ``raw_*_contents``). BYTES
elements travel raw as a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ridgeline.errors import InvalidRequest
from ridgeline.v2.spec import ModelSpec, TensorSpec

Array = npt.NDArray[Any]

NUMPY_DTYPES: dict[str, npt.DTypeLike] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
LITTLE_ENDIAN = {k: np.dtype(v).newbyteorder("<") for k, v in NUMPY_DTYPES.items() if k != "BYTES"}


@dataclass(frozen=True, slots=True)
class WireTensor:
    name: str
    datatype: str
    shape: Sequence[int]
    data: Sequence[Any] | bytes | memoryview | None


def decode_inputs(model: ModelSpec, tensors: Sequence[WireTensor]) -> tuple[int, list[Array]]:
    """Check ``tensors`` against the model's inputs; return (rows, arrays in spec order)."""
    inputs, max_rows = model.inputs, model.max_batch_size
    if len(tensors) == 1 == len(inputs) and tensors[0].name == inputs[0].name:
        only = _decode(inputs[0], tensors[0], max_rows)  # the common case, kept cheap
        return only.shape[0], [only]
    specs = {s.name: s for s in inputs}
    given: dict[str, WireTensor] = {}
    for t in tensors:
        if t.name not in specs:
            raise InvalidRequest(
                f"unknown input {t.name!r}; model {model.name!r} has inputs {sorted(specs)}"
            )
        if t.name in given:
            raise InvalidRequest(f"input {t.name!r} appears more than once")
        given[t.name] = t
    missing = [n for n in specs if n not in given]
    if missing:
        raise InvalidRequest(f"missing inputs {missing} for model {model.name!r}")
    arrays = [_decode(specs[name], given[name], max_rows) for name in specs]
    rows = {a.shape[0] for a in arrays}
    if len(rows) > 1:
        raise InvalidRequest(f"inputs disagree on the batch dim: {sorted(rows)} rows")
    return rows.pop(), arrays


def _decode(spec: TensorSpec, t: WireTensor, max_rows: int) -> Array:
    if t.datatype != spec.datatype:
        raise InvalidRequest(
            f"input {t.name!r} has datatype {t.datatype}; the model expects {spec.datatype}"
        )
    shape, expected = t.shape, spec.shape
    fits = len(shape) == len(expected)
    count = 1
    if fits:
        for d, e in zip(shape, expected, strict=True):
            if d < 0 or (e != -1 and d != e):
                fits = False
            count *= d
    if not fits:
        raise InvalidRequest(
            f"input {t.name!r} has shape {list(shape)}; the model expects {list(expected)}"
        )
    if not 1 <= shape[0] <= max_rows:
        raise InvalidRequest(
            f"input {t.name!r} has batch size {shape[0]}; the model accepts 1..{max_rows} rows"
        )
    data = t.data
    if data is None:
        raise InvalidRequest(f"input {t.name!r} has no data")
    if isinstance(data, bytes | memoryview):
        flat = _from_raw(spec.datatype, data, f"input {t.name!r}")
    else:
        flat = _from_elements(spec.datatype, data, f"input {t.name!r}")
    if flat.size != count:
        raise InvalidRequest(
            f"input {t.name!r} carries {flat.size} elements but shape {list(shape)} needs {count}"
        )
    return flat.reshape(shape)


def _from_raw(datatype: str, raw: bytes | memoryview, where: str) -> Array:
    if datatype != "BYTES":
        dtype = LITTLE_ENDIAN[datatype]
        if len(raw) % dtype.itemsize:
            raise InvalidRequest(
                f"{where} has {len(raw)} bytes of data, not a whole number of "
                f"{dtype.itemsize}-byte {datatype} elements"
            )
        return np.frombuffer(raw, dtype=dtype)
    items, view, i = [], memoryview(raw), 0
    while i < len(view):
        if i + 4 > len(view):
            raise InvalidRequest(f"{where}: BYTES data ends inside a 4-byte length prefix")
        (n,) = struct.unpack_from("<I", view, i)
        if i + 4 + n > len(view):
            raise InvalidRequest(f"{where}: a BYTES element of {n} bytes runs past the data")
        items.append(bytes(view[i + 4 : i + 4 + n]))
        i += 4 + n
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def _from_elements(datatype: str, data: Sequence[Any], where: str) -> Array:
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=np.object_).reshape(-1)
            return np.array(
                [x.encode() if isinstance(x, str) else bytes(x) for x in flat], dtype=np.object_
            ).reshape(-1)
        return np.asarray(data, dtype=NUMPY_DTYPES[datatype]).reshape(-1)
    except (ValueError, TypeError, OverflowError) as e:
        raise InvalidRequest(f"{where} data cannot be read as {datatype}: {e}") from e


def to_raw(arr: Array) -> bytes:
    """The tensor as raw little-endian bytes (BYTES: length-prefixed elements)."""
    if arr.dtype != np.object_:
        return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return b"".join(struct.pack("<I", len(x)) + x for x in arr.reshape(-1))


def to_elements(arr: Array) -> list[Any]:
    """The tensor as a flat JSON-ready list (BYTES decoded as UTF-8)."""
    flat = arr.reshape(-1)
    if arr.dtype == np.object_:
        return [x.decode("utf-8", errors="replace") for x in flat]
    out: list[Any] = flat.tolist()
    return out
