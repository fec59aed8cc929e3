"""Shared fixtures: real servers on 127.0.0.1 (port 0), a throwaway run store."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import settings

from ridgeline.fakeserver import FakeServer
from ridgeline.synthetic.model import LatencyModel
from ridgeline.telemetry.store import RunStore

StartFake = Callable[..., Awaitable[FakeServer]]

# CI runs the examples a fixed seed draws: a red build is a bug found, not a new dice roll.
# Neither profile has a deadline: it is a wall-clock assertion, and these machines are
# shared (four allocator examples once took 276 ms beside a study, against 200 ms)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A child process left running when the suite ends fails the run here, at once: the
    interpreter's exit would otherwise wait on it (a leaked pool worker once held CI for an
    hour after the last test passed)."""
    left = multiprocessing.active_children()
    if not left:
        return
    for child in left:
        child.terminate()
    names = ", ".join(f"{c.name} (pid {c.pid})" for c in left)
    print(f"\nchild processes outlived the suite and were terminated: {names}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.sqlite") as s:
        yield s


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that fall back to the default store write into the test's tmp dir."""
    monkeypatch.setenv("RIDGELINE_DB", str(tmp_path / "default-runs.sqlite"))


@pytest.fixture
async def start_fake() -> AsyncIterator[StartFake]:
    """``await start_fake(model, **FakeServer options)``: a fake server on 127.0.0.1 in
    the test's event loop, stopped when the test ends."""
    servers: list[FakeServer] = []

    async def start(model: LatencyModel, **kwargs: Any) -> FakeServer:
        server = FakeServer(model, **kwargs)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    """A local Ray cluster for one test module (``ray.init(num_cpus=2)``, loopback only;
    skipped, and shut down, where this Ray binds its services beyond loopback):
    each module's tests share it (a start costs seconds), and it is shut down after them
    so that its processes do not take the CPU from the real-time tests after. Skipped
    where Ray is not installed (it is in the ``dev`` extra, so CI runs these)."""
    ray = pytest.importorskip("ray")
    from ridgeline._loopback import outside_loopback
    from ridgeline.export.ray_serve import private_ray_auth

    with private_ray_auth():  # its own token: the home folder's is neither read nor written
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
            configure_logging=False,
        )
        if exposed := outside_loopback():  # what the suite starts listens on loopback only
            ray.shutdown()
            shown = "; ".join(map(str, exposed[:3]))
            pytest.skip(f"this Ray listens beyond loopback ({shown} …): not started here")
        try:
            yield ray
        finally:
            ray.shutdown()
