"""GPU devices for a served plan, on a host that has none: a fake ``nvidia-smi`` lists
two A100s in MIG mode and a third with MIG off, a fake ``nvidia-cuda-mps-control``
records what it is asked. The plan's layout (``gpus``) decides which GPU's device each
instance gets; MPS clients get their device's daemon, started once per device and told
to quit when the server stops; a GPU with MIG off is dealt whole."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ridgeline.errors import PlanError
from ridgeline.pipeline.plan import Plan
from ridgeline.serve.loading import setup_plan
from ridgeline.serve.runtime import PlanServer

pytestmark = pytest.mark.timeout(120)

SMI = """#!/bin/sh
cat <<'EOF'
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)
  MIG 3g.40gb     Device  0: (UUID: MIG-0-3g)
  MIG 1g.10gb     Device  1: (UUID: MIG-0-1g-a)
  MIG 1g.10gb     Device  2: (UUID: MIG-0-1g-b)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb)
  MIG 1g.10gb     Device  0: (UUID: MIG-1-1g-a)
GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc)
EOF
"""

CONTROL = """#!/bin/sh
echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY $* $(cat 2>/dev/null | tr -d '\\n')" \
    >> "$MPS_LOG"
"""


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", SMI), ("nvidia-cuda-mps-control", CONTROL)):
        f = bin_dir / name
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "mps.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_LOG", str(log))
    return log


def plan(**tasks: dict[str, Any]) -> Plan:
    synthetic = {"base_ms": 1, "per_item_ms": 0, "noise_cv": 0, "max_batch_size": 1}
    return Plan.model_validate(
        {
            "name": "p",
            "slo_ms": 100,
            "tasks": {
                name: {"variant": "v", "synthetic": synthetic, "latency_budget_ms": 100, **t}
                for name, t in tasks.items()
            },
        }
    )


def mps(instances: int, gpus: list[int] | None = None) -> dict[str, Any]:
    segment = {"kind": "mps", "gpu": "A100-80GB", "profile": "1g.10gb", "share": 0.5}
    return {"segment": segment, "instances": instances, "gpus": gpus}


def test_the_layout_puts_each_instance_on_its_gpu_and_a_gpu_with_mig_off_is_whole(
    fake_gpus: Path, tmp_path: Path
) -> None:
    p = plan(
        a={
            "segment": {"kind": "mig", "gpu": "A100-80GB", "profile": "1g.10gb"},
            "instances": 2,
            "gpus": [1, 0],
        },
        w={"segment": {"kind": "gpu", "gpu": "A100-80GB"}, "instances": 1, "gpus": [2]},
    )
    setups = setup_plan(p, tmp_path)
    assert [s.cuda_visible_devices for s in setups["a"].placements] == ["MIG-1-1g-a", "MIG-0-1g-a"]
    assert [s.cuda_visible_devices for s in setups["w"].placements] == ["GPU-cccc"]


def test_a_layout_naming_a_gpu_without_such_a_device_says_how_to_fix_it(
    fake_gpus: Path, tmp_path: Path
) -> None:
    p = plan(
        a={
            "segment": {"kind": "mig", "gpu": "A100-80GB", "profile": "3g.40gb"},
            "instances": 1,
            "gpus": [1],
        }
    )
    with pytest.raises(PlanError, match=r"tasks\.a\.gpus: .* GPU 1, which has no unused device"):
        setup_plan(p, tmp_path)


async def test_mps_clients_share_their_devices_daemon_started_once_and_quit_at_stop(
    fake_gpus: Path, tmp_path: Path
) -> None:
    p = plan(a=mps(2, [0, 0]), b=mps(1, [1]))
    async with PlanServer(p, tmp_path, http_port=0, grpc_port=None) as server:
        envs = {n: [w.placement.env() for w in ws] for n, ws in server.workers.items()}
        started = fake_gpus.read_text().splitlines()
    assert sorted(line.split()[0] for line in started) == ["MIG-0-1g-a", "MIG-1-1g-a"]
    assert all(line.split()[2] == "-d" for line in started)
    pipes = {line.split()[0]: line.split()[1] for line in started}
    a0, a1 = envs["a"]
    assert a0["CUDA_VISIBLE_DEVICES"] == a1["CUDA_VISIBLE_DEVICES"]  # the layout: GPU 0 twice
    assert a0["CUDA_MPS_PIPE_DIRECTORY"] == pipes[a0["CUDA_VISIBLE_DEVICES"]]
    assert a0["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    (b0,) = envs["b"]
    assert b0["CUDA_MPS_PIPE_DIRECTORY"] == pipes["MIG-1-1g-a"]
    quits = [line for line in fake_gpus.read_text().splitlines() if line.endswith("quit")]
    assert sorted(q.split()[0] for q in quits) == ["MIG-0-1g-a", "MIG-1-1g-a"]
