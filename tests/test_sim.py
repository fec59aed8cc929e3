"""The virtual-time server simulator: exact timelines on tiny cases, the queueing laws
(Little's law, saturated throughput = capacity_rps, capacity monotone in speed), the bulk
driver against the one queue stepped one event at a time, and the shipped presets."""

from __future__ import annotations

import heapq
import math
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.policies.batching import BatchingConfig, Wait
from ridgeline.policies.queue import BatchQueue, Entry
from ridgeline.sim import (
    Interference,
    SimState,
    load_sim_config,
    load_sim_preset,
    shapes_for,
    sim_preset_names,
    simulate,
)
from ridgeline.synthetic.model import (
    LatencyModel,
    PeriodicStall,
    Stall,
    Warmup,
    capacity_rps,
    service_time_s,
)
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.workload.payloads import FixedSize, RequestShape

OK, ERROR, TIMEOUT = int(Outcome.OK), int(Outcome.ERROR), int(Outcome.TIMEOUT)
NEVER = 1e9  # a timeout no request reaches
TICK = 1 / 1024  # seconds; ms counts of 1000/1024 make every time below exact in binary


def model(base_ms: float, per_item_ms: float = 0.0, **kw: object) -> LatencyModel:
    batching = BatchingConfig.model_validate(kw.pop("batching", {}))
    return LatencyModel.model_validate(
        {"base_ms": base_ms, "per_item_ms": per_item_ms, "batching": batching, **kw}
    )


def arr(*times: float) -> np.ndarray:
    return np.asarray(times, dtype=np.float64)


def poisson(rate: float, n: int, seed: int) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


# --- exact timelines -------------------------------------------------------------------


def test_two_joined_then_one_sent_on_its_deadline() -> None:
    m = model(2.0, 1.0, batching={"max_batch_size": 2, "max_queue_delay_s": 0.001})
    rec, state = simulate(m, arr(0.0, 0.0005, 0.010))
    # 0 waits for company; 0.0005 fills the batch (2+2 ms); 0.010 goes alone at its
    # deadline 0.011 (2+1 ms).
    assert rec.done.tolist() == pytest.approx([0.0045, 0.0045, 0.014], abs=1e-15)
    assert rec.outcome.tolist() == [OK, OK, OK]
    assert rec.sent.tolist() == rec.scheduled.tolist() == [0.0, 0.0005, 0.010]
    assert rec.errors == {}
    assert state.served == 3


def test_simultaneous_arrivals_are_decided_one_by_one() -> None:
    m = model(250.0, 125.0, batching={"max_batch_size": 2, "max_queue_delay_s": 0.125})
    rec, state = simulate(m, arr(0.0, 0.0625, 1.0, 1.0, 1.0))
    # The 2nd request at 1.0 fills a batch; the 3rd waits for the instance, free at 1.5,
    # and goes alone (its deadline has passed): 0.25 + 0.125 s.
    assert rec.done.tolist() == [0.5625, 0.5625, 1.5, 1.5, 1.875]
    assert state == SimState(server_time_s=1.875, served=5)


def test_instances_run_batches_side_by_side() -> None:
    m = model(500.0, 0.0, instances=2)
    rec, _ = simulate(m, arr(0.0, 0.0, 0.0, 0.25))
    assert rec.done.tolist() == [0.5, 0.5, 1.0, 1.0]


def test_preferred_size_goes_at_once_and_rows_fill_batches() -> None:
    cfg = {"max_batch_size": 8, "max_queue_delay_s": 1.0, "preferred_batch_sizes": [4]}
    m = model(250.0, 0.0, batching=cfg)
    shapes = [RequestShape(items=k) for k in (3, 2, 8, 1)]
    rec, _ = simulate(m, arr(0.0, 0.125, 0.25, 0.375), shapes)
    # 3+2 rows reach the preferred 4: the oldest that fit (3 rows) go at 0.125. At 0.375
    # (the 1-row request joins first) 11 rows wait: the 2 rows go alone (2+8 > 8), then the
    # 8 at 0.625; the last row waits for its deadline, 0.375 + 1 s.
    assert rec.done.tolist() == [0.375, 0.625, 0.875, 1.625]


def test_returned_state_spans_the_step_or_the_last_answer() -> None:
    m = model(250.0)
    _, after = simulate(m, arr(0.0, 2.0), state=SimState(server_time_s=10.0, served=7))
    assert after == SimState(server_time_s=12.25, served=9)
    _, idle = simulate(m, arr(0.0), span_s=5.0)
    assert idle.server_time_s == 5.0
    _, empty = simulate(m, arr())
    assert empty == SimState.fresh()
    assert SimState.fresh().advance(2.5) == SimState(server_time_s=2.5)


def test_same_seed_same_records_other_seed_other_noise() -> None:
    m = model(
        4.0,
        0.5,
        batching={"max_batch_size": 8, "max_queue_delay_s": 0.002},
        noise_cv=0.3,
        error_rate=0.05,
        instances=2,
    )
    t = poisson(1000.0, 5000, seed=3)
    a, sa = simulate(m, t, seed=11)
    b, sb = simulate(m, t, seed=11)
    c, _ = simulate(m, t, seed=12)
    assert sa == sb
    for col in ("done", "outcome", "scheduled", "sent"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.errors == b.errors
    assert not np.array_equal(a.done, c.done)


# --- failure modes ---------------------------------------------------------------------


def test_timeouts_are_counted_at_the_deadline_and_still_occupy_the_server() -> None:
    m = model(1000.0)
    rec, state = simulate(m, arr(0.0, 0.0, 0.0, 2.5), timeout_s=1.5)
    # Served at 1, 2, 3, 4 s; the client gives up on the 2nd and 3rd at 1.5 s, and the 4th
    # (arrived at 2.5, answered at exactly 2.5 + 1.5) is in time.
    assert rec.outcome.tolist() == [OK, TIMEOUT, TIMEOUT, OK]
    assert rec.done.tolist() == [1.0, 1.5, 1.5, 4.0]
    assert rec.errors == {"timeout after 1.5 s": 2}
    assert state.server_time_s == 4.0


def test_stalls_defer_completions_past_the_freeze() -> None:
    m = model(500.0, stalls=[Stall(at_s=0.5, duration_ms=500.0)])
    rec, _ = simulate(m, arr(0.25, 2.0))
    assert rec.done.tolist() == [1.0, 2.5]
    periodic = model(500.0, periodic_stall=PeriodicStall(every_s=4.0, duration_ms=1000.0))
    rec, _ = simulate(periodic, arr(0.0, 3.75, 8.75))
    assert rec.done.tolist() == [0.5, 5.0, 9.25]
    later, _ = simulate(periodic, arr(0.0), state=SimState(server_time_s=4.0))  # in server time
    assert later.done.tolist() == [1.0]


def test_warmup_slows_early_requests_and_carries_over_through_state() -> None:
    m = model(100.0, warmup=Warmup(factor=3.0, seconds=4.0))
    rec, state = simulate(m, arr(0.0, 2.0, 4.0))
    # factor 3 at 0 s, 2 halfway through the warm-up, 1 after it.
    assert rec.done.tolist() == [0.3, 2.2, 4.1]
    first, state = simulate(m, arr(0.0))
    assert first.done.tolist() == [0.3] and state.server_time_s == 0.3
    second, _ = simulate(m, arr(0.0), state=state.advance(1.7))  # server time 2.0
    assert second.done.tolist() == [0.2]
    by_count = model(100.0, warmup=Warmup(factor=3.0, requests=2))
    _, st1 = simulate(by_count, arr(0.0))
    again, _ = simulate(by_count, arr(0.0, 1.0), state=st1)
    assert again.done.tolist() == [0.2, 1.1]  # 1 served before: factor 2, then warm


def test_interference_slows_service_only_inside_its_windows() -> None:
    noisy = Interference(amount=1.0, period_s=10.0, duty=0.5, phase_s=0.0)
    m = model(250.0)
    rec, _ = simulate(m, arr(1.0, 6.0, 11.0, 16.0), interference=noisy)
    assert rec.done.tolist() == [1.5, 6.25, 11.5, 16.25]
    always, _ = simulate(m, arr(6.0), interference=Interference(amount=3.0))
    assert always.done.tolist() == [7.0]


def test_interference_factor_at_window_edges() -> None:
    w = Interference(amount=0.5, period_s=8.0, duty=0.25, phase_s=1.0)
    assert [w.factor(t) for t in (0.5, 1.0, 2.999, 3.0, 9.0, 11.0, -7.0)] == [
        1.0,
        1.5,
        1.5,
        1.0,
        1.5,
        1.0,
        1.5,
    ]


def test_injected_errors_come_at_the_configured_rate() -> None:
    n, p = 20_000, 0.1
    m = model(0.5, batching={"max_batch_size": 4}, error_rate=p, instances=4)
    rec, _ = simulate(m, poisson(500.0, n, seed=1))
    errors = rec.count(Outcome.ERROR)
    assert abs(errors - n * p) < 5 * math.sqrt(n * p * (1 - p))
    assert rec.errors == {"injected error": errors}


def test_full_queue_refuses_at_once() -> None:
    m = model(1000.0, max_queue=2)
    rec, state = simulate(m, arr(0.0, 0.0, 0.0, 0.0, 0.5))
    assert rec.outcome.tolist() == [OK, OK, OK, ERROR, ERROR]
    assert rec.done.tolist() == [1.0, 2.0, 3.0, 0.0, 0.5]
    assert rec.errors == {"queue full": 2}
    assert state.served == 3
    loss = model(1000.0, max_queue=0)  # refuse unless an instance takes it now
    rec, _ = simulate(loss, arr(0.0, 0.5, 1.25))
    assert rec.outcome.tolist() == [OK, ERROR, OK]


def test_bad_inputs_say_how_to_fix_them() -> None:
    m = model(1.0, batching={"max_batch_size": 4})
    with pytest.raises(ConfigError, match="sorted"):
        simulate(m, arr(1.0, 0.5))
    with pytest.raises(ConfigError, match="max_batch_size"):
        simulate(m, arr(0.0), [RequestShape(items=5)])
    with pytest.raises(ConfigError, match="one shape per request"):
        simulate(m, arr(0.0, 1.0), [RequestShape()])
    with pytest.raises(ConfigError, match="speed"):
        simulate(m, arr(0.0), speed=0.0)
    with pytest.raises(ConfigError, match="idle time"):
        SimState.fresh().advance(-1.0)


# --- the bulk driver against the one queue stepped one event at a time -----------------


def queue_event_by_event(m: LatencyModel, times: list[float], rows: list[int]) -> list[float]:
    """Done times (refused: NaN) from ``policies.queue.BatchQueue`` stepped as the fake
    server's engine steps it, one event at a time in virtual time: every arrival and
    completion asks the queue, every wait arms a timer, a batch that takes no time
    completes at once. Arrivals first at a tie. The simulator's bulk driver must find
    the same timeline while asking far fewer questions."""
    n, rng = len(times), random.Random(0)
    events: list[tuple[float, int, int, tuple[int, ...]]] = [
        (t, 0, i, ()) for i, t in enumerate(times)
    ]
    heapq.heapify(events)
    queue: BatchQueue[int] = BatchQueue(m.batching, m.instances)
    done = [math.nan] * n
    served, seq = 0, n

    def pump(now: float) -> None:
        nonlocal served, seq
        while True:
            formed = queue.form(now)
            if formed is None:
                return
            if isinstance(formed, Wait):
                assert formed.until is not None
                heapq.heappush(events, (formed.until, 1, seq, ()))
                seq += 1
                return
            batch = tuple(e.payload for e in formed.batch)
            end = now + service_time_s(m, formed.rows, now, served, rng)
            served += len(batch)
            if end <= now:  # the engine completes a batch that took no time at once
                queue.release(formed.slot, now)
                for j in batch:
                    done[j] = now
                continue
            heapq.heappush(events, (end, 1, seq, (formed.slot, *batch)))
            seq += 1

    while events:
        now, kind, i, batch = heapq.heappop(events)
        if kind == 0:
            entry = Entry(i, rows[i], now)
            queue.push(entry)
            if queue.free:
                pump(now)
            queue.overflow(entry, m.max_queue)
            continue
        if batch:
            queue.release(batch[0], now)
            for j in batch[1:]:
                done[j] = now
        pump(now)
    return done


@st.composite
def tick_cases(draw: st.DrawFn) -> tuple[LatencyModel, list[float], list[int]]:
    biggest = draw(st.integers(1, 6))
    preferred = draw(st.lists(st.integers(1, biggest), max_size=2, unique=True))
    ms = 1000 * TICK  # one tick of service per unit below
    m = model(
        ms * draw(st.integers(0, 6)),
        ms * draw(st.integers(0, 3)),
        batching={
            "max_batch_size": biggest,
            "max_queue_delay_s": TICK * draw(st.integers(0, 4)),
            "preferred_batch_sizes": preferred,
        },
        instances=draw(st.integers(1, 3)),
        max_queue=draw(st.none() | st.integers(0, 4)),
    )
    ticks = sorted(draw(st.lists(st.integers(0, 60), min_size=1, max_size=40)))
    rows = draw(st.lists(st.integers(1, biggest), min_size=len(ticks), max_size=len(ticks)))
    return m, [k * TICK for k in ticks], rows


@settings(max_examples=300, deadline=None)
@given(tick_cases())
def test_simulator_matches_the_engine_taken_one_event_at_a_time(
    case: tuple[LatencyModel, list[float], list[int]],
) -> None:
    m, times, rows = case
    rec, _ = simulate(m, np.asarray(times), [RequestShape(items=r) for r in rows], timeout_s=NEVER)
    expected = queue_event_by_event(m, times, rows)
    refused = [math.isnan(x) for x in expected]
    assert [o == ERROR for o in rec.outcome.tolist()] == refused
    got = [d if o == OK else math.nan for d, o in zip(rec.done.tolist(), rec.outcome, strict=True)]
    assert got == pytest.approx(expected, nan_ok=True, abs=0.0, rel=0.0)


# --- queueing laws ---------------------------------------------------------------------


@st.composite
def stable_cases(draw: st.DrawFn) -> tuple[LatencyModel, float]:
    m = model(
        draw(st.floats(0.5, 20.0)),
        draw(st.floats(0.0, 5.0)),
        batching={
            "max_batch_size": draw(st.integers(1, 32)),
            "max_queue_delay_s": draw(st.floats(0.0, 0.01)),
        },
        instances=draw(st.integers(1, 4)),
        noise_cv=draw(st.floats(0.0, 0.5)),
    )
    return m, draw(st.floats(0.1, 0.7)) * capacity_rps(m)


def time_average_in_system(rec: Records, until: float) -> float:
    """∫ N(t) dt / until over [0, until], N counted by sweeping arrivals and departures."""
    stamps = np.concatenate([rec.scheduled, rec.done])
    steps = np.concatenate([np.ones(len(rec)), -np.ones(len(rec))])
    order = np.argsort(stamps, kind="stable")
    stamps, in_system = stamps[order], np.cumsum(steps[order])
    inside = stamps < until
    edges = np.append(stamps[inside], until)
    return float(np.sum(in_system[inside] * np.diff(edges)) / until)


@settings(max_examples=20, deadline=None)
@given(stable_cases())
def test_littles_law_holds_below_capacity(case: tuple[LatencyModel, float]) -> None:
    m, rate = case
    t = poisson(rate, 20_000, seed=5)
    rec, _ = simulate(m, t, timeout_s=NEVER)
    until = float(t[-1])
    throughput = np.count_nonzero(rec.done <= until) / until
    mean_latency = float(np.mean(rec.done - rec.scheduled))
    assert time_average_in_system(rec, until) == pytest.approx(throughput * mean_latency, rel=0.02)


@pytest.mark.parametrize(
    ("m", "speed"),
    [
        (model(5.0, 1.0, batching={"max_batch_size": 8, "max_queue_delay_s": 0.001}), 1.0),
        (model(2.0, 0.25, batching={"max_batch_size": 32}, instances=3, noise_cv=0.2), 1.0),
        (model(20.0, 4.0, batching={"max_batch_size": 16, "max_queue_delay_s": 0.004}), 2.5),
    ],
)
def test_saturated_throughput_is_capacity(m: LatencyModel, speed: float) -> None:
    cap = capacity_rps(m) * speed
    duration = 60.0
    rec, _ = simulate(
        m, poisson(2 * cap, int(2 * cap * duration), seed=2), speed=speed, timeout_s=NEVER
    )
    served = np.count_nonzero((rec.done > 10.0) & (rec.done <= duration))
    assert served / (duration - 10.0) == pytest.approx(cap, rel=0.01)


@settings(max_examples=40, deadline=None)
@given(stable_cases(), st.floats(0.2, 5.0), st.floats(1.0, 3.0))
def test_capacity_never_falls_as_the_gpu_gets_faster(
    case: tuple[LatencyModel, float], speed: float, faster_by: float
) -> None:
    m, _ = case
    burst = np.zeros(m.instances * m.batching.max_batch_size * 20)  # every batch full

    def drained_rps(s: float) -> float:
        rec, _ = simulate(m, burst, speed=s, timeout_s=NEVER)
        return len(rec) / float(rec.done.max())

    assert drained_rps(speed * faster_by) >= drained_rps(speed)


# --- presets ---------------------------------------------------------------------------

PRESET_DIR = Path(__file__).parents[1] / "src" / "ridgeline" / "sim" / "presets"


def test_presets_cover_the_architecture_classes() -> None:
    assert sim_preset_names() == [
        "llm",
        "nlp",
        "ranking",
        "recommendation",
        "vision",
        "vision-warmup",
    ]  # llm: tests/test_llm_sim.py


@pytest.mark.parametrize("name", ["nlp", "ranking", "recommendation", "vision", "vision-warmup"])
def test_each_preset_states_its_capacity_and_carries_an_slo(name: str) -> None:
    preset = load_sim_preset(name)
    text = (PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    stated = re.search(r"capacity_rps = ([0-9.]+)", text)
    assert stated is not None, "the header comment must state capacity_rps"
    assert float(stated.group(1)) == round(capacity_rps(preset.model), 1)
    assert re.fullmatch(r"p99<\d+ms,errors<[0-9.]+%", preset.slo)
    assert "stand-ins" in text


def test_recommendation_stays_fast_to_simulate() -> None:
    assert capacity_rps(load_sim_preset("recommendation").model) <= 40_000


def test_vision_warmup_is_vision_until_warm() -> None:
    vision, warmup = load_sim_preset("vision"), load_sim_preset("vision-warmup")
    t = arr(0.0, 70.0)
    cold, _ = simulate(warmup.model, t)
    warm, _ = simulate(vision.model, t)
    delay = vision.model.batching.max_queue_delay_s  # a lone request waits this long
    slowdown = 1.0 + 2.0 * (1.0 - delay / 60.0)  # its batch starts `delay` into the warm-up
    assert cold.done[0] - delay == pytest.approx(slowdown * (warm.done[0] - delay), rel=1e-12)
    assert cold.done[1] == warm.done[1]  # the same noise draws; warm by 60 s


def test_shapes_follow_the_preset_sizes() -> None:
    assert shapes_for(load_sim_preset("vision"), 100, seed=1) is None
    nlp = load_sim_preset("nlp")
    shapes = shapes_for(nlp, 5000, seed=1)
    assert shapes is not None and shapes == shapes_for(nlp, 5000, seed=1)
    items = np.array([s.items for s in shapes])
    assert items.min() >= 1 and items.max() <= nlp.model.batching.max_batch_size
    assert 3.5 < items.mean() < 4.5
    rec, _ = simulate(nlp.model, poisson(60.0, 5000, seed=1), shapes)
    assert rec.count(Outcome.OK) == 5000


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownKindError, match="presets are: llm, nlp, ranking"):
        load_sim_preset("resnet")


def config_file(tmp_path: Path, text: str) -> Path:
    """A simulated server's YAML config file holding ``text``."""
    path = tmp_path / "sim.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_config_file_overrides_a_preset(tmp_path: Path) -> None:
    mine = load_sim_config(
        config_file(
            tmp_path,
            "preset: vision\nspeed: 2.0\nsizes: 2\nmodel:\n  instances: 4\n"
            "interference: {amount: 0.5, period_s: 30, duty: 0.2}\n",
        )
    )
    vision = load_sim_preset("vision")
    assert mine.model == vision.model.model_copy(update={"instances": 4})
    assert (mine.speed, mine.sizes, mine.slo) == (2.0, FixedSize(value=2), vision.slo)
    assert mine.interference == Interference(amount=0.5, period_s=30.0, duty=0.2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "description: d\nmodel: {batching: {max_batch_size: 4}}\n"
            "sizes: {kind: lognormal, mean: 4, cv: 1}\n",
            "high ≤ max_batch_size",
        ),
        ("preset: vision\nspeed: 0\n", "speed"),
        ("model: {base_ms: 1.0}\n", "description: Field required"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_sim_config(config_file(tmp_path, text))


def test_a_missing_config_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_sim_config(tmp_path / "missing.yaml")


# --- speed -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_million_requests_simulate_in_seconds() -> None:
    preset = load_sim_preset("recommendation")
    t = poisson(0.9 * capacity_rps(preset.model), 1_000_000, seed=1)
    start = time.perf_counter()
    rec, _ = simulate(preset.model, t)
    elapsed = time.perf_counter() - start
    assert rec.count(Outcome.OK) == 1_000_000
    assert elapsed < 3.0
