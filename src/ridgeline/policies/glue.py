"""The glue between the tasks of a served graph: how many child rows a parent's answer
becomes, and what those rows hold.

A real deployment writes this glue itself (crop the detected boxes, tokenise a caption);
ridgeline stands in for it with a deterministic reshaping, so that every model's compute
is real and only the content of a child's input is not. The runtime (``serve.graph``)
and both exported applications (the Ray Serve module and Triton's Python-backend glue
model) call these two functions, so a plan fans out the same way on every engine.

NumPy only, on purpose: the exporters copy this file beside the applications they write
(as ``ridgeline_glue.py``), which run where ridgeline is not installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

COPIED_AS = "ridgeline_glue"
"""The module name the exporters copy this file under."""

Array = np.ndarray[Any, Any]
Target = tuple[Any, Sequence[int]]
"""A child input as the glue needs it: (NumPy dtype, dims after the batch dim; -1 or 0
for a free dim, which gets 1)."""


def fan_out(carried: float, rows: int, factor: float, *, at_least: int = 0) -> tuple[int, float]:
    """Child rows for ``rows`` parent rows over an edge of ``factor``, and the fraction
    carried to the next request: over many requests the child sees exactly ``factor``
    times the parent's rows (a detector finding 2.5 objects per frame on average).
    ``at_least`` rows are sent even when fewer are due (an engine that runs every step of
    every request, as Triton's ensemble does, then sends the child more than planned)."""
    total = carried + rows * factor
    n = max(at_least, math.floor(total + 1e-9))
    return n, max(0.0, total - n)


def adapt(parent: Sequence[Array], rows: int, targets: Sequence[Target]) -> list[Array]:
    """``rows`` rows for each of ``targets`` from the parent's outputs, deterministically:
    the parent's numbers, tiled to size; integer and boolean inputs (token ids, masks)
    get 0 or 1, valid for any vocabulary."""
    numeric = [a.reshape(-1) for a in parent if a.dtype != np.object_ and a.size]
    flat = np.concatenate(numeric) if numeric else np.zeros(1, dtype=np.float32)
    out = []
    for dtype, dims in targets:
        shape = (rows, *(max(d, 1) for d in dims))
        values = np.resize(flat, math.prod(shape))
        if np.dtype(dtype).kind in "iub":
            values = np.abs(values) > 0.5
        out.append(np.ascontiguousarray(values.astype(dtype).reshape(shape)))
    return out
