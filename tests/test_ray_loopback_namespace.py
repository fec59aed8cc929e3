"""The Ray tests where a local Ray listens beyond loopback (issue 33, fault 26): Ray 2.60
binds its services to every interface whatever it is told, so on such a host the
suite's local Ray is refused and the distributed-load and Ray Serve tests skip. Here they
run in a network namespace of their own whose only interface is loopback (``unshare
--net``, as root), where nothing they start can be reached from another machine, and
must pass there without a skip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ridgeline._loopback import loopback_only_namespace

HERE = Path(__file__).resolve().parent
RAY_TESTS = ("test_distributed_load.py", "test_export_ray_serve.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux's"),
]


def test_the_ray_tests_pass_in_a_loopback_only_network_namespace() -> None:
    pytest.importorskip("ray")
    if loopback_only_namespace():
        pytest.skip("already in a loopback-only namespace: the Ray tests run as they are")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a network namespace needs root and unshare(1)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    inside = [sys.executable, str(HERE / "_loopback_namespace.py")]
    pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    run = subprocess.run(
        [
            "unshare",
            "--net",
            *inside,
            sys.executable,
            *pytest_args,
            *(str(HERE / t) for t in RAY_TESTS),
        ],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
    )
    tail = run.stdout[-3000:] + run.stderr[-1000:]
    if run.returncode != 0 and "unshare failed" in run.stderr:
        pytest.skip(f"no network namespace here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, tail
    summary = run.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, tail
