"""Backends: what runs one batch inside a worker process.

A backend meets ``Backend``: ``load()`` once, then ``run(inputs)`` per batch, and
``describe()`` for its tensors. A backend config is a small frozen pydantic model whose
``kind`` selects the class, so ``{kind: onnx, path: m.onnx}`` validates into
``OnnxBackendConfig``; the worker calls ``config.build(threads)`` in its own process,
after it has applied its placement.

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

import importlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ridgeline.clock import Clock, MonotonicClock
from ridgeline.errors import ConfigError
from ridgeline.fakeserver._outputs import compute_outputs
from ridgeline.fakeserver.model import LatencyModel, TensorSpec, service_time_s
from ridgeline.v2.tensors import Array, InvalidRequest


class BackendConfigError(ConfigError):
    """A backend cannot be built or loaded as configured; the message says how to fix it."""


class ModelNotFoundError(BackendConfigError):
    """The model file a backend should load does not exist."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"model file {path} does not exist (resolved: {Path(path).resolve()}); fix the "
            "backend's path (a relative path is read from the serving process's directory)"
        )

    def __reduce__(self) -> tuple[type[ModelNotFoundError], tuple[str]]:
        return type(self), (self.path,)  # crosses the worker's pipe intact


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output: a v2 datatype name ("FP32") and a shape, -1 where dynamic."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Signature:
    """A model's inputs and outputs, in the model's order."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


class Backend(Protocol):
    """Runs batches of one model, one at a time, inside one worker process."""

    def load(self) -> None:
        """Open the model and get ready to run; called once, before any batch."""
        ...

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """One batch: outputs by name for inputs by name, batch dimension first."""
        ...

    def describe(self) -> Signature:
        """The model's tensors; valid after ``load``."""
        ...


class SyntheticBackend:
    """The fake server's latency model as a backend: each batch sleeps its service time
    (base_ms + per_item_ms·rows, with the model's noise), then answers as the fake server
    does (2·input by position, echoed BYTES, or zeros). ``sleep`` and ``clock`` are
    injectable, so tests can record the exact sleeps."""

    def __init__(
        self,
        model: LatencyModel,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Clock | None = None,
    ) -> None:
        self.model = model
        self._sleep = sleep
        self._clock = clock or MonotonicClock()
        self._rng = random.Random(model.seed)
        self._loaded_at = 0.0
        self._rows_served = 0

    def load(self) -> None:
        self._rng = random.Random(self.model.seed)
        self._loaded_at = self._clock.now()
        self._rows_served = 0

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        missing = [s.name for s in self.model.inputs if s.name not in inputs]
        if missing:
            raise InvalidRequest(f"missing inputs {missing}; the batch has {sorted(inputs)}")
        arrays = [inputs[s.name] for s in self.model.inputs]
        rows = {a.shape[0] if a.ndim else 1 for a in arrays}
        if len(rows) > 1:
            raise InvalidRequest(f"inputs disagree on the batch dim: {sorted(rows)} rows")
        n = rows.pop()
        since_load = self._clock.now() - self._loaded_at
        self._sleep(service_time_s(self.model, n, since_load, self._rows_served, self._rng))
        self._rows_served += n
        outputs = compute_outputs(self.model, n, arrays)
        return {s.name: out for s, out in zip(self.model.outputs, outputs, strict=True)}

    def describe(self) -> Signature:
        return Signature(
            tuple(TensorInfo(s.name, s.datatype, s.shape) for s in self.model.inputs),
            tuple(TensorInfo(s.name, s.datatype, s.shape) for s in self.model.outputs),
        )


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


class SyntheticBackendConfig(_Config):
    """The fake server's latency model: no model file, real sleeps, fake answers."""

    kind: Literal["synthetic"] = "synthetic"
    base_ms: float = Field(5.0, ge=0.0, description="fixed cost of one batch, a in a + b·n")
    per_item_ms: float = Field(1.0, ge=0.0, description="cost per row of a batch, b in a + b·n")
    noise_cv: float = Field(0.0, ge=0.0, le=10.0, description="CV of lognormal noise, mean 1")
    seed: int = Field(0, description="seed of the noise draws")
    inputs: tuple[TensorSpec, ...] = Field(
        (TensorSpec(name="INPUT0"),), min_length=1, description="input tensors"
    )
    outputs: tuple[TensorSpec, ...] = Field(
        (TensorSpec(name="OUTPUT0"),), min_length=1, description="output tensors"
    )

    @model_validator(mode="after")
    def _a_valid_model(self) -> Self:
        self.latency_model()  # unique tensor names, as the fake server requires
        return self

    def latency_model(self) -> LatencyModel:
        """The fake server's model with these fields (the rest at their defaults)."""
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
        module_name, _, attr = self.target.partition(":")
        try:
            factory: Any = importlib.import_module(module_name)
        except ImportError as e:
            raise BackendConfigError(
                f"backend target {self.target!r}: cannot import {module_name!r} ({e}); install "
                "it, or put its folder on PYTHONPATH of the serving process"
            ) from e
        for part in attr.split("."):
            factory = getattr(factory, part, None)
        if not callable(factory):
            raise BackendConfigError(
                f"backend target {self.target!r}: {module_name} has no callable {attr!r}; "
                "name a Backend class or a function returning one"
            )
        backend: Backend = factory(**self.options)
        lacking = [
            m for m in ("load", "run", "describe") if not callable(getattr(backend, m, None))
        ]
        if lacking:
            raise BackendConfigError(
                f"backend target {self.target!r} made a {type(backend).__name__}, which lacks "
                f"{', '.join(lacking)}; a Backend needs load(), run(inputs) and describe()"
            )
        return backend


BackendConfig = Annotated[
    OnnxBackendConfig | SyntheticBackendConfig | PythonBackendConfig,
    Field(discriminator="kind"),
]
"""Any backend config; its ``kind`` field selects the class."""
