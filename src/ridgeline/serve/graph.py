"""Running a request through the task graph: fan-out by the edge factors, join at the end.

A pipeline request carries an absolute deadline (arrival + the plan's SLO) to every task
it reaches. The source tasks run on the request's own inputs. When a task answers, each
edge to a child turns its rows into ``rows × factor`` child rows — fractional factors
carried from request to request, so that over many requests the child sees exactly
``factor`` times the parent's rows (a detector that finds 2.5 objects per frame on
average) — split into requests no larger than the child's batch size, all in flight at
once. The answer joins every sink task's outputs, named ``TASK.OUTPUT``.

What passes between tasks is glue a real deployment writes itself (crop the detected
boxes, tokenise a caption). The runtime stands in for it with a deterministic reshaping
of the parent's outputs into the child's input shape (``adapt``): every model's compute
is real, the content of a child's input is not.

If the graph's expected time already passes the deadline at arrival, the whole request
is dropped at once; a drop or an error at any task fails the whole request with it. The
drop rule allows for what the queue model does not see: every expectation of the
request, at arrival and at each task, is scaled by the ``dropping.Slack`` the answers
showed from that same place (the hops to worker processes and back, the glue between
tasks, batch times swinging on shared cores: ``dropping.Trail``), and its deadline keeps
back a low quantile of the event loop's own lateness (``frontend_s``) and ``margin`` of
the SLO (default none, ``DROP_MARGIN``) for what happens outside the pipeline if a
deployment needs it. A plan's per-task latency budgets are the planner's shares of the
SLO, not deadlines: a request behind its share at one task that can still make the
end-to-end deadline is kept (``dropping``). A request that finds every task idle is
never dropped, at any task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

import numpy as np

from ridgeline.clock import Clock
from ridgeline.errors import InferFailed
from ridgeline.pipeline.plan import Edge, Plan
from ridgeline.policies import glue
from ridgeline.policies.dropping import DROP_MARGIN, Slack, Trail, learn
from ridgeline.policies.queue import refuses_request
from ridgeline.serve.batcher import TaskQueue
from ridgeline.v2.spec import TensorSpec
from ridgeline.v2.tensors import NUMPY_DTYPES, Array


def adapt(parent: Sequence[Array], rows: int, specs: Sequence[TensorSpec]) -> list[Array]:
    """``rows`` rows for each of ``specs`` from the parent's outputs: ``policies.glue``'s
    deterministic reshaping, which the exported applications run too."""
    return glue.adapt(parent, rows, [(NUMPY_DTYPES[s.datatype], s.shape[1:]) for s in specs])


class GraphRunner:
    """One plan's requests, through its task queues."""

    def __init__(
        self,
        plan: Plan,
        queues: Mapping[str, TaskQueue],
        clock: Clock,
        margin: float = DROP_MARGIN,
        frontend_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.plan, self.queues, self.clock, self.margin = plan, queues, clock, margin
        self.frontend_s = frontend_s
        """Time a request spends outside the queues, waiting for the event loop on its
        way in and out (``PlanServer``: twice the loop's recent p99 lateness)."""
        self.slack = Slack()
        self.sources = plan.sources()
        self.sinks = [t for t in plan.tasks if not plan.children(t)]
        self._carry: dict[int, float] = {}

    def expected_s(self) -> float:
        """Expected time of a request arriving now: its longest path's."""
        return max(self.queues[s].expected_s() for s in self.sources)

    async def infer(self, rows: int, arrays: list[Array], *, drop: bool = True) -> list[Array]:
        """The sink tasks' outputs, in ``plan.tasks`` order, each task's in its order.
        With ``drop`` false the request is dropped nowhere (not at arrival, not at a
        task)."""
        now, slo_s = self.clock.now(), self.plan.slo_ms / 1000.0
        expected = self.expected_s()
        budget = (1 - self.margin) * slo_s - self.frontend_s()
        deadline, factor = now + budget, self.slack.judge(expected)
        idle = all(q.idle() for q in self.queues.values())
        if drop and refuses_request(now, deadline, factor * expected, idle):
            raise InferFailed(
                "dropped",
                f"cannot meet SLO {self.plan.slo_ms:g} ms: the pipeline's queues already "
                "expect it to finish past its deadline",
            )
        results: dict[str, list[list[Array]]] = {s: [] for s in self.sinks}
        keep = idle or not drop  # kept: no task drops it either
        trail: Trail = [(self.slack, now, expected)]
        await self._gather(
            [self._run(s, rows, arrays, (deadline, trail), results, keep) for s in self.sources]
        )
        out: list[Array] = []
        for sink in self.sinks:
            queue = self.queues[sink]
            for k, spec in enumerate(queue.outputs):
                parts = [r[k] for r in results[sink]]
                if parts:
                    out.append(np.concatenate(parts, axis=0))
                else:
                    dims = tuple(max(d, 1) for d in spec.shape[1:])
                    out.append(np.zeros((0, *dims), dtype=NUMPY_DTYPES[spec.datatype]))
        learn(trail, self.clock.now())
        return out

    async def _run(
        self,
        task: str,
        rows: int,
        arrays: list[Array],
        deadline: tuple[float, Trail],
        results: dict[str, list[list[Array]]],
        keep: bool,
    ) -> None:
        """``rows`` rows at ``task``, then on along its edges; ``deadline``: the request's
        and its checks so far (``dropping.Trail``)."""
        queue = self.queues[task]
        size = queue.cfg.max_batch_size
        due, trail = deadline
        chunks = [
            queue.submit(min(size, rows - i), [a[i : i + size] for a in arrays], due, keep, trail)
            for i in range(0, rows, size)
        ]
        answers: list[list[Array]] = await self._gather(chunks)
        outputs = [
            np.concatenate([a[k] for a in answers], axis=0) for k in range(len(queue.outputs))
        ]
        if task in results:
            results[task].append(outputs)
        children = []
        for i, edge in enumerate(self.plan.edges):
            if edge.source != task:
                continue
            n = self._fan_out(i, edge, rows)
            if n:
                child = self.queues[edge.target]
                children.append(
                    self._run(
                        edge.target,
                        n,
                        adapt(outputs, n, child.inputs),
                        deadline,
                        results,
                        keep,
                    )
                )
        await self._gather(children)

    def _fan_out(self, index: int, edge: Edge, rows: int) -> int:
        n, self._carry[index] = glue.fan_out(self._carry.get(index, 0.0), rows, edge.factor)
        return n

    @staticmethod
    async def _gather(aws: Sequence[Awaitable[object]]) -> list[list[Array]]:
        """All of ``aws``; the first failure (a drop before an error) fails the whole."""
        if not aws:
            return []
        done = await asyncio.gather(*aws, return_exceptions=True)
        failures = [d for d in done if isinstance(d, BaseException)]
        if failures:
            drops = [f for f in failures if isinstance(f, InferFailed) and f.kind == "dropped"]
            raise (drops or failures)[0]
        return [d for d in done if isinstance(d, list)]
