"""YAML configs with presets: parse a mapping, lay it over a preset, validate it with a
pydantic model — one path for the fake server's latency models and the simulator's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ridgeline.errors import ConfigError, UnknownKindError

M = TypeVar("M", bound=BaseModel)


def read_text(path: Path, what: str, error: type[ConfigError] = ConfigError) -> str:
    """The UTF-8 text of the file at ``path`` (a byte-order mark dropped): the one way a
    config, spec, plan or profile file is read. A file that cannot be read, or is not
    UTF-8, raises ``error`` naming ``what`` it should be, the path and the fix."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}; check the path") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(
            f"{what} {path}, line {line}: byte {data[e.start]:#04x} is not UTF-8 text; save "
            "the file as UTF-8"
        ) from None


MAX_NODES = 1_000_000
"""The most values a config may hold once its aliases are expanded: a 351-byte document
of nested aliases (``a: &a [x, x, …]``, ``b: &b [*a, *a, …]``, …) stands for billions,
and validating it took minutes and gigabytes. The largest shipped config holds some
thousands."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a document whose aliases expand past
    ``MAX_NODES`` values: counted on the composed graph, each node once, before anything
    walks it."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None and _expanded(node, {}) > MAX_NODES:
            raise _TooLarge
        return node


class _TooLarge(Exception):
    """A document whose aliases expand past ``MAX_NODES`` values."""


def _expanded(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is expanded: each node's
    count computed once (``sizes``, by identity), so a bomb is counted in linear time;
    stops counting past ``MAX_NODES``. Iterative, for a document nested thousands deep."""
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        key = id(current)
        if key in sizes:
            continue
        kids: list[yaml.Node] = []
        if isinstance(current, yaml.SequenceNode):
            kids = list(current.value)
        elif isinstance(current, yaml.MappingNode):
            kids = [n for pair in current.value for n in pair]
        if not children_done:
            stack.append((current, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
            continue
        sizes[key] = min(1 + sum(sizes.get(id(k), 1) for k in kids), MAX_NODES + 1)
    return sizes[id(node)]


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text`` with aliases bounded (``_BoundedLoader``); raises
    ``yaml.YAMLError``, ``RecursionError`` or ``_TooLarge``."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_mapping(text: str, where: str, fields: str) -> dict[str, Any]:
    """The YAML mapping in ``text``; ``fields`` names what it should hold, for errors."""
    try:
        data = load_yaml(text)
    except _TooLarge:
        raise ConfigError(
            f"{where} expands to more than {MAX_NODES:,} values through its aliases (& and "
            "*): write the config out, or use fewer nested aliases"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(
            f"{where} is nested too deep to read; a config is a few levels of mappings"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of {fields}, not {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``: nested mappings merge, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def validate(model: type[M], mapping: dict[str, Any], where: str, what: str) -> M:
    """``model`` from ``mapping``; every problem named by its field path."""
    try:
        return model.model_validate(mapping)
    except ValidationError as e:
        raise ConfigError(f"{where}: invalid {what}: {problems(e)}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid {what}: nested too deep") from None


def problems(error: ValidationError, names: Mapping[str, str] | None = None) -> str:
    """Every problem of a pydantic validation on one line, each named by its field path,
    or by what ``names`` calls that path (a command's option), with the bound it broke
    and the value given (``timeout_s: Input should be greater than 0, got 0.0``)."""
    names = names or {}
    return "; ".join(_problem(err, names.get(_path(err))) for err in own_errors(error))


def _problem(err: Any, name: str | None) -> str:
    message = f"{err['msg'].removeprefix('Value error, ')}{_given(err)}"
    if name is not None and name in message:
        return message  # it names its option already
    return f"{name or _path(err) or '(top)'}: {message}"


def error_paths(error: ValidationError) -> set[str]:
    """The field paths of a validation's problems (``warmup_config.rate``)."""
    return {_path(err) for err in own_errors(error)}


def _path(err: Any) -> str:
    return ".".join(str(x) for x in err["loc"])


def own_errors(error: ValidationError) -> list[Any]:
    """The errors of a validation, less those that only follow from another (a default
    computed from a field that failed)."""
    return [e for e in error.errors(include_url=False) if e["type"] != "default_factory_not_called"]


def _given(err: Any) -> str:
    if err["type"] in ("missing", "extra_forbidden") or err["loc"] == ():
        return ""
    text = repr(err["input"])
    return f", got {text if len(text) <= 60 else text[:57] + '...'}"


@dataclass(frozen=True, slots=True)
class Presets(Generic[M]):
    """A directory of shipped YAML presets (``presets/`` of ``package``) validated by
    ``model``; a user's file may name ``preset: NAME`` to start from one and override
    some fields (nested mappings merged key by key).

    ``kind`` names a preset in errors ("preset"), ``what`` a config ("fake-model
    config"), ``fields`` what a file holds ("LatencyModel fields").
    """

    package: str
    model: type[M]
    kind: str
    what: str
    fields: str

    def names(self) -> list[str]:
        """Names of the shipped presets, sorted."""
        root = resources.files(self.package).joinpath("presets")
        return sorted(
            p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml")
        )

    def load(self, name: str) -> M:
        """The shipped preset ``name``; UnknownKindError (listing the presets) if none."""
        return validate(self.model, self._mapping(name), f"{self.kind} {name!r}", self.what)

    def load_file(self, path: str | Path) -> M:
        """A config from a YAML file, optionally layered over ``preset: NAME``."""
        p = Path(path)
        return self.load_mapping(
            parse_mapping(read_text(p, self.what), str(p), self.fields), str(p)
        )

    def load_mapping(self, mapping: dict[str, Any], where: str) -> M:
        """A config from a mapping already read (a part of a larger file, ``where``),
        optionally layered over ``preset: NAME``."""
        mapping = dict(mapping)
        base = mapping.pop("preset", None)
        if base is not None:
            mapping = deep_merge(self._mapping(str(base)), mapping)
        return validate(self.model, mapping, where, self.what)

    def _mapping(self, name: str) -> dict[str, Any]:
        names = self.names()
        if name not in names:
            raise UnknownKindError(self.kind, name, names)
        root = resources.files(self.package).joinpath("presets")
        text = root.joinpath(f"{name}.yaml").read_text(encoding="utf-8")
        return parse_mapping(text, f"{self.kind} {name!r}", self.fields)


def load_model(model: type[M], path: str | Path, what: str, fields: str) -> M:
    """``model`` from the YAML file at ``path``; ``PlanError`` naming the file, the field
    and the fix for anything wrong (a plan, a pipeline spec)."""
    from ridgeline.errors import PlanError

    p = Path(path)
    mapping = parse_mapping(read_text(p, what, PlanError), str(p), fields)
    try:
        return validate(model, mapping, str(p), what)
    except ConfigError as e:
        raise PlanError(str(e)) from e
