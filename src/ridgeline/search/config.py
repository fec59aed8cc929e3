"""Search strategy configs: one frozen pydantic model per kind, selected by ``kind``.

``{kind: adaptive, min_rate: 5, max_rate: 400}`` from YAML and ``parse_strategy("adaptive",
min_rate=5, max_rate=400)`` from code or the command line validate into the same
``AdaptiveConfig``; ``strategy_from_config`` builds the strategy registered under its
kind (``search.base.register``); this module imports no strategy.

==========  =========================================  ====================================
kind        fields beyond the common ones              what it does
==========  =========================================  ====================================
sweep       rates                                      every grid rate, ascending, until one
                                                       fails
binary      —                                          double until a step fails, bisect
stability   rate, duration_s                           one long step at one rate
adaptive    max_growth, explore_duration_s,            steps sized by the score, secant near
            explore_score, damping_distance,           the boundary, then a long confirmation
            estimate_window, cv_threshold,             (the Vanguard method)
            trust_tolerance, spike_score,
            boundary_requests, confirm_factor,
            confirm_requests, confirm_margin
==========  =========================================  ====================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ridgeline._fields import Seconds, StepRate
from ridgeline._registry import Registry
from ridgeline._yaml_config import own_errors
from ridgeline.errors import ConfigError
from ridgeline.search._driver import Budget
from ridgeline.search.base import Strategy, create
from ridgeline.search.confirmation import DEFAULT_MARGIN, ConfirmMargin


class SearchConfig(BaseModel):
    """The fields every strategy has."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min_rate_from: ClassVar[str | None] = None
    """A field (a rate or list of rates) whose lowest value is ``min_rate`` by default."""

    min_rate: StepRate = Field(description="lowest rate to try, requests/s")
    max_rate: StepRate | None = Field(None, description="highest rate to try; None: no ceiling")
    start_rate: StepRate = Field(
        default_factory=lambda data: data.get("min_rate"),
        description="first rate tried, requests/s (default min_rate)",
    )
    step_duration_s: Seconds = Field(10.0, description="length of one step, s")
    precision: float = Field(
        0.02, gt=0, le=0.5, description="relative width (hi − lo)/lo of the final bracket"
    )
    max_steps: int = Field(60, ge=1, le=100_000, description="steps at most (re-runs count)")
    max_test_seconds: Seconds | None = Field(
        None, description="seconds of load at most, over all steps; None: no limit"
    )
    decisive_requests: int = Field(
        0,
        ge=0,
        description="a step that places the boundary (inside a bracket, or predicted near "
        "it) lasts long enough for this many requests: fewer cannot show a percentile held "
        "(the probe sets it from the SLO: 299 for a p99 at 95 %); 0: step_duration_s alone",
    )

    def placing_s(self, rate: float) -> float:
        """The length of a step at ``rate`` that places the boundary."""
        return max(self.step_duration_s, self.decisive_requests / rate)

    def budget(self) -> Budget:
        """What ends the search unconverged: ``max_steps``, ``max_test_seconds``."""
        return Budget(self.max_steps, self.max_test_seconds)

    @model_validator(mode="before")
    @classmethod
    def _default_min_rate(cls, data: Any) -> Any:
        return data if cls.min_rate_from is None else _fill_min_rate(data, cls.min_rate_from)

    @model_validator(mode="after")
    def _rates_in_order(self) -> Self:
        if self.max_rate is not None and self.max_rate < self.min_rate:
            raise ValueError(
                f"max_rate {self.max_rate:g} is below min_rate {self.min_rate:g}; "
                "raise max_rate or lower min_rate"
            )
        if self.start_rate < self.min_rate:
            raise ValueError(
                f"start_rate {self.start_rate:g} is below min_rate {self.min_rate:g}; "
                "raise start_rate or lower min_rate"
            )
        if self.max_rate is not None and self.start_rate > self.max_rate:
            raise ValueError(
                f"start_rate {self.start_rate:g} is above max_rate {self.max_rate:g}; "
                "lower start_rate or raise max_rate"
            )
        return self


def _fill_min_rate(data: Any, source: str) -> Any:
    """Let ``min_rate`` default to the lowest of ``source`` (a rate or list of rates)."""
    if isinstance(data, Mapping) and "min_rate" not in data and data.get(source) is not None:
        given = data[source]
        rates = given if isinstance(given, list | tuple) else [given]
        if rates and all(isinstance(r, int | float) for r in rates):
            return {**data, "min_rate": min(rates)}
    return data


class SweepConfig(SearchConfig):
    """Every rate of a grid, ascending, until the first unsustainable one."""

    kind: Literal["sweep"] = "sweep"
    min_rate_from: ClassVar[str | None] = "rates"
    rates: tuple[StepRate, ...] | None = Field(
        None,
        min_length=1,
        description="explicit grid (sorted for you); None: geometric from min_rate to "
        "max_rate with ratio 1 + precision",
    )

    @model_validator(mode="after")
    def _grid_defined(self) -> Self:
        if self.rates is None and self.max_rate is None:
            raise ValueError("a sweep needs max_rate (for a geometric grid) or explicit rates")
        outside = [
            r
            for r in self.rates or ()
            if r < self.min_rate or (self.max_rate is not None and r > self.max_rate)
        ]
        if outside:
            raise ValueError(
                f"sweep rates {outside} lie outside [min_rate, max_rate]; "
                "remove them or widen the range"
            )
        if self.rates is not None and self.start_rate > max(self.rates):
            raise ValueError(
                f"start_rate {self.start_rate:g} is above every sweep rate; "
                "lower start_rate or add higher rates"
            )
        return self


class BinaryConfig(SearchConfig):
    """Double from start_rate until a step fails (or max_rate), then bisect to precision."""

    kind: Literal["binary"] = "binary"


class StabilityConfig(SearchConfig):
    """One long constant-rate step: does ``rate`` hold?"""

    kind: Literal["stability"] = "stability"
    min_rate_from: ClassVar[str | None] = "rate"
    rate: StepRate = Field(
        default_factory=lambda data: data.get("start_rate"),
        description="the rate to hold, requests/s (default start_rate)",
    )
    duration_s: Seconds = Field(
        default_factory=lambda data: 5 * data.get("step_duration_s", 10.0),
        description="length of the one step, s (default 5 × step_duration_s)",
    )

    @model_validator(mode="after")
    def _rate_in_range(self) -> Self:
        if self.rate < self.min_rate or (self.max_rate is not None and self.rate > self.max_rate):
            raise ValueError(
                f"rate {self.rate:g} lies outside [min_rate, max_rate]; "
                "change the rate or widen the range"
            )
        return self


class AdaptiveConfig(SearchConfig):
    """The Vanguard method: step sizes from the score, secant near the boundary."""

    kind: Literal["adaptive"] = "adaptive"
    max_growth: float = Field(
        2.0, gt=1, le=4, description="largest factor between consecutive rates (×/÷)"
    )
    explore_duration_s: Seconds = Field(
        default_factory=lambda data: data.get("step_duration_s", 10.0) / 2,
        description="length of a step predicted far from the boundary (default half a step)",
    )
    explore_score: float = Field(
        0.75,
        gt=0,
        lt=1,
        description="a step is far when its predicted score is ≤ this or ≥ its inverse",
    )
    damping_distance: float = Field(
        0.5,
        gt=0,
        description="steps shrink in proportion when |1 − score| is below this",
    )
    estimate_window: int = Field(
        3, ge=2, le=20, description="boundary estimates whose spread decides convergence"
    )
    cv_threshold: float = Field(
        0.01, gt=0, lt=1, description="converged when those estimates' CV is below this"
    )
    trust_tolerance: float = Field(
        0.05,
        ge=0,
        description="the confirmation may go above the bracket's low end only when the "
        "model predicted the last step's score within this (relative)",
    )
    spike_score: float = Field(
        1.2,
        gt=1,
        description="a failure scoring below this that contradicts a sustained rate at or "
        "above it is re-tested once",
    )
    confirm_factor: float = Field(
        3.0, ge=1, le=100, description="the confirmation step lasts this × step_duration_s"
    )
    confirm_requests: int = Field(
        0,
        ge=0,
        description="the confirmation lasts long enough for this many requests (the p99 "
        "tail needs samples: 10,000 leave 100 beyond it); 0: confirm_factor alone",
    )
    boundary_requests: int = Field(
        3000,
        ge=0,
        description="a step near the boundary lasts long enough for this many requests: "
        "a p99 from a few hundred requests rests on a handful of samples and runs "
        "optimistic on a heavy-tailed server (3,000 leave 30 beyond the p99)",
    )
    confirm_margin: ConfirmMargin = DEFAULT_MARGIN

    @model_validator(mode="after")
    def _explore_not_longer(self) -> Self:
        if self.explore_duration_s > self.step_duration_s:
            raise ValueError(
                f"explore_duration_s {self.explore_duration_s:g} exceeds step_duration_s "
                f"{self.step_duration_s:g}; shorten it (set it equal to turn exploring off)"
            )
        return self


StrategyConfig = Annotated[
    SweepConfig | BinaryConfig | StabilityConfig | AdaptiveConfig,
    Field(discriminator="kind"),
]
"""Any strategy config; its ``kind`` field selects the class. The one declaration of the
strategy kinds: ``STRATEGY_KINDS`` (errors, help) is read from it."""

STRATEGY_KINDS: Registry[type[SearchConfig]] = Registry.of_union("search strategy", StrategyConfig)
"""Each config class by its kind, from the union above."""

_ADAPTER: TypeAdapter[StrategyConfig] = TypeAdapter(StrategyConfig)


def strategy_from_config(cfg: StrategyConfig) -> Strategy:
    """A fresh strategy for ``cfg``: the one registered under its ``kind``."""
    return create(cfg)


def strategy_config(name: str, **fields: Any) -> StrategyConfig:
    """Validate ``fields`` as the config of strategy ``name``; errors name the field."""
    STRATEGY_KINDS.get(name)  # an unknown name lists the valid ones
    try:
        return _ADAPTER.validate_python({**fields, "kind": name})
    except ValidationError as exc:
        errors = own_errors(exc)
        at_fault = {str(e["loc"][1]) for e in errors if len(e["loc"]) > 1}
        raise ConfigError(
            "; ".join(_describe(name, e) for e in errors),
            field=at_fault.pop() if len(at_fault) == 1 else None,
        ) from None


def parse_strategy(name: str, **fields: Any) -> Strategy:
    """The strategy ``name`` with ``fields``: ``parse_strategy("binary", min_rate=5)``."""
    return strategy_from_config(strategy_config(name, **fields))


def _describe(kind: str, error: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence naming the field and what is valid."""
    cls = STRATEGY_KINDS.get(kind)
    loc = [str(part) for part in error["loc"][1:]]
    field = loc[0] if loc else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        valid = ", ".join(name for name in cls.model_fields if name != "kind")
        return f"search strategy {kind!r} has no field {field!r}; valid fields are: {valid}"
    if error["type"] == "missing":
        return f"search strategy {kind!r} needs {field!r} ({cls.model_fields[field].description})"
    if not field:
        return f"search strategy {kind!r}: {message}"
    return f"search strategy {kind!r} field {field!r}: {message}, got {error['input']!r}"
