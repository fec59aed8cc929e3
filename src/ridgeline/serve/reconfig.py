"""Reconfiguration as a pure policy: when demand has moved far enough from the demand a
plan was made for, re-plan; and what differs between the old plan and the new.

* **Demand estimate** (``estimate_rps``): requests counted over the last ``window_s``.
* **Band, cool-down and stabilisation** (``decide``): a re-plan is due when the estimate leaves
  [planned·(1 − band), planned·(1 + band)] and at least ``cooldown_s`` has passed since
  the last change, so that a noisy estimate does not make the server flap. The new plan
  is made for the estimate times (1 + ``headroom``). A re-plan that fails (``failed``)
  leaves the band where it was and restarts the cool-down. With ``stabilize_s``, a
  re-plan down is for the highest estimate of that window (Kubernetes' scale-down
  stabilisation), so the gaps of bursty traffic do not drain what its bursts need.
* **Difference** (``diff``): per task, the instances to start or to drain, and whether
  anything else changed (variant, segment, batching), which a live server cannot apply
  to a running task in place.

The runtime's controller (``serve.controller``) applies a difference live; a simulator
can drive the same functions in virtual time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ridgeline.pipeline.plan import Plan, TaskPlan


@dataclass(frozen=True, slots=True)
class ReconfigConfig:
    window_s: float = 5.0
    """Demand is estimated over this many seconds of arrivals."""
    band: float = 0.2
    """Re-plan when the estimate is more than this fraction off the planned demand."""
    cooldown_s: float = 10.0
    """At least this long between two changes."""
    headroom: float = 0.1
    """Plan for the estimate times (1 + headroom)."""
    min_rps: float = 1.0
    """Never plan for less."""
    stabilize_s: float = 0.0
    """Scale-down stabilisation (Kubernetes' HPA calls it the scale-down stabilisation
    window): a re-plan below the band is for the highest estimate of the last
    ``stabilize_s``, and none is made while that one is inside the band. Bursty traffic
    (a recorded trace's idle gaps) then does not drain instances a burst needs a moment
    later; demand that rises is followed at once. 0: the current estimate alone."""


@dataclass(frozen=True, slots=True)
class ReconfigState:
    planned_rps: float
    last_change_s: float = float("-inf")
    recent: tuple[tuple[float, float], ...] = ()
    """(time, estimate) of the last ``stabilize_s``, oldest first."""


@dataclass(frozen=True, slots=True)
class Replan:
    demand_rps: float
    reason: str


def estimate_rps(arrivals: Sequence[float], now: float, window_s: float) -> float:
    """Requests per second over the ``window_s`` before ``now`` (arrival times, s)."""
    recent = [t for t in arrivals if now - window_s < t <= now]
    return len(recent) / window_s


def decide(
    cfg: ReconfigConfig, state: ReconfigState, now: float, estimate: float
) -> tuple[Replan | None, ReconfigState]:
    """Whether to re-plan now, and the state after."""
    if cfg.stabilize_s > 0:
        kept = tuple((t, e) for t, e in state.recent if t > now - cfg.stabilize_s)
        state = replace(state, recent=(*kept, (now, estimate)))
        if estimate < state.planned_rps:  # going down: the highest of the window, if lower
            estimate = min(state.planned_rps, max(e for _, e in state.recent))
    lo, hi = state.planned_rps * (1 - cfg.band), state.planned_rps * (1 + cfg.band)
    if lo <= estimate <= hi:
        return None, state
    if now - state.last_change_s < cfg.cooldown_s:
        return None, state
    target = max(cfg.min_rps, estimate * (1 + cfg.headroom))
    side = "above" if estimate > hi else "below"
    held = (
        f" (the highest of the last {cfg.stabilize_s:g} s)"
        if side == "below" and cfg.stabilize_s > 0
        else ""
    )
    reason = (
        f"demand {estimate:.1f} req/s{held} is {side} the band [{lo:.1f}, {hi:.1f}] around "
        f"the planned {state.planned_rps:.1f} req/s; re-plan for {target:.1f} req/s"
    )
    return Replan(target, reason), replace(state, planned_rps=target, last_change_s=now)


def failed(before: ReconfigState, after: ReconfigState) -> ReconfigState:
    """The state when the re-plan that ``decide`` asked for (``before`` → ``after``)
    could not be made or applied: the server still runs the plan for the old demand, so
    the band stays around it; the cool-down restarts, so a re-plan that failed is tried
    again no sooner than a change would be."""
    return replace(after, planned_rps=before.planned_rps)


@dataclass(frozen=True, slots=True)
class TaskChange:
    task: str
    instances_before: int
    instances_after: int
    replaced: bool
    """Something a running task cannot take in place changed (variant, segment, batch
    size)."""
    queue_delay_ms: float | None = None
    """The new batching delay, when only it changed besides the instances."""


_LIVE = ("instances", "latency_budget_ms", "max_queue_delay_ms")
"""What a running task takes in place."""


def diff(old: Plan, new: Plan) -> list[TaskChange]:
    """What differs, task by task (tasks that did not change are left out)."""
    if set(old.tasks) != set(new.tasks) or old.edges != new.edges:
        raise ValueError("the new plan has other tasks or edges; serve it afresh")
    out = []
    for name, before in old.tasks.items():
        after = new.tasks[name]
        replaced = before.model_copy(update={k: getattr(after, k) for k in _LIVE}) != after
        delay = after.max_queue_delay_ms
        moved = delay != before.max_queue_delay_ms
        if before.instances != after.instances or replaced or moved:
            out.append(
                TaskChange(
                    name, before.instances, after.instances, replaced, delay if moved else None
                )
            )
    return out


def describe(change: TaskChange, before: TaskPlan, after: TaskPlan) -> str:
    """One change as a log reads it: ``detect: 1 -> 2 instances``, ``car: queue delay 2 ->
    1.5 ms``, ``face: arcface-r18 cpu1 batch 1 -> arcface-r50 cpu1 batch 2``."""
    parts = []
    if change.replaced:
        parts.append(
            f"{before.variant} {before.segment.label} batch {before.batch_size} -> "
            f"{after.variant} {after.segment.label} batch {after.batch_size}"
        )
    if change.instances_before != change.instances_after:
        parts.append(f"{change.instances_before} -> {change.instances_after} instances")
    if change.queue_delay_ms is not None:
        parts.append(f"queue delay {before.max_queue_delay_ms:g} -> {change.queue_delay_ms:g} ms")
    return f"{change.task}: {', '.join(parts)}"
