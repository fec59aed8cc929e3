"""The reconfiguration controller: the pure policy of ``reconfig`` applied to a live
``PlanServer``.

Every ``interval_s`` it estimates the pipeline's demand from its recent arrivals; when
``reconfig.decide`` calls for a re-plan, it asks ``replan`` (for instance the planner at
the new demand) for a plan, takes the difference, and applies it task by task with
``PlanServer.scale``: new workers start and warm up before they take batches, retired
ones finish their batch in flight. A task whose variant, segment or batching changes is
replaced (``PlanServer.replace``): the new configuration starts and warms up beside the
old, new requests go to it, the old one serves what it holds and stops. Every change is
kept in ``events`` with its reason (and handed to ``on_event``, to store it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ridgeline.aio import wait_event
from ridgeline.errors import RidgelineError
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import plan_pipeline
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.spec import PipelineSpec
from ridgeline.serve.reconfig import (
    ReconfigConfig,
    ReconfigState,
    Replan,
    decide,
    describe,
    diff,
    estimate_rps,
    failed,
)
from ridgeline.serve.runtime import PlanServer


@dataclass(frozen=True, slots=True)
class ReconfigEvent:
    t_s: float
    """Seconds since the controller started."""
    estimate_rps: float
    planned_rps: float
    """The demand the served plan is for after the event (unchanged when it failed)."""
    reason: str
    instances: dict[str, int]
    """Instances per task after the change."""
    skipped: tuple[str, ...] = ()
    """Changes not applied, each with why."""
    applied: tuple[str, ...] = ()
    """What changed in the served tasks (``reconfig.describe``); none when the re-plan
    came out as the plan served (then only the planned demand, and its band, moved)."""

    def line(self) -> str:
        """The event as the logs print it."""
        what = "; ".join(self.applied) if self.applied else "the served tasks unchanged"
        return (
            f"t={self.t_s:.0f}s {self.reason}: {what} (instances "
            + ", ".join(f"{t} {n}" for t, n in self.instances.items())
            + ")"
            + "".join(f"; skipped: {k}" for k in self.skipped)
        )


@dataclass
class Reconfigurer:
    server: PlanServer
    replan: Callable[[float], Plan]
    cfg: ReconfigConfig = field(default_factory=ReconfigConfig)
    interval_s: float = 0.5
    on_event: Callable[[ReconfigEvent], None] | None = None
    events: list[ReconfigEvent] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch and reconfigure until ``stop`` is set."""
        clock = self.server.clock
        t0 = clock.now()
        arrivals = self.server.arrivals
        planned = self.server.plan.demand_rps or 1.0
        state = ReconfigState(planned_rps=planned, last_change_s=t0)
        while not stop.is_set():
            if await wait_event(stop, self.interval_s):
                return
            now = clock.now()
            estimate = estimate_rps(list(arrivals), now, self.cfg.window_s)
            replan, after = decide(self.cfg, state, now, estimate)
            if replan is None:
                continue
            made = await self._apply(replan, estimate, now - t0, state.planned_rps)
            state = after if made else failed(state, after)

    async def _apply(self, replan: Replan, estimate: float, t_s: float, planned: float) -> bool:
        """Re-plan for the demand ``replan`` asks and apply the difference; whether the
        re-plan was made (changes a running task cannot take are skipped, and logged,
        either way). The event logs the demand planned for after it: the old one,
        ``planned``, when the re-plan failed."""
        demand = replan.demand_rps
        skipped: list[str] = []
        applied: list[str] = []
        made = True
        try:
            new = self.replan(demand)
            for change in diff(self.server.plan, new):
                applied.append(
                    describe(change, self.server.plan.tasks[change.task], new.tasks[change.task])
                )
                if change.replaced:  # start the new configuration, shift, drain the old
                    await self.server.replace(change.task, new.tasks[change.task])
                    continue
                if change.queue_delay_ms is not None:
                    self.server.set_queue_delay(change.task, change.queue_delay_ms)
                await self.server.scale(change.task, change.instances_after)
        except (RidgelineError, ValueError) as e:
            made = False
            skipped.append(f"re-plan for {demand:.1f} req/s failed: {e}")
        event = ReconfigEvent(
            t_s,
            estimate,
            demand if made else planned,
            replan.reason,
            {t: p.instances for t, p in self.server.plan.tasks.items()},
            tuple(skipped),
            tuple(applied) if made else (),
        )
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        return made


def planner_replan(
    spec: PipelineSpec, table: ProfileTable, available: Mapping[str, float]
) -> Callable[[float], Plan]:
    """A ``replan`` that asks the planner (``plan_pipeline``) for the spec at a demand."""

    def replan(demand: float) -> Plan:
        return to_plan(
            plan_pipeline(spec.model_copy(update={"demand_rps": demand}), table, available)
        )

    return replan


def serve_reconfiguring_forever(
    plan_path: Path | str,
    replan: Callable[[float], Plan],
    *,
    cfg: ReconfigConfig | None = None,
    announce: Callable[[str], None] = print,
    **options: Any,
) -> None:
    """``ridgeline serve PLAN --reconfigure``: serve the plan at ``plan_path`` with the
    controller running beside it until SIGINT or SIGTERM; each change is announced with
    its reason. ``options`` are ``PlanServer``'s."""
    from ridgeline.aio import run_coroutine, stop_on_signal
    from ridgeline.pipeline.plan import load_plan

    plan = load_plan(plan_path)

    def told(e: ReconfigEvent) -> None:
        announce(e.line())

    async def main() -> None:
        stop = stop_on_signal()
        async with PlanServer(plan, Path(plan_path).parent, **options) as server:
            announce(
                f"serving plan {plan.name!r}: v2 HTTP {server.model_url()}, reconfiguring "
                f"around {plan.demand_rps or 1.0:g} req/s"
            )
            ctl = Reconfigurer(server, replan, cfg or ReconfigConfig(), on_event=told)
            await ctl.run(stop)

    run_coroutine(main())
