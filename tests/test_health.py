"""The health engine on exact observations: every state, its reason, the scores."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ridgeline.health import (
    HealthState,
    Observation,
    ScoreWeights,
    SLOPolicy,
    assess,
    observation_from_window,
    parse_slo,
    severity,
)
from ridgeline.telemetry.scrape import Scraper, parse_metrics
from ridgeline.telemetry.summary import Percentiles
from ridgeline.telemetry.windows import Window

POLICY = parse_slo("p99<100ms,errors<1%")


def obs(**kw: object) -> Observation:
    base: dict[str, object] = dict(
        start_s=0.0,
        end_s=1.0,
        offered_rps=100.0,
        achieved_rps=100.0,
        error_rate=0.0,
        latency_ms={"p50": 10.0, "p99": 40.0},
        answered=100,
    )
    base.update(kw)
    return Observation(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("o", "state", "reason"),
    [
        (obs(), HealthState.HEALTHY, "within 80% of every bound (closest: p99 40.0 ms)"),
        (obs(latency_ms={"p99": 85.0}), HealthState.WARN, "p99 85.0 ms > 80% of 100 ms"),
        (obs(error_rate=0.009), HealthState.WARN, "error rate 0.90% > 80% of 1%"),
        (obs(latency_ms={"p99": 142.0}), HealthState.UNHEALTHY, "p99 142.0 ms > 100 ms"),
        (obs(error_rate=0.02), HealthState.UNHEALTHY, "error rate 2.00% > 1%"),
        (
            obs(gpu_problems=("GPU 0 throttling: sw_thermal_slowdown",)),
            HealthState.UNHEALTHY,
            "GPU 0 throttling: sw_thermal_slowdown",
        ),
        (
            obs(end_s=10.0, achieved_rps=80.0),
            HealthState.OVERLOADED,
            "attainment shortfall 20.0% of 1000 offered > 9.5% allowed",
        ),
        (obs(latency_ms={"p99": 300.0}), HealthState.CRITICAL, "p99 300.0 ms ≥ 3× 100 ms"),
        (obs(error_rate=0.6), HealthState.CRITICAL, "error rate 60.0% ≥ 50%: errors dominate"),
        (
            obs(gpu_problems=("GPU 0: 1 XID error (last 79)",)),
            HealthState.CRITICAL,
            "GPU 0: 1 XID error (last 79)",
        ),
        (
            obs(offered_rps=0.0, achieved_rps=0.0, answered=0, latency_ms={}),
            HealthState.WARN,  # no evidence is never Healthy
            "nothing measured in the window",
        ),
    ],
)
def test_every_state_is_reached_and_names_its_metric(
    o: Observation, state: HealthState, reason: str
) -> None:
    a = assess(o, POLICY)
    assert (a.state, a.reason) == (state, reason)


def test_metric_scores_are_value_over_bound() -> None:
    a = assess(obs(latency_ms={"p99": 100.0}, error_rate=0.005), POLICY)
    assert a.metric_scores == {"p99": 1.0, "errors": 0.5, "attainment": 0.0}
    assert a.state is HealthState.WARN


def test_the_worst_rule_wins_and_several_metrics_are_named() -> None:
    a = assess(obs(latency_ms={"p99": 150.0}, error_rate=0.02), POLICY)
    assert a.state is HealthState.UNHEALTHY
    assert a.reason == "p99 150.0 ms > 100 ms; error rate 2.00% > 1%"
    b = assess(obs(latency_ms={"p99": 150.0}, error_rate=0.05, end_s=10.0, achieved_rps=50), POLICY)
    assert b.state is HealthState.CRITICAL
    assert b.reason == "error rate 5.00% ≥ 3× 1%"


def test_attainment_allows_a_short_windows_counting_noise() -> None:
    # the same 20 % shortfall: noise among 100 requests, overload among 10 000
    short = assess(obs(offered_rps=100.0, achieved_rps=80.0), POLICY)
    long = assess(obs(offered_rps=1000.0, achieved_rps=800.0, end_s=10.0), POLICY)
    assert short.state is HealthState.HEALTHY
    assert math.isclose(short.metric_scores["attainment"], 0.2 / 0.3)
    assert long.state is HealthState.OVERLOADED
    assert math.isclose(long.metric_scores["attainment"], 0.2 / 0.05)


def test_growing_latency_is_overload_before_any_bound_breaks() -> None:
    history = [obs(latency_ms={"p50": v, "p99": 60.0}) for v in (10.0, 20.0, 30.0, 40.0)]
    a = assess(obs(latency_ms={"p50": 50.0, "p99": 60.0}), POLICY, history)
    assert a.state is HealthState.OVERLOADED
    assert a.metric_scores["trend"] == 2.0  # 10 ms/window over 5 % of the 100 ms bound
    assert a.reason == "p50 trend +10.0 ms/window > 5 ms/window"
    flat = [obs(latency_ms={"p50": 30.0, "p99": 60.0}) for _ in range(4)]
    assert (
        assess(obs(latency_ms={"p50": 30.0, "p99": 60.0}), POLICY, flat).metric_scores["trend"]
        == 0.0
    )


def test_trend_needs_three_windows() -> None:
    a = assess(obs(latency_ms={"p50": 50.0, "p99": 60.0}), POLICY, [obs()])
    assert "trend" not in a.metric_scores


def test_a_zero_weight_takes_a_metric_out_of_the_score() -> None:
    only_latency = POLICY.model_copy(
        update={"weights": ScoreWeights(errors=0.0, attainment=0.0, trend=0.0, gpu=0.0)}
    )
    o = obs(latency_ms={"p99": 50.0}, error_rate=0.009)  # p99 at 0.5, errors at 0.9
    assert assess(o, only_latency).score == 0.5
    assert assess(o, POLICY).score == pytest.approx(0.9)


def test_a_heavier_weight_pulls_the_score_towards_its_metric() -> None:
    o = obs(latency_ms={"p99": 200.0}, error_rate=0.015)  # p99 at 2.0, errors at 1.5
    scores = [
        assess(o, POLICY.model_copy(update={"weights": ScoreWeights(latency=w)})).score
        for w in (0.5, 1.0, 4.0)
    ]
    assert scores == pytest.approx([1.5, 2.0, 2.0])  # the weighted maximum


def test_equal_metrics_score_their_common_value() -> None:
    o = obs(latency_ms={"p99": 50.0}, error_rate=0.005, offered_rps=100.0, achieved_rps=85.0)
    a = assess(o, POLICY)
    assert a.metric_scores == pytest.approx({"p99": 0.5, "errors": 0.5, "attainment": 0.5})
    assert a.score == pytest.approx(0.5)


@given(
    p99=st.floats(min_value=0.0, max_value=1000.0),
    err=st.floats(min_value=0.0, max_value=1.0),
    achieved=st.floats(min_value=0.0, max_value=200.0),
)
def test_score_is_the_worst_metric_at_equal_weights(
    p99: float, err: float, achieved: float
) -> None:
    a = assess(obs(latency_ms={"p99": p99}, error_rate=err, achieved_rps=achieved), POLICY)
    worst = max(a.metric_scores.values())
    assert a.score == pytest.approx(worst)  # on the boundary exactly when the worst metric is
    if worst <= 1.0:
        assert a.state.sustainable


def test_a_lighter_weight_discounts_a_metric_in_the_score() -> None:
    o = obs(latency_ms={"p99": 150.0}, error_rate=0.0, offered_rps=100.0, achieved_rps=100.0)
    light = POLICY.model_copy(update={"weights": ScoreWeights(latency=0.5)})
    assert assess(o, POLICY).score == pytest.approx(1.5)
    assert assess(o, light).score == pytest.approx(0.75)
    assert assess(o, light).state == HealthState.UNHEALTHY  # the state still says so


def test_severity_orders_the_states() -> None:
    order = sorted(HealthState, key=severity)
    assert order == [
        HealthState.HEALTHY,
        HealthState.WARN,
        HealthState.UNHEALTHY,
        HealthState.OVERLOADED,
        HealthState.CRITICAL,
    ]


def test_a_window_of_only_failures_is_flagged() -> None:
    a = assess(obs(error_rate=1.0), POLICY)
    assert (a.state, a.all_failed) == (HealthState.CRITICAL, True)
    assert assess(obs(error_rate=0.6), POLICY).all_failed is False


TRITON = """# HELP nv_inference_count Number of inferences performed (rows)
# TYPE nv_inference_count counter
nv_inference_count{{model="fake",version="1"}} {rows}
# HELP nv_inference_exec_count Number of model executions performed (batches)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{{model="fake",version="1"}} {batches}
# HELP nv_inference_pending_request_count Requests queued or executing
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="fake",version="1"}} {pending}
"""


def _window(**kw: object) -> Window:
    base: dict[str, object] = dict(
        index=0, start_s=0.0, end_s=1.0, offered=100, ok=90, failed=6, dropped=2,
        completed_ok=88, offered_rps=100.0, achieved_rps=88.0, error_rate=0.06,
        latency_ms=Percentiles(p50=12.0, p99=80.0), lateness_p99_ms=0.1,
    )  # fmt: skip
    base.update(kw)
    return Window.model_validate(base)


def test_observation_from_window_reads_triton_counters() -> None:
    scraper = Scraper("http://127.0.0.1:1/metrics")
    for t, (rows, batches, pending) in ((0.0, (100, 40, 3)), (1.0, (340, 100, 7))):
        values, counters = parse_metrics(TRITON.format(rows=rows, batches=batches, pending=pending))
        scraper.samples.append((t, values))
        scraper.counters |= counters
    w = _window()
    scraper.attach([w])
    o = observation_from_window(w, gpu_utilisation=0.7, gpu_problems=("GPU 0 at 90 °C > 87 °C",))
    assert o.mean_batch_size == 4.0  # 240 rows in 60 batches
    assert o.queue_length == 7.0
    assert o.answered == 98
    assert (o.offered_rps, o.achieved_rps, o.error_rate) == (100.0, 88.0, 0.06)
    assert o.latency_ms["p50"] == 12.0 and o.latency_ms["p999"] is None
    assert (o.gpu_utilisation, o.gpu_problems) == (0.7, ("GPU 0 at 90 °C > 87 °C",))


def test_observation_prefers_the_fake_servers_queue_and_sums_models() -> None:
    w = _window(
        server={
            'fakeserver_queue_length{model="a"}': 2.0,
            'fakeserver_queue_length{model="b"}': 3.0,
            'nv_inference_pending_request_count{model="a",version="1"}': 9.0,
        }
    )
    o = observation_from_window(w)
    assert (o.queue_length, o.mean_batch_size) == (5.0, None)
    assert observation_from_window(_window()).queue_length is None


def test_an_observation_from_a_window_is_assessed() -> None:
    a = assess(observation_from_window(_window()), POLICY)
    assert a.state is HealthState.CRITICAL
    assert a.reason == "error rate 6.00% ≥ 3× 1%"
    assert SLOPolicy().latency == ()


# --- token-level bounds and vLLM's saturation signals ---------------------------------

TOKENS = parse_slo("ttft_p99<200ms,itl_p99<50ms,tpot_p99<40ms,errors<1%")


@pytest.mark.parametrize(
    ("metric", "p99", "state", "reason"),
    [
        ("ttft", 240.0, HealthState.UNHEALTHY, "ttft p99 240.0 ms > 200 ms"),
        ("itl", 45.0, HealthState.WARN, "itl p99 45.0 ms > 80% of 50 ms"),
        ("tpot", 130.0, HealthState.CRITICAL, "tpot p99 130.0 ms ≥ 3× 40 ms"),
        ("ttft", 100.0, HealthState.HEALTHY, "closest: ttft p99 100.0 ms"),
    ],
)
def test_each_token_bound_is_a_latency_reading_with_its_reason(
    metric: str, p99: float, state: HealthState, reason: str
) -> None:
    a = assess(obs(latency_ms={"p99": 5000.0}, token_ms={metric: {"p99": p99}}), TOKENS)
    assert a.state is state and reason in a.reason
    bound = {"ttft": 200.0, "itl": 50.0, "tpot": 40.0}[metric]
    assert a.metric_scores == {
        f"{metric}_p99": p99 / bound,
        "errors": 0.0,
        "attainment": 0.0,
    }  # the end-to-end 5 s is not bounded, so not read


def test_the_old_slo_text_still_reads_the_end_to_end_latency() -> None:
    a = assess(obs(latency_ms={"p99": 150.0}, token_ms={"ttft": {"p99": 1.0}}), POLICY)
    assert (a.state, a.reason) == (HealthState.UNHEALTHY, "p99 150.0 ms > 100 ms")


def test_a_token_only_slo_fits_its_trend_to_ttft() -> None:
    rising = [
        obs(latency_ms={"p50": 900.0}, token_ms={"ttft": {"p50": 10.0 * k}}) for k in range(5)
    ]
    a = assess(rising[-1], parse_slo("ttft_p50<100ms"), rising[:-1])
    assert a.state is HealthState.OVERLOADED
    assert a.reason == "ttft p50 trend +10.0 ms/window > 5 ms/window"


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        ({"vllm:num_preemptions_total": 3.0}, "3 requests preempted (KV cache full)"),
        (
            {'vllm:kv_cache_usage_perc{model_name="m"}': 0.99, "vllm:num_requests_waiting": 4.0},
            "KV cache 99% full with 4 requests waiting",
        ),
    ],
)
def test_vllm_saturation_makes_a_healthy_window_warn_and_leaves_its_score(
    server: dict[str, float], reason: str
) -> None:
    w = _window(failed=0, dropped=0, error_rate=0.0, achieved_rps=100.0, completed_ok=100)
    w.ttft_ms = Percentiles(p99=100.0)
    quiet = assess(observation_from_window(w), TOKENS)
    loud = assess(observation_from_window(w.model_copy(update={"server": server})), TOKENS)
    assert quiet.state is HealthState.HEALTHY
    assert (loud.state, loud.reason) == (HealthState.WARN, reason)
    assert loud.score == quiet.score  # the capacity stays what the SLO says


def test_a_full_kv_cache_with_nothing_waiting_is_no_sign() -> None:
    a = assess(obs(kv_cache_usage=1.0, queue_length=0.0), POLICY)
    assert a.state is HealthState.HEALTHY


def test_vllm_running_requests_are_the_batch_and_waiting_ones_the_queue() -> None:
    w = _window(server={"vllm:num_requests_running": 12.0, "vllm:num_requests_waiting": 3.0})
    o = observation_from_window(w)
    assert (o.mean_batch_size, o.queue_length) == (12.0, 3.0)
