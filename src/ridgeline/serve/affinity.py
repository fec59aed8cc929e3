"""Where a worker runs: its CPU cores and threads, and the GPU (or GPU share) it sees.

A ``Placement`` is applied in the worker's own process before its backend loads
(``apply_placement``): OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES (a GPU index or a MIG
device UUID) and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE go into its environment, and its CPU
affinity is set to ``cores`` and read back, so a core that does not exist is an error
rather than silently dropped by the kernel.
"""

from __future__ import annotations

import contextlib
import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ridgeline.errors import PlacementError


class Placement(BaseModel):
    """Where a worker runs: its CPU cores and threads, and the GPU (share) it sees."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cores: tuple[Annotated[int, Field(ge=0)], ...] | None = Field(
        None, min_length=1, description="CPU cores the process may run on (None: any)"
    )
    threads: int = Field(1, ge=1, le=1024, description="intra-op threads; also OMP_NUM_THREADS")
    cuda_visible_devices: str | None = Field(
        None, min_length=1, description="the GPU it sees: an index ('0') or a MIG UUID ('MIG-…')"
    )
    mps_thread_percentage: int | None = Field(
        None, ge=1, le=100, description="its share of the GPU's SMs under MPS, percent"
    )
    mps_pipe_directory: str | None = Field(
        None, description="the pipe directory of its device's MPS control daemon"
    )

    @field_validator("cores")
    @classmethod
    def _distinct(cls, cores: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if cores is not None and len(set(cores)) < len(cores):
            raise ValueError(f"cores {list(cores)} repeat a core; list each core once")
        return cores

    def env(self) -> dict[str, str]:
        """The environment variables the worker's process gets."""
        env = {"OMP_NUM_THREADS": str(self.threads)}
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        if self.mps_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.mps_thread_percentage)
        if self.mps_pipe_directory is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.mps_pipe_directory
        return env


def apply_placement(placement: Placement) -> None:
    """Place the current process: its environment, then its CPU affinity (checked)."""
    os.environ.update(placement.env())
    if placement.cores is None:
        return
    wanted = set(placement.cores)
    if not hasattr(os, "sched_setaffinity"):
        raise PlacementError("pinning a worker to cores needs Linux; leave cores unset here")
    allowed = sorted(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):  # EINVAL when no wanted core exists: caught below
        os.sched_setaffinity(0, wanted)
    missing = sorted(wanted - os.sched_getaffinity(0))
    if missing:
        raise PlacementError(
            f"cannot pin worker to cores {sorted(wanted)}: cores {missing} do not exist or are "
            f"not available to this process, which may use cores {allowed}; pick from those"
        )
