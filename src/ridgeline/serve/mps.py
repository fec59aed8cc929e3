"""MPS control daemons for a plan's MPS segments: one per GPU device its clients share.

A task on an MPS segment (``1g.10gb@0.5``) runs as an MPS client of one MIG device:
CUDA's Multi-Process Service lets several processes share that device's SMs, each held
to ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` of them. On a MIG GPU each MIG device needs its
own MPS control daemon, started with that device visible, and its clients must reach it
through the same pipe directory. ``MpsDaemons.start`` starts ``nvidia-cuda-mps-control
-d`` once per device the placements name, each with ``CUDA_VISIBLE_DEVICES`` = the
device and its own ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` under a
temporary directory, and gives each client placement that pipe directory;
``stop`` sends each daemon ``quit``. Nothing here runs without an MPS segment in the
plan, and it needs a GPU: without ``nvidia-cuda-mps-control`` on the PATH it says so.
It never changes the GPU's MIG layout or compute mode.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ridgeline.errors import PlanError
from ridgeline.serve.affinity import Placement

CONTROL = "nvidia-cuda-mps-control"


class MpsDaemons:
    """The control daemons a plan's MPS clients need; ``stop`` ends them."""

    def __init__(self, pipes: Mapping[str, Path], root: Path | None) -> None:
        self.pipes = dict(pipes)
        """Per device (a MIG or GPU UUID): its daemon's pipe directory."""
        self._root = root

    @classmethod
    def start(
        cls, placements: Mapping[str, Sequence[Placement]]
    ) -> tuple[MpsDaemons, dict[str, tuple[Placement, ...]]]:
        """Daemons for every device an MPS client is placed on, and the placements with
        each client's pipe directory set (others unchanged)."""
        devices = sorted(
            {
                p.cuda_visible_devices
                for ps in placements.values()
                for p in ps
                if p.mps_thread_percentage is not None and p.cuda_visible_devices is not None
            }
        )
        if not devices:
            return cls({}, None), {t: tuple(ps) for t, ps in placements.items()}
        control = shutil.which(CONTROL)
        if control is None:
            raise PlanError(
                f"the plan has MPS segments, which need the MPS control daemon: {CONTROL} is "
                "not on the PATH (it comes with the NVIDIA driver); install it, or plan "
                "without MPS shares"
            )
        root = Path(tempfile.mkdtemp(prefix="ridgeline-mps-"))
        pipes: dict[str, Path] = {}
        daemons = cls(pipes, root)
        try:
            for k, device in enumerate(devices):
                pipe, log = root / f"pipe{k}", root / f"log{k}"
                pipe.mkdir()
                log.mkdir()
                env = {
                    **os.environ,
                    "CUDA_VISIBLE_DEVICES": device,
                    "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                    "CUDA_MPS_LOG_DIRECTORY": str(log),
                }
                done = subprocess.run(
                    [control, "-d"], env=env, capture_output=True, text=True, timeout=30
                )
                if done.returncode != 0:
                    raise PlanError(
                        f"{CONTROL} -d for device {device} failed ({done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()}; is the GPU's compute mode "
                        "EXCLUSIVE_PROCESS or DEFAULT, and is no other daemon running?"
                    )
                pipes[device] = pipe
                daemons.pipes = dict(pipes)
        except BaseException:
            daemons.stop()
            raise
        placed = {
            t: tuple(
                p.model_copy(update={"mps_pipe_directory": str(pipes[p.cuda_visible_devices])})
                if p.mps_thread_percentage is not None and p.cuda_visible_devices in pipes
                else p
                for p in ps
            )
            for t, ps in placements.items()
        }
        return daemons, placed

    def stop(self) -> None:
        """Send each daemon ``quit`` (its clients have stopped), then tidy up."""
        control = shutil.which(CONTROL)
        for device, pipe in self.pipes.items():
            if control is None:
                break
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
            # a daemon already gone or stuck: its pipe directory goes below all the same
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    [control], input="quit\n", env=env, capture_output=True, text=True, timeout=30
                )
        self.pipes = {}
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
