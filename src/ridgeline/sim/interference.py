"""Interference from a co-located tenant: service runs ``1 + amount`` times slower while
the neighbour is busy.

The neighbour is busy in periodic windows: ``[phase_s + k·period_s, phase_s + k·period_s
+ duty·period_s)`` for every integer ``k``, in seconds of server time; ``duty = 1`` means
always busy. The simulator evaluates ``factor`` when a batch starts, so a batch started in
a window takes its whole, slowed service time.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Interference(BaseModel):
    """A co-located tenant that slows service by ``1 + amount`` during its busy windows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    amount: float = Field(
        gt=0.0,
        le=100.0,
        allow_inf_nan=False,
        description="extra service time while busy: 0.5 makes every batch 1.5x slower",
    )
    period_s: float = Field(
        60.0, gt=0.0, allow_inf_nan=False, description="seconds from one busy window to the next"
    )
    duty: float = Field(
        1.0, gt=0.0, le=1.0, description="fraction of each period the neighbour is busy (1: always)"
    )
    phase_s: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="server time at which a busy window opens"
    )

    def busy(self, t_s: float) -> bool:
        """Whether the neighbour is busy at server time ``t_s``."""
        if self.duty >= 1.0:
            return True
        return (t_s - self.phase_s) % self.period_s < self.duty * self.period_s

    def factor(self, t_s: float) -> float:
        """The slowdown of a batch started at server time ``t_s``: 1 + amount or 1."""
        return 1.0 + self.amount if self.busy(t_s) else 1.0
