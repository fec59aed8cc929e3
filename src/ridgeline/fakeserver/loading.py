"""Latency models from YAML: the shipped presets, or a file of the user's.

A file holds the fields of ``LatencyModel``; it may also name ``preset: NAME`` to start
from a preset and override some fields (nested mappings such as ``batching`` are merged
key by key).
"""

from __future__ import annotations

from ridgeline._yaml_config import Presets
from ridgeline.synthetic.model import LatencyModel

_PRESETS = Presets(
    "ridgeline.fakeserver", LatencyModel, "preset", "fake-model config", "LatencyModel fields"
)


preset_names = _PRESETS.names
"""Names of the shipped presets, sorted."""
load_preset = _PRESETS.load
"""The shipped preset ``name``; UnknownKindError (listing the presets) if none."""
load_config = _PRESETS.load_file
"""A latency model from a YAML file, optionally layered over ``preset: NAME``."""
