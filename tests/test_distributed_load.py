"""One schedule sent from Ray generator actors: the rate held, the workers' records
merged exactly, a lost worker named, a bad ``--workers`` refused in one line.

The generators run in actor processes of the session's local Ray cluster (``ray_local``),
so the fake server can run in the test's own event loop.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from _cli import ridgeline
from _timing import await_until
from conftest import StartFake
from ridgeline.aio import run_coroutine
from ridgeline.errors import ConfigError, TargetUnreachableError
from ridgeline.loadgen.distributed import ACTOR_PREFIX
from ridgeline.loadgen.replayer import Progress
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.policies.batching import BatchingConfig
from ridgeline.synthetic.model import LatencyModel
from ridgeline.telemetry.records import Outcome

QUICK = LatencyModel(
    base_ms=1.0, per_item_ms=0.1, batching=BatchingConfig(max_batch_size=8, max_queue_delay_s=0.001)
)
# judged on a fixed bound: on a shared 2-core host the 1 ms floor of the default rule
# measures the host (the sends' lateness is asserted below on its own)
TWO = StepConfig(
    workers="ray:auto", processes=2, validity=ValidityConfig(lateness_p99_bound_s=0.05)
)


def _constant(rate: float, seconds: float) -> Any:
    from ridgeline.workload.arrivals import parse_arrival

    return from_arrival(parse_arrival("constant", rate), seconds)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_two_workers_hold_the_rate_and_merge_to_the_union_of_their_records(
    ray_local: Any, start_fake: StartFake
) -> None:
    server = await start_fake(QUICK, grpc_port=None)
    schedule = _constant(200.0, 3.0)
    result = await measure_step(server.model_url, schedule, TWO)
    s = result.summary
    assert s.valid, s.invalid_reason
    assert s.processes == 2
    assert s.workers is not None
    (node,) = {n["NodeManagerAddress"] for n in ray_local.nodes()}
    assert [(w.worker, w.node, w.scheduled, w.sent, w.state) for w in s.workers] == [
        (0, node, 300, 300, "ok"),
        (1, node, 300, 300, "ok"),
    ]
    assert s.ok == 600
    # 600 answers over the 3 s to the last of them, and at most the slowest's latency past
    assert s.latency_ms.max is not None
    assert 600 / (3.0 + s.latency_ms.max / 1000.0) <= s.achieved_rps <= 200.0
    parts = result.worker_records
    assert parts is not None and all(p is not None for p in parts)
    mine = [p for p in parts if p is not None]
    for load, part in zip(s.workers, mine, strict=True):
        # one start for both, each on its own clock: no send early, most on time
        late_ms = part.lateness * 1000.0
        assert late_ms.min() >= 0 and np.median(late_ms) < 5.0
        expected = float(np.percentile(late_ms, 99, method="inverted_cdf"))
        assert load.lateness_p99_ms == pytest.approx(expected, rel=2e-3, abs=2e-3)
    np.testing.assert_array_equal(mine[0].scheduled, schedule.times[0::2])
    np.testing.assert_array_equal(mine[1].scheduled, schedule.times[1::2])
    union_ms = np.concatenate([p.latency_from_schedule for p in mine]) * 1000.0
    assert union_ms.min() > 0
    # the merged summary is the union's: its order statistics, to the histogram's 3 figures
    for name, q in (("p50", 50), ("p99", 99)):
        expected = float(np.percentile(union_ms, q, method="inverted_cdf"))
        assert getattr(s.latency_ms, name) == pytest.approx(expected, rel=2e-3, abs=2e-3)
    assert s.latency_ms.mean == pytest.approx(float(union_ms.mean()))
    assert s.latency_ms.max == pytest.approx(float(union_ms.max()), rel=2e-3, abs=2e-3)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_worker_lost_mid_step_makes_it_invalid_naming_it_and_keeps_the_others(
    ray_local: Any, start_fake: StartFake
) -> None:
    ray = ray_local
    server = await start_fake(QUICK, grpc_port=None)
    progress = Progress()
    before = set(ray.util.list_named_actors())
    step = asyncio.ensure_future(
        measure_step(server.model_url, _constant(200.0, 3.0), TWO, progress=progress)
    )
    await await_until(lambda: progress.sent >= 100 or step.done(), 60, "both workers sending")
    assert not step.done()
    (victim,) = [
        n
        for n in ray.util.list_named_actors()
        if n not in before and n.startswith(ACTOR_PREFIX) and n.endswith("-1")
    ]
    ray.kill(ray.get_actor(victim))
    result = await step
    s = result.summary
    assert not s.valid
    assert s.invalid_reason is not None
    (node,) = {n["NodeManagerAddress"] for n in ray.nodes()}
    assert s.invalid_reason.startswith(f"generator worker 1 (node {node}) died after ")
    assert s.workers is not None
    lost = s.workers[1]
    assert lost.state == "lost" and 0 < lost.sent < 300
    assert s.workers[0].state == "ok"
    # the survivor's records are all there; the lost worker's requests still count
    assert result.worker_records is not None
    survivor, gone = result.worker_records
    assert gone is None
    assert survivor is not None and survivor.count(Outcome.OK) == 300
    assert (s.scheduled, s.ok, s.not_sent) == (600, 300, 300)


@pytest.mark.parametrize("value", ["ray:", "auto", "ray://head", "ray://head:port", "tcp://h:1"])
def test_a_worker_address_of_another_form_names_the_accepted_ones(value: str) -> None:
    with pytest.raises(ValidationError, match=r"give ray://HOST:PORT .* or ray:auto"):
        StepConfig(workers=value)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "probe"])
def test_the_cli_refuses_a_bad_worker_address_in_one_line(command: str) -> None:
    rate = ["--rate", "5"] if command == "run" else ["--max-rate", "5"]
    res = ridgeline(command, "null://", *rate, "--workers", "ray//head:10001")
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert "not a worker address: give ray://HOST:PORT" in line
    assert "ray:auto" in line and "'ray//head:10001'" in line


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_worker_that_cannot_reach_the_endpoint_fails_the_step_naming_it(
    ray_local: Any,
) -> None:
    url = "http://127.0.0.1:1/v2/models/none"  # nothing listens on port 1
    with pytest.raises(TargetUnreachableError, match=r"^generator worker \d could not start: "):
        await measure_step(url, _constant(10.0, 1.0), TWO)


def test_without_ray_a_distributed_step_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed
    with pytest.raises(ConfigError, match=re.escape("pip install 'ridgeline[ray]'")):
        run_coroutine(measure_step("null://", _constant(10.0, 1.0), TWO))
