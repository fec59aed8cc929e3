"""Profiles: the roofline's laws and numbers, its calibration, the CSV table, and CPU
rows measured against the real serving runtime."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer import Typer
from typer.testing import CliRunner, Result

from ridgeline.cli.planning import profile_command
from ridgeline.errors import ConfigError, PlanError
from ridgeline.loop.profiling import ensure_zoo, measure_cpu, model_gpus
from ridgeline.pipeline.gpu import GPU_TYPES
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable, load_profiles
from ridgeline.pipeline.roofline import (
    Cost,
    Roofline,
    calibrate,
    cpu_modelled_rows,
    modelled_rows,
    variant_gflops,
)
from ridgeline.pipeline.segments import CPU, segment_types
from ridgeline.pipeline.spec import PipelineSpec, VariantSpec

H100 = "H100-80GB"


def by_key(rows: list[ProfileRow]) -> dict[tuple[str, str, int], ProfileRow]:
    return {(r.variant, r.segment, r.batch): r for r in rows}


GUESS = Roofline()
"""Round constants (efficiency 0.4, overhead 1 ms, no occupancy term): the formula's
arithmetic on hand-picked numbers. GPU rows by default use the fit (test_roofline_fit)."""


# --- the formula on hand-picked numbers ----------------------------------------------------


def test_compute_bound_on_a_whole_h100() -> None:
    """7g.80gb is all 132 SMs: 989 TFLOP/s × 0.4 = 395.6 TFLOP/s reached, so 395.6 GFLOPs
    take 1 ms per item; 335 MB at 3,350 GB/s is 0.1 ms, under it. Plus 1 ms overhead."""
    rows = by_key(modelled_rows([Cost("c", 395.6, 335.0)], H100, [1, 4], model=GUESS))
    assert rows["c", "7g.80gb", 1].latency_ms == pytest.approx(2.0, rel=1e-12)
    assert rows["c", "7g.80gb", 1].throughput_rps == pytest.approx(500.0, rel=1e-12)
    assert rows["c", "7g.80gb", 4].latency_ms == pytest.approx(5.0, rel=1e-12)
    assert rows["c", "7g.80gb", 4].throughput_rps == pytest.approx(800.0, rel=1e-12)
    assert {r.source for r in rows.values()} == {"modelled"}
    twice = by_key(
        modelled_rows([Cost("c", 395.6, 335.0)], H100, [4], calibration=2.0, model=GUESS)
    )
    assert twice["c", "7g.80gb", 4].latency_ms == pytest.approx(10.0, rel=1e-12)


def test_a_batch_that_gives_each_sm_its_saturation_keeps_1_minus_1_over_e_busy() -> None:
    """132 GFLOPs over 7g.80gb's 132 SMs is 1 GFLOP per SM, the saturation: 63.2 % of the
    SMs are busy, so the 0.3337 ms the whole roof would take stretch to 0.5279 ms; at
    batch 8 (8 GFLOPs per SM) 99.97 % are busy."""
    occupied = GUESS.model_copy(update={"saturation_gflop_per_sm": 1.0, "overhead_ms": 0.0})
    rows = by_key(modelled_rows([Cost("c", 132.0, 1.0)], H100, [1, 8], model=occupied))
    assert rows["c", "7g.80gb", 1].latency_ms == pytest.approx(0.52787, rel=1e-4)
    assert rows["c", "7g.80gb", 8].latency_ms == pytest.approx(8 * 0.33367 / 0.99966, rel=1e-4)


def test_memory_bound_weights_are_read_once_per_batch() -> None:
    """All of 3,350 MB is weights (no activation traffic): 1 ms at 3,350 GB/s whatever the
    batch, while 8 × 0.3956 GFLOPs compute in 0.008 ms; so batch 8 costs what batch 1 does."""
    weights_only = Roofline(activation_mb_per_gflop=0.0)
    rows = by_key(modelled_rows([Cost("w", 0.3956, 3350.0)], H100, [1, 8], model=weights_only))
    assert rows["w", "7g.80gb", 1].latency_ms == pytest.approx(2.0, rel=1e-12)
    assert rows["w", "7g.80gb", 8].latency_ms == pytest.approx(2.0, rel=1e-12)
    assert rows["w", "7g.80gb", 8].throughput_rps == pytest.approx(4000.0, rel=1e-12)


def test_an_mps_half_is_half_a_slice() -> None:
    """Without overhead, half of a 1g slice's SMs and bandwidth takes twice as long."""
    bare = Roofline(overhead_ms=0.0)
    rows = by_key(modelled_rows([Cost("v", 5.0)], H100, [1, 8], model=bare))
    for b in (1, 8):
        half, whole = rows["v", "1g.10gb@1/2", b], rows["v", "1g.10gb", b]
        assert half.latency_ms == pytest.approx(2 * whole.latency_ms, rel=1e-12)


def test_a_cpu_segment_has_its_cores_peak() -> None:
    """cpu2: 2 × 100 GFLOP/s × 0.4 = 80 GFLOP/s, so 0.08 GFLOPs take 1 ms per item; the
    0.88 MB per item (0.08 weights + 0.8 activations) at 20 GB/s stay under it."""
    rows = by_key(cpu_modelled_rows([Cost("c", 0.08)], [2], [1, 3]))
    assert rows["c", "cpu2", 1].latency_ms == pytest.approx(2.0, rel=1e-12)
    assert rows["c", "cpu2", 3].latency_ms == pytest.approx(4.0, rel=1e-12)
    assert rows["c", "cpu2", 3].throughput_rps == pytest.approx(750.0, rel=1e-12)
    assert rows["c", "cpu2", 3].pool == CPU


def test_every_segment_type_of_the_gpu_gets_rows() -> None:
    rows = modelled_rows([Cost("a", 1.0), Cost("b", 2.0)], "A100-80GB", [1, 2])
    labels = {s.label for s in segment_types("A100-80GB")}
    assert {r.segment for r in rows} == labels
    assert len(rows) == 2 * len(labels) * 2
    whole_only = modelled_rows([Cost("a", 1.0)], "A100-80GB", [1], spatial=False)
    assert [r.segment for r in whole_only] == ["gpu"]  # MIG off: every SM


def test_gflops_come_from_the_spec_then_the_published_figures() -> None:
    assert variant_gflops(VariantSpec(name="yolov5s", accuracy=1, gflops=20.0)) == 20.0
    assert variant_gflops(VariantSpec(name="yolov5s", accuracy=1)) == 16.5
    # EfficientNet's and ArcFace's sources print multiply-adds: FLOPs are twice that
    assert variant_gflops(VariantSpec(name="efficientnet-b0", accuracy=1)) == 0.78
    assert variant_gflops(VariantSpec(name="arcface-r50", accuracy=1)) == 12.6
    # GIT publishes none: the zoo's builder counts the full-size model's
    base = variant_gflops(VariantSpec(name="git-base-coco", accuracy=1))
    assert 0 < base < variant_gflops(VariantSpec(name="git-large-coco", accuracy=1))


def test_a_variant_without_gflops_is_named() -> None:
    with pytest.raises(PlanError, match=r"'mystery'.*gflops:"):
        modelled_rows([VariantSpec(name="mystery", accuracy=1)], H100, [1])


def test_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(PlanError, match="batch sizes"):
        modelled_rows([Cost("a", 1.0)], H100, [0])
    with pytest.raises(PlanError, match="calibration"):
        modelled_rows([Cost("a", 1.0)], H100, [1], calibration=0.0)
    with pytest.raises(PlanError, match="cpu_modelled_rows"):
        modelled_rows([Cost("a", 1.0)], CPU, [1])


# --- the laws -----------------------------------------------------------------------------

costs = st.builds(
    Cost,
    name=st.just("v"),
    gflops=st.floats(0.001, 2000.0),
    mbytes=st.none() | st.floats(0.01, 20000.0),
)
pools = st.sampled_from(sorted(GPU_TYPES))
batch_lists = st.lists(st.integers(1, 256), min_size=2, max_size=6, unique=True).map(sorted)


@given(costs, pools, batch_lists)
def test_latency_and_throughput_never_fall_with_the_batch(
    cost: Cost, pool: str, batches: list[int]
) -> None:
    rows = modelled_rows([cost], pool, batches)
    for seg in {r.segment for r in rows}:
        ordered = [r for r in rows if r.segment == seg]  # in batch order
        for small, big in itertools.pairwise(ordered):
            assert big.latency_ms >= small.latency_ms
            assert big.throughput_rps >= small.throughput_rps * (1 - 1e-12)


@given(costs, pools, st.integers(1, 256))
def test_a_segment_with_no_fewer_sms_nor_less_bandwidth_serves_no_less(
    cost: Cost, pool: str, batch: int
) -> None:
    segs = segment_types(pool)
    rows = by_key(modelled_rows([cost], pool, [batch]))
    for a in segs:
        for b in segs:
            if a.sms() >= b.sms() and a.bandwidth_gbps() >= b.bandwidth_gbps():
                big, small = rows["v", a.label, batch], rows["v", b.label, batch]
                assert big.throughput_rps >= small.throughput_rps * (1 - 1e-12)


@given(costs, st.floats(1.0, 100.0), pools, st.integers(1, 256))
def test_more_flops_take_no_less_time(cost: Cost, scale: float, pool: str, batch: int) -> None:
    heavier = dataclasses.replace(cost, name="h", gflops=(cost.gflops or 1.0) * scale)
    rows = by_key(modelled_rows([cost, heavier], pool, [batch]))
    for seg in segment_types(pool):
        assert rows["h", seg.label, batch].latency_ms >= rows["v", seg.label, batch].latency_ms


@given(costs, pools, st.floats(0.01, 100.0))
def test_calibration_scales_every_latency(cost: Cost, pool: str, k: float) -> None:
    bare = modelled_rows([cost], pool, [1, 16])
    scaled = modelled_rows([cost], pool, [1, 16], calibration=k)
    for r, s in zip(bare, scaled, strict=True):
        assert s.latency_ms == pytest.approx(k * r.latency_ms, rel=1e-12)


# --- calibration ----------------------------------------------------------------------------


def test_calibration_recovers_a_known_factor() -> None:
    model = cpu_modelled_rows([Cost("a", 0.05), Cost("b", 0.4)], [1, 2], [1, 4])
    measured = [
        dataclasses.replace(r, latency_ms=2.5 * r.latency_ms, source="measured") for r in model
    ]
    assert calibrate(ProfileTable(measured), model) == pytest.approx(2.5, rel=1e-12)
    # an outlier, a row with no modelled twin and a modelled row do not move the median
    noisy = [
        dataclasses.replace(measured[0], latency_ms=100 * measured[0].latency_ms),
        *measured[1:],
        ProfileRow("c", CPU, "cpu1", 1, 50.0, 20.0, "measured"),
        dataclasses.replace(model[1], latency_ms=1e6),
    ]
    assert calibrate(noisy, model) == pytest.approx(2.5, rel=1e-12)


def test_calibration_needs_rows_in_common() -> None:
    model = cpu_modelled_rows([Cost("a", 0.05)], [1], [1])
    with pytest.raises(PlanError, match="measure the variants on CPU first"):
        calibrate([ProfileRow("a", CPU, "cpu2", 1, 5.0, 200.0, "measured")], model)


def test_gpu_rows_from_a_spec_without_zoo_models_have_no_cpu_factor() -> None:
    """Synthetic models have no FLOPs to compare with: no factor, said so; the GPU rows
    are the fitted roofline's either way."""
    spec = synthetic_spec(gflops=2.0)
    measured = ProfileTable([ProfileRow("s", CPU, "cpu1", 1, 6.0, 166.7, "measured")])
    m = model_gpus(spec, measured, [H100, "A100-40GB"], [1, 2], ensure_zoo(spec, Path("nozoo")))
    assert (m.cpu_factor, m.basis) == (1.0, 0)
    assert m.rows == [
        *modelled_rows(spec.tasks["t"].variants, H100, [1, 2]),
        *modelled_rows(spec.tasks["t"].variants, "A100-40GB", [1, 2]),
    ]


def test_the_cpu_factor_is_reported_and_not_carried_to_the_gpu_rows() -> None:
    """An artifact of 0.05 GFLOPs measured at 3 × its CPU roofline: the factor is 3, and
    the A100-80GB rows are still the fit's, calibrated, unscaled."""
    variant = {"name": "a", "accuracy": 1.0, "artifact": "a.onnx", "gflops": 0.05}
    spec = PipelineSpec.model_validate(
        {"name": "a", "slo_ms": 100, "demand_rps": 1, "tasks": {"t": {"variants": [variant]}}}
    )
    (cpu,) = cpu_modelled_rows([Cost("a", 0.05)], [1], [1])
    measured = ProfileTable(
        [dataclasses.replace(cpu, latency_ms=3 * cpu.latency_ms, source="measured")]
    )
    m = model_gpus(spec, measured, ["A100-80GB"], [1, 4], None)
    assert (m.cpu_factor, m.basis) == (pytest.approx(3.0, rel=1e-12), 1)
    assert m.rows == modelled_rows(spec.tasks["t"].variants, "A100-80GB", [1, 4])
    assert {r.source for r in m.rows} == {"calibrated"}


# --- the CSV table ------------------------------------------------------------------------


def test_a_table_round_trips_through_csv(tmp_path: Path) -> None:
    rows = [
        *modelled_rows([Cost("yolov5n", 4.5), Cost("x", 0.3, 12.5)], "A100-80GB", [1, 8]),
        ProfileRow("yolov5n", CPU, "cpu2", 4, 37.25, 107.38255033557047, "measured"),
    ]
    path = tmp_path / "p.csv"
    path.write_text(ProfileTable(rows).to_csv())
    assert load_profiles(path).rows == rows


HEADER = "variant,pool,segment,batch,latency_ms,throughput_rps,source\n"
GOOD = "a,H100-80GB,1g.10gb,1,2.0,500.0,modelled\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "variant,pool,segment,batch,throughput_rps,source\na,H100-80GB,1g.10gb,1,5,modelled\n",
            "missing columns latency_ms",
        ),
        (HEADER + GOOD + "a,H100-80GB,1g.10gb,2,3.0\n", "line 3"),
        (HEADER + "a,H100-80GB,1g.10gb,1,-2.0,500.0,modelled\n", "line 2"),
        (HEADER + GOOD + "a,H100-80GB,1g.10gb,x,2.0,500.0,modelled\n", "line 3"),
        (HEADER + "a,H100-80GB,1g.10gb,1,2.0,500.0,guessed\n", "line 2"),
    ],
)
def test_a_bad_row_names_its_line(text: str, says: str) -> None:
    with pytest.raises(PlanError, match=says):
        ProfileTable.from_csv(text, "p.csv")


def test_an_unknown_mig_profile_names_its_line() -> None:
    text = HEADER + GOOD + "a,H100-80GB,5g.50gb,1,2.0,500.0,modelled\n"
    with pytest.raises(PlanError, match=r"line 3.*5g\.50gb"):
        ProfileTable.from_csv(text, "p.csv")


def test_every_source_round_trips_through_csv(tmp_path: Path) -> None:
    rows = [
        ProfileRow("a", "A100-80GB", "1g.10gb", 4, 12.5, 320.0, "measured"),
        ProfileRow("a", "A100-80GB", "7g.80gb", 4, 6.25, 640.0, "calibrated"),
        ProfileRow("a", "H100-80GB", "1g.10gb@1/2", 1, 3.0, 333.3333333333333, "modelled"),
    ]
    path = tmp_path / "p.csv"
    path.write_text(ProfileTable(rows).to_csv())
    assert load_profiles(path).rows == rows


def test_a_table_from_before_calibrated_rows_still_loads() -> None:
    text = HEADER + GOOD + "a,cpu,cpu1,1,4.0,250.0,measured\n"
    assert [r.source for r in ProfileTable.from_csv(text)] == ["modelled", "measured"]


def test_an_unknown_source_names_its_line_and_the_valid_ones() -> None:
    text = HEADER + GOOD + "a,H100-80GB,1g.10gb,2,3.0,666.0,fitted\n"
    with pytest.raises(
        PlanError,
        match=r"p\.csv line 3: source 'fitted' is not one of measured, calibrated, modelled",
    ):
        ProfileTable.from_csv(text, "p.csv")


# --- measuring against the serving runtime -----------------------------------------------


def synthetic_spec(gflops: float | None = None, max_batch_size: int = 64) -> PipelineSpec:
    model = {"base_ms": 5, "per_item_ms": 1, "max_batch_size": max_batch_size}
    variant = {"name": "s", "accuracy": 1.0, "synthetic": model, "gflops": gflops}
    return PipelineSpec.model_validate(
        {"name": "synth", "slo_ms": 1000, "demand_rps": 10, "tasks": {"t": {"variants": [variant]}}}
    )


async def test_what_cannot_be_measured_fails_before_any_server(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="takes batches of 4 at most"):
        await measure_cpu(synthetic_spec(max_batch_size=4), tmp_path, batches=(1, 8))
    zoo_spec = PipelineSpec.model_validate(
        {
            "name": "z",
            "slo_ms": 100,
            "demand_rps": 1,
            "tasks": {"detect": {"variants": [{"name": "yolov5n", "accuracy": 28.0}]}},
        }
    )
    with pytest.raises(PlanError, match=r"tasks\.detect\.variants: 'yolov5n' needs the model zoo"):
        await measure_cpu(zoo_spec, tmp_path / "nozoo")
    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(ConfigError, match=f"this process may use {too_many - 1} cores"):
        await measure_cpu(synthetic_spec(), tmp_path, cores=(too_many,))


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_synthetic_variant_measures_its_latency_model(tmp_path: Path) -> None:
    """base 5 ms + 1 ms per item: batches of 1 take 6 ms and of 4 take 9 ms, so 4 serve
    more rows per second."""
    seen: list[ProfileRow] = []
    table = await measure_cpu(
        synthetic_spec(), tmp_path, (1,), (1, 4), 1.5, warmup_s=0.3, on_row=seen.append
    )
    rows = by_key(table.rows)
    assert seen == table.rows
    assert {(r.pool, r.source) for r in table} == {(CPU, "measured")}
    one, four = rows["s", "cpu1", 1], rows["s", "cpu1", 4]
    # the model is the floor (a batch cannot beat it; 5 % for timer rounding) and the
    # serving path's overhead (two processes, a pipe) is added on top: on a busy host
    # it grows, so it is bounded by the batch's own cost, not by ±30 % around the model
    assert 0.95 * 6.0 <= one.latency_ms < 2 * 6.0
    assert 0.95 * 9.0 <= four.latency_ms < 2 * 9.0
    assert four.latency_ms > one.latency_ms and four.throughput_rps > one.throughput_rps


def _profile(
    tmp_path: Path, task: str, variant: str, args: list[str]
) -> tuple[Result, ProfileTable]:
    """Run the profile command (0.5 s a measurement) on a one-task spec of one variant;
    its output and the table it wrote."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: p\nslo_ms: 1000\ndemand_rps: 10\ntasks:\n  {task}:\n    variants:\n"
        f"      - {variant}\n"
    )
    app = Typer()
    app.command()(profile_command)
    out = tmp_path / "p.csv"
    result = CliRunner().invoke(app, [str(spec), "--out", str(out), "--seconds", "0.5", *args])
    assert result.exit_code == 0, result.output
    return result, load_profiles(out)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_command_writes_measured_and_modelled_rows(tmp_path: Path) -> None:
    result, table = _profile(
        tmp_path,
        "t",
        "{name: s, accuracy: 1, gflops: 3.0, synthetic: {base_ms: 2, per_item_ms: 1}}",
        ["--batches", "2", "--gpus", H100],
    )
    assert [(r.segment, r.batch, r.source) for r in table.for_variant("s", CPU)] == [
        ("cpu1", 2, "measured")
    ]
    assert len(table.for_variant("s", H100)) == len(segment_types(H100))
    assert {r.source for r in table.for_variant("s", H100)} == {"modelled"}
    assert f"modelled on {H100}" in result.output
    assert "no measured row's model has known FLOPs" in result.output


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_zoo_variant_is_built_measured_and_its_gpu_rows_are_the_fit(tmp_path: Path) -> None:
    """ArcFace R18 from a zoo the command builds; its measured rows give this host's CPU
    factor, reported; the GPU rows, on the full-size model's FLOPs, are the fit's."""
    zoo = tmp_path / "zoo"
    result, table = _profile(
        tmp_path,
        "face",
        "{name: arcface-r18, accuracy: 79.13}",
        ["--zoo", str(zoo), "--batches", "1,2", "--gpus", "A100-80GB"],
    )
    assert (zoo / "manifest.json").is_file()
    measured = table.for_variant("arcface-r18", CPU)
    assert [(r.segment, r.batch, r.source) for r in measured] == [
        ("cpu1", 1, "measured"),
        ("cpu1", 2, "measured"),
    ]
    gpu = table.for_variant("arcface-r18", "A100-80GB")
    assert len(gpu) == 2 * len(segment_types("A100-80GB"))
    assert {r.source for r in gpu} == {"calibrated"}
    assert "calibrated on A100-80GB" in result.output
    assert "its roofline by 2 measured rows" in result.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_profile_writes_the_rows_it_measured(tmp_path: Path, sig: int) -> None:
    """Issue 33, fault 21: Ctrl-C during `profile` printed two tracebacks and wrote no
    CSV, the rows already measured lost. Stopped once its first row is told: the rows
    measured are written, one `error:` line says how many, exit 130."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: p\nslo_ms: 1000\ndemand_rps: 10\ntasks:\n  t:\n    variants:\n"
        "      - {name: s, accuracy: 1, synthetic: {base_ms: 2, per_item_ms: 1}}\n"
    )
    out = tmp_path / "p.csv"
    cmd = [sys.executable, "-m", "ridgeline", "profile", str(spec), "--out", str(out)]
    cmd += ["--batches", "1,2,4,8,16,32", "--seconds", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("s cpu1 batch 1:"), first
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 130, rest
    errors = [line for line in rest.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "measured row(s) written to" in errors[0], rest
    assert "Traceback" not in rest
    rows = load_profiles(out).rows
    assert 1 <= len(rows) < 6 and {r.source for r in rows} == {"measured"}
