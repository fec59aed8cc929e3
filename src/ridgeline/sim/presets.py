"""Simulated servers by architecture class: the shipped presets, or a YAML file of the user's.

A preset is a latency model plus what a simulated search needs besides: the sizes of the
requests it serves, a default SLO, a hardware speed factor and optional interference. A
file holds ``SimPreset`` fields; it may also name ``preset: NAME`` to start from a shipped
preset and override some fields (nested mappings such as ``model.batching`` are merged key
by key).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ridgeline._yaml_config import Presets
from ridgeline.sim.interference import Interference
from ridgeline.sim.llm import simulate_llm
from ridgeline.sim.server import SimState, simulate
from ridgeline.synthetic.model import LatencyModel
from ridgeline.telemetry.records import Records
from ridgeline.workload.payloads import (
    FixedSize,
    LognormalSize,
    RequestShape,
    SizeSpec,
    UniformSize,
    sampled_shapes,
)


def _one_row() -> FixedSize:
    return FixedSize(value=1)


class SimPreset(BaseModel):
    """A simulated server: its latency model and the workload and SLO that go with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = Field(min_length=1, description="what it stands for, in a few words")
    model: LatencyModel = Field(description="the server's latency model")
    sizes: SizeSpec = Field(
        default_factory=_one_row,
        description="rows per request: an integer or a size spec ({kind: lognormal, ...})",
    )
    slo: str = Field(
        "p99<100ms,errors<0.1%", min_length=1, description="the default SLO of a search"
    )
    speed: float = Field(
        1.0, gt=0.0, allow_inf_nan=False, description="hardware speed factor: service ÷ speed"
    )
    interference: Interference | None = Field(None, description="a co-located tenant")
    prompt_tokens: SizeSpec | None = Field(
        None, description="LLM servers: prompt tokens per request (an integer or a size spec)"
    )
    output_tokens: SizeSpec | None = Field(
        None, description="LLM servers: output tokens asked per request (max_tokens)"
    )

    @field_validator("sizes", "prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _constant(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"kind": "fixed", "value": value}
        return value

    @model_validator(mode="after")
    def _sizes_fit_a_batch(self) -> SimPreset:
        biggest = self.model.batching.max_batch_size
        top = _largest(self.sizes)
        if self.sizes.smallest() < 1 or top is None or top > biggest:
            raise ValueError(
                f"sizes {self.sizes!r} allow requests outside 1..{biggest} rows "
                "(max_batch_size); set low ≥ 1 and high ≤ max_batch_size"
            )
        return self

    @model_validator(mode="after")
    def _tokens_for_an_llm(self) -> SimPreset:
        llm = self.model.llm is not None
        given = [f for f in ("prompt_tokens", "output_tokens") if getattr(self, f) is not None]
        if llm and len(given) < 2:
            raise ValueError(
                "an LLM server (model.llm set) needs prompt_tokens and output_tokens, "
                "e.g. `prompt_tokens: 128` and `output_tokens: 64`"
            )
        if not llm and given:
            raise ValueError(f"{' and '.join(given)} apply to LLM servers only; set model.llm")
        if llm and self.output_tokens is not None and self.output_tokens.smallest() < 1:
            raise ValueError(f"output_tokens {self.output_tokens!r} must be ≥ 1")
        return self


def _largest(spec: FixedSize | UniformSize | LognormalSize) -> int | None:
    if isinstance(spec, FixedSize):
        return spec.value
    return spec.high


def shapes_for(preset: SimPreset, n: int, seed: int) -> list[RequestShape] | None:
    """Shapes of ``n`` requests drawn from the preset's sizes (an LLM server's: its prompt
    and output tokens); None when every request is one row (the simulator's fast
    default)."""
    if preset.prompt_tokens is not None and preset.output_tokens is not None:
        return sampled_shapes(
            n, seed, prompt_tokens=preset.prompt_tokens, output_tokens=preset.output_tokens
        )
    if isinstance(preset.sizes, FixedSize) and preset.sizes.value == 1:
        return None
    return sampled_shapes(n, seed, items=preset.sizes)


def simulate_preset(
    preset: SimPreset,
    times: NDArray[np.float64],
    shapes: Sequence[RequestShape] | None,
    *,
    state: SimState | None = None,
    seed: int = 0,
    timeout_s: float = 30.0,
    span_s: float | None = None,
) -> tuple[Records, SimState]:
    """Serve requests arriving at ``times`` on the preset's server, as fast as its
    ``speed`` and beside its ``interference``: ``simulate``, or ``simulate_llm`` for an
    LLM preset (whose requests always have shapes)."""
    kw: dict[str, Any] = {
        "state": state,
        "seed": seed,
        "timeout_s": timeout_s,
        "speed": preset.speed,
        "interference": preset.interference,
        "span_s": span_s,
    }
    if preset.model.llm is None:
        return simulate(preset.model, times, shapes, **kw)
    if shapes is None:
        raise ValueError("an LLM preset's requests need shapes (shapes_for gives them)")
    return simulate_llm(preset.model, times, shapes, **kw)


_PRESETS = Presets(
    "ridgeline.sim",
    SimPreset,
    "simulated server preset",
    "simulated server config",
    "SimPreset fields (description, model, sizes, slo, speed, interference, prompt_tokens, "
    "output_tokens)",
)


sim_preset_names = _PRESETS.names
"""Names of the shipped presets, sorted."""
load_sim_preset = _PRESETS.load
"""The shipped preset ``name``; UnknownKindError (listing the presets) if none."""
load_sim_config = _PRESETS.load_file
"""A simulated server from a YAML file, optionally layered over ``preset: NAME``."""
load_sim_mapping = _PRESETS.load_mapping
"""A simulated server from a mapping (a part of a larger file, named by ``where``),
optionally layered over ``preset: NAME``."""
