"""Shared fixtures: real servers on 127.0.0.1 (port 0), a throwaway run store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ridgeline.telemetry.store import RunStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.sqlite") as s:
        yield s


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that fall back to the default store write into the test's tmp dir."""
    monkeypatch.setenv("RIDGELINE_DB", str(tmp_path / "default-runs.sqlite"))
