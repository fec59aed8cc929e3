"""The validation bank: simulated servers with a known behaviour, split into a dev half and a
held-out half, on two hardware profiles.

Each ``cases/*.yaml`` file names the case and what it stands for, and holds under
``server:`` a ``SimPreset`` mapping (optionally over ``preset: NAME``), exactly what
``ridgeline probe sim:FILE.yaml`` reads; its ``hardware`` sets the server's ``speed``.
Cases that share a ``pair`` are one server on hardware a and on hardware b, for
cross-hardware calibration::

    name: vision-stall-a
    class: vision            # recommendation | ranking | vision | nlp
    split: dev               # dev | heldout
    hardware: a              # a (speed 1.0) | b (speed 1.6)
    pair: vision-stall       # optional
    behaviour: an 80 ms stall every 7 s
    server: {preset: vision, model: {periodic_stall: {every_s: 7, duration_ms: 80}}}

``Case.traits`` names the behaviours a case has, read from its model rather than from its
description, so that the bank's coverage is checked against what the servers do.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ridgeline._yaml_config import parse_mapping, read_text, validate
from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.sim import SimPreset
from ridgeline.sim.presets import load_sim_mapping
from ridgeline.synthetic.model import capacity_rps
from ridgeline.workload.payloads import FixedSize

Klass = Literal["recommendation", "ranking", "vision", "nlp"]
Split = Literal["dev", "heldout"]
Hardware = Literal["a", "b"]

CLASSES: tuple[Klass, ...] = ("recommendation", "ranking", "vision", "nlp")
SPLITS: tuple[Split, ...] = ("dev", "heldout")
HARDWARE_SPEED: dict[str, float] = {"a": 1.0, "b": 1.6}
"""Each hardware profile's speed factor: service times are divided by it."""

SMALL_DELAY_S = 0.01
LARGE_DELAY_S = 0.05
HEAVY_TAIL_CV = 0.5
LOW_RATE_RPS = 6.0
"""Nominal capacity below which a case is a low-rate server (its SLO capacity under 5)."""

TRAITS = (
    "batching-small-delay",
    "batching-large-delay",
    "heavy-tail",
    "periodic-stall",
    "warmup-by-time",
    "warmup-by-work",
    "interference",
    "low-rate",
    "errors",
    "variable-sizes",
)


class _Header(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9\-]*$")
    klass: Klass = Field(alias="class", description="the architecture class it stands for")
    split: Split = Field(description="dev: calibrate on it; heldout: judge on it")
    hardware: Hardware = Field(description="a (speed 1.0) or b (speed 1.6)")
    pair: str | None = Field(None, description="the same server on the other hardware")
    behaviour: str = Field(min_length=1, description="what it does, in a few words")


class Case(BaseModel):
    """One simulated server of the bank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    klass: Klass
    split: Split
    hardware: Hardware
    pair: str | None
    behaviour: str
    preset: SimPreset
    """The server as ``ridgeline probe sim:FILE.yaml`` reads it (``speed`` set)."""

    @property
    def nominal_rps(self) -> float:
        """One-row requests per second under saturation, warm, at this hardware's speed
        (no interference): an upper bound on the capacity."""
        return capacity_rps(self.preset.model) * self.preset.speed

    @property
    def traits(self) -> frozenset[str]:
        m = self.preset.model
        delay = m.batching.max_queue_delay_s
        batches = m.batching.max_batch_size > 1
        w = m.warmup
        found = {
            "batching-small-delay": batches and 0.0 < delay <= SMALL_DELAY_S,
            "batching-large-delay": batches and delay >= LARGE_DELAY_S,
            "heavy-tail": m.noise_cv >= HEAVY_TAIL_CV,
            "periodic-stall": m.periodic_stall is not None,
            "warmup-by-time": w is not None and w.seconds is not None,
            "warmup-by-work": w is not None and w.requests is not None,
            "interference": self.preset.interference is not None,
            "low-rate": self.nominal_rps < LOW_RATE_RPS,
            "errors": m.error_rate > 0.0 or (m.max_queue is not None and m.max_queue < 100),
            "variable-sizes": not isinstance(self.preset.sizes, FixedSize),
        }
        return frozenset(k for k, v in found.items() if v)

    def sim_yaml(self) -> str:
        """The server as a plain ``sim:FILE.yaml`` file (no bank fields, speed set)."""
        return yaml.safe_dump(self.preset.model_dump(mode="json"), sort_keys=False)

    def write_sim_file(self, directory: Path) -> Path:
        """``directory/NAME.yaml``: what ``ridgeline probe sim:PATH`` probes."""
        path = directory / f"{self.name}.yaml"
        path.write_text(f"# {self.name}: {self.behaviour}\n{self.sim_yaml()}", encoding="utf-8")
        return path


def load_case(path: str | Path) -> Case:
    """One bank file: its header validated, its server layered over its preset."""
    p = Path(path)
    mapping = parse_mapping(
        read_text(p, "bank case"), str(p), "a bank case (name, class, split, ..., server)"
    )
    server = mapping.pop("server", None)
    if not isinstance(server, dict):
        raise ConfigError(f"{p}: a bank case needs `server:`, a mapping of SimPreset fields")
    head = validate(_Header, mapping, str(p), "bank case")
    speed = HARDWARE_SPEED[head.hardware]
    if "speed" in server and server["speed"] != speed:
        raise ConfigError(
            f"{p}: speed {server['speed']} contradicts hardware {head.hardware!r} "
            f"(speed {speed}); drop `speed`, the hardware sets it"
        )
    preset = load_sim_mapping({**server, "speed": speed}, f"{p} server")
    return Case(preset=preset, **head.model_dump(exclude={"klass"}), klass=head.klass)


def bank_dir() -> Path:
    """The shipped bank's directory."""
    return Path(str(resources.files("ridgeline.study").joinpath("cases")))


def load_bank(directory: str | Path | None = None) -> list[Case]:
    """Every case of the bank (the shipped one by default), sorted by split then name;
    ConfigError if two share a name or a pair is not one server on a and b."""
    root = Path(directory) if directory is not None else bank_dir()
    cases = [load_case(p) for p in sorted(root.glob("*.yaml"))]
    if not cases:
        raise ConfigError(f"no bank cases (*.yaml) in {root}")
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ConfigError(f"bank {root}: case names repeat: {sorted(names)}")
    for pair, (a, b) in pairs(cases).items():
        if a.hardware != "a" or b.hardware != "b" or a.split != b.split:
            raise ConfigError(
                f"bank pair {pair!r}: needs one case on hardware a and one on b, in one split"
            )
        if a.preset.model_copy(update={"speed": b.preset.speed}) != b.preset:
            raise ConfigError(f"bank pair {pair!r}: {a.name} and {b.name} differ beyond speed")
    return sorted(cases, key=lambda c: (SPLITS.index(c.split), c.name))


def pairs(cases: list[Case]) -> dict[str, tuple[Case, Case]]:
    """Paired cases by pair name: (hardware a, hardware b)."""
    grouped: dict[str, list[Case]] = {}
    for c in cases:
        if c.pair is not None:
            grouped.setdefault(c.pair, []).append(c)
    out: dict[str, tuple[Case, Case]] = {}
    for name, members in grouped.items():
        if len(members) != 2:
            raise ConfigError(f"bank pair {name!r} has {len(members)} cases; a pair has 2")
        a, b = sorted(members, key=lambda c: c.hardware)
        out[name] = (a, b)
    return out


def select(cases: list[Case], names: list[str]) -> list[Case]:
    """The cases named, in the bank's order; UnknownKindError for a name it lacks."""
    known = {c.name for c in cases}
    for n in names:
        if n not in known:
            raise UnknownKindError("bank case", n, sorted(known))
    return [c for c in cases if c.name in names]


def stall_fraction(case: Case) -> float:
    """The fraction of time the server is stalled."""
    s = case.preset.model.periodic_stall
    return 0.0 if s is None else s.duration_ms / 1000.0 / s.every_s


def interference_load(case: Case) -> float:
    """Extra service time averaged over the neighbour's cycle (amount × duty)."""
    i = case.preset.interference
    return 0.0 if i is None else i.amount * i.duty
