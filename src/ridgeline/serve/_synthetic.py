"""The ``synthetic`` backend: the shared latency model, sleeping real time per batch."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

from ridgeline.clock import Clock, MonotonicClock
from ridgeline.errors import InvalidRequest
from ridgeline.serve.backend import Signature
from ridgeline.synthetic.model import LatencyModel, service_time_s
from ridgeline.synthetic.outputs import compute_outputs
from ridgeline.v2.tensors import Array


class SyntheticBackend:
    """The shared latency model as a backend: each batch sleeps its service time
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
        return Signature(self.model.inputs, self.model.outputs)
