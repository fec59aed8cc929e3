"""The Python-backend model ``ridgeline export triton`` copies as ``TASK/1/model.py``: a
synthetic task, or the glue of one edge of the plan's graph.

Self-contained on purpose: Triton's Python backend stub runs it with NumPy and its own
``triton_python_backend_utils``, never ridgeline. What it does comes from its
``config.pbtxt`` (``parameters``, and the inputs and outputs it declares):

* ``kind: synthetic``: sleeps ``base_ms + per_item_ms·rows`` once per batch (the
  dynamic batcher hands it every request of the batch at once) and answers as the fake
  server and the runtime's synthetic backend do: output j is 2·input j (or of the last
  input) where the element counts agree, BYTES echo BYTES, anything else zeros.
* ``kind: glue`` (the model ``PARENT_to_CHILD``): an edge of the plan's graph. A parent's
  answer of ``rows`` rows becomes ``rows × factor`` rows of the child's inputs, the
  fraction carried to the next request (at least one row: an ensemble runs every step
  of every request, and Triton takes a tensor of no rows for a batch of one; one
  instance, no batching, so requests pass in order), each input a deterministic
  reshaping of the parent's outputs (``policies/glue.py``, copied beside it): what
  ``ridgeline.serve.graph.adapt`` stands in for (crop the boxes, tokenise a caption).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

try:  # the exporter copies policies/glue.py beside this file
    from ridgeline_glue import adapt, fan_out  # type: ignore[import-not-found]
except ImportError:  # imported from the package (the tests)
    from ridgeline.policies.glue import adapt, fan_out

Array = np.ndarray[Any, Any]
Spec = tuple[str, Any, tuple[int, ...]]
"""An output as the config declares it: (name, NumPy dtype, dims after the batch dim)."""


def synthetic_outputs(inputs: Sequence[Array], specs: Sequence[Spec]) -> list[Array]:
    """One array per output: 2·input (by position), echoed BYTES, or zeros."""
    rows = int(inputs[0].shape[0])
    out = []
    for j, (_, dtype, dims) in enumerate(specs):
        src = inputs[min(j, len(inputs) - 1)]
        shape = (
            rows,
            *(
                src.shape[k] if d == -1 and k < src.ndim else max(d, 1)
                for k, d in enumerate(dims, start=1)
            ),
        )
        same = src.size == math.prod(shape)
        if same and (src.dtype == np.object_) == (np.dtype(dtype) == np.object_):
            doubled = src if src.dtype in (np.object_, np.bool_) else src * 2
            out.append(doubled.astype(dtype).reshape(shape))
        elif np.dtype(dtype) == np.object_:
            out.append(np.full(shape, b"", dtype=np.object_))
        else:
            out.append(np.zeros(shape, dtype=dtype))
    return out


class TritonPythonModel:
    """What Triton's Python backend loads: ``initialize``, then ``execute`` per batch."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.kind = params["kind"]
        self.base_s = float(params.get("base_ms", 0)) / 1000.0
        self.per_item_s = float(params.get("per_item_ms", 0)) / 1000.0
        self.factor = float(params.get("factor", 1))
        self.carried = 0.0
        self.inputs = [t["name"] for t in config["input"]]
        # a batching model's dims leave out the batch dim; the glue's (no batching) hold it
        skip = 0 if config.get("max_batch_size", 0) else 1
        self.outputs: list[Spec] = [
            (
                t["name"],
                pb_utils.triton_string_to_numpy(t["data_type"]),
                tuple(int(d) for d in t["dims"][skip:]),
            )
            for t in config["output"]
        ]

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        arrays = [
            [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.inputs]
            for r in requests
        ]
        if self.kind == "glue":
            answers = []
            for parent in arrays:
                n, self.carried = fan_out(
                    self.carried, int(parent[0].shape[0]), self.factor, at_least=1
                )
                answers.append(adapt(parent, n, [(d, dims) for _, d, dims in self.outputs]))
        else:
            rows = sum(int(a[0].shape[0]) for a in arrays)
            time.sleep(self.base_s + self.per_item_s * rows)
            answers = [synthetic_outputs(a, self.outputs) for a in arrays]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(name, value)
                    for (name, _, _), value in zip(self.outputs, answer, strict=True)
                ]
            )
            for answer in answers
        ]
