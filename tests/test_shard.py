"""One schedule sharded across generator processes that share a start time."""

from __future__ import annotations

import numpy as np
import pytest

from ridgeline.aio import run_coroutine
from ridgeline.errors import TargetError
from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.loadgen.generators import InLoop, InProcesses, OnRay
from ridgeline.loadgen.replayer import ReplayConfig
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.shard import Sending, replay_sharded
from ridgeline.loadgen.step import StepConfig, generator_for, measure_step
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.records import Outcome
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.payloads import RequestShape

NONE = TargetOptions()


@pytest.mark.slow
def test_two_processes_replay_the_whole_schedule_once_on_one_clock() -> None:
    sched = from_arrival(parse_arrival("poisson", 2000.0), 1.5, seed=7)
    rec = run_coroutine(
        replay_sharded(Sending("null://", NONE, sched.times, None, ReplayConfig()), processes=2)
    )
    np.testing.assert_array_equal(rec.scheduled, sched.times)
    assert rec.count(Outcome.OK) == len(sched.times)
    # both shards timed from the same start: lateness small everywhere, never negative
    assert rec.lateness.min() >= 0
    assert np.percentile(rec.lateness, 50) < 0.005


@pytest.mark.slow
def test_a_sharded_step_against_the_fake_server_merges_its_results() -> None:
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        sched = from_arrival(parse_arrival("constant", 200.0), 2.0)
        res = run_coroutine(measure_step(srv.model_url, sched, StepConfig(processes=2)))
    assert res.summary.processes == 2
    assert res.summary.ok == 400
    assert sum(w.offered for w in res.windows) == 400


@pytest.mark.slow
def test_a_shard_that_cannot_connect_fails_the_step_with_the_reason() -> None:
    with pytest.raises(TargetError, match="could not start"):
        run_coroutine(
            replay_sharded(
                Sending("python://no_such_module_x:f", NONE, np.arange(3.0), None, ReplayConfig()),
                processes=2,
            )
        )


def test_the_generator_is_chosen_once_from_the_step_settings() -> None:
    one, apart, many = StepConfig(), StepConfig(apart=True), StepConfig(processes=3)
    ray = StepConfig(workers="ray:auto", processes=2)
    assert isinstance(generator_for("null://", NONE, one), InLoop)
    alone = generator_for("null://", NONE, apart)  # one process, apart from this loop
    assert isinstance(alone, InProcesses) and alone.processes == 1
    assert isinstance(generator_for("null://", NONE, many), InProcesses)
    assert isinstance(generator_for("null://", NONE, ray), OnRay)


def test_shares_cut_the_schedule_every_nth_arrival() -> None:
    sizes = [RequestShape(items=i + 1) for i in range(7)]
    cut = Sending("null://", NONE, np.arange(7.0), sizes, ReplayConfig(max_outstanding=10))
    shares = cut.shares(3)
    assert [list(s.times) for s in shares] == [[0.0, 3.0, 6.0], [1.0, 4.0], [2.0, 5.0]]
    assert [[r.items for r in s.shapes or ()] for s in shares] == [[1, 4, 7], [2, 5], [3, 6]]
    assert [s.cfg.max_outstanding for s in shares] == [3, 3, 3]
    assert {s.url for s in shares} == {"null://"} and all(s.options is NONE for s in shares)
    small = Sending("null://", NONE, np.arange(7.0), None, ReplayConfig(max_outstanding=2))
    assert [s.cfg.max_outstanding for s in small.shares(3)] == [1, 1, 1]
    assert [s.shapes for s in small.shares(3)] == [None, None, None]
