"""Backend configs: which backend runs a task's batches, as typed, kind-selected configs.

A backend config is a small frozen pydantic model whose ``kind`` selects the class, so
``{kind: onnx, path: m.onnx}`` validates into ``OnnxBackendConfig``; the worker calls
``config.build(threads)`` in its own process, after it has applied its placement. The
contract a built backend meets is ``serve.backend.Backend``.

=========  =====================================  ========================================
kind       parameters                             a batch is run by
=========  =====================================  ========================================
onnx       path, device (cpu|cuda),               an onnxruntime InferenceSession with
           inter_op_threads                       the placement's intra-op threads
synthetic  base_ms, per_item_ms, noise_cv, seed,  sleeping base_ms + per_item_ms·rows, then
           inputs, outputs                        answering as the fake server (2·input)
python     target ("pkg.module:Name"), options    ``Name(**options)``, any Backend
=========  =====================================  ========================================

``OnnxBackend`` lives in ``serve._onnx``, which only worker processes import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._registry import Registry
from ridgeline.serve._python import load_python_backend
from ridgeline.serve._synthetic import SyntheticBackend
from ridgeline.serve.backend import Backend
from ridgeline.synthetic.model import BatchCost, LatencyModel


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OnnxBackendConfig(_Config):
    """An ONNX model file run by onnxruntime."""

    kind: Literal["onnx"] = "onnx"
    path: Path = Field(description="the .onnx model file")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cuda: CUDA execution provider on the worker's GPU, CPU for the rest"
    )
    inter_op_threads: int = Field(1, ge=1, le=64, description="threads running graph branches")

    def build(self, threads: int) -> Backend:
        """The backend, with ``threads`` intra-op threads (the placement's)."""
        from ridgeline.serve._onnx import OnnxBackend  # onnxruntime loads in workers only

        return OnnxBackend(
            self.path,
            intra_op_threads=threads,
            inter_op_threads=self.inter_op_threads,
            device=self.device,
        )


class SyntheticBackendConfig(BatchCost):
    """The shared latency model: no model file, real sleeps, fake answers."""

    kind: Literal["synthetic"] = "synthetic"
    seed: int = Field(0, description="seed of the noise draws")

    def latency_model(self) -> LatencyModel:
        """The shared latency model with these fields (the rest at their defaults)."""
        return LatencyModel(**self.model_dump(exclude={"kind"}))

    def build(self, threads: int) -> SyntheticBackend:
        """The backend (``threads`` is unused: it only sleeps)."""
        return SyntheticBackend(self.latency_model())


class PythonBackendConfig(_Config):
    """Any importable Backend: ``target`` is called with ``options`` in the worker."""

    kind: Literal["python"] = "python"
    target: str = Field(
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="a Backend class or factory as 'package.module:Name'",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")

    def build(self, threads: int) -> Backend:
        """Import the target and call it (threads reach it as OMP_NUM_THREADS)."""
        return load_python_backend(self.target, self.options)


BackendConfig = Annotated[
    OnnxBackendConfig | SyntheticBackendConfig | PythonBackendConfig,
    Field(discriminator="kind"),
]
"""Any backend config; its ``kind`` field selects the class. The one declaration of the
backend kinds: ``BACKEND_KINDS`` is read from it."""

BACKEND_KINDS: Registry[type[BaseModel]] = Registry.of_union("backend kind", BackendConfig)
"""Each backend config class by its kind, from the union above."""
