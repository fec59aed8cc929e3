"""The LLM server in virtual time: exact timelines from the shared scheduler (first token
at the end of the prefill step, gaps = decode steps), refusals and timeouts, laws over
the records, the sim:llm preset, the knee moving with the KV cache, a token-SLO probe of sim:llm
against the long-run truth, and the simulator beside the fake server on loopback."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _llm import TINY
from ridgeline.aio import run_coroutine
from ridgeline.errors import ConfigError
from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.health.slo import parse_slo
from ridgeline.loadgen.schedule import Schedule, from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.probe.api import default_slo, run_probe
from ridgeline.probe.drivers import SimDriver
from ridgeline.probe.orchestrator import ProbeConfig
from ridgeline.sim import (
    Interference,
    SimPreset,
    SimState,
    load_sim_preset,
    shapes_for,
    simulate_llm,
)
from ridgeline.study.truth import broken_records
from ridgeline.synthetic.llm import saturated_rps
from ridgeline.synthetic.model import LatencyModel
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.payloads import RequestShape

ENGINE = TINY
MODEL = LatencyModel(name="tiny", llm=ENGINE)


def arr(*t: float) -> np.ndarray:
    return np.asarray(t, dtype=np.float64)


def shape(prompt: int, out: int) -> RequestShape:
    return RequestShape(prompt_tokens=prompt, output_tokens=out)


def token_times(rec: Records, i: int) -> list[float]:
    return [float(rec.first_token[i]), *(rec.first_token[i] + np.cumsum(rec.gaps_of(i)))]


# --- exact timelines -------------------------------------------------------------------


def test_first_token_ends_the_prefill_step_and_gaps_are_decode_steps() -> None:
    rec, state = simulate_llm(MODEL, arr(0.0), [shape(5, 3)])
    # prefill: 8 + 5 + 0.5·6 = 16 ms; decodes: 8 + 2 + 0.5·7 = 13.5 ms, 8 + 2 + 0.5·8 = 14
    assert rec.first_token[0] == 0.016
    assert rec.gaps_of(0).tolist() == pytest.approx([0.0135, 0.014], abs=1e-12)
    assert rec.done[0] == pytest.approx(0.0435, abs=1e-12)
    assert (rec.output_tokens[0], rec.prompt_tokens[0], rec.outcome[0]) == (3, 5, Outcome.OK)
    assert state == SimState(server_time_s=float(rec.done[0]), served=1)


def test_a_request_arriving_mid_step_joins_at_its_end() -> None:
    rec, _ = simulate_llm(MODEL, arr(0.0, 0.010), [shape(5, 3), shape(3, 1)])
    # request 1 comes during request 0's prefill step (0 to 16 ms) and is prefilled in
    # the next one with request 0's decode: 8 + 3 + 2 + 0.5·(7 + 4) = 18.5 ms
    assert rec.first_token[1] == pytest.approx(0.016 + 0.0185, abs=1e-12)
    assert rec.gaps_of(0)[0] == pytest.approx(0.0185, abs=1e-12)


def test_preempted_requests_wait_and_recompute_but_lose_no_token() -> None:
    rec, _ = simulate_llm(MODEL, arr(0.0, 0.0), [shape(3, 6), shape(3, 6)])
    assert rec.output_tokens.tolist() == [6, 6]
    assert rec.gap_counts().tolist() == [5, 5]
    # request 1 is preempted when request 0 needs its third block (its 6th token) and
    # readmitted after: its last gap spans that step and its recompute step
    assert rec.gaps_of(1)[-1] > 2 * rec.gaps_of(1)[0]
    assert rec.done[1] > rec.done[0]


def test_refusals_are_errors_with_the_servers_reason() -> None:
    model = MODEL.model_copy(update={"max_queue": 1})
    rec, _ = simulate_llm(model, arr(0.0, 0.0, 0.0), [shape(10, 7), shape(1, 1), shape(1, 1)])
    assert rec.outcome.tolist() == [Outcome.ERROR, Outcome.OK, Outcome.ERROR]
    assert rec.done[0] == 0.0 and rec.done[2] == 0.0
    assert rec.errors == {
        "prompt (10 tokens) + max_tokens (7) exceeds the KV cache (16 tokens); shorten the "
        "prompt or lower max_tokens": 1,
        "queue full": 1,
    }


def test_a_timed_out_request_keeps_no_token_and_frees_its_cache() -> None:
    slow = MODEL.model_copy(update={"llm": ENGINE.model_copy(update={"max_num_seqs": 1})})
    rec, _ = simulate_llm(slow, arr(0.0, 0.05), [shape(3, 12), shape(3, 2)], timeout_s=0.1)
    assert rec.outcome.tolist() == [Outcome.TIMEOUT, Outcome.OK]
    assert rec.done[0] == 0.1 and rec.output_tokens[0] == 0 and np.isnan(rec.first_token[0])
    assert rec.gap_counts()[0] == 0
    assert rec.done[1] < 0.15  # it ran once the first was aborted at its deadline
    assert rec.errors == {"timeout after 0.1 s": 1}


def test_speed_and_interference_scale_every_step() -> None:
    base, _ = simulate_llm(MODEL, arr(0.0), [shape(5, 3)])
    fast, _ = simulate_llm(MODEL, arr(0.0), [shape(5, 3)], speed=2.0)
    busy = Interference(amount=1.0)
    slow, _ = simulate_llm(MODEL, arr(0.0), [shape(5, 3)], interference=busy)
    assert fast.done[0] == pytest.approx(base.done[0] / 2, rel=1e-12)
    assert slow.done[0] == pytest.approx(base.done[0] * 2, rel=1e-12)


def test_bad_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="has no `llm:` engine"):
        simulate_llm(LatencyModel(), arr(0.0), [shape(1, 1)])
    with pytest.raises(ConfigError, match="1 shapes for 2 times"):
        simulate_llm(MODEL, arr(0.0, 1.0), [shape(1, 1)])
    with pytest.raises(ConfigError, match="sorted"):
        simulate_llm(MODEL, arr(1.0, 0.0), [shape(1, 1)] * 2)


# --- laws --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 0.5), st.integers(1, 8), st.integers(1, 8)), max_size=40),
    st.integers(1, 6),
)
def test_laws_of_the_records(reqs: list[tuple[float, int, int]], seqs: int) -> None:
    """Every answered request streams exactly what it asked, its tokens in order from
    its first token to its end (first + gaps = done), none before it arrived."""
    engine = ENGINE.model_copy(update={"max_num_seqs": seqs})
    reqs = sorted(reqs)
    times = arr(*(r[0] for r in reqs))
    shapes = [shape(p, o) for _, p, o in reqs]
    rec, _ = simulate_llm(LatencyModel(llm=engine), times, shapes, timeout_s=1e9)
    assert (rec.outcome == Outcome.OK).all()
    assert rec.output_tokens.tolist() == [o for _, _, o in reqs]
    assert rec.gap_counts().tolist() == [o - 1 for _, _, o in reqs]
    assert (rec.gaps > 0).all() and (rec.first_token > times).all()
    for i in range(len(reqs)):
        assert token_times(rec, i)[-1] == pytest.approx(rec.done[i], abs=1e-9)


# --- presets -----------------------------------------------------------------------------

PRESET_DIR = Path(__file__).parents[1] / "src" / "ridgeline" / "sim" / "presets"


def test_the_sim_preset_is_the_fake_servers_engine_with_its_workload() -> None:
    preset = load_sim_preset("llm")
    assert preset.model.llm == load_preset("llm").llm
    assert preset.model.name == load_preset("llm").name
    shapes = shapes_for(preset, 3, seed=0)
    assert shapes == [RequestShape(1, 128, 64)] * 3
    text = (PRESET_DIR / "llm.yaml").read_text(encoding="utf-8")
    stated = re.search(r"saturated_rps = ([0-9.]+)", text)
    assert stated is not None and preset.model.llm is not None
    assert float(stated.group(1)) == round(saturated_rps(preset.model.llm, 128, 64), 1)
    assert "stand-ins" in text and re.fullmatch(
        r"ttft_p99<\d+ms,itl_p99<\d+ms,errors<[0-9.]+%", preset.slo
    )
    assert default_slo("sim:llm") == preset.slo == "ttft_p99<300ms,itl_p99<80ms,errors<0.1%"


def test_llm_presets_need_their_token_shapes() -> None:
    with pytest.raises(ValueError, match="needs prompt_tokens and output_tokens"):
        SimPreset(description="x", model=MODEL, prompt_tokens=128)
    with pytest.raises(ValueError, match="apply to LLM servers only"):
        SimPreset(description="x", model=LatencyModel(), prompt_tokens=128, output_tokens=8)
    with pytest.raises(ValueError, match="output_tokens"):
        SimPreset(description="x", model=MODEL, prompt_tokens=1, output_tokens=0)


# --- the knee ----------------------------------------------------------------------------


def ttft_capacity(kv_tokens: int, bound_s: float = 0.5) -> float:
    """The highest rate of a 2 req/s grid at which TTFT p99 over every request of a
    120 s Poisson run stays under ``bound_s``: a plain sweep over the simulator."""
    preset = with_kv(load_sim_preset("llm"), kv_tokens)
    model = preset.model
    held = 0.0
    for rate in np.arange(10.0, 40.0, 2.0):
        sched = from_arrival(parse_arrival("poisson", float(rate)), 120.0, 5)
        rec, _ = simulate_llm(model, sched.times, shapes_for(preset, len(sched.times), 5))
        ttft = np.where(rec.outcome == Outcome.OK, rec.first_token - rec.scheduled, np.inf)
        if np.percentile(ttft, 99) >= bound_s:
            break
        held = float(rate)
    return held


def test_the_knee_moves_with_the_kv_cache() -> None:
    small, default, large = (ttft_capacity(kv) for kv in (8192, 16384, 32768))
    assert small < default < large, (small, default, large)
    assert small > 10.0 and large < 40.0


# --- the probe against the long-run truth ------------------------------------------------

TOKEN_SLO = "ttft_p99<300ms,itl_p99<80ms,errors<0.1%"


def with_kv(preset: SimPreset, kv_tokens: int) -> SimPreset:
    assert preset.model.llm is not None
    llm = preset.model.llm.model_copy(update={"kv_cache_tokens": kv_tokens})
    return preset.model_copy(update={"model": preset.model.model_copy(update={"llm": llm})})


def token_truth(preset: SimPreset, slo: str, duration_s: float = 600.0) -> float:
    """The highest constant (Poisson) rate whose long run meets ``slo``'s token bounds
    judged plainly over every request and every gap (``study.truth.broken_records``),
    bisected to 0.1 req/s."""
    policy = parse_slo(slo)

    def holds(rate: float) -> bool:
        sched = from_arrival(parse_arrival("poisson", rate), duration_s, 11)
        rec, _ = simulate_llm(preset.model, sched.times, shapes_for(preset, len(sched.times), 11))
        return broken_records(rec, policy) is None

    assert preset.model.llm is not None
    lo, hi = 1.0, saturated_rps(preset.model.llm, 128, 64) * 1.1
    while hi - lo > 0.1:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


@pytest.mark.slow
def test_a_token_slo_probe_of_sim_llm_lands_within_5_percent_of_the_long_run_truth() -> None:
    """``ridgeline probe sim:llm --slo "ttft_p99<300ms,itl_p99<80ms,errors<0.1%"``: the
    estimate within 5 % of the long-run truth (with half the cache the same holds,
    16.4 against 16.2 req/s; docs/llm.md, left out here for time)."""
    preset = load_sim_preset("llm")
    cfg = ProbeConfig(slo=TOKEN_SLO, strategy_options={"min_rate": 1.0})
    result = run_probe(SimDriver(preset, label="llm"), cfg)
    truth = token_truth(preset, TOKEN_SLO)
    assert result.capacity_rps is not None and result.confirmed
    assert result.capacity_rps == pytest.approx(truth, rel=0.05), (result.capacity_rps, truth)
    assert truth > token_truth(with_kv(preset, 8192), TOKEN_SLO, duration_s=300.0)


# --- beside the fake server --------------------------------------------------------------


@pytest.mark.slow
def test_the_simulator_and_the_fake_server_agree_on_ttft_at_a_low_rate() -> None:
    """The same schedule (4 req/s, 128 tokens in, 16 out) simulated and sent to the fake
    server: mean TTFT agrees within a bound a busy host keeps (the server adds HTTP and
    event-loop time, never takes any away)."""
    preset = load_sim_preset("llm")
    sched = from_arrival(parse_arrival("poisson", 4.0), 5.0, seed=2)
    shapes = [shape(128, 16)] * len(sched.times)
    sim, _ = simulate_llm(preset.model, sched.times, shapes)
    with running_in_process(load_preset("llm"), grpc_port=None) as srv:
        url = srv.http_url.replace("http://", "openai+http://") + "/v1"
        step = Schedule(sched.times, shapes, sched.duration_s, "llm")
        real = run_coroutine(measure_step(url, step, StepConfig())).records
    assert real.count(Outcome.OK) == len(shapes)
    assert real.output_tokens.tolist() == sim.output_tokens.tolist()
    sim_ttft = float(np.mean(sim.first_token - sim.scheduled))
    real_ttft = float(np.nanmean(real.first_token - real.scheduled))
    assert sim_ttft - 0.002 <= real_ttft <= sim_ttft * 1.5 + 0.015, (sim_ttft, real_ttft)
    assert float(np.median(real.gaps)) == pytest.approx(float(np.median(sim.gaps)), abs=0.01)
