"""Dynamic batching as a pure policy: "dispatch now, or wait until when?".

Only ``policies.queue`` asks it (the one queue the fake server, the serving runtime and
both simulators step), so a simulated timeline and a served one batch alike. Semantics
follow Triton's dynamic batcher: a batch goes as soon as it is full (``max_batch_size``)
or a preferred size can be formed; otherwise the batcher waits until the oldest request
has waited ``max_queue_delay_s``, then sends what it has.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ridgeline._fields import Count


class BatchingConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_size: Count = Field(1, le=4096, description="largest batch sent to an instance")
    max_queue_delay_s: float = Field(
        0.0, ge=0.0, le=60.0, description="longest a request waits for a fuller batch"
    )
    preferred_batch_sizes: tuple[Count, ...] = Field(
        (), description="sizes sent at once when they can be formed (each ≤ max_batch_size)"
    )

    @model_validator(mode="after")
    def _preferred_within_max(self) -> BatchingConfig:
        bad = [p for p in self.preferred_batch_sizes if not 1 <= p <= self.max_batch_size]
        if bad:
            raise ValueError(
                f"preferred_batch_sizes {bad} must lie in 1..max_batch_size "
                f"({self.max_batch_size}); lower them or raise max_batch_size"
            )
        return self


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send a batch of ``size`` requests, oldest first, now."""

    size: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Send nothing yet; decide again at ``until`` (or at the next arrival if sooner)."""

    until: float | None


def decide(queued: int, oldest_arrival: float, now: float, cfg: BatchingConfig) -> Dispatch | Wait:
    """Decide for a free instance facing ``queued`` requests, the oldest enqueued at
    ``oldest_arrival``."""
    if queued <= 0:
        return Wait(None)
    if queued >= cfg.max_batch_size:
        return Dispatch(cfg.max_batch_size)
    if cfg.preferred_batch_sizes:
        formable = [p for p in cfg.preferred_batch_sizes if p <= queued]
        if formable:
            return Dispatch(max(formable))
    deadline = oldest_arrival + cfg.max_queue_delay_s
    if now >= deadline:
        return Dispatch(queued)
    return Wait(deadline)
