"""Protocol-neutral tensor handling shared by every HTTP and gRPC front end (the fake
server's, the serving runtime's): decode and validate a request's inputs against a
model's specs, and encode outputs.

A request's tensors arrive as ``WireTensor``: name, datatype, shape, and data either as a
sequence of elements (JSON ``data``, gRPC typed contents, possibly nested) or as raw
little-endian bytes (Triton's binary extension, gRPC ``raw_*_contents``). BYTES
elements travel raw as a 4-byte little-endian length then the bytes.

Every element has one meaning: BOOL elements are booleans, integer elements integers
within the datatype's range, floating-point elements numbers the datatype can hold, and
BYTES elements strings (UTF-8 encoded) or bytes. Anything else (a null, a string of
digits, an integer standing for a BYTES element) is an ``InvalidRequest``. A request
allocates no more than it carries: a declared shape is checked against the data and
against the server's body bound before any array is made.
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


def decode_inputs(
    model: ModelSpec, tensors: Sequence[WireTensor], max_bytes: int
) -> tuple[int, list[Array]]:
    """Check ``tensors`` against the model's inputs; return (rows, arrays in spec order).
    A tensor whose declared shape would decode to more than ``max_bytes`` (the server's
    body bound) is refused before anything is allocated."""
    inputs, max_rows = model.inputs, model.max_batch_size
    if len(tensors) == 1 == len(inputs) and tensors[0].name == inputs[0].name:
        only = _decode(inputs[0], tensors[0], max_rows, max_bytes)  # the common case, cheap
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
    arrays = [_decode(specs[name], given[name], max_rows, max_bytes) for name in specs]
    rows = {a.shape[0] for a in arrays}
    if len(rows) > 1:
        raise InvalidRequest(f"inputs disagree on the batch dim: {sorted(rows)} rows")
    return rows.pop(), arrays


def _decode(spec: TensorSpec, t: WireTensor, max_rows: int, max_bytes: int) -> Array:
    if t.datatype != spec.datatype:
        raise InvalidRequest(
            f"input {t.name!r} has datatype {t.datatype}; the model expects {spec.datatype}"
        )
    if spec.datatype not in NUMPY_DTYPES:
        raise InvalidRequest(
            f"input {t.name!r} is {spec.datatype}, which this server cannot decode; "
            "serve the model with FP16 or FP32 inputs"
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
            f"input {t.name!r} has shape {_dims(shape)}; the model expects {list(expected)}"
        )
    if not 1 <= shape[0] <= max_rows:
        raise InvalidRequest(
            f"input {t.name!r} has batch size {shape[0]}; the model accepts 1..{max_rows} rows"
        )
    size = count * _ITEMSIZE[spec.datatype]
    if size > max_bytes:
        raise InvalidRequest(
            f"input {t.name!r} declares shape {_dims(shape)}: {count} {spec.datatype} elements, "
            f"{size} bytes decoded, over the server's bound of {max_bytes} bytes; "
            "send fewer rows per request"
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


def _dims(shape: Sequence[int]) -> str:
    """A shape for a message: ``[1, 16]``, or its first dimensions when there are many."""
    if len(shape) <= 8:
        return str(list(shape))
    return f"[{', '.join(map(str, shape[:8]))}, ... ({len(shape)} dimensions)]"


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


_KINDS = {"BOOL": "b", **{t: "iu" for t in NUMPY_DTYPES if t[0] in "IU"}}
_KINDS.update({t: "iuf" for t in ("FP16", "FP32", "FP64")})
"""The numpy kinds a datatype's elements may arrive as (b bool, i/u integer, f float)."""

_WANTED = {"b": "booleans", "iu": "integers", "iuf": "numbers"}
_FITS: dict[str, tuple[type, ...]] = {"b": (bool,), "iu": (int,), "iuf": (int, float)}

_DTYPES = {t: np.dtype(d) for t, d in NUMPY_DTYPES.items()}
_FINITE_MAX = {t: float(np.finfo(NUMPY_DTYPES[t]).max) for t in ("FP16", "FP32")}
"""The largest finite values of the floating-point datatypes a JSON number can overflow."""

_ITEMSIZE = {t: 1 if t == "BYTES" else np.dtype(d).itemsize for t, d in NUMPY_DTYPES.items()}
"""Decoded bytes per element; a BYTES element takes at least one byte of any body."""


def _from_elements(datatype: str, data: Sequence[Any], where: str) -> Array:
    """Elements (a flat or nested list, or gRPC typed contents) as a flat array."""
    if datatype == "BYTES":
        return _bytes_from_elements(data, where)
    dtype = _DTYPES[datatype]
    try:
        src = np.asarray(data).reshape(-1)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise InvalidRequest(
            f"{where} data is not a list of {datatype} elements (nested lists must be even): "
            f"{str(e).splitlines()[0]}"
        ) from None
    if src.size == 0:
        return np.empty(0, dtype=dtype)
    wanted = _KINDS[datatype]
    if src.dtype.kind not in wanted and dtype.kind in "iu":
        src = _exact_integers(data, datatype, where, src)
    if src.dtype.kind not in wanted:
        held = _offending(data, wanted, dtype)
        hint = " (JSON has no NaN; send binary data for NaN)" if held == "null" else ""
        raise InvalidRequest(
            f"{where} data holds {held}; {datatype} elements are {_WANTED[wanted]}{hint}"
        )
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = int(src.min()), int(src.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidRequest(
                f"{where} data holds {bad}, outside {datatype}'s range {info.min}..{info.max}"
            )
    fmax = _FINITE_MAX.get(datatype)
    if fmax is not None and (src.dtype.itemsize > dtype.itemsize or datatype == "FP16"):
        magnitude = np.abs(src)
        if magnitude.max() > fmax:  # NaN compares false; infinities are the client's own
            over = np.isfinite(src) & (magnitude > fmax)
            if over.any():
                raise InvalidRequest(
                    f"{where} data holds {src[over][0]}, beyond {datatype}'s largest finite "
                    f"value {fmax}"
                )
    out = src.astype(dtype, copy=False)
    return out


def _exact_integers(data: Sequence[Any], datatype: str, where: str, src: Array) -> Array:
    """Integers numpy read as floats or objects (0 and 2**63 have no common integer type),
    exactly; ``src`` unchanged when some element is not an integer."""
    leaves = np.asarray(data, dtype=np.object_).reshape(-1)
    if not all(type(v) is int for v in leaves):
        return src
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    info = np.iinfo(dtype)
    low, high = min(leaves), max(leaves)
    if low < info.min or high > info.max:
        raise InvalidRequest(
            f"{where} data holds {low if low < info.min else high}, outside "
            f"{datatype}'s range {info.min}..{info.max}"
        )
    return leaves.astype(dtype)


def _offending(data: Sequence[Any], wanted: str, dtype: np.dtype[Any]) -> str:
    """The first element a datatype cannot hold, described (the error path only)."""
    leaves = np.asarray(data, dtype=np.object_).reshape(-1)
    fits = _FITS[wanted]
    for leaf in leaves:
        if not isinstance(leaf, fits) or (isinstance(leaf, bool) and wanted != "b"):
            return (
                f"a fractional number ({leaf!r})" if type(leaf) is float else describe_value(leaf)
            )
    return "numbers it cannot hold"


def _bytes_from_elements(data: Sequence[Any], where: str) -> Array:
    """BYTES elements: strings (encoded as UTF-8) or bytes, never anything else (an
    integer ``n`` is not ``bytes(n)``, n zero bytes)."""
    try:
        flat = np.asarray(data, dtype=np.object_).reshape(-1)
        items = [x.encode() if type(x) is str else x for x in flat]
    except (ValueError, TypeError, RecursionError, UnicodeError) as e:
        raise InvalidRequest(
            f"{where} data is not a list of BYTES elements (strings): {str(e).splitlines()[0]}"
        ) from None
    for x in items:
        if type(x) is not bytes:
            raise InvalidRequest(
                f"{where} data holds {describe_value(x)}; BYTES elements are strings"
            )
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def describe_value(value: Any) -> str:
    """What a request's value is, for a one-line message, without echoing much of it
    (and without recursing into it): ``a number (5)``, ``a list of 2 items``."""
    if value is None:
        return "null"
    if isinstance(value, list | tuple | dict):
        n = len(value)
        kind = "an object" if isinstance(value, dict) else "a list"
        return f"{kind} of {n} {'entry' if n == 1 else 'entries'}"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    kind = {int: "a number", float: "a number", str: "a string"}.get(
        type(value), type(value).__name__
    )
    text = repr(value[:40] if isinstance(value, str | bytes) else value)
    return f"{kind} ({text if len(text) <= 40 else text[:37] + '...'})"


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
