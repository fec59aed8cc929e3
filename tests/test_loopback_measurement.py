"""Honest measurement on loopback against the fake server (real time, real sockets)."""

from __future__ import annotations

import pytest

from ridgeline.aio import run_coroutine
from ridgeline.fakeserver import running_in_process
from ridgeline.loadgen.replayer import ReplayConfig
from ridgeline.loadgen.schedule import Schedule, from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.policies.batching import BatchingConfig
from ridgeline.synthetic.model import LatencyModel, Stall, capacity_rps
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.payloads import RequestShape


@pytest.mark.slow
def test_coordinated_omission_is_shown_and_avoided() -> None:
    """A 200 ms stall, and a client that can keep only one request in flight (as a
    closed-loop tool does): timed from the actual send the stall all but vanishes; timed
    from the schedule it is there, and the step is refused as the generator's."""
    model = LatencyModel(base_ms=2.0, per_item_ms=0.0, stalls=(Stall(at_s=1.5, duration_ms=200.0),))
    with running_in_process(model, grpc_port=None) as srv:
        sched = from_arrival(parse_arrival("constant", 100.0), 3.0)
        # the server's clock starts before the step: put the stall inside the step
        cfg = StepConfig(replay=ReplayConfig(max_outstanding=1, timeout_s=5.0))
        res = run_coroutine(measure_step(srv.model_url, sched, cfg)).summary
    assert res.errors == 0 and res.ok == 300
    p99_schedule = res.latency_ms.p99
    p99_send = res.latency_from_send_ms.p99
    assert p99_schedule is not None and p99_send is not None
    assert p99_schedule >= 150.0, res.latency_ms
    assert p99_send < 50.0, res.latency_from_send_ms
    assert res.latency_from_send_ms.max is not None and res.latency_from_send_ms.max >= 100.0
    assert not res.valid
    assert res.invalid_reason is not None and "lateness" in res.invalid_reason


@pytest.mark.slow
def test_open_loop_keeps_sending_through_a_stall() -> None:
    """Open loop with room in flight: sends stay on schedule during the stall, so both
    timings see it and the step is valid (the stall is the server's, not ours). On
    schedule means lateness far below the stall (a closed loop's is the stall itself,
    as above): a tenth of it, where a busy host's scheduling may add a few ms, which the
    default 1 ms validity bound would count against the generator."""
    model = LatencyModel(base_ms=2.0, per_item_ms=0.0, stalls=(Stall(at_s=1.5, duration_ms=200.0),))
    with running_in_process(model, grpc_port=None) as srv:
        sched = from_arrival(parse_arrival("constant", 100.0), 3.0)
        cfg = StepConfig(validity=ValidityConfig(lateness_p99_bound_s=0.02))
        res = run_coroutine(measure_step(srv.model_url, sched, cfg)).summary
    assert res.valid, res.invalid_reason
    assert res.lateness_ms.p99 is not None and res.lateness_ms.p99 <= 20.0
    assert res.latency_ms.p99 is not None and res.latency_ms.p99 >= 100.0
    assert res.latency_from_send_ms.p99 is not None and res.latency_from_send_ms.p99 >= 100.0


@pytest.mark.slow
def test_the_fake_servers_measured_capacity_matches_its_latency_model() -> None:
    """Offered one and a half times its capacity, the server completes at its modelled
    capacity: its queue grows by some 140 requests a second and never empties, and the
    backlog left at the end (answered before the step returns) drains in 3 s, not the 6 s
    twice its capacity left."""
    model = LatencyModel(
        base_ms=20.0,
        per_item_ms=2.0,
        instances=2,
        batching=BatchingConfig(max_batch_size=4, max_queue_delay_s=0.002),
    )
    expected = capacity_rps(model)  # 2 · 4 / 28 ms = 285.7/s
    assert expected == pytest.approx(285.714, rel=1e-4)
    with running_in_process(model, grpc_port=None) as srv:
        sched = from_arrival(parse_arrival("poisson", 1.5 * expected), 6.0, seed=3)
        cfg = StepConfig(replay=ReplayConfig(timeout_s=30.0))
        res = run_coroutine(measure_step(srv.model_url, sched, cfg))
    # the queue fills, so steady completions run at capacity; skip the first window
    steady = [w.achieved_rps for w in res.windows[1:]]
    measured = sum(steady) / len(steady)
    assert measured == pytest.approx(expected, rel=0.05), steady
    assert res.summary.errors == 0


@pytest.mark.slow
def test_streaming_llm_step_reports_ttft_inter_token_latency_and_tokens() -> None:
    """OpenAI-compatible streaming, sizes from a trace-like shape list: time to first
    token, inter-token latency and token counts come out of the same step."""
    model = LatencyModel(base_ms=5.0, per_item_ms=0.0, ttft_ms=20.0, per_token_ms=5.0)
    with running_in_process(model, grpc_port=None) as srv:
        sched = from_arrival(parse_arrival("poisson", 20.0), 2.0, seed=2)
        shapes = [RequestShape(prompt_tokens=50, output_tokens=8)] * len(sched.times)
        sched = Schedule(sched.times, shapes, sched.duration_s, "llm")
        url = srv.http_url.replace("http://", "openai+http://") + "/v1"
        res = run_coroutine(measure_step(url, sched, StepConfig())).summary
    assert res.errors == 0 and res.ok == len(shapes)
    assert res.ttft_ms is not None and res.itl_ms is not None
    assert res.ttft_ms.p50 is not None and res.ttft_ms.p50 >= 25.0  # engine 5 ms + ttft 20 ms
    assert res.itl_ms.p50 == pytest.approx(5.0, abs=1.5)
    # over the seconds to the last answer: at most the slowest answer's latency past 2 s
    slowest_s = (res.latency_ms.max or 0.0) / 1000.0
    tokens_per_s = res.output_tokens_per_s
    assert tokens_per_s is not None
    assert 8 * res.ok / (2.0 + slowest_s) <= tokens_per_s <= 8 * res.ok / 2.0
