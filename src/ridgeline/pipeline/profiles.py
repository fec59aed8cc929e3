"""Profiles: latency and throughput per (variant, segment type, batch size).

One row says: an instance of ``variant`` on one segment of type ``segment`` (of the
``pool``: a GPU type such as ``A100-80GB``, or ``cpu``) runs a batch of ``batch`` in
``latency_ms`` and so serves ``throughput_rps`` items per second. Each row says where it
came from (``source``):

- ``measured``: timed here, by ``ridgeline profile`` against the serving runtime's
  workers, or on a GPU by ``benchmarks/gpu_profile.py``;
- ``calibrated``: the roofline with constants fitted to public measurements of that GPU
  type (A100-80GB: MIGProfiler's; ``pipeline.fit``);
- ``modelled``: the roofline on hardware nothing was fitted to (the fitted constants
  carried over to another GPU type's peak, bandwidth and SMs; the CPU's guesses).

Stored as CSV (tables written before ``calibrated`` existed load unchanged)::

    variant,pool,segment,batch,latency_ms,throughput_rps,source
    yolov5n,A100-80GB,1g.10gb,4,6.1,655.7,calibrated
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from ridgeline._yaml_config import read_text
from ridgeline.errors import ConfigError, PlanError
from ridgeline.pipeline.segments import segment_cost

Source = Literal["measured", "calibrated", "modelled"]
"""Where a row came from, most trusted first."""
SOURCES: tuple[Source, ...] = ("measured", "calibrated", "modelled")


@dataclass(frozen=True, slots=True)
class ProfileRow:
    variant: str
    pool: str
    """A GPU type (``A100-80GB``) or ``cpu``."""
    segment: str
    """A segment label: a MIG profile (``1g.10gb``), an MPS share (``1g.10gb@1/2``) or
    ``cpuN``."""
    batch: int
    latency_ms: float
    """Execution time of one batch of ``batch`` on one instance."""
    throughput_rps: float
    """Items per second one instance serves at this batch size."""
    source: Source = "modelled"


class ProfileTable:
    """Rows, looked up by variant and pool."""

    def __init__(self, rows: Iterable[ProfileRow]) -> None:
        self.rows = list(rows)

    def __iter__(self) -> Iterator[ProfileRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def for_variant(self, variant: str, pool: str) -> list[ProfileRow]:
        return [r for r in self.rows if r.variant == variant and r.pool == pool]

    def pools(self) -> list[str]:
        return sorted({r.pool for r in self.rows})

    def to_csv(self) -> str:
        out = io.StringIO()
        names = [f.name for f in fields(ProfileRow)]
        w = csv.DictWriter(out, names, lineterminator="\n")
        w.writeheader()
        for r in self.rows:
            w.writerow({n: getattr(r, n) for n in names})
        return out.getvalue()

    @classmethod
    def from_csv(cls, text: str, where: str = "profiles") -> ProfileTable:
        """The table in CSV ``text``; a ``PlanError`` naming the line and the field for
        anything wrong (a missing column, a batch that is not a positive integer, a
        latency or throughput that is not a finite positive number, an unknown segment)."""
        names = [f.name for f in fields(ProfileRow)]
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            missing = [n for n in names if n not in (reader.fieldnames or [])]
            if missing:
                raise PlanError(
                    f"{where}: missing columns {', '.join(missing)}; the header must be "
                    f"{','.join(names)}"
                )
            return cls([_row(rec, f"{where} line {reader.line_num}") for rec in reader])
        except csv.Error as e:  # a field over csv's limit (128 KiB), a NUL byte
            raise PlanError(
                f"{where} line {reader.reader.line_num}: not readable as CSV ({e}); fix the line"
            ) from None


def _row(rec: dict[str | Any, str | Any], where: str) -> ProfileRow:
    """One CSV record as a row; every bound checked here, where the table is read."""
    if None in rec or any(v is None for v in rec.values()):
        raise PlanError(f"{where}: expected {len(fields(ProfileRow))} fields; fix the row")
    try:
        row = ProfileRow(
            variant=rec["variant"],
            pool=rec["pool"],
            segment=rec["segment"],
            batch=int(rec["batch"]),
            latency_ms=float(rec["latency_ms"]),
            throughput_rps=float(rec["throughput_rps"]),
            source=_source(rec["source"]),
        )
    except ValueError as e:
        raise PlanError(f"{where}: {e}; fix the row") from None
    for name in ("latency_ms", "throughput_rps"):
        value = getattr(row, name)
        if not 0 < value < math.inf:
            raise PlanError(
                f"{where}: {name} must be a finite number above 0, got {value!r}; fix the row"
            )
    if row.batch < 1:
        raise PlanError(f"{where}: batch must be an integer ≥ 1, got {row.batch}; fix the row")
    try:
        segment_cost(row.pool, row.segment)
    except ConfigError as e:
        raise PlanError(f"{where}: {e}") from None
    return row


def _source(text: str) -> Source:
    for known in SOURCES:
        if text == known:
            return known
    raise ValueError(f"source {text!r} is not one of {', '.join(SOURCES)}")


def load_profiles(path: str | Path) -> ProfileTable:
    """The profile table in the CSV file at ``path`` (UTF-8)."""
    p = Path(path)
    return ProfileTable.from_csv(read_text(p, "profile table", PlanError), str(p))
