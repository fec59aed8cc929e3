"""A calibration factor measured between two hardware profiles, as a file: the study
(``ridgeline study vanguard --calibration FILE``) writes it, ``ridgeline allocate
--calibration-from FILE`` plans with it.

The factor maps a capacity measured on the bench hardware (``from_hardware``) onto the
production hardware's (``to_hardware``): per-replica capacity = measured × factor, the
allocator's ``calibration``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ridgeline._fields import Positive
from ridgeline._yaml_config import problems
from ridgeline.errors import ConfigError


class MeasuredCalibration(BaseModel):
    """A factor fitted on measured pairs, and how well it held on pairs kept apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    factor: Positive = Field(description="production capacity / bench estimate")
    from_hardware: str = Field(min_length=1, description="where the estimates were measured")
    to_hardware: str = Field(min_length=1, description="where the capacity is planned")
    fitted_on: int = Field(ge=1, description="estimate–truth pairs the factor was fitted on")
    heldout_bias: float | None = Field(
        None, description="mean relative error of estimate × factor on held-out pairs"
    )
    source: str = Field(min_length=1, description="what measured it, e.g. the study's commit")


def write_calibration(calibration: MeasuredCalibration, path: str | Path) -> Path:
    p = Path(path)
    p.write_text(calibration.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return p


def read_calibration(path: str | Path) -> MeasuredCalibration:
    """The calibration in ``path``; ConfigError saying what is wrong with it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"cannot read the calibration {p}: {e.strerror}; write one with "
            "`ridgeline study vanguard --calibration FILE`"
        ) from e
    try:
        return MeasuredCalibration.model_validate_json(text)
    except ValidationError as e:
        raise ConfigError(f"{p} is not a measured calibration: {problems(e)}") from e
