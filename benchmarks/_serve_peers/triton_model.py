"""Triton's peer: a Python-backend model (copied into the model repository as
``NAME/1/model.py``) running the shared onnxruntime session.

Triton's own front end parses the v2 requests (HTTP/JSON and gRPC) and its dynamic
batcher groups them (``max_batch_size``, ``max_queue_delay_microseconds`` in
config.pbtxt); the Python backend hands ``execute`` the requests of a batch as a list,
each with its own tensor, so they are stacked along the first dimension for one session
run and the answer is split back per request. Runs in the backend's stub process, under
``.triton-venv``'s Python; the ONNX file is the model parameter ``onnx``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend
from session import open_session, run


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})
        if "onnx" not in params:
            raise ValueError("config.pbtxt names no parameter 'onnx' (the ONNX file)")
        self.session = open_session(params["onnx"]["string_value"])

    def execute(self, requests: list[Any]) -> list[Any]:
        images = [pb_utils.get_input_tensor_by_name(r, "images").as_numpy() for r in requests]
        rows = [len(x) for x in images]
        logits = run(self.session, np.concatenate(images))
        parts = np.split(logits, np.cumsum(rows)[:-1])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("logits", p)]) for p in parts]
