"""Where benchmark rows go: the end of their own section's table in docs/benchmarks.md."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

from ridgeline.study.bank import Case, load_bank

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def add_rows(heading: str, comment: str, rows: list[str], doc: Path = DOC) -> None:
    """Insert ``<!-- comment -->`` and ``rows`` after the last line of the section that
    starts with ``heading`` (before the next ``## `` heading, or at the end)."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    while end > start and not lines[end - 1].strip():
        end -= 1
    lines[end:end] = [f"<!-- {comment} -->", *rows]
    doc.write_text("\n".join(lines) + "\n")


def ensure_section(heading: str, intro: list[str], doc: Path = DOC) -> None:
    """Append the section ``heading`` with ``intro`` (its methodology and table header)
    at the end of the doc, unless a line already starts with ``heading``."""
    lines = doc.read_text().splitlines()
    if any(line.startswith(heading) for line in lines):
        return
    while lines and not lines[-1].strip():
        lines.pop()
    lines += ["", heading, "", *intro]
    doc.write_text("\n".join(lines) + "\n")


def machine() -> str:
    """The machine a row was measured on: cores, CPU model, Python, OS."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


def head_commit() -> str:
    """The short hash of the checkout's HEAD: which code a row measured."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=DOC.parent
    )
    return done.stdout.strip()


def bank_half(split: str, names: list[str]) -> list[Case]:
    """The validation bank's cases of ``split`` (``heldout`` or ``dev``), in its order;
    only those named in ``names`` when any are."""
    cases = [c for c in load_bank() if c.split == split]
    return [c for c in cases if c.name in names] if names else cases
