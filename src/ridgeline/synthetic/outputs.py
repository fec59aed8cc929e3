"""The synthetic answer: what each output of a synthetic model holds, given the inputs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2.tensors import LITTLE_ENDIAN, Array


def compute_outputs(model: LatencyModel, rows: int, inputs: Sequence[Array]) -> list[Array]:
    """One array per output spec: 2·input (by position), echoed BYTES, or zeros."""
    out = []
    for j, spec in enumerate(model.outputs):
        i = min(j, len(inputs) - 1)
        src, src_spec = inputs[i], model.inputs[i]
        shape = [rows] + [
            (src.shape[k] if k < src.ndim else 1) if d == -1 else d
            for k, d in enumerate(spec.shape[1:], start=1)
        ]
        same_size = src.size == math.prod(shape)
        if same_size and spec.datatype == "BYTES" and src_spec.datatype == "BYTES":
            out.append(src.reshape(shape))
        elif same_size and "BYTES" not in (spec.datatype, src_spec.datatype):
            doubled = src if src.dtype == np.bool_ else src * 2
            out.append(doubled.astype(LITTLE_ENDIAN[spec.datatype], copy=False).reshape(shape))
        elif spec.datatype == "BYTES":
            blank = np.empty(shape, dtype=np.object_)
            blank.fill(b"")
            out.append(blank)
        else:
            out.append(np.zeros(shape, dtype=LITTLE_ENDIAN[spec.datatype]))
    return out
