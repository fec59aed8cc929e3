"""Backends for tests/test_serve_workers.py, importable by the worker processes it spawns
(a spawned child inherits the parent's sys.path, on which pytest put tests/)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ridgeline.serve.backend import Signature
from ridgeline.v2.spec import TensorSpec

CRASH = 13.0
"""A first element that makes ``Doubler`` end its process with exit code 3."""
RAISE = 7.0
"""A first element that makes ``Doubler`` raise ValueError."""


class Doubler:
    """Y = 2·X, X of ``width`` columns, except on the magic first elements above."""

    def __init__(self, width: int = 4) -> None:
        self.width = width

    def load(self) -> None:
        pass

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        x = inputs["X"]
        if x.flat[0] == CRASH:
            os._exit(3)
        if x.flat[0] == RAISE:
            raise ValueError("seven is not a number this backend takes")
        return {"Y": 2 * x}

    def describe(self) -> Signature:
        spec = (-1, self.width)
        return Signature((TensorSpec("X", "FP32", spec),), (TensorSpec("Y", "FP32", spec),))


class PlacementEcho:
    """Answers where it runs: its CPU affinity and the placement's environment."""

    def load(self) -> None:
        pass

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        env = {k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
        env["MPS"] = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
        return {
            "cores": np.array(sorted(os.sched_getaffinity(0))),
            "env": np.array([f"{k}={v}" for k, v in sorted(env.items())]),
        }

    def describe(self) -> Signature:
        return Signature((), (TensorSpec("cores", "INT64", (-1,)),))


class DiesWhileLoading(Doubler):
    """Ends its process with exit code 5 in ``load``."""

    def load(self) -> None:
        os._exit(5)


class LoadsOnce(Doubler):
    """Loads the first time only: a second load (a restart) finds ``marker`` and fails."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def load(self) -> None:
        if os.path.exists(self.marker):
            raise RuntimeError(f"{self.marker} exists: this backend was loaded before")
        open(self.marker, "w").close()


def doubler_plan_doc() -> dict[str, Any]:
    """A one-task plan (``double``, one instance of ``Doubler`` on one core), as a document."""
    task = {
        "segment": {"kind": "cpu", "cores": 1},
        "latency_budget_ms": 100,
        "variant": "doubler",
        "python": {"target": "_serve_backends:Doubler"},
    }
    return {"name": "p", "slo_ms": 1000, "tasks": {"double": task}}


class Echo:
    """Answers each input as it came (copied: the inputs are views of shared memory)."""

    def load(self) -> None:
        pass

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {name: np.array(x, copy=True) for name, x in inputs.items()}

    def describe(self) -> Signature:
        return Signature((), ())
