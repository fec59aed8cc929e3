"""``ridgeline serve PLAN --reconfigure``: the controller runs beside the server, and a
demand well above the plan's makes it re-plan and start more instances."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _timing import running
from ridgeline.cli import app
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.pipeline.plan import dump_plan
from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import plan_pipeline
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.spec import PipelineSpec
from ridgeline.serve.controller import planner_replan
from ridgeline.workload.arrivals import parse_arrival

pytestmark = pytest.mark.timeout(120)


def spec() -> PipelineSpec:
    synthetic = {"base_ms": 40, "per_item_ms": 0, "noise_cv": 0, "max_batch_size": 4}
    return PipelineSpec.model_validate(
        {
            "name": "one",
            "slo_ms": 400,
            "demand_rps": 10,
            "tasks": {"work": {"variants": [{"name": "w", "accuracy": 1, "synthetic": synthetic}]}},
        }
    )


def table() -> ProfileTable:
    """40 ms a batch of up to 4 on one core: 100 rows/s an instance at batch 4."""
    return ProfileTable(
        [ProfileRow("w", "cpu", "cpu1", b, 40.0, b / 40.0 * 1000.0, "measured") for b in (1, 4)]
    )


def test_the_replan_is_the_planner_at_the_new_demand() -> None:
    replan = planner_replan(spec(), table(), {"cpu": 8.0})
    low, high = replan(10.0), replan(600.0)
    assert low.tasks["work"].instances < high.tasks["work"].instances
    assert high.demand_rps == 600.0


def test_reconfigure_needs_the_spec_and_the_profiles(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(dump_plan(to_plan(plan_pipeline(spec(), table(), {"cpu": 2.0}))))
    got = CliRunner().invoke(app, ["serve", str(plan), "--reconfigure"])
    assert got.exit_code == 2, got.output
    assert "--reconfigure re-plans: give --spec" in got.output


@pytest.mark.slow
async def test_serve_reconfigure_scales_up_when_demand_rises(tmp_path: Path) -> None:
    s = spec()
    (tmp_path / "spec.yaml").write_text(s.model_dump_json())
    (tmp_path / "p.csv").write_text(table().to_csv())
    plan = tmp_path / "plan.yaml"
    plan.write_text(dump_plan(to_plan(plan_pipeline(s, table(), {"cpu": 2.0}))))
    cmd = [sys.executable, "-m", "ridgeline", "serve", str(plan), "--port", "0"]
    cmd += ["--grpc-port", "0", "--reconfigure", "--spec", str(tmp_path / "spec.yaml")]
    cmd += ["--profiles", str(tmp_path / "p.csv"), "--gpus", "2cpu"]
    with running(cmd) as stdout:
        line = stdout.wait_for("reconfiguring around", timeout=60)
        found = re.search(r"v2 HTTP (\S+),", line)
        assert found is not None, line
        # 100 req/s against a plan for 10: out of the band once the controller's
        # cool-down (10 s from the start) has passed. Sent until the re-plan is seen, not
        # for a fixed time: the server is in its own process, so this loop only sends
        sched = from_arrival(parse_arrival("poisson", 100.0), 60.0)
        stop = asyncio.Event()
        sending = asyncio.create_task(measure_step(found.group(1), sched, StepConfig(), stop=stop))
        try:
            event = await asyncio.to_thread(stdout.wait_for, "re-plan for", 60)
        finally:
            stop.set()
            await sending
        assert re.search(r"instances work [2-9]", event), event


async def test_a_task_replaced_live_loses_no_request(tmp_path: Path) -> None:
    """detect → classify, synthetic. While requests keep coming, classify is replaced
    by another batching and speed (what a re-plan to another variant or segment asks):
    every request is answered, none dropped or failed, and the new queue serves from
    then on."""
    import numpy as np

    from ridgeline.pipeline.plan import Plan
    from ridgeline.serve.runtime import PlanServer

    def synthetic(ms: float, batch: int) -> dict[str, float]:
        return {"base_ms": ms, "per_item_ms": 0.0, "noise_cv": 0.0, "max_batch_size": batch}

    plan = Plan.model_validate(
        {
            "name": "pipe",
            "slo_ms": 5000,
            "tasks": {
                "detect": {
                    "variant": "d",
                    "synthetic": synthetic(2, 4),
                    "batch_size": 4,
                    "latency_budget_ms": 2500,
                },
                "classify": {
                    "variant": "c",
                    "synthetic": synthetic(5, 2),
                    "batch_size": 2,
                    "latency_budget_ms": 2500,
                },
            },
            "edges": [{"source": "detect", "target": "classify", "factor": 2}],
        }
    )
    new = plan.tasks["classify"].model_copy(
        update={
            "variant": "c2",
            "synthetic": plan.tasks["classify"].synthetic.model_copy(
                update={"base_ms": 3.0, "max_batch_size": 8}
            ),
            "batch_size": 8,
            "max_queue_delay_ms": 2.0,
            "instances": 2,
        }
    )
    async with PlanServer(plan, tmp_path, http_port=0, grpc_port=None, drop=False) as server:
        model = server.models["pipe"]
        before = server.queues["classify"]
        x = [np.ones((1, 4), np.float32)]

        async def one() -> list[object]:
            return await model.infer(1, x)  # type: ignore[attr-defined, no-any-return]

        first = [asyncio.create_task(one()) for _ in range(40)]
        await asyncio.sleep(0)
        swap = asyncio.create_task(server.replace("classify", new))
        more = [asyncio.create_task(one()) for _ in range(40)]
        await swap
        last = [asyncio.create_task(one()) for _ in range(40)]
        answers = await asyncio.gather(*first, *more, *last)
        assert len(answers) == 120  # every one answered (a failure would have raised)
        assert server.queues["classify"] is not before and before.idle()
        assert server.queues["classify"].cfg.max_batch_size == 8
        assert server.plan.tasks["classify"].variant == "c2"
        assert len(server.workers["classify"]) == 2
