"""The ``onnx`` backend: an onnxruntime InferenceSession on one model file.

Imported by worker processes only (``OnnxBackendConfig.build``), so a serving process
that only batches never loads onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import onnxruntime as ort

from ridgeline.errors import BackendConfigError, ModelNotFoundError
from ridgeline.v2.spec import ONNX_TYPES, Signature, TensorSpec, from_onnx
from ridgeline.v2.tensors import Array


class OnnxBackend:
    """An onnxruntime InferenceSession on one model file."""

    def __init__(
        self,
        path: Path,
        *,
        intra_op_threads: int = 1,
        inter_op_threads: int = 1,
        device: Literal["cpu", "cuda"] = "cpu",
    ) -> None:
        self.path = path
        self.intra_op_threads = intra_op_threads
        self.inter_op_threads = inter_op_threads
        self.device = device
        self._session: Any = None
        self._output_names: list[str] = []

    def load(self) -> None:
        if not self.path.is_file():
            raise ModelNotFoundError(str(self.path))

        providers = ["CPUExecutionProvider"]
        if self.device == "cuda":
            _require_cuda_provider(ort.get_available_providers())
            providers.insert(0, "CUDAExecutionProvider")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        if self.inter_op_threads > 1:  # inter-op threads only work in parallel mode
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        try:
            session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as e:  # onnxruntime's own error types (Fail, InvalidProtobuf, ...)
            raise BackendConfigError(
                f"onnxruntime cannot load {self.path}: {e}; check that it is a valid ONNX "
                "model (onnx.checker.check_model) of an opset this onnxruntime supports"
            ) from e
        if self.device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
            raise BackendConfigError(
                f"onnxruntime fell back to the CPU for {self.path}: the CUDA execution provider "
                "did not start (its reason is logged above); check that CUDA and cuDNN match "
                "onnxruntime-gpu and that CUDA_VISIBLE_DEVICES names a device this host has"
            )
        self._session = session
        self._output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        if self._session is None:
            raise BackendConfigError(f"OnnxBackend({self.path}) ran before load(); load it first")
        outputs = self._session.run(self._output_names, dict(inputs))
        return dict(zip(self._output_names, outputs, strict=True))

    def describe(self) -> Signature:
        session = self._session
        return Signature(
            tuple(_tensor_info(arg) for arg in session.get_inputs()),
            tuple(_tensor_info(arg) for arg in session.get_outputs()),
        )


def _require_cuda_provider(available: list[str]) -> None:
    if "CUDAExecutionProvider" not in available:
        raise BackendConfigError(
            "device: cuda needs onnxruntime's CUDAExecutionProvider, but this onnxruntime "
            f"offers only {', '.join(available)}; install onnxruntime-gpu in place of "
            "onnxruntime (pip uninstall onnxruntime; pip install onnxruntime-gpu), or set "
            "device: cpu"
        )


_CARRIED = [f"tensor({t.lower()})" for t in ONNX_TYPES.values()]


def _tensor_info(arg: Any) -> TensorSpec:
    """An onnxruntime NodeArg as a TensorSpec; symbolic or unknown dims become -1."""
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    datatype = from_onnx(arg.type)
    if datatype is None:
        raise BackendConfigError(
            f"tensor {arg.name!r} has type {arg.type}, which the Open Inference Protocol v2 "
            f"cannot carry; export the model with inputs and outputs of {sorted(_CARRIED)}"
        )
    return TensorSpec(arg.name, datatype, shape)
