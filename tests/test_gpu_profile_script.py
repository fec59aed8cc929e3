"""benchmarks/gpu_profile.py without a GPU: it says so and exits 0, and it only ever asks
nvidia-smi to list (a fake nvidia-smi on PATH records what it was asked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_profile.py"
LISTING = """\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 1g.10gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
"""


def run_script(path: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "rows.csv")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(60)
def test_without_nvidia_smi_it_says_so_and_exits_0(tmp_path: Path) -> None:
    done = run_script(str(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no GPU to profile: no nvidia-smi on PATH" in done.stdout
    assert not (tmp_path / "rows.csv").exists()


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(),
    reason="with onnxruntime-gpu the script would go on to measure",
)
def test_it_only_lists_what_the_gpus_have(tmp_path: Path) -> None:
    """A host whose nvidia-smi lists an A100 with two MIG instances, but whose onnxruntime
    has no CUDA: the script lists the devices, asks nothing else, and stops with why."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "listing.txt").write_text(LISTING)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/calls.txt\n'
        'case "$1" in\n'
        f"  -L) cat {tmp_path}/listing.txt ;;\n"
        "  --query-gpu=*) echo '0, NVIDIA A100-SXM4-80GB, 81920, Enabled' ;;\n"
        "  *) exit 9 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    done = run_script(f"{bin_dir}:/usr/bin:/bin", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no GPU to profile: onnxruntime has no CUDA execution provider" in done.stdout
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls and all(c == "-L" or c.startswith("--query-gpu=") for c in calls), calls
