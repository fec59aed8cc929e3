"""Simulated inference servers in virtual time: the fake server's latency model run as a
discrete-event simulation, so a capacity search runs in seconds and asserts exact outcomes.

    records, state = simulate(load_sim_preset("vision").model, times)
    records, state = simulate_llm(llm.model, times, shapes_for(llm, len(times), seed=0))
"""

from ridgeline.sim.interference import Interference
from ridgeline.sim.llm import simulate_llm
from ridgeline.sim.presets import (
    SimPreset,
    load_sim_config,
    load_sim_preset,
    shapes_for,
    sim_preset_names,
    simulate_preset,
)
from ridgeline.sim.server import SimState, simulate

__all__ = [
    "Interference",
    "SimPreset",
    "SimState",
    "load_sim_config",
    "load_sim_preset",
    "shapes_for",
    "sim_preset_names",
    "simulate",
    "simulate_llm",
    "simulate_preset",
]
