"""The fake server's model as a v2 server sees it (``v2.server.V2Model``): the latency
model's tensors, metadata and Triton config, its requests batched by the engine, its
answers the synthetic ones (``synthetic.outputs``), its statistics Triton's.

The v2 HTTP routes and gRPC service of ``v2.server`` serve it as they serve the runtime's
models; the fast path (``_fastpath.py``) takes the same model in two steps (``submit``,
then ``answer``) so that it needs no task per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ridgeline.errors import InferFailed
from ridgeline.fakeserver.engine import BatchingEngine, Outcome, Status
from ridgeline.synthetic.model import LatencyModel
from ridgeline.synthetic.outputs import compute_outputs
from ridgeline.v2 import describe
from ridgeline.v2.spec import TensorSpec
from ridgeline.v2.tensors import Array

SERVER_NAME = "ridgeline-fakeserver"
PLATFORM = "ridgeline_fake"


class FakeModel:
    """One ``LatencyModel`` served on a ``BatchingEngine``, counting into its ``Stats``."""

    def __init__(self, model: LatencyModel, engine: BatchingEngine) -> None:
        self.model, self.engine, self.stats = model, engine, engine.stats

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self.model.inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self.model.outputs

    @property
    def max_batch_size(self) -> int:
        return self.model.max_batch_size

    def metadata(self) -> dict[str, Any]:
        return describe.model_metadata(self.name, PLATFORM, self.inputs, self.outputs)

    def config(self) -> dict[str, Any]:
        """Triton-style model configuration (the JSON form of ``model_config.proto``)."""
        m = self.model
        return describe.model_config(
            m.name, PLATFORM, m.inputs, m.outputs, m.batching, m.instances, "KIND_GPU"
        )

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics extension for this model (durations in nanoseconds)."""

        def duration(count: int, us: float) -> dict[str, int]:
            return {"count": count, "ns": round(us * 1000)}

        s = self.stats
        done = s.success + s.outcomes["error"]
        return {
            "name": self.name,
            "version": describe.VERSION,
            "inference_count": s.inference_count,
            "execution_count": s.exec_count,
            "inference_stats": {
                "success": duration(s.success, s.ok_us),
                "fail": duration(s.failure, s.failed_us),
                "queue": duration(done, s.queue_us),
                "compute_input": duration(done, 0.0),
                "compute_infer": duration(done, s.compute_us),
                "compute_output": duration(done, 0.0),
            },
        }

    async def infer(self, rows: int, arrays: list[Array]) -> list[Array]:
        """The outputs, in the order of ``outputs``; raises ``InferFailed``."""
        began = time.perf_counter()
        return self.answer(rows, arrays, await self.engine.submit(rows), began)

    def submit(self, rows: int) -> Outcome | asyncio.Future[Outcome]:
        """``infer``'s first step: the request queued (``BatchingEngine.submit_nowait``)."""
        return self.engine.submit_nowait(rows)

    def answer(self, rows: int, arrays: list[Array], outcome: Outcome, began: float) -> list[Array]:
        """``infer``'s second step, once the engine decided ``outcome``: the outputs, or
        ``InferFailed`` (queue full or shut down: unavailable; an injected error:
        internal); counted, with the time since ``began``."""
        if outcome.status is not Status.OK:
            self.stats.finish(outcome.status.value, time.perf_counter() - began)
            rejected = outcome.status is Status.REJECTED
            raise InferFailed("unavailable" if rejected else "internal", outcome.detail)
        outputs = compute_outputs(self.model, rows, arrays)
        self.stats.finish("ok", time.perf_counter() - began)
        return outputs
