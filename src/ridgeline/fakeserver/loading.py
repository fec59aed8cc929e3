"""Latency models from YAML: the shipped presets, or a file of the user's.

A file holds the fields of ``LatencyModel``; it may also name ``preset: NAME`` to start
from a preset and override some fields (nested mappings such as ``batching`` are merged
key by key).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from ridgeline._yaml_config import deep_merge, parse_mapping, validate
from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.synthetic.model import LatencyModel

_PRESETS = resources.files("ridgeline.fakeserver").joinpath("presets")


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(
        p.name.removesuffix(".yaml") for p in _PRESETS.iterdir() if p.name.endswith(".yaml")
    )


def _preset_mapping(name: str) -> dict[str, Any]:
    names = preset_names()
    if name not in names:
        raise UnknownKindError("preset", name, names)
    text = _PRESETS.joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return _parse(text, f"preset {name!r}")


def load_preset(name: str) -> LatencyModel:
    """The shipped preset ``name``; UnknownKindError (listing the presets) if none."""
    return _validate(_preset_mapping(name), f"preset {name!r}")


def load_config(path: str | Path) -> LatencyModel:
    """A latency model from a YAML file, optionally layered over ``preset: NAME``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read fake-model config {p}: {e.strerror}") from e
    mapping = _parse(text, str(p))
    base = mapping.pop("preset", None)
    if base is not None:
        mapping = deep_merge(_preset_mapping(str(base)), mapping)
    return _validate(mapping, str(p))


def _parse(text: str, where: str) -> dict[str, Any]:
    return parse_mapping(text, where, "LatencyModel fields")


def _validate(mapping: dict[str, Any], where: str) -> LatencyModel:
    return validate(LatencyModel, mapping, where, "fake-model config")
