"""Shared fixtures: real servers on 127.0.0.1 (port 0), a throwaway run store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from ridgeline.telemetry.store import RunStore

# CI runs the examples a fixed seed draws: a red build is a bug found, not a new dice roll
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.sqlite") as s:
        yield s


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that fall back to the default store write into the test's tmp dir."""
    monkeypatch.setenv("RIDGELINE_DB", str(tmp_path / "default-runs.sqlite"))
