"""Arrival processes: when each request is sent, all decided before the run.

An arrival spec is a small frozen pydantic model whose ``kind`` selects the class, so
``{kind: poisson, rate: 20}`` from YAML (``arrival_from_dict``) and ``poisson`` with
``--rate 20`` on the command line (``parse_arrival``) validate into the same
``PoissonArrivals``. Every spec meets ``ArrivalProcess``: ``schedule(duration_s, seed)``
returns all send offsets of the run, sorted, in ``[0, duration_s)``; the same seed gives
the same schedule.

===========  ==========================================  =============================
kind         parameters (CLI names in brackets)          process
===========  ==========================================  =============================
constant     rate                                        evenly spaced, first at 0
poisson      rate                                        exponential gaps
gamma        rate, cv                                    gamma gaps, gap CV = cv
ramp         start_rate [from], end_rate [to], poisson   linear rate over the run
steps        rates [10/20/40], step_s [step], poisson    piecewise constant, holds last
diurnal      rate, amplitude, period_s [period],         rate·(1 + A·sin(2π(t+φ)/P))
             phase_s [phase], poisson
===========  ==========================================  =============================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Protocol

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError

from ridgeline._registry import Registry
from ridgeline.errors import ConfigError
from ridgeline.workload._unit import Floats
from ridgeline.workload.stationary import (
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
    SpecModel,
)
from ridgeline.workload.varying import DiurnalArrivals, RampArrivals, StepArrivals


class ArrivalProcess(Protocol):
    """Anything that lays out a run's send offsets before it starts."""

    def schedule(self, duration_s: float, seed: int = 0) -> Floats:
        """Sorted float64 offsets in seconds, all in ``[0, duration_s)``."""
        ...

    def mean_rate(self, duration_s: float) -> float:
        """Expected arrivals per second over ``[0, duration_s)``."""
        ...


ArrivalSpec = Annotated[
    ConstantArrivals
    | PoissonArrivals
    | GammaArrivals
    | RampArrivals
    | StepArrivals
    | DiurnalArrivals,
    Field(discriminator="kind"),
]
"""Any arrival spec; its ``kind`` field selects the class. The one declaration of the
arrival kinds: ``ARRIVAL_KINDS`` is read from it, and holds the names whose examples
``ridgeline._kind_names`` gives the command line's help (``arrival_help``)."""

ARRIVAL_KINDS: Registry[type[SpecModel]] = Registry.of_union("arrival kind", ArrivalSpec)
"""Each spec class by its kind, from the union above."""

_ADAPTER: TypeAdapter[ArrivalSpec] = TypeAdapter(ArrivalSpec)


def parse_arrival(text: str, rate: float | None = None) -> ArrivalSpec:
    """Read a command-line arrival spec: ``kind`` or ``kind:name=value,name=value``.

    ``rate`` (the CLI's ``--rate``) fills ``rate`` where the kind has one and the text
    does not give it; for ``ramp`` it fills a missing ``to``, and a missing ``from`` is 0
    (ramp up to ``rate``). Values written in the text win over ``rate``. Examples:
    ``poisson``, ``gamma:cv=2``, ``ramp:from=10,to=100``, ``steps:rates=10/20/40,step=5``,
    ``diurnal:amplitude=0.5,period=60``.
    """
    kind, _, rest = text.strip().partition(":")
    kind = kind.strip()
    cls = _kind_class(kind)
    names = _accepted_names(cls)
    params: dict[str, Any] = {"kind": kind}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key:
            raise ConfigError(
                f"arrival {kind!r}: expected name=value, got {item!r}; "
                f"valid parameters are: {_listing(cls)}"
            )
        if key not in names:
            raise _no_such_parameter(kind, key, cls)
        if names[key] in params:
            raise ConfigError(f"arrival {kind!r}: {names[key]!r} is given twice in {text!r}")
        params[names[key]] = value
    if rate is not None:
        if "rate" in cls.model_fields:
            params.setdefault("rate", rate)
        if cls is RampArrivals:
            params.setdefault("end_rate", rate)
            params.setdefault("start_rate", 0.0)
    return _validate(kind, params)


def arrival_from_dict(spec: Mapping[str, Any]) -> ArrivalSpec:
    """Validate a mapping (from YAML or JSON) such as ``{"kind": "poisson", "rate": 20}``."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"an arrival spec must be a mapping with a 'kind', got {spec!r}")
    if "kind" not in spec:
        raise ConfigError(
            f"an arrival spec needs a 'kind', one of: {', '.join(ARRIVAL_KINDS.names())}; "
            f"got only {', '.join(map(str, spec)) or 'no keys'}"
        )
    kind = str(spec["kind"])
    _kind_class(kind)
    return _validate(kind, dict(spec))


def _kind_class(kind: str) -> type[SpecModel]:
    return ARRIVAL_KINDS.get(kind)


def _validate(kind: str, params: dict[str, Any]) -> ArrivalSpec:
    try:
        return _ADAPTER.validate_python(params)
    except ValidationError as exc:
        cls = ARRIVAL_KINDS.get(kind)
        raise ConfigError("; ".join(_describe(kind, cls, e) for e in exc.errors())) from None


def _describe(kind: str, cls: type[SpecModel], error: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence naming the parameter and what is valid."""
    loc = [str(part) for part in error["loc"][1:]]
    name = loc[0] + "".join(f"[{part}]" for part in loc[1:]) if loc else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return str(_no_such_parameter(kind, name, cls))
    if error["type"] == "missing":
        field = cls.model_fields[name]
        return f"arrival {kind!r} needs {name!r} ({field.description})"
    if not name:
        return f"arrival {kind!r}: {message}"
    return f"arrival {kind!r} parameter {name!r}: {message}, got {error['input']!r}"


def _accepted_names(cls: type[SpecModel]) -> dict[str, str]:
    """Each name a parameter may be written under, mapped to its field."""
    names: dict[str, str] = {}
    for field_name, field in cls.model_fields.items():
        if field_name == "kind":
            continue
        names[field_name] = field_name
        if isinstance(field.validation_alias, AliasChoices):
            for choice in field.validation_alias.choices:
                names[str(choice)] = field_name
    return names


def _listing(cls: type[SpecModel]) -> str:
    return ", ".join(name for name in _accepted_names(cls))


def _no_such_parameter(kind: str, name: str, cls: type[SpecModel]) -> ConfigError:
    return ConfigError(
        f"arrival {kind!r} has no parameter {name!r}; valid parameters are: {_listing(cls)}"
    )
