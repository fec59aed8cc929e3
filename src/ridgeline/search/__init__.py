"""Capacity search: strategies that propose steps and learn from their verdicts.

A strategy never runs load. The orchestrator asks it for a step (``propose``), runs
the step, and tells it the assessed verdict (``observe``) until ``propose`` returns
None; ``result`` is the estimate. Build one from a config (``strategy_from_config``)
or by name (``parse_strategy("adaptive", min_rate=5, max_rate=400)``).

Importing this package imports every strategy module, and each registers itself
(``search.base.register``): a new strategy is a config class in ``config.py`` and one
module with a registered class, imported here.
"""

from ridgeline.search._steps import AdaptiveState
from ridgeline.search.adaptive import AdaptiveStrategy
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict, Strategy
from ridgeline.search.binary import BinaryStrategy
from ridgeline.search.config import (
    STRATEGY_KINDS,
    AdaptiveConfig,
    BinaryConfig,
    SearchConfig,
    StabilityConfig,
    StrategyConfig,
    SweepConfig,
    parse_strategy,
    strategy_config,
    strategy_from_config,
)
from ridgeline.search.stability import StabilityStrategy
from ridgeline.search.sweep import SweepStrategy, sweep_grid

__all__ = [
    "STRATEGY_KINDS",
    "AdaptiveConfig",
    "AdaptiveState",
    "AdaptiveStrategy",
    "BinaryConfig",
    "BinaryStrategy",
    "CapacityEstimate",
    "SearchConfig",
    "StabilityConfig",
    "StabilityStrategy",
    "StepPlan",
    "StepVerdict",
    "Strategy",
    "StrategyConfig",
    "SweepConfig",
    "SweepStrategy",
    "parse_strategy",
    "strategy_config",
    "strategy_from_config",
    "sweep_grid",
]
