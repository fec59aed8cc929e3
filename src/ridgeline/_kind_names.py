"""The kinds the command line offers by name, declared where reading them loads nothing:
the help of ``--arrival`` and ``--strategy`` is made from them without importing the
classes they name (and numpy), so ``ridgeline --help`` stays fast.

Each registry (``workload.arrivals.ARRIVAL_KINDS``, ``search.config.STRATEGY_KINDS``) is
built from its classes and holds exactly these names (``tests/test_kind_registry.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

ARRIVAL_EXAMPLES: Mapping[str, str] = MappingProxyType(
    {
        "constant": "constant",
        "poisson": "poisson",
        "gamma": "gamma:cv=2",
        "ramp": "ramp:from=10,to=100",
        "steps": "steps:rates=10/20,step=5",
        "diurnal": "diurnal:amplitude=0.5,period=60",
    }
)
"""Each arrival kind, in the order of ``workload.arrivals.ArrivalSpec``, and a spec of it as
the command line writes it."""

STRATEGY_NAMES = ("adaptive", "binary", "sweep", "stability")
"""Each search strategy (``search.config.StrategyConfig``), in the order the help shows."""


def arrival_help() -> str:
    """Every arrival kind as the command line writes it: ``constant | poisson | gamma:cv=2
    | ...``."""
    return " | ".join(ARRIVAL_EXAMPLES.values())


def strategy_help() -> str:
    """Every search strategy's name: ``adaptive | binary | sweep | stability``."""
    return " | ".join(STRATEGY_NAMES)
