"""The serving runtime: plans, the drop policy, a task queue's batching, and a served
pipeline driven by tritonclient and by the load engine on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc.aio as tgrpc
import tritonclient.http.aio as thttp
from hypothesis import given, settings
from hypothesis import strategies as st

from _timing import measure_apart, running
from ridgeline.clock import MonotonicClock, VirtualClock
from ridgeline.errors import ConfigError, PlanError
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.pipeline.plan import Plan, dump_plan, load_plan
from ridgeline.policies.batching import BatchingConfig
from ridgeline.policies.dropping import (
    SLACK_QUANTILE,
    ExecModel,
    Slack,
    TaskTiming,
    expected_remaining_s,
    expected_wait_s,
    should_drop,
)
from ridgeline.serve.batcher import TaskQueue
from ridgeline.serve.graph import adapt
from ridgeline.serve.metrics import ServeMetrics
from ridgeline.serve.runtime import PlanServer
from ridgeline.v2.spec import TensorSpec
from ridgeline.workload.arrivals import parse_arrival

TASK = {"segment": {"kind": "cpu", "cores": 1}, "latency_budget_ms": 100}


def synthetic(base_ms: float, per_item_ms: float, **kw: Any) -> dict[str, Any]:
    return {
        "variant": "synthetic",
        "synthetic": {"base_ms": base_ms, "per_item_ms": per_item_ms},
        **TASK,
        **kw,
    }


def three_task_plan(slo_ms: float = 400, **detect: Any) -> dict[str, Any]:
    """A detector (3 objects per frame) feeding two classifiers."""
    return {
        "name": "traffic",
        "slo_ms": slo_ms,
        "tasks": {
            "detect": synthetic(5, 1, batch_size=8, max_queue_delay_ms=5, **detect),
            "car": synthetic(3, 0.5, batch_size=16, max_queue_delay_ms=5),
            "face": synthetic(3, 0.5, batch_size=16, max_queue_delay_ms=5),
        },
        "edges": [
            {"source": "detect", "target": "car", "factor": 3},
            {"source": "detect", "target": "face", "factor": 1.5},
        ],
    }


# --- the plan ---------------------------------------------------------------------------


def test_a_plan_round_trips_through_yaml(tmp_path: Path) -> None:
    plan = Plan.model_validate(three_task_plan())
    path = tmp_path / "plan.yaml"
    path.write_text(dump_plan(plan))
    assert load_plan(path) == plan
    assert plan.sources() == ["detect"]
    assert (plan.arrival_factor("car"), plan.arrival_factor("face")) == (3.0, 1.5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {
                "edges": [
                    {"source": "car", "target": "detect"},
                    {"source": "detect", "target": "car"},
                ]
            },
            "cycle: car -> detect -> car",
        ),
        ({"edges": [{"source": "detect", "target": "nope"}]}, "names task 'nope'"),
        ({"slo_ms": 150}, "path detect -> car has latency budgets summing to 200 ms"),
    ],
)
def test_a_bad_plan_names_the_problem_and_the_fix(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    doc = {**three_task_plan(), **change}
    path = tmp_path / "plan.yaml"
    path.write_text(_yaml(doc))
    with pytest.raises(PlanError, match=re.escape(message)):
        load_plan(path)


@pytest.mark.parametrize("share", [-0.1, 1.0])
def test_a_drop_holdout_outside_0_to_1_is_refused_naming_the_fix(
    tmp_path: Path, share: float
) -> None:
    plan = Plan.model_validate(three_task_plan())
    with pytest.raises(ConfigError, match=r"drop holdout is .*at least 0 and below 1"):
        PlanServer(plan, tmp_path, http_port=0, grpc_port=None, drop_holdout=share)


def test_a_batch_over_the_models_limit_is_refused_at_load(tmp_path: Path) -> None:
    doc = three_task_plan()
    doc["tasks"]["car"]["batch_size"] = 128  # the synthetic model allows 64
    path = tmp_path / "plan.yaml"
    path.write_text(_yaml(doc))
    with pytest.raises(PlanError, match=r"tasks\.car: .*batch_size 128 is over .* 64; lower it"):
        load_plan(path)


def _yaml(doc: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(doc)


def test_a_missing_artifact_is_named_at_start(tmp_path: Path) -> None:
    doc = three_task_plan()
    doc["tasks"]["car"] = {**TASK, "variant": "resnet", "artifact": "models/missing.onnx"}
    plan = Plan.model_validate(doc)

    async def start() -> None:
        async with PlanServer(plan, tmp_path, http_port=0, grpc_port=None):
            pass

    with pytest.raises(PlanError, match=r"tasks\.car\.artifact: .*missing\.onnx does not exist"):
        asyncio.run(start())


# --- the drop policy (pure) -------------------------------------------------------------


def test_expected_wait_is_the_later_of_a_free_instance_and_a_ready_batch() -> None:
    t = TaskTiming(
        ExecModel(0.010), queued_rows=9, batch_size=4, instances=1, max_queue_delay_s=0.005
    )
    # 2 full batches ahead (20 ms); its own batch (9 % 4 + 1 = 2 rows) will not fill, but
    # its 5 ms delay runs out while they run: it starts when the instance is free
    assert expected_wait_s(t) == pytest.approx(0.020)
    # a delay longer than the batches ahead: it starts when the delay is out
    assert expected_wait_s(replace(t, max_queue_delay_s=0.030)) == pytest.approx(0.030)
    t2 = TaskTiming(
        ExecModel(0.010), queued_rows=11, batch_size=4, instances=2, max_queue_delay_s=0.005
    )
    # 2 full batches over 2 instances: one round; its batch fills (11 % 4 + 1 = 4)
    assert expected_wait_s(t2) == pytest.approx(0.010)


def test_a_busy_instance_adds_half_a_batch() -> None:
    t = TaskTiming(
        ExecModel(0.010), queued_rows=3, batch_size=4, instances=1, max_queue_delay_s=0.0, busy=1
    )
    assert expected_wait_s(t) == pytest.approx(0.005)


def test_the_first_of_many_busy_instances_frees_soon() -> None:
    """43 busy instances: the first comes free, on average, in 1/44 of a batch; with 43
    full batches ahead the request waits for the last of them, then a round."""
    busy = TaskTiming(
        ExecModel(0.088), queued_rows=0, batch_size=1, instances=43, max_queue_delay_s=0.0, busy=43
    )
    assert expected_wait_s(busy) == pytest.approx(0.002)
    behind = TaskTiming(
        ExecModel(0.088), queued_rows=43, batch_size=1, instances=43, max_queue_delay_s=0.0, busy=43
    )
    assert expected_wait_s(behind) == pytest.approx(0.088 + 0.002)
    one_idle = TaskTiming(
        ExecModel(0.088), queued_rows=0, batch_size=1, instances=43, max_queue_delay_s=0.0, busy=42
    )
    assert expected_wait_s(one_idle) == 0.0


def test_the_exec_model_fits_warmup_and_scales_by_a_moving_mean() -> None:
    m = ExecModel.from_warmup(0.012, 8, 0.026)  # 1 row 12 ms, 8 rows 26 ms: 10 + 2/row
    assert (m.time(1), m.time(8)) == (pytest.approx(0.012), pytest.approx(0.026))
    slow = m.observe(4, 0.036)  # modelled 18 ms, took 36 (twice): scale 1 -> 1.05
    assert slow.scale == pytest.approx(1.05)
    assert slow.observe(4, 0.009).scale == pytest.approx(1.05 + 0.05 * (0.5 - 1.05))
    assert ExecModel().observe(4, 0.020).time(4) == 0.020  # nothing measured: this batch


def test_expected_remaining_follows_the_longest_path() -> None:
    idle = TaskTiming(ExecModel(0.010), 0, 4, 1, 0.0)
    slow = TaskTiming(ExecModel(0.030), 0, 4, 1, 0.0)
    timings = {"a": idle, "b": idle, "c": slow}
    children = {"a": ["b", "c"], "b": [], "c": []}
    assert expected_remaining_s("a", timings, children) == pytest.approx(0.040)
    assert should_drop(0.0, 0.039, 0.040) and not should_drop(0.0, 0.040, 0.040)


def test_the_slack_is_a_quantile_of_how_many_times_longer_than_expected_answers_took() -> None:
    slack = Slack(quantile=0.5, window=4, min_answers=3, initial=1.0, by_expectation=False)
    slack.observe(0.050, 0.040)
    slack.observe(0.050, 0.025)
    assert slack.factor == 1.0  # fewer than min_answers: the model is trusted as it is
    slack.observe(0.060, 0.040)  # ratios 1.25, 2, 1.5: median 1.5
    assert slack.factor == pytest.approx(1.5)
    slack.observe(0.020, 0.040)  # 0.5: the model was pessimistic
    slack.observe(0.020, 0.040)  # the window (4) forgets the first: 2, 1.5, 0.5, 0.5
    assert slack.factor == pytest.approx(1.0)
    slack.observe(0.010, 0.0)  # no expectation: nothing learnt
    assert slack.factor == pytest.approx(1.0)
    # a request is judged by factor · expected: dropped exactly when that passes the
    # budget
    slack.observe(0.080, 0.040)  # 1.5, 0.5, 0.5, 2: median 1
    slack.observe(0.080, 0.040)  # 0.5, 0.5, 2, 2: median 1.25
    assert slack.factor == pytest.approx(1.25)
    assert slack.judge(0.080) == pytest.approx(1.25) and slack.last == pytest.approx(1.25)
    assert should_drop(10.0, 10.100, slack.judge(0.0801) * 0.0801)
    assert not should_drop(10.0, 10.100, slack.judge(0.0799) * 0.0799)


@settings(max_examples=10, deadline=None)
@given(st.floats(0.05, 0.6), st.sampled_from([0.05, 0.1, 0.25]), st.integers(0, 2**31))
def test_a_dropped_request_would_have_come_late_at_least_one_minus_the_quantile_of_the_time(
    sigma: float, q: float, seed: int
) -> None:
    """Expected latencies spread over four times the budget, answers taking a lognormal
    multiple of what was expected that the queue model does not know: dropping where the
    expectation times the slack passes the budget, at least about ``1 − quantile`` of the
    dropped would have come late had they been kept."""
    rng = np.random.default_rng(seed)
    expected = rng.uniform(0.0, 4.0, 10_000)
    took = expected * rng.lognormal(0.0, sigma, expected.size)
    dropped, would_be_late = dropping_on(Slack(quantile=q), 1.0, expected, took, 2_000)
    assert dropped > 1_000 and would_be_late / dropped >= 1 - q - 0.03


def dropping_on(
    slack: Slack, budget: float, expected: Any, took: Any, learning: int
) -> tuple[int, int]:
    """Requests expected to take ``expected`` and taking ``took``, each dropped when
    ``slack`` says so, else answered (and learnt from): how many were dropped after the
    first ``learning``, and how many of those would have come late."""
    dropped = would_be_late = 0
    for k, (e, t) in enumerate(zip(expected, took, strict=True)):
        if should_drop(0.0, budget, slack.judge(e) * e):
            if k >= learning:
                dropped += 1
                would_be_late += t > budget
            continue
        slack.observe(t, e)
    return dropped, would_be_late


def test_the_slack_is_learnt_apart_for_answers_expected_about_as_long() -> None:
    """Shallow answers twice as long as expected (an overhead the queue model does not
    see) do not scale a deep expectation: a request expected twenty times as long, with no
    evidence of its own yet, takes the lowest factor known and no more than 1 (the model
    as it is); once answers expected as long are known, their own ratio decides."""
    slack = Slack(quantile=0.5, min_answers=3)
    for _ in range(3):
        slack.observe(0.020, 0.010)  # expected 10 ms (bin 3): ratio 2
    assert slack.factor_for(0.012) == pytest.approx(2.0)
    assert slack.judge(0.015) == pytest.approx(2.0)
    assert slack.factor_for(0.200) == 1.0  # bin 7: nothing known, the model as it is
    assert not should_drop(0.0, 0.210, slack.judge(0.200) * 0.200)
    for took in (0.015, 0.016, 0.017):
        slack.observe(took, 0.020)  # expected 20 ms (bin 4): 0.75, 0.8, 0.85
    assert slack.factor_for(0.200) == pytest.approx(0.8)  # the lowest known
    assert slack.last == 1.0  # the factor of the latest request judged
    for took in (0.210, 0.220, 0.230):
        slack.observe(took, 0.200)  # ratios 1.05, 1.1, 1.15: median 1.1
    assert slack.factor_for(0.150) == pytest.approx(1.1)  # 128–256 ms share a bin
    assert should_drop(0.0, 0.210, slack.judge(0.200) * 0.200)
    assert slack.last == pytest.approx(1.1)
    middle = 0.008 * math.sqrt(2.0)  # bin 3's middle (8–16 ms): its own factor alone
    assert slack.factor_for(middle) == pytest.approx(2.0)  # the shallow bin is unchanged


def test_the_slack_factor_has_no_cliff_at_a_bins_edge() -> None:
    """A bin's factor holds at its middle and is drawn linearly, in the logarithm of the
    expectation, toward the next bin's from there: at the edge between 16 ms (bin 4,
    ratio 0.8) and 32 ms (bin 5, ratio 1.6) both sides meet at 1.2, where the bins
    alone jumped from 0.8 to 1.6 (a held-out plan's requests expected 250 ms took bin
    7's 1.48 where 260 ms took bin 8's 0.92). A neighbour with too few answers is not
    drawn toward."""
    slack = Slack(quantile=0.5, min_answers=3)
    for _ in range(3):
        slack.observe(0.8 * 0.020, 0.020)
        slack.observe(1.6 * 0.040, 0.040)
    low_mid, high_mid = 0.016 * math.sqrt(2.0), 0.032 * math.sqrt(2.0)
    assert slack.factor_for(low_mid) == pytest.approx(0.8)
    assert slack.factor_for(high_mid) == pytest.approx(1.6)
    below, above = slack.factor_for(0.032 * (1 - 1e-9)), slack.factor_for(0.032)
    assert below == pytest.approx(1.2) and above == pytest.approx(1.2)
    assert slack.factor_for(0.016 * 2**0.75) == pytest.approx(1.0)  # a quarter of the way
    assert slack.factor_for(0.012) == pytest.approx(0.8)  # toward bin 3: nothing known


@settings(max_examples=10, deadline=None)
@given(st.floats(0.005, 0.03), st.floats(0.05, 0.4), st.integers(0, 2**31))
def test_an_overhead_the_model_misses_does_not_drop_deep_requests_that_would_make_it(
    overhead: float, sigma: float, seed: int
) -> None:
    """Answers take a fixed overhead the queue model does not know (a frontend, a hop
    between processes) plus a lognormal multiple of what was expected; most requests are
    shallow (expected 2–20 ms), where the overhead doubles their latency or more, one in
    twenty deep (up to 3 budgets), where it hardly counts. Of the dropped, at least
    about ``1 − quantile`` would have come late: with one window for all, the shallow answers'
    ratio was put on the deep ones and dropped requests that would have made it."""
    rng = np.random.default_rng(seed)
    n = 40_000
    deep = rng.random(n) < 0.05
    expected = np.where(deep, rng.uniform(0.03, 0.3, n), rng.uniform(0.002, 0.020, n))
    took = overhead + expected * rng.lognormal(0.0, sigma, n)
    dropped, would_be_late = dropping_on(Slack(), 0.100, expected, took, 4_000)
    assert dropped > 500 and would_be_late / dropped >= 1 - SLACK_QUANTILE - 0.03


# --- a task queue in-process -------------------------------------------------------------


class Held:
    """An instance that records batch sizes and holds each batch until released."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.release = asyncio.Event()

    async def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        self.sizes.append(len(inputs["X"]))
        await self.release.wait()
        return {"Y": inputs["X"] * 2}


async def test_requests_queued_behind_a_busy_instance_go_as_one_batch() -> None:
    spec = [TensorSpec("X", "FP32", (-1, 2))]
    out = [TensorSpec("Y", "FP32", (-1, 2))]
    inst = Held()
    q = TaskQueue(
        "t",
        spec,
        out,
        BatchingConfig(max_batch_size=4),
        [inst],
        MonotonicClock(),
        ServeMetrics(lambda: 1.0),
    )
    far = MonotonicClock().now() + 60
    futures = [q.submit(1, [np.full((1, 2), i, np.float32)], far) for i in range(6)]
    await asyncio.sleep(0)
    inst.release.set()
    answers = await asyncio.gather(*futures)
    assert inst.sizes == [1, 4, 1]  # the first goes alone, the next four wait together
    assert [float(a[0][0, 0]) for a in answers] == [0, 2, 4, 6, 8, 10]


async def test_a_request_kept_at_an_idle_queue_is_not_dropped() -> None:
    """However slow the model thinks the task is (one slow batch inflates it), a request
    that finds the queue idle runs: otherwise, once everything is dropped, nothing would
    run to show the model it was wrong."""
    q = TaskQueue(
        "t",
        [TensorSpec("X", "FP32", (-1, 2))],
        [TensorSpec("Y", "FP32", (-1, 2))],
        BatchingConfig(max_batch_size=1),
        [Instant()],
        MonotonicClock(),
        ServeMetrics(lambda: 1.0),
    )
    q.core.exec = ExecModel(1.0)  # a batch "takes" 1 s
    now = MonotonicClock().now()
    answer = await q.submit(1, [np.ones((1, 2), np.float32)], now + 0.050, keep=q.idle())
    assert answer[0].tolist() == [[2.0, 2.0]]
    assert q.core.exec.time(1) < 1.0  # and the model learnt from it


class Instant:
    async def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"Y": inputs["X"] * 2}


def one_at_a_time(inst: Held, clock: MonotonicClock | VirtualClock) -> TaskQueue:
    """Task ``t``: batches of one row, on the one instance ``inst``."""
    return TaskQueue(
        "t",
        [TensorSpec("X", "FP32", (-1, 2))],
        [TensorSpec("Y", "FP32", (-1, 2))],
        BatchingConfig(max_batch_size=1),
        [inst],
        clock,
        ServeMetrics(lambda: 1.0),
    )


async def test_a_request_that_cannot_make_its_deadline_is_dropped_at_once() -> None:
    inst = Held()
    q = one_at_a_time(inst, MonotonicClock())
    q.core.exec = ExecModel(0.050)  # measured: a batch takes 50 ms
    for _ in range(20):  # and answers expected 75 ms from joining took that long
        q.core.joining.observe(0.075, 0.075)
    now = MonotonicClock().now()
    first = q.submit(1, [np.zeros((1, 2), np.float32)], now + 10)
    await asyncio.sleep(0)
    # the instance is busy: expected 25 ms (half a batch) + 50 ms, over 60 ms
    late = q.submit(1, [np.zeros((1, 2), np.float32)], now + 0.060)
    with pytest.raises(Exception, match="dropped: cannot meet SLO at task 't'"):
        await late
    inst.release.set()
    await first


def test_adapt_reshapes_a_parents_outputs_into_a_childs_inputs() -> None:
    parent = [np.arange(6, dtype=np.float32).reshape(1, 6)]
    images, ids = adapt(
        parent, 2, [TensorSpec("img", "FP32", (-1, 4)), TensorSpec("ids", "INT64", (-1, 3))]
    )
    assert images.tolist() == [[0, 1, 2, 3], [4, 5, 0, 1]]
    assert ids.dtype == np.int64 and ids.tolist() == [[0, 1, 1], [1, 1, 1]]


# --- a served pipeline -------------------------------------------------------------------


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[PlanServer]:
    async with PlanServer(
        Plan.model_validate(three_task_plan()), tmp_path, http_port=0, grpc_port=0
    ) as server:
        yield server


def expected_pipeline(x: np.ndarray) -> dict[str, np.ndarray]:
    """Synthetic tasks answer 2·input; children get the parent's answer adapted."""
    det = 2 * x
    spec = [TensorSpec("INPUT0", "FP32", (-1, 16))]
    car = 2 * adapt([det], math.floor(len(x) * 3), spec)[0]
    face = 2 * adapt([det], math.floor(len(x) * 1.5), spec)[0]
    return {"car.OUTPUT0": car, "face.OUTPUT0": face}


async def test_tritonclient_http_infers_the_pipeline_and_a_task(served: PlanServer) -> None:
    client = thttp.InferenceServerClient(served.http_url.removeprefix("http://"))
    try:
        x = np.arange(32, dtype=np.float32).reshape(2, 16)
        inp = thttp.InferInput("INPUT0", [2, 16], "FP32")
        inp.set_data_from_numpy(x)
        result = await client.infer("traffic", [inp])
        for name, want in expected_pipeline(x).items():
            np.testing.assert_allclose(result.as_numpy(name), want)
        task = await client.infer("detect", [inp])
        np.testing.assert_allclose(task.as_numpy("OUTPUT0"), 2 * x)
        config = await client.get_model_config("detect")
        assert config["max_batch_size"] == 8
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
        meta = await client.get_model_metadata("traffic")
        assert [o["name"] for o in meta["outputs"]] == ["car.OUTPUT0", "face.OUTPUT0"]
    finally:
        await client.close()


async def test_tritonclient_grpc_infers_the_pipeline(served: PlanServer) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    try:
        x = np.ones((1, 16), dtype=np.float32)
        inp = tgrpc.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        result = await client.infer("traffic", [inp])
        for name, want in expected_pipeline(x).items():
            np.testing.assert_allclose(result.as_numpy(name), want)
        config = await client.get_model_config("car", as_json=True)
        assert int(config["config"]["max_batch_size"]) == 16
    finally:
        await client.close()


async def test_a_bad_request_gets_the_protocols_error_and_serving_goes_on(
    served: PlanServer,
) -> None:
    client = thttp.InferenceServerClient(served.http_url.removeprefix("http://"))
    try:
        bad = thttp.InferInput("INPUT0", [1, 15], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 15), np.float32))
        with pytest.raises(Exception, match="shape"):
            await client.infer("traffic", [bad])
        good = thttp.InferInput("INPUT0", [1, 16], "FP32")
        good.set_data_from_numpy(np.zeros((1, 16), np.float32))
        assert (await client.infer("detect", [good])).as_numpy("OUTPUT0").shape == (1, 16)
    finally:
        await client.close()


def metric_sum(text: str, name: str, task: str) -> float:
    m = re.search(rf'^{name}\{{task="{task}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def load(url: str, rate: float, seconds: float, slo_ms: float, timed: bool = True) -> Any:
    """A Poisson step from a generator in its own process: the server under test runs
    in this test's event loop, and a generator sharing that loop falls behind its
    schedule when the host is busy. Latency counts from the schedule, so lateness only
    makes the SLO harder to meet; the step must be valid with up to a tenth of the SLO
    of it (the rule ``verify`` applies), or its latencies say nothing of the server."""
    sched = from_arrival(parse_arrival("poisson", rate), seconds)
    validity = ValidityConfig(lateness_p99_bound_s=slo_ms / 10 / 1000)
    step = await measure_apart(url, sched, StepConfig(validity=validity))
    assert step.summary.valid or not timed, step.summary.invalid_reason
    return step


LAW_SE = 3.0
"""Issue 32's law served for real, as an A/B test inside one server (``--drop-holdout
0.5``): the requests that could be dropped miss the SLO (dropped, failed or late) no
more often than those kept from dropping, within this many standard errors of the
difference. One run, not a run with dropping and one without: two runs one after the
other on a shared 2-core host differ by more than their binomial noise (a CI host's
p75 SLO was missed by 31.4 % in one and 10.9 % in another), and the law failed on that
difference, not on the drops (CI, stop 39)."""


def slo_outcomes(text: str, pipeline: str) -> dict[str, dict[str, float]]:
    """Each arm's requests by outcome, from ``/metrics``."""
    arms: dict[str, dict[str, float]] = {}
    for labels, count in re.findall(
        r"^ridgeline_pipeline_slo_outcomes_total\{([^}]*)\} (\S+)$", text, re.M
    ):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if got["pipeline"] == pipeline:
            arms.setdefault(got["arm"], {})[got["outcome"]] = float(count)
    return arms


def law_break(arms: dict[str, dict[str, float]]) -> float:
    """How far the droppable arm's share missed is above the kept arm's, beyond
    ``LAW_SE`` standard errors of the difference (≤ 0: the law held)."""
    n = {a: sum(c.values()) for a, c in arms.items()}
    miss = {a: 1.0 - arms[a].get("on_time", 0.0) / n[a] for a in arms}
    pooled = (miss["droppable"] * n["droppable"] + miss["kept"] * n["kept"]) / sum(n.values())
    se = math.sqrt(max(pooled * (1 - pooled), 0.01) * (1 / n["droppable"] + 1 / n["kept"]))
    return miss["droppable"] - miss["kept"] - LAW_SE * se


def arms_seen(arms: dict[str, dict[str, float]]) -> str:
    return "; ".join(
        f"{a}: {1 - c.get('on_time', 0.0) / sum(c.values()):.1%} missed of {sum(c.values()):.0f} "
        f"({', '.join(f'{k} {v:.0f}' for k, v in sorted(c.items()))})"
        for a, c in sorted(arms.items())
    )


async def steady_load(url: str, rate: float, seconds: float, slo_ms: float, tries: int = 3) -> Any:
    """``load``, unjudged, until its arrivals kept within a quarter of the SLO of their
    schedule (p99), at most ``tries`` times: a generator sharing two cores with the
    server, its workers and the suite is sometimes starved for a whole step, and then
    the load is not the one asked for. The caller asserts on the last step's lateness."""
    for _ in range(tries):
        step = await load(url, rate, seconds, slo_ms, timed=False)
        if np.percentile(step.records.lateness, 99) * 1000 <= slo_ms / 4:
            break
    return step


@pytest.mark.slow
@pytest.mark.timeout(240)  # up to three judged steps (steady_load)
async def test_batching_at_load_and_drops_under_a_tight_slo(tmp_path: Path) -> None:
    """At a fixed rate the detector batches (mean batch > 1). With an SLO tighter than a
    busy detector allows, requests are dropped at once, and those that could be dropped
    miss the SLO no more often than those the holdout kept from dropping (``law_break``)."""
    import aiohttp

    plan = Plan.model_validate(three_task_plan())
    async with PlanServer(plan, tmp_path, http_port=0, grpc_port=None, drop=False) as server:
        step = await load(server.model_url(), 300.0, 3.0, plan.slo_ms)
        async with aiohttp.ClientSession() as s, s.get(f"{server.http_url}/metrics") as r:
            text = await r.text()
        batches = metric_sum(text, "ridgeline_task_batch_size_count", "detect")
        rows = metric_sum(text, "ridgeline_task_batch_size_sum", "detect")
        assert step.summary.ok == step.summary.sent and batches > 0
        assert rows / batches > 1.0
        lag = dict(
            re.findall(r'ridgeline_event_loop_lag_seconds\{quantile="([^"]+)"\} (\S+)', text)
        )
        assert set(lag) == {"0.5", "0.99"} and 0.0 <= float(lag["0.5"]) <= float(lag["0.99"])

    slo = 60.0  # a detector batch of 8 alone takes 26 ms, and the classifiers follow
    tight = three_task_plan(slo_ms=slo)
    for t in tight["tasks"].values():
        t["latency_budget_ms"] = 30
    tight["tasks"]["detect"]["synthetic"] = {"base_ms": 10, "per_item_ms": 2}
    # one server, half its requests (one of each pair, drawn at random) kept from
    # dropping: the same host, queues and moments for both arms
    with serving_apart(Plan.model_validate(tight), tmp_path, tmp_path, *HOLDOUT) as served:
        step = await steady_load(served.grpc, 250.0, 4.0, slo)
        arms = slo_outcomes(await served.metrics(), "traffic")
    seen = f"{arms_seen(arms)}: {step.summary}"
    # the arrivals near their schedule (a generator sharing two cores with the suite
    # fell 9 ms behind once), or the load is not the one asked for
    assert np.percentile(step.records.lateness, 99) * 1000 <= slo / 4, seen
    assert step.summary.errors == 0, seen
    assert arms["droppable"].get("dropped", 0) > 0 and "dropped" not in arms["kept"], seen
    assert law_break(arms) <= 0.0, seen


# --- the zoo's real models, from the example plan ----------------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plans" / "traffic-cpu.yaml"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ridgeline.zoo import build_zoo

    out = tmp_path_factory.mktemp("zoo")
    build_zoo(out, ["detector", "classifier", "face"])
    return out


class ServedApart(NamedTuple):
    grpc: str
    """The plan's model over gRPC, ``grpc://host:port/name``."""
    http: str
    """The server's HTTP root."""

    async def metrics(self) -> str:
        import aiohttp

        async with aiohttp.ClientSession() as s, s.get(f"{self.http}/metrics") as r:
            return await r.text()


HOLDOUT = ("--drop", "--drop-holdout", "0.5")


@contextlib.contextmanager
def serving_apart(plan: Plan, where: Path, zoo: Path, *options: str) -> Iterator[ServedApart]:
    """``ridgeline serve`` of ``plan`` (with ``options``) in its own process, until the
    block ends, then SIGINT and its exit."""
    path = where / f"{plan.name}.yaml"
    path.write_text(dump_plan(plan))
    cmd = [sys.executable, "-m", "ridgeline", "serve", str(path), "--port", "0", *options]
    with running([*cmd, "--grpc-port", "0", "--zoo", str(zoo)]) as stdout:
        line = stdout.wait_for("v2 gRPC", timeout=120)
        found = re.search(r"v2 gRPC\s+(\S+):(\d+)", line)
        assert found is not None, line
        metrics = stdout.wait_for("metrics ", timeout=10).split()[-1]
        yield ServedApart(
            f"grpc://{found.group(1)}:{found.group(2)}/{plan.name}",
            metrics.removesuffix("/metrics"),
        )


@pytest.mark.slow
@pytest.mark.timeout(240)  # up to three judged steps (steady_load)
async def test_the_example_plan_batches_at_load_and_drops_under_a_tight_slo(
    zoo: Path, tmp_path: Path
) -> None:
    """detector → car and face classifiers, real ONNX on CPU. At a fixed rate the detector
    forms batches (mean > 1; dropping off, so every request counts); with a tight SLO (the
    p75 of an undropped run), served with half its requests (one of each pair, drawn at
    random) kept from dropping: none fails, and those that could be dropped miss the SLO no
    more often than those kept (``law_break``)."""
    import aiohttp

    plan = load_plan(EXAMPLE)
    async with PlanServer(
        plan, EXAMPLE.parent, http_port=0, grpc_port=0, zoo=zoo, drop=False
    ) as server:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            frame = tgrpc.InferInput("images", [1, 3, 320, 320], "FP32")
            frame.set_data_from_numpy(np.zeros((1, 3, 320, 320), np.float32))
            result = await client.infer("traffic", [frame])
            assert result.as_numpy("car.logits").shape == (2, 1000)  # factor 2
            assert result.as_numpy("face.embedding").shape == (1, 512)
        finally:
            await client.close()
        # batch sizes and errors, not latency: a generator starved by the busy workers
        # changes when requests arrive, not whether the detector batches them
        # 120 requests: a batch of more than one among them is all the mean needs. Binary
        # frames over gRPC, so they reach the batcher as sent: 1.2 MB JSON frames would go
        # through one decoder process first, which spaces them out as a queue does
        url = f"grpc://127.0.0.1:{server.grpc_port}/{plan.name}"
        step = await load(url, 60.0, 2.0, plan.slo_ms, timed=False)
        async with aiohttp.ClientSession() as s, s.get(f"{server.http_url}/metrics") as r:
            text = await r.text()
    batches = metric_sum(text, "ridgeline_task_batch_size_count", "detect")
    rows = metric_sum(text, "ridgeline_task_batch_size_sum", "detect")
    assert step.summary.errors == 0 and rows / batches > 1.0

    # frames go as binary tensors over gRPC, as an image client sends them: a 1.2 MB JSON
    # frame would spend more of the SLO being parsed than being inferred.
    # Tight is relative to the machine: a fixed 60 ms dropped 26 % here and 2.9 % on a
    # faster CI host. So the plan is first served with an SLO nothing misses, and the
    # tight SLO is the p75 of what that run answered: without dropping, one request in
    # four would come late, and each task may spend half of it.
    # Served as `ridgeline serve` serves it, in a process of its own: inside the test
    # process its event loop shared the heap (and the collector's pauses) of the whole
    # suite, and answered p99s of 67-75 ms came from that, not from the runtime
    loose = plan.model_copy(update={"slo_ms": 10_000.0})
    with serving_apart(loose, tmp_path, zoo) as served:
        await load(served.grpc, 30.0, 2.0, 10_000.0, timed=False)  # warm-up, unjudged
        step = await steady_load(served.grpc, 30.0, 6.0, 10_000.0)
    assert step.summary.ok == step.summary.sent, step.summary
    slo = float(np.ceil(np.percentile(step.records.latency_from_send, 75) * 1000))
    tight = plan.model_copy(
        update={
            "slo_ms": slo,
            "tasks": {
                n: t.model_copy(update={"latency_budget_ms": slo / 2})
                for n, t in plan.tasks.items()
            },
        }
    )
    # one server, half its requests (one of each pair, drawn at random) kept from
    # dropping: the same host, queues and moments for both arms
    with serving_apart(tight, tmp_path, zoo, *HOLDOUT) as served:
        await load(served.grpc, 30.0, 3.0, slo, timed=False)  # warm-up, as a probe runs one
        before = slo_outcomes(await served.metrics(), plan.name)
        # long enough that each arm's share missed is a share (some 450 requests), not the
        # luck of a hundred
        step = await steady_load(served.grpc, 30.0, 30.0, slo)
        after = slo_outcomes(await served.metrics(), plan.name)
    arms = {
        a: {k: v - before.get(a, {}).get(k, 0.0) for k, v in c.items()} for a, c in after.items()
    }
    seen = f"SLO {slo:.0f} ms: {arms_seen(arms)}; {step.summary}"
    # the generator shares two cores with four busy processes and may send a few ms late
    # (9 ms p99 in one run): the arrivals must stay near their schedule (a quarter of the
    # SLO), or the load is not the one asked for
    assert np.percentile(step.records.lateness, 99) * 1000 <= slo / 4, seen
    assert step.summary.errors == 0 and "dropped" not in arms["kept"], seen
    # a tight SLO is one a quarter of the undropped answers missed: dropping must not
    # make that worse (it drops only what is nearly sure to come late)
    assert law_break(arms) <= 0.0, seen


# --- a worker crash, a token, a body bound ----------------------------------------------


def doubler_plan(**extra: Any) -> Plan:
    task = {**TASK, "variant": "doubler", "python": {"target": "_serve_backends:Doubler"}}
    return Plan.model_validate({"name": "p", "slo_ms": 1000, "tasks": {"double": task}, **extra})


async def test_a_crashed_worker_fails_its_batch_restarts_and_serving_goes_on(
    tmp_path: Path,
) -> None:
    from _serve_backends import CRASH

    async with PlanServer(doubler_plan(), tmp_path, http_port=0, grpc_port=None) as server:
        client = thttp.InferenceServerClient(server.http_url.removeprefix("http://"))
        try:
            x = thttp.InferInput("X", [1, 4], "FP32")
            x.set_data_from_numpy(np.full((1, 4), CRASH, np.float32))
            with pytest.raises(Exception, match="exit code 3"):
                await asyncio.wait_for(client.infer("double", [x]), 10)
            x.set_data_from_numpy(np.ones((1, 4), np.float32))
            answer = await asyncio.wait_for(client.infer("double", [x]), 30)
            np.testing.assert_allclose(answer.as_numpy("Y"), 2 * np.ones((1, 4)))
        finally:
            await client.close()
        assert server.workers["double"][0].restarts == 1


async def test_the_token_guards_every_endpoint_and_bodies_are_bounded(tmp_path: Path) -> None:
    import aiohttp

    plan = doubler_plan()
    async with PlanServer(
        plan, tmp_path, http_port=0, grpc_port=None, token="s3cret", max_body_bytes=1024
    ) as server:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{server.http_url}/v2/models/double/config") as r:
                assert r.status == 401
            auth = {"Authorization": "Bearer s3cret"}
            async with s.get(f"{server.http_url}/v2/models/double/config", headers=auth) as r:
                assert r.status == 200
            big = b'{"inputs": [' + b" " * 2048 + b"]}"
            async with s.post(f"{server.model_url('double')}/infer", data=big, headers=auth) as r:
                assert r.status == 413
        assert server.host == "127.0.0.1"


async def test_closing_a_queue_skips_requests_whose_callers_have_gone() -> None:
    """Ctrl-C cancels the callers first; closing the queue then must not fail on them."""
    inst = Held()
    q = TaskQueue(
        "t",
        [TensorSpec("X", "FP32", (-1, 2))],
        [TensorSpec("Y", "FP32", (-1, 2))],
        BatchingConfig(max_batch_size=1),
        [inst],
        MonotonicClock(),
        ServeMetrics(lambda: 1.0),
        drop=False,
    )
    far = MonotonicClock().now() + 60
    running = q.submit(1, [np.zeros((1, 2), np.float32)], far)
    await asyncio.sleep(0)
    waiting = q.submit(1, [np.zeros((1, 2), np.float32)], far)
    waiting.cancel()
    inst.release.set()
    await q.close()
    assert waiting.cancelled() and (await running)[0].shape == (1, 2)


async def test_a_server_stopping_under_load_answers_every_request_in_flight(
    tmp_path: Path,
) -> None:
    """Issue 33, fault 13: SIGTERM to ``serve`` under load closed 1-17 requests in flight
    without an answer. Stopping now takes no new request and answers those in flight
    (served, or 503 once their queue closes) before the connections close: 12 requests
    on one slow instance (300 ms a request), the server stopped once the first is
    answered; each of the other 11 gets an HTTP answer, none a closed connection."""
    doc = three_task_plan()
    doc["tasks"] = {"t": synthetic(300, 0, batch_size=1, max_queue_delay_ms=0)}
    doc["edges"] = []
    doc["slo_ms"] = 60_000
    doc["tasks"]["t"]["latency_budget_ms"] = 60_000
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16}]}
    async with PlanServer(
        Plan.model_validate(doc), tmp_path, http_port=0, grpc_port=None
    ) as server:
        first = asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def infer() -> int | str:
                try:
                    async with session.post(server.model_url() + "/infer", json=body) as r:
                        await r.read()
                        first.set()
                        return r.status
                except aiohttp.ClientError as e:  # closed without an answer
                    return type(e).__name__

            sent = [asyncio.create_task(infer()) for _ in range(12)]
            await asyncio.wait_for(first.wait(), 30)
            await server.stop()
            answers = await asyncio.gather(*sent)
    assert all(a in (200, 503) for a in answers), answers
    assert answers.count(200) >= 1
