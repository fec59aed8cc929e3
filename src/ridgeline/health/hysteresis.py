"""Hysteresis over window assessments: the reported state moves only when windows agree.

``smooth(prev, assessment, cfg)`` is pure: the state goes in, the reported state and the
next state come out. Rules:

- **Agreement.** A *run* is the consecutive windows whose assessed state lies on the
  same side of the reported state (all worse, or all better). The reported state moves
  once a run reaches ``k`` windows, to the state of the last ``k`` nearest the reported
  one: every one of them agrees that things are at least that bad (or that good). So
  one bad window does not flip the state, and Unhealthy/Overloaded windows that
  alternate under load still move a Healthy state (to Unhealthy). A window assessed as
  the reported state ends the run.
- **Spikes.** A run of at most ``spike_windows`` worse windows, each scored above 1 but
  below ``spike_max_score``, is a tolerated spike while it lasts: it does not move the
  state (even when ``k`` ≤ ``spike_windows``) and each of its windows is flagged
  ``spike=True`` when smoothed. Should the run go on past ``spike_windows`` it is no spike:
  its windows count towards ``k`` from its start, and the state moves after
  max(k, spike_windows + 1) windows.
- **A dying server.** A window in which every answered request failed
  (``Assessment.all_failed``) moves the state to Critical at once: there is nothing to
  smooth, and waiting ``k`` windows would keep loading a dead server.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ridgeline.health.engine import severity
from ridgeline.health.state import Assessment, HealthState


class HysteresisConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(3, ge=1, description="consecutive agreeing windows that move the state")
    spike_windows: int = Field(
        1, ge=0, description="longest run of moderately bad windows tolerated as a spike"
    )
    spike_max_score: float = Field(
        3.0, gt=1, description="a window scored at or above this is never a spike"
    )


@dataclass(frozen=True, slots=True)
class HysteresisState:
    state: HealthState
    """The reported state."""
    run: tuple[HealthState, ...] = ()
    """Assessed states of the current run (one side of ``state``), oldest first, at most
    ``k`` kept."""
    run_length: int = 0
    direction: int = 0
    """+1 when the run is worse than ``state``, −1 when better, 0 with no run."""
    spiky: bool = False
    """Every window of the run so far was spike-like (worse, 1 < score < spike_max_score)."""
    spike: bool = False
    """The window just smoothed was tolerated as a spike."""

    @classmethod
    def initial(cls, state: HealthState = HealthState.HEALTHY) -> HysteresisState:
        return cls(state=state)


def smooth(
    prev: HysteresisState, a: Assessment, cfg: HysteresisConfig
) -> tuple[HealthState, HysteresisState]:
    """The reported state after window ``a``, and the state to pass to the next call."""
    if a.all_failed:
        return HealthState.CRITICAL, HysteresisState.initial(HealthState.CRITICAL)
    gap = severity(a.state) - severity(prev.state)
    if gap == 0:
        return prev.state, HysteresisState.initial(prev.state)
    direction = 1 if gap > 0 else -1
    fresh = direction != prev.direction
    spike_like = direction > 0 and 1 < a.score < cfg.spike_max_score
    run_length = 1 if fresh else prev.run_length + 1
    spiky = spike_like and (fresh or prev.spiky)
    run = ((a.state,) if fresh else (*prev.run, a.state))[-cfg.k :]
    if spiky and run_length <= cfg.spike_windows:
        return prev.state, HysteresisState(prev.state, run, run_length, direction, True, True)
    if run_length >= cfg.k:
        nearest = min(run, key=lambda s: abs(severity(s) - severity(prev.state)))
        return nearest, HysteresisState.initial(nearest)
    return prev.state, HysteresisState(prev.state, run, run_length, direction, spiky, False)
