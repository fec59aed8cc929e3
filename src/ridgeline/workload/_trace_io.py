"""Reading trace files into columns of raw cells, and parsing those cells.

Every problem raises ``TraceFormatError`` naming the file, the 1-based line in the file
and the column, and saying what was expected. Fast paths are vectorised (numpy parses
the datetime and number columns at once); the first bad cell is found only when one
fails.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError, TraceFormatError

TimeUnit = Literal["s", "ms", "us", "ns"]
UNIT_SECONDS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

TIMESTAMP_EXAMPLE = "2023-11-16 18:17:03.97"
_DATETIME = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"
)


@dataclass(frozen=True, slots=True)
class RawTable:
    """A trace file's cells by column, before parsing."""

    path: str
    header: list[str]
    cells: dict[str, list[Any]]
    """Column name to one cell per row (``None`` where a JSON record lacks the key)."""
    lines: list[int]
    """The file line (1-based) each row came from."""


def read_table(path: Path) -> RawTable:
    """Read a CSV file or, for ``.jsonl``/``.ndjson``, a file of one JSON object a line."""
    text = _read_text(path)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return _read_jsonl(path, text)
    return _read_csv(path, text)


def _read_text(path: Path) -> str:
    """The file's text, UTF-8 (a byte-order mark dropped); a file that cannot be read or
    is not UTF-8 raises an error naming the path and where."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"cannot read trace {path}: {e.strerror or e}; give the path of a CSV or JSONL file"
        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise TraceFormatError(
            str(path),
            data.count(b"\n", 0, e.start) + 1,
            e.start - line_start + 1,
            f"byte {data[e.start]:#04x} is not UTF-8 text; save the trace as UTF-8",
        ) from None


def _read_csv(path: Path, text: str) -> RawTable:
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = [cell.strip() for cell in row]
                continue
            if len(row) != len(header):
                column: str | int = header[len(row)] if len(row) < len(header) else len(row)
                raise TraceFormatError(
                    str(path),
                    reader.line_num,
                    column,
                    f"expected {len(header)} comma-separated fields "
                    f"({', '.join(header)}), got {len(row)}",
                )
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as e:  # a field over csv's limit (128 KiB), a stray quote
        raise TraceFormatError(
            str(path), reader.line_num, "?", f"not readable as CSV ({e}); fix the line"
        ) from None
    if header is None:
        raise TraceFormatError(
            str(path), 1, 1, "the file is empty; expected a header line naming the columns"
        )
    cells = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    return RawTable(str(path), header, cells, lines)


def _read_jsonl(path: Path, text: str) -> RawTable:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    for number, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(
                str(path), number, exc.colno, f"not valid JSON ({exc.msg})"
            ) from None
        except (ValueError, RecursionError) as exc:  # an int of 5,000 digits; deep nesting
            problem = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
            raise TraceFormatError(
                str(path), number, 1, f"not a readable JSON record ({problem})"
            ) from None
        if not isinstance(record, dict):
            raise TraceFormatError(
                str(path),
                number,
                1,
                'expected a JSON object like {"timestamp": 0.5, "prompt_tokens": 100}, '
                f"got {type(record).__name__}",
            )
        records.append(record)
        lines.append(number)
    header = list(records[0]) if records else []
    cells = {name: [record.get(name) for record in records] for name in header}
    return RawTable(str(path), header, cells, lines)


def parse_times(table: RawTable, column: str, unit: TimeUnit | None) -> NDArray[np.float64]:
    """Seconds since the column's earliest cell: datetime strings (``unit`` must then be
    None) or numbers in ``unit`` (seconds when None)."""
    cells = table.cells[column]
    first = cells[0]
    if isinstance(first, str) and _DATETIME.fullmatch(first.strip()):
        if unit is not None:
            raise TraceFormatError(
                table.path,
                table.lines[0],
                column,
                f"time_unit={unit!r} applies to numeric timestamps, but this column holds "
                f"datetimes like {first.strip()!r}; leave time_unit unset",
            )
        return _parse_datetimes(table, column)
    scale = UNIT_SECONDS[unit or "s"]
    try:
        values: NDArray[np.float64] = np.array(cells, dtype=np.float64)
        ok = bool(np.all(np.isfinite(values))) and not any(isinstance(c, bool) for c in cells)
    except (ValueError, TypeError, OverflowError):
        ok = False
    if not ok:
        _raise_first(table, column, lambda cell: _number(cell) is None, _expected_time(unit))
    seconds: NDArray[np.float64] = (values - values.min()) * scale
    return seconds


def _parse_datetimes(table: RawTable, column: str) -> NDArray[np.float64]:
    cells = table.cells[column]
    texts = [cell.strip() if isinstance(cell, str) else "" for cell in cells]
    for i, text in enumerate(texts):
        if not _DATETIME.fullmatch(text):
            _raise_at(table, column, i, _expected_time(None))
    with warnings.catch_warnings():
        # numpy warns that datetime64 holds no time zone; offsets are converted to UTC.
        warnings.simplefilter("ignore", UserWarning)
        try:
            stamps = np.array(texts, dtype="datetime64[ns]")
        except (ValueError, OverflowError):
            _raise_first(table, column, lambda cell: not _is_datetime(cell), _expected_time(None))
    seconds: NDArray[np.float64] = (stamps - stamps.min()).astype(np.int64) / 1e9
    return seconds


def parse_counts(table: RawTable, column: str, minimum: int) -> NDArray[np.int64]:
    """Integer cells (a size column), each at least ``minimum``."""
    counts = [_count(cell) for cell in table.cells[column]]
    for i, count in enumerate(counts):
        if count is None or count < minimum:
            _raise_at(table, column, i, f"an integer ≥ {minimum}")
    return np.array(counts, dtype=np.int64)


def _expected_time(unit: TimeUnit | None) -> str:
    number = "seconds" if unit in (None, "s") else f"a number of {unit}"
    return f"a timestamp like {TIMESTAMP_EXAMPLE} or {number}"


def _number(cell: Any) -> float | None:
    if isinstance(cell, bool) or not isinstance(cell, str | int | float):
        return None
    try:
        value = float(cell)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _count(cell: Any) -> int | None:
    if isinstance(cell, bool):
        return None
    if isinstance(cell, int):
        return cell
    if isinstance(cell, float):
        return int(cell) if cell.is_integer() else None
    if isinstance(cell, str):
        try:
            return int(cell)
        except ValueError:
            return None
    return None


def _is_datetime(cell: Any) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            return not np.isnat(np.datetime64(str(cell).strip(), "ns"))
        except (ValueError, OverflowError):
            return False


def _raise_first(
    table: RawTable, column: str, bad: Callable[[Any], bool], expected: str
) -> NoReturn:
    for i, cell in enumerate(table.cells[column]):
        if bad(cell):
            _raise_at(table, column, i, expected)
    raise AssertionError("a column that failed to parse has no bad cell")  # pragma: no cover


def _raise_at(table: RawTable, column: str, row: int, expected: str) -> NoReturn:
    """Raise for the cell at ``row``: "expected <expected>, got <cell>"."""
    cell = table.cells[column][row]
    got = "nothing" if cell is None or cell == "" else repr(cell)
    raise TraceFormatError(table.path, table.lines[row], column, f"expected {expected}, got {got}")
