"""The model registry: digests, revisions, latest-by-default, and errors that name what exists."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from itertools import count
from pathlib import Path

import pytest

from ridgeline.errors import ConfigError, StoreError
from ridgeline.sizing import CapacityResult, Registry
from ridgeline.telemetry.store import RunStore

ABC_SHA256 = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def result(rps: float, run_id: int | None = None) -> CapacityResult:
    return CapacityResult(
        capacity_rps=rps,
        ci_low=rps * 0.95,
        ci_high=rps * 1.05,
        slo="p99<100ms,errors<1%",
        strategy="adaptive",
        run_id=run_id,
    )


def ticking() -> count[float]:
    return count(1_700_000_000.0, 60.0)


def test_an_entry_round_trips_with_the_digest_of_its_artifact_file(
    store: RunStore, tmp_path: Path
) -> None:
    weights = tmp_path / "model.onnx"
    weights.write_bytes(b"abc")
    clock = ticking()
    with Registry(store, clock=lambda: next(clock)) as reg:
        made = reg.register(
            "resnet50",
            "1.0",
            artifact=weights,
            hardware="A100-80GB MIG 3g.40gb",
            capacity=result(420.0, run_id=7),
            serving_config={"max_batch_size": 8, "instances": 2},
        )
        got = reg.get("resnet50")
    assert got == made
    assert got.digest == ABC_SHA256
    assert (got.revision, got.hardware, got.capacity.run_id) == (1, "A100-80GB MIG 3g.40gb", 7)
    assert got.serving_config == {"instances": 2, "max_batch_size": 8}
    assert got.created_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


def test_a_digest_given_as_text_is_kept_as_it_is(store: RunStore) -> None:
    with Registry(store) as reg:
        entry = reg.register(
            "llama", "3-8b", artifact=" sha256:feed ", hardware="H100", capacity=result(12.0)
        )
    assert entry.digest == "sha256:feed"


def test_registering_again_adds_a_revision_and_get_returns_the_latest(store: RunStore) -> None:
    with Registry(store) as reg:
        reg.register("m", "1", artifact="d1", hardware="A100", capacity=result(100.0))
        reg.register("m", "1", artifact="d1", hardware="L4", capacity=result(40.0))
        reg.register("m", "1", artifact="d1", hardware="A100", capacity=result(110.0))
        reg.register("m", "2", artifact="d2", hardware="A100", capacity=result(150.0))
        reg.register("other", "1", artifact="d3", hardware="A100", capacity=result(5.0))
        history = [(e.version, e.hardware, e.revision) for e in reg.list_entries("m")]
        assert history == [("1", "A100", 1), ("1", "L4", 1), ("1", "A100", 2), ("2", "A100", 1)]
        assert len(reg.list_entries()) == 5
        assert reg.get("m").capacity.capacity_rps == 150.0
        assert reg.get("m", "1").capacity.capacity_rps == 110.0
        assert reg.get("m", "1", hardware="L4").capacity.capacity_rps == 40.0
        assert reg.models() == ["m", "other"]


def test_entries_outlive_the_connection_and_share_the_run_store_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    with RunStore(path) as store, Registry(store) as reg:
        reg.register("m", "1", artifact="d", hardware="T4", capacity=result(30.0))
        run_id = store.create_run("probe", "null://", {})
    with RunStore(path) as store, Registry(store) as reg:
        assert [e.capacity.capacity_rps for e in reg.list_entries()] == [30.0]
        assert store.get_run(run_id)["kind"] == "probe"
    with closing(sqlite3.connect(path)) as db:
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master")}
    assert {"runs", "registry"} <= tables


def test_an_unknown_model_or_version_names_what_exists(store: RunStore) -> None:
    with Registry(store) as reg:
        with pytest.raises(StoreError, match="registry is empty"):
            reg.get("m")
        reg.register("bert", "1", artifact="d", hardware="T4", capacity=result(30.0))
        reg.register("gpt2", "1", artifact="d", hardware="T4", capacity=result(30.0))
        with pytest.raises(StoreError, match=r"no model 'bart'.*registered models are: bert, gpt2"):
            reg.get("bart")
        with pytest.raises(StoreError, match="no model 'bart'"):
            reg.list_entries("bart")
        with pytest.raises(StoreError, match=r"no entry for version '2'.*version '1' on 'T4'"):
            reg.get("bert", "2")


def test_bad_registrations_say_what_to_give(store: RunStore, tmp_path: Path) -> None:
    with Registry(store) as reg:
        with pytest.raises(ConfigError, match="model is empty"):
            reg.register(" ", "1", artifact="d", hardware="T4", capacity=result(1.0))
        with pytest.raises(ConfigError, match=r"cannot read the artifact .*digest as text"):
            reg.register("m", "1", artifact=tmp_path / "nope", hardware="T4", capacity=result(1.0))
        with pytest.raises(ConfigError, match="digest is empty"):
            reg.register("m", "1", artifact="", hardware="T4", capacity=result(1.0))
        assert reg.models() == []


def test_a_capacity_result_comes_from_a_probe_summary() -> None:
    summary = {
        "capacity_rps": 88.0,
        "ci_low": 80.0,
        "ci_high": 95.0,
        "slo": "p99<50ms",
        "strategy": "binary",
        "run_id": 3,
        "steps": 9,
    }
    got = CapacityResult.from_probe(summary)
    assert (got.capacity_rps, got.ci_low, got.ci_high, got.run_id) == (88.0, 80.0, 95.0, 3)
    with pytest.raises(ConfigError, match="no capacity to register"):
        CapacityResult.from_probe(summary | {"capacity_rps": None})
