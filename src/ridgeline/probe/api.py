"""``ridgeline probe`` as a library call: pick the driver from the target, run the probe
on an event loop with Ctrl-C or SIGTERM turned into a clean, stored stop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ridgeline.aio import run_coroutine, stopping_on_signal
from ridgeline.loadgen.step import StepConfig
from ridgeline.probe.drivers import Driver, NetworkDriver, SimDriver, check_trace_scale
from ridgeline.probe.orchestrator import ProbeConfig, ProbeResult, ProgressFn, StartFn, probe
from ridgeline.sim import load_sim_config, load_sim_preset
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.gpu import GpuMonitor
from ridgeline.telemetry.store import RunStore
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.llm import LlmWorkload
from ridgeline.workload.traces import Trace, read_trace


def make_driver(
    target: str,
    *,
    step: StepConfig | None = None,
    arrival: str = "poisson",
    trace: str | Path | None = None,
    target_options: TargetOptions | None = None,
    workload: LlmWorkload | None = None,
    trace_scale: str = "overlay",
) -> Driver:
    """``sim:PRESET`` or ``sim:FILE.yaml`` → a simulated server (virtual time);
    anything else → the endpoint at that URL (real time). ``workload`` sets every step's
    prompts and output lengths; ``trace_scale`` (``overlay`` or ``speed``) how a
    ``trace`` is brought to each step's rate (``drivers.step_schedule``)."""
    scale = check_trace_scale(trace_scale)
    tr: Trace | None = read_trace(trace) if trace is not None else None
    if tr is None:
        parse_arrival(arrival, 1.0)  # a bad spec now, not in the first step it shapes
    if target.startswith("sim:"):
        name = target.removeprefix("sim:")
        preset = (
            load_sim_config(Path(name))
            if name.endswith((".yaml", ".yml"))
            else (load_sim_preset(name))
        )
        return SimDriver(
            preset,
            label=name,
            arrival=arrival,
            trace=tr,
            trace_scale=scale,
            window_s=(step or StepConfig()).window_s,
            workload=workload,
        )
    return NetworkDriver(
        target,
        step or StepConfig(),
        arrival,
        target_options or TargetOptions(),
        trace=tr,
        trace_scale=scale,
        workload=workload,
    )


def default_slo(target: str) -> str | None:
    """A simulated server (a preset, or a file over one) carries its own SLO; None for
    real targets."""
    if not target.startswith("sim:"):
        return None
    name = target.removeprefix("sim:")
    if name.endswith((".yaml", ".yml")):
        return load_sim_config(Path(name)).slo
    return load_sim_preset(name).slo


def run_probe(
    driver: Driver,
    cfg: ProbeConfig,
    *,
    store: RunStore | None = None,
    on_step: ProgressFn | None = None,
    gpu: GpuMonitor | None = None,
    on_start: StartFn | None = None,
) -> ProbeResult:
    hooks: dict[str, Any] = {"on_step": on_step, "on_start": on_start}

    async def main() -> ProbeResult:
        stop, got = asyncio.Event(), list[int]()
        with stopping_on_signal(stop, got):
            return await probe(driver, cfg, store=store, stop=stop, gpu=gpu, signals=got, **hooks)

    return run_coroutine(main())
