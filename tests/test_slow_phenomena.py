"""Servers slower than a probe's steps (issue 31): a stall every 45 s and a neighbour on
a 90 s cycle are not over-estimated, and adding a stall never raises an estimate. All in
virtual time, each estimate set against ``study.truth`` (long runs at random server
phases, judged plainly: apart from the probe's own judge)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ridgeline.probe.api import run_probe
from ridgeline.probe.drivers import SimDriver
from ridgeline.sim import SimPreset
from ridgeline.study.bank import load_bank
from ridgeline.study.truth import true_capacity
from ridgeline.study.vanguard import cli_probe_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OVER = 0.05
"""An estimate more than this above the truth is an over-estimate (the study's bar)."""


def vision(slo: str, *, instances: int = 1, **extra: Any) -> SimPreset:
    """ResNet-50-class batches of up to 16 (6 ms + 1.5 ms a row), with ``extra`` (a
    stall, a neighbour) laid over the model or the server."""
    model: dict[str, Any] = {
        "name": "v",
        "base_ms": 6.0,
        "per_item_ms": 1.5,
        "batching": {"max_batch_size": 16, "max_queue_delay_s": 0.004},
        "instances": instances,
        "noise_cv": 0.05,
        "max_queue": 4096,
    }
    server: dict[str, Any] = {"description": "vision", "model": model, "slo": slo}
    if "periodic_stall" in extra:
        model["periodic_stall"] = extra["periodic_stall"]
    if "interference" in extra:
        server["interference"] = extra["interference"]
    return SimPreset.model_validate(server)


def default_probe(preset: SimPreset, seed: int = 0) -> tuple[float | None, str]:
    """``ridgeline probe sim:…`` with its defaults (adaptive, the CLI's config)."""
    assert preset.slo is not None
    r = run_probe(SimDriver(preset, label="t"), cli_probe_config(preset.slo, "adaptive", seed))
    return r.capacity_rps, r.reason


def test_a_stall_every_45_s_is_not_over_estimated() -> None:
    """A 300 ms stall every 45 s over a 150 ms p99 bound: a probe whose steps and 30 s
    confirmations are shorter than the period confirmed what a quiet stretch allowed.
    Its confirmations now hold ten stalls' worth of late requests (``health.timescale``)."""
    preset = vision("p99<150ms,errors<0.1%", periodic_stall={"every_s": 45.0, "duration_ms": 300})
    estimate, reason = default_probe(preset)
    truth = true_capacity(preset).capacity_rps
    assert estimate is not None and truth is not None, reason
    assert estimate <= truth * (1 + OVER), (estimate, truth, reason)


def test_a_neighbour_on_a_90_s_cycle_is_not_over_estimated() -> None:
    """Two instances beside a neighbour 1.7× slower for 36 s of every 90 s: steps in
    its quiet phase held rates its busy phase cannot serve. The throughput that varied
    between steps makes the confirmation as long as the caps allow."""
    preset = vision(
        "p99<100ms,errors<0.1%",
        instances=2,
        interference={"amount": 0.7, "period_s": 90.0, "duty": 0.4},
    )
    estimate, reason = default_probe(preset)
    truth = true_capacity(preset).capacity_rps
    assert estimate is not None and truth is not None, reason
    assert estimate <= truth * (1 + OVER), (estimate, truth, reason)


@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    every_s=st.sampled_from([5.0, 12.0, 30.0]),
    duration_ms=st.sampled_from([40.0, 120.0, 250.0]),
)
def test_a_stall_never_raises_the_estimate(every_s: float, duration_ms: float) -> None:
    """The same server, the same seed, with a stall added: the estimate is no higher than
    without it, beyond the search's precision (2 %)."""
    slo = "p99<100ms,errors<0.1%"
    plain, _ = default_probe(vision(slo))
    stalled, reason = default_probe(
        vision(slo, periodic_stall={"every_s": every_s, "duration_ms": duration_ms})
    )
    assert plain is not None
    assert stalled is None or stalled <= plain * 1.02, (stalled, plain, reason)


def test_a_low_rate_server_judged_at_p999_is_not_over_estimated() -> None:
    """300 ms a request on one instance, p99.9 < 3 s: near 2 req/s a confirmation of
    20 minutes holds some 3 requests beyond the percentile, and its late requests come
    in runs of a dozen; one that held on that evidence was 14 % over. A confirmation
    that held near the boundary shorter than one of its clusters, or without an upper
    end to its percentile's interval (then read from its exponential tail), now fails."""
    preset = SimPreset.model_validate(
        {
            "description": "seq2seq",
            "model": {
                "name": "s",
                "base_ms": 300.0,
                "per_item_ms": 0.0,
                "batching": {"max_batch_size": 1, "max_queue_delay_s": 0.0},
                "instances": 1,
                "noise_cv": 0.4,
                "max_queue": 256,
            },
            "slo": "p99.9<3s,errors<0.1%",
        }
    )
    estimate, reason = default_probe(preset)
    truth = true_capacity(preset).capacity_rps
    assert truth is not None
    assert estimate is None or estimate <= truth * (1 + OVER), (estimate, truth, reason)


def test_a_failure_that_never_decided_does_not_bound_the_search() -> None:
    """0.05 % injected errors under errors<0.1 %: with seed 0 a pooled step at 193 req/s
    drew 16 errors in 15,708 (7.9 expected; 15.7 allowed), a coin toss against the bound
    that stood as measured once its reruns ran out, and bounded the search at 47 % of
    the truth. Its recheck held, decided, but not "clearly better" (0.85 against 1.02):
    a failure that never decided is no evidence against it, and the search goes on."""
    preset = SimPreset.model_validate(
        {
            "description": "nlp with injected errors",
            "speed": 1.6,
            "model": {
                "name": "e",
                "base_ms": 10.0,
                "per_item_ms": 2.0,
                "batching": {"max_batch_size": 8, "max_queue_delay_s": 0.002},
                "instances": 1,
                "noise_cv": 0.2,
                "error_rate": 0.0005,
                "max_queue": 24,
            },
            "slo": "p99<150ms,errors<0.1%",
        }
    )
    estimate, reason = default_probe(preset, seed=0)
    truth = true_capacity(preset).capacity_rps
    assert estimate is not None and truth is not None, reason
    assert abs(estimate / truth - 1) <= OVER, (estimate, truth, reason)


def test_a_bound_whose_failure_and_recheck_never_decided_does_not_end_the_search() -> None:
    """The bank's ``nlp-gc-tail-b``: a 500 ms pause every 40 s over a 200 ms p99 and a
    heavy tail. With seed 0, 80 s steps at 127.3 req/s failed by the luck of their
    phase (144 late requests in clusters of some 40: worth 4, where 2.6 were allowed),
    just above a 600 s confirmation that held with 0.84 % late, and its recheck failed
    the same way: the search ended 73 % below the truth. Two coin tosses do not bound
    it; it goes on above."""
    (case,) = [c for c in load_bank() if c.name == "nlp-gc-tail-b"]
    estimate, reason = default_probe(case.preset, seed=0)
    truth = true_capacity(case.preset).capacity_rps
    assert estimate is not None and truth is not None, reason
    assert 0.9 * truth <= estimate <= truth * (1 + OVER), (estimate, truth, reason)
    assert "whose failures never decided" in reason, reason


def test_a_confirmation_run_before_the_stalls_were_seen_is_run_again() -> None:
    """The bank's ``rec-gc-90-e``: a 1.2 s GC pause every 90 s is 1.3 % of the time,
    past its p99 at any rate, so the truth has no capacity. Seed 1's search confirmed
    4,083 req/s in 30 s before any step had met a pause, then resumed upward, where
    every confirmation (97 s and longer) caught them; it reported 4,083 req/s. The
    confirmation that stands is now run again as long as the pauses the probe saw ask
    (``orchestrator._still_covered``): it fails, and so do its back-offs."""
    (case,) = [c for c in load_bank() if c.name == "rec-gc-90-e"]
    assert true_capacity(case.preset).capacity_rps is None
    estimate, reason = default_probe(case.preset, seed=1)
    assert estimate is None, reason
    assert "ran before the probe had seen the server's slow behaviour" in reason, reason


def test_clusters_seen_near_saturation_do_not_back_off_a_rate_far_below() -> None:
    """The bank's ``nlp-lowrate-e``: 1.4 s a request on four instances, judged at p99.9.
    Near its saturation (2.2 req/s) its late requests came 7 together, from the queue's
    busy periods; at 1.2 req/s its p99.9 is the service time's tail, with nothing
    clustered, yet every confirmation there that held near the bound was called unsure
    by those clusters, and it was reported 47 % low. A confirmation's clusters are read
    from the steps offered at most ``REACH`` times its rate."""
    (case,) = [c for c in load_bank() if c.name == "nlp-lowrate-e"]
    estimate, reason = default_probe(case.preset, seed=0)
    truth = true_capacity(case.preset).capacity_rps
    assert estimate is not None and truth is not None, reason
    assert 0.9 * truth <= estimate <= truth * (1 + OVER), (estimate, truth, reason)
