"""Latency models from YAML: the shipped presets, or a file of the user's.

A file holds the fields of ``LatencyModel``; it may also name ``preset: NAME`` to start
from a preset and override some fields (nested mappings such as ``batching`` are merged
key by key).
"""

from __future__ import annotations

from pathlib import Path

from ridgeline._yaml_config import Presets
from ridgeline.synthetic.model import LatencyModel

_PRESETS = Presets(
    "ridgeline.fakeserver", LatencyModel, "preset", "fake-model config", "LatencyModel fields"
)


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return _PRESETS.names()


def load_preset(name: str) -> LatencyModel:
    """The shipped preset ``name``; UnknownKindError (listing the presets) if none."""
    return _PRESETS.load(name)


def load_config(path: str | Path) -> LatencyModel:
    """A latency model from a YAML file, optionally layered over ``preset: NAME``."""
    return _PRESETS.load_file(path)
