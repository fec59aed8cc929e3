"""Shared fixtures: real servers on 127.0.0.1 (port 0), a throwaway run store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from ridgeline.telemetry.store import RunStore

# CI runs the examples a fixed seed draws: a red build is a bug found, not a new dice roll.
# Neither profile has a deadline: it is a wall-clock assertion, and these machines are
# shared (four allocator examples once took 276 ms beside a study, against 200 ms)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.sqlite") as s:
        yield s


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that fall back to the default store write into the test's tmp dir."""
    monkeypatch.setenv("RIDGELINE_DB", str(tmp_path / "default-runs.sqlite"))
