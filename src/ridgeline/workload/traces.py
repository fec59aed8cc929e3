"""Recorded traces: replay the arrival times (and sizes) of real traffic.

``read_trace`` reads a CSV or JSONL file (one JSON object a line; ``.jsonl`` or
``.ndjson``) with a timestamp column: datetime strings such as the Azure LLM trace's
``2023-11-16 18:17:03.9799600`` (any number of fractional digits; a ``Z`` or ``+hh:mm``
suffix is converted to UTC) or numbers, in seconds unless ``time_unit`` or the column
name (``time_ms``, ``timestamp_us``, ...) says otherwise. Size columns are kept under
canonical names: ``prompt_tokens`` (also ``ContextTokens``, ``input_tokens``),
``output_tokens`` (also ``GeneratedTokens``, ``generated_tokens``) and ``items`` (also
``batch_size``). Other columns are ignored.

A trace's times are seconds from its first request, so ``times[0] == 0``. Rows out of
time order are sorted stably: requests with equal timestamps keep their file order.
A bundled Azure trace (CC-BY 4.0, see ``ridgeline/data/ATTRIBUTION.md``) is found with
``bundled_trace_path()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError, TraceFormatError, UnknownKindError
from ridgeline.workload._trace_io import (
    UNIT_SECONDS,
    TimeUnit,
    parse_counts,
    parse_times,
    read_table,
)

Counts = NDArray[np.int64]

TIME_COLUMNS = (
    "timestamp", "time", "ts", "arrival_time", "arrival_timestamp", "request_time",
    "start_time", "invocation_time", "created_at",
    "timestamp_s", "time_s", "timestamp_ms", "time_ms", "timestamp_us", "time_us",
)  # fmt: skip
"""Timestamp column names recognised (in this order of preference, any letter case)."""

SIZE_COLUMNS: Mapping[str, str] = {
    "prompt_tokens": "prompt_tokens", "contexttokens": "prompt_tokens",
    "context_tokens": "prompt_tokens", "input_tokens": "prompt_tokens",
    "output_tokens": "output_tokens", "generatedtokens": "output_tokens",
    "generated_tokens": "output_tokens",
    "items": "items", "batch_size": "items",
}  # fmt: skip
"""Size column names recognised (any letter case), mapped to their canonical name."""

_MINIMUM = {"prompt_tokens": 0, "output_tokens": 0, "items": 1}
_SUFFIX_UNITS: dict[str, TimeUnit] = {"ms": "ms", "us": "us", "ns": "ns"}


@dataclass(frozen=True, eq=False)
class Trace:
    """Request times (seconds from the first request, sorted) and optional sizes.

    The arrays are held read-only; build a trace from raw times with ``from_times``.
    """

    times: NDArray[np.float64]
    columns: dict[str, Counts] = field(default_factory=dict)
    """Canonical size columns (``prompt_tokens``, ``output_tokens``, ``items``), one
    integer per request."""
    source: str = ""
    """Where the trace came from (a file path), for reports."""

    def __post_init__(self) -> None:
        times = _frozen(self.times, np.float64)
        object.__setattr__(self, "times", times)
        object.__setattr__(
            self, "columns", {name: _frozen(c, np.int64) for name, c in self.columns.items()}
        )
        if times.ndim != 1 or len(times) == 0:
            raise ConfigError("a trace needs a 1-D array of at least one request time")
        if not bool(np.all(np.isfinite(times))):
            raise ConfigError("trace times must be finite numbers of seconds")
        if times[0] != 0 or not bool(np.all(np.diff(times) >= 0)):
            raise ConfigError("trace times must be sorted and start at 0; use Trace.from_times")
        for name, column in self.columns.items():
            if column.shape != times.shape:
                raise ConfigError(
                    f"trace column {name!r} has {len(column)} values, not {len(times)}"
                )

    @classmethod
    def from_times(
        cls,
        times: NDArray[np.float64],
        columns: Mapping[str, Counts] | None = None,
        source: str = "",
    ) -> Trace:
        """A trace from times in any order and origin: sorted stably, then re-based so the
        first request is at 0; columns follow their rows."""
        order = np.argsort(times, kind="stable")
        sorted_times = np.asarray(times, dtype=np.float64)[order]
        rebased = sorted_times - sorted_times[0] if len(sorted_times) else sorted_times
        kept = {name: np.asarray(c, dtype=np.int64)[order] for name, c in (columns or {}).items()}
        return cls(rebased, kept, source)

    def __len__(self) -> int:
        return len(self.times)

    @property
    def duration(self) -> float:
        """Seconds from the first request to the last."""
        return float(self.times[-1])

    @property
    def mean_rate(self) -> float:
        """Requests per second, as one over the mean gap: ``(n - 1) / duration``."""
        if self.duration <= 0:
            raise ConfigError(
                f"trace {self.source!r} spans no time ({len(self)} requests, all at once); "
                "it has no mean rate"
            )
        return (len(self) - 1) / self.duration

    def window(self, start_s: float, end_s: float) -> Trace:
        """The requests at ``start_s ≤ t < end_s``, re-based so the first of them is at 0
        (any quiet lead-in between ``start_s`` and that request is dropped)."""
        if not start_s < end_s:
            raise ConfigError(f"a trace window needs start_s < end_s, got {start_s}, {end_s}")
        lo, hi = np.searchsorted(self.times, [start_s, end_s], side="left")
        if lo == hi:
            raise ConfigError(
                f"trace window [{start_s}, {end_s}) holds no requests; "
                f"the trace spans 0 to {self.duration:g} s"
            )
        columns = {name: column[lo:hi] for name, column in self.columns.items()}
        return Trace(self.times[lo:hi] - self.times[lo], columns, self.source)

    def at_speed(self, factor: float) -> Trace:
        """Every gap divided by ``factor``: 2 replays twice as fast, 0.5 half as fast."""
        if not (np.isfinite(factor) and factor > 0):
            raise ConfigError(f"a trace speed factor must be finite and > 0, got {factor}")
        return Trace(self.times / factor, self.columns, self.source)

    def scaled_to_rate(self, target_rate: float) -> Trace:
        """Every gap scaled by one factor so the mean rate becomes ``target_rate``; the
        order and the ratios between gaps (the burstiness) are kept."""
        if not (np.isfinite(target_rate) and target_rate > 0):
            raise ConfigError(f"a target rate must be finite and > 0 req/s, got {target_rate}")
        return self.at_speed(target_rate / self.mean_rate)


def read_trace(
    path: str | Path, time_column: str | None = None, time_unit: TimeUnit | None = None
) -> Trace:
    """Read a CSV or JSONL trace; see the module docstring for the columns understood.

    ``time_column`` names the timestamp column when auto-detection would not find it;
    ``time_unit`` (``s``, ``ms``, ``us``, ``ns``) is the unit of numeric timestamps.
    """
    path = Path(path)
    if time_unit is not None and time_unit not in UNIT_SECONDS:
        raise UnknownKindError("time unit", time_unit, UNIT_SECONDS)
    table = read_table(path)
    if not table.lines:
        raise TraceFormatError(
            str(path), 1, time_column or "timestamp", "the trace holds no requests"
        )
    column = time_column or _find_time_column(table.header)
    if column is None or column not in table.header:
        looked_for = repr(time_column) if time_column else "one named " + ", ".join(TIME_COLUMNS)
        raise TraceFormatError(
            str(path),
            1,
            time_column or "timestamp",
            f"no timestamp column: looked for {looked_for}; "
            f"columns found: {', '.join(table.header) or 'none'} "
            "(pass time_column= to name it)",
        )
    unit = time_unit or _unit_from_name(column)
    times = parse_times(table, column, unit)
    sizes: dict[str, Counts] = {}
    for name in table.header:
        canonical = SIZE_COLUMNS.get(name.lower())
        if canonical is not None and canonical not in sizes:
            sizes[canonical] = parse_counts(table, name, _MINIMUM[canonical])
    return Trace.from_times(times, sizes, str(path))


def bundled_trace_path(name: str = "azure_llm_2023_code") -> Path:
    """The path of a trace shipped with ridgeline (``ridgeline/data/<name>.csv``)."""
    data = resources.files("ridgeline").joinpath("data")
    available = sorted(
        p.name.removesuffix(".csv") for p in data.iterdir() if p.name.endswith(".csv")
    )
    if name not in available:
        raise UnknownKindError("bundled trace", name, available)
    return Path(str(data.joinpath(f"{name}.csv")))


def _frozen(values: NDArray[Any], dtype: type[np.generic]) -> NDArray[Any]:
    """A read-only view (a copy only when the dtype differs); the caller's array stays
    writable."""
    view = np.asarray(values, dtype=dtype).view()
    view.flags.writeable = False
    return view


def _find_time_column(header: list[str]) -> str | None:
    by_lower = {name.lower(): name for name in reversed(header)}
    return next((by_lower[n] for n in TIME_COLUMNS if n in by_lower), None)


def _unit_from_name(column: str) -> TimeUnit | None:
    """``ms``, ``us`` or ``ns`` when the column name ends so (``time_ms``), else None."""
    return _SUFFIX_UNITS.get(column.lower().rpartition("_")[2])
