"""The one way a kind is chosen by name (``ridgeline._registry``): an unknown name lists
the valid ones, and a union's classes, the names in errors and the help text come from
one declaration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, get_args

import pytest
from pydantic import BaseModel, Field, TypeAdapter

from ridgeline._kind_names import ARRIVAL_EXAMPLES, STRATEGY_NAMES, arrival_help, strategy_help
from ridgeline._registry import Registry
from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.pipeline.segments import SEGMENT_KINDS, Segment
from ridgeline.search.base import STRATEGIES
from ridgeline.search.config import STRATEGY_KINDS, StrategyConfig
from ridgeline.serve.backends import BACKEND_KINDS, BackendConfig
from ridgeline.workload.arrivals import (
    ARRIVAL_KINDS,
    ArrivalSpec,
    arrival_from_dict,
    parse_arrival,
)


class _Slow(BaseModel):
    kind: Literal["slow"] = "slow"


class _Fast(BaseModel):
    kind: Literal["fast"] = "fast"


_Speed = Annotated[_Slow | _Fast, Field(discriminator="kind")]


def test_an_unknown_name_lists_the_valid_ones() -> None:
    colours: Registry[int] = Registry("colour")
    colours.add("red", 1)
    colours.add("blue", 2)
    colours.add("green", 3)
    assert colours.get("red") == 1
    with pytest.raises(UnknownKindError) as caught:
        colours.get("mauve")
    assert str(caught.value) == "unknown colour 'mauve'; valid colours are: blue, green, red"
    assert isinstance(caught.value, ConfigError)
    assert (caught.value.name, caught.value.valid) == ("mauve", ["blue", "green", "red"])
    assert colours.names() == ("blue", "green", "red")
    assert colours.help() == "blue | green | red"
    assert list(colours) == ["red", "blue", "green"]  # registration order


def test_a_decorator_registers_what_it_decorates_and_returns_it() -> None:
    shouts: Registry[Callable[[str], str]] = Registry("shout")

    @shouts.register("loud")
    def loud(text: str) -> str:
        return text.upper()

    assert shouts.get("loud") is loud
    assert loud("hi") == "HI"


def test_a_name_registered_twice_is_refused() -> None:
    once: Registry[int] = Registry("thing")
    once.add("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        once.add("a", 2)


def test_a_union_is_the_one_declaration_of_its_kinds() -> None:
    speeds = Registry.of_union("speed", _Speed)
    assert speeds.names() == ("fast", "slow")
    assert speeds.get("slow") is _Slow
    assert isinstance(TypeAdapter(_Speed).validate_python({"kind": "fast"}), _Fast)
    with pytest.raises(UnknownKindError, match="valid speeds are: fast, slow"):
        speeds.get("warp")


@pytest.mark.parametrize(
    ("registry", "union"),
    [
        (ARRIVAL_KINDS, ArrivalSpec),
        (STRATEGY_KINDS, StrategyConfig),
        (BACKEND_KINDS, BackendConfig),
        (SEGMENT_KINDS, Segment),
    ],
)
def test_each_kind_registry_holds_exactly_its_union(
    registry: Registry[type], union: object
) -> None:
    classes = get_args(get_args(union)[0])
    assert [registry.get(name) for name in registry] == list(classes)


def test_arrival_errors_and_help_come_from_the_union() -> None:
    kinds = ", ".join(ARRIVAL_KINDS.names())
    for attempt in (lambda: parse_arrival("bursty", 10), lambda: arrival_from_dict({"kind": "x"})):
        with pytest.raises(UnknownKindError, match=f"valid arrival kinds are: {kinds}"):
            attempt()
    assert list(ARRIVAL_EXAMPLES) == list(ARRIVAL_KINDS)  # the light names are the union's
    for kind, example in ARRIVAL_EXAMPLES.items():  # every example in the help is a valid spec
        assert parse_arrival(example, 10).kind == kind


def test_every_strategy_config_has_its_strategy() -> None:
    assert STRATEGIES.names() == STRATEGY_KINDS.names() == tuple(sorted(STRATEGY_NAMES))


def _help(command: str, option: str) -> str:
    """The help of ``ridgeline COMMAND --OPTION``, as the command line shows it."""
    from typer.main import get_command

    from ridgeline.cli import app

    params = get_command(app).commands[command].params
    return next(str(p.help) for p in params if p.name == option)


def test_the_command_line_names_the_declared_kinds() -> None:
    # the commands' modules may not load numpy to read their help (a fast --help), so
    # they read the names from ridgeline._kind_names, which the registries hold (above)
    for command in ("run", "simulate"):
        assert _help(command, "arrival") == arrival_help()
        assert arrival_help().startswith("constant | poisson | gamma:cv=2 | ramp:from=10,to=100")
    assert _help("probe", "strategy") == strategy_help() == "adaptive | binary | sweep | stability"
