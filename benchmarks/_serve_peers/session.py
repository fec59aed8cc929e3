"""The onnxruntime session every peer runs: the settings of ridgeline's ``onnx`` backend
(``src/ridgeline/serve/_onnx.py``): CPU provider, ``threads`` intra-op threads, one
inter-op thread, sequential execution, default graph optimisation.

Imported by the peers inside ``.bench-venv`` (found there through PYTHONPATH).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort


def open_session(path: str, threads: int | None = None) -> Any:
    """An InferenceSession on ``path``; ``threads`` defaults to $RIDGELINE_BENCH_THREADS."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or int(os.environ.get("RIDGELINE_BENCH_THREADS", "1"))
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def run(session: Any, images: np.ndarray) -> np.ndarray:
    """``logits`` for a batch of ``images``."""
    (logits,) = session.run(["logits"], {"images": images.astype(np.float32, copy=False)})
    return np.asarray(logits)
