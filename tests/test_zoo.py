"""The model zoo: real ONNX models that run, cost what their families cost, and say so."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import typer
from typer.testing import CliRunner

from ridgeline.cli.models import app as zoo_app
from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.zoo import (
    ACCURACY,
    FAMILIES,
    PUBLISHED_GFLOPS,
    Manifest,
    ZooVariant,
    build_model,
    build_zoo,
    load_manifest,
    paper_flops,
)

ALL_VARIANTS = [(family, name) for family, names in FAMILIES.items() for name in names]

app = typer.Typer()
app.add_typer(zoo_app, name="models")  # as the main app mounts it
runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    out = tmp_path_factory.mktemp("zoo")
    return out, build_zoo(out)


def _session(out: Path, v: ZooVariant) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(out / v.path), options, providers=["CPUExecutionProvider"])


def _feeds(v: ZooVariant, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in v.inputs:
        shape = (batch, *spec.shape[1:])
        feeds[spec.name] = (
            rng.random(shape, dtype=np.float32)
            if spec.datatype == "FP32"
            else rng.integers(0, 100, shape, dtype=np.int64)
        )
    return feeds


def _ms_per_item(out: Path, v: ZooVariant, runs: int = 7) -> float:
    session, feeds = _session(out, v), _feeds(v, 1)
    session.run(None, feeds)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@pytest.mark.parametrize(("family", "name"), ALL_VARIANTS)
def test_every_variant_runs_batch_1_and_4_with_its_manifest_shapes(
    zoo: tuple[Path, Manifest], family: str, name: str
) -> None:
    out, manifest = zoo
    v = manifest.variant(name)
    assert v.family == family
    assert all(spec.shape[0] == -1 for spec in (*v.inputs, *v.outputs))
    session = _session(out, v)
    names = [spec.name for spec in v.outputs]
    for batch in (1, 4):
        results = session.run(names, _feeds(v, batch))
        for spec, result in zip(v.outputs, results, strict=True):
            assert result.shape == (batch, *spec.shape[1:])
            assert result.dtype == np.float32
            assert np.isfinite(result).all()
    # an item's answer depends on its own input only, not on its batch-mates
    batched = session.run(names, _feeds(v, 4))
    alone = session.run(names, {k: x[:1] for k, x in _feeds(v, 4).items()})
    other = session.run(names, _feeds(v, 1, seed=1))
    for b, a, o in zip(batched, alone, other, strict=True):
        np.testing.assert_allclose(b[:1], a, rtol=1e-4, atol=1e-4)
        assert not np.allclose(a, o), "another input gives the same answer"


def test_flops_and_params_strictly_increase_within_each_family(
    zoo: tuple[Path, Manifest],
) -> None:
    _, manifest = zoo
    for family, names in FAMILIES.items():
        variants = manifest.family(family)
        assert [v.name for v in variants] == list(names)
        flops = [v.flops_per_item for v in variants]
        params = [v.params for v in variants]
        assert flops == sorted(set(flops)) and params == sorted(set(params)), family


def test_reduced_flops_keep_the_published_ratio_roughly(zoo: tuple[Path, Manifest]) -> None:
    _, manifest = zoo
    for family in ("detector", "classifier", "face"):
        smallest, *_, largest = manifest.family(family)
        assert smallest.published_gflops is not None and largest.published_gflops is not None
        real = largest.published_gflops / smallest.published_gflops
        ours = largest.flops_per_item / smallest.flops_per_item
        assert real / 2 < ours < real * 2, (family, real, ours)


# the zoo counts 2 x MACs; EfficientNet and ArcFace publish multiply-adds, YOLOv5 2 x MACs
FLOPS_PER_PUBLISHED_UNIT = {"detector": 1.0, "classifier": 0.5, "face": 0.5}


@pytest.mark.parametrize(
    ("family", "name"), [(f, n) for f, n in ALL_VARIANTS if n in PUBLISHED_GFLOPS]
)
def test_at_paper_scale_the_builders_count_the_published_flops(family: str, name: str) -> None:
    flops, _ = paper_flops(family, name)
    published = PUBLISHED_GFLOPS[name] * 1e9
    assert flops * FLOPS_PER_PUBLISHED_UNIT[family] == pytest.approx(published, rel=0.06)


@pytest.mark.parametrize("family", ["detector", "classifier"])
def test_cpu_time_per_item_grows_from_the_smallest_to_the_largest(
    zoo: tuple[Path, Manifest], family: str
) -> None:
    out, manifest = zoo
    smallest, *_, largest = manifest.family(family)
    assert _ms_per_item(out, largest) >= 2 * _ms_per_item(out, smallest)


def test_the_manifest_round_trips_and_paths_are_relative(zoo: tuple[Path, Manifest]) -> None:
    out, manifest = zoo
    assert load_manifest(out) == manifest
    assert Manifest.model_validate_json(manifest.model_dump_json()) == manifest
    for v in manifest.variants:
        assert v.path == f"{v.family}/{v.name}.onnx"
        assert (out / v.path).stat().st_size == v.size_bytes


def test_the_whole_zoo_stays_small_on_disk(zoo: tuple[Path, Manifest]) -> None:
    _, manifest = zoo
    assert sum(v.size_bytes for v in manifest.variants) < 200e6


def test_every_accuracy_figure_names_its_source(zoo: tuple[Path, Manifest]) -> None:
    _, manifest = zoo
    names = {v.name for v in manifest.variants}
    assert set(ACCURACY) <= names and set(PUBLISHED_GFLOPS) <= names
    for v in manifest.variants:
        assert v.accuracy == ACCURACY.get(v.name)
        if v.accuracy is not None:
            assert v.accuracy.source.strip() and v.accuracy.metric.strip()
    assert manifest.variant("yolov5s").accuracy == ACCURACY["yolov5s"]
    assert (ACCURACY["yolov5s"].value, ACCURACY["efficientnet-b7"].value) == (37.4, 84.3)
    assert all(v.accuracy is None for v in manifest.family("tts"))


def test_a_rebuild_keeps_up_to_date_files_and_replaces_damaged_ones(tmp_path: Path) -> None:
    first = build_zoo(tmp_path, ["tts"])
    small, base = tmp_path / "tts/tts-small.onnx", tmp_path / "tts/tts-base.onnx"
    stamp = small.stat().st_mtime_ns
    base.write_bytes(b"not a model")
    again = build_zoo(tmp_path, ["tts"])
    assert again == first
    assert small.stat().st_mtime_ns == stamp
    assert base.stat().st_size == first.variant("tts-base").size_bytes


def test_building_a_family_keeps_the_families_built_before(tmp_path: Path) -> None:
    build_zoo(tmp_path, ["tts"])
    manifest = build_zoo(tmp_path, ["captioner"])
    assert [v.family for v in manifest.variants] == ["captioner"] * 2 + ["tts"] * 3
    assert load_manifest(tmp_path) == manifest


def test_weights_are_the_same_on_every_build() -> None:
    a, b = build_model("tts", "tts-small"), build_model("tts", "tts-small")
    assert a.model.SerializeToString() == b.model.SerializeToString()


def test_unknown_family_or_variant_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownKindError, match="valid model families are: captioner, classifier"):
        build_zoo(tmp_path, ["detector", "segmenter"])
    assert not (tmp_path / "detector").exists()
    with pytest.raises(UnknownKindError, match="yolov5n, yolov5s"):
        build_model("detector", "yolov8n")
    with pytest.raises(UnknownKindError, match="valid zoo variants are: tts-base"):
        build_zoo(tmp_path, ["tts"]).variant("yolov8n")
    with pytest.raises(ConfigError, match="ridgeline models build"):
        load_manifest(tmp_path / "empty")


def test_cli_build_prints_the_table_and_writes_the_zoo(tmp_path: Path) -> None:
    res = runner.invoke(app, ["models", "build", "--out", str(tmp_path), "--family", "face"])
    assert res.exit_code == 0, res.output
    assert "arcface-r100" in res.output and "96.69" in res.output
    assert [v.name for v in load_manifest(tmp_path).variants] == list(FAMILIES["face"])


def test_cli_defaults_to_ridgeline_zoo_and_lists_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIDGELINE_ZOO", str(tmp_path / "zoo"))
    assert runner.invoke(app, ["models", "build", "--family", "tts"]).exit_code == 0
    res = runner.invoke(app, ["models", "list"])
    assert res.exit_code == 0, res.output
    assert "tts-large" in res.output and "none published" in res.output


def test_cli_unknown_family_fails_with_the_valid_ones(tmp_path: Path) -> None:
    res = runner.invoke(app, ["models", "build", "--out", str(tmp_path), "--family", "asr"])
    assert res.exit_code == 2
    assert "valid model families are" in res.output
