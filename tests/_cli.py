"""The ``ridgeline`` command run for real, as a user runs it: a subprocess, its output
captured. Whatever it is asked, no Python traceback may reach the user: every run through
here fails its test if one does (issue 14: "0 tracebacks reach a user in the CLI suite")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RIDGELINE = [sys.executable, "-m", "ridgeline"]


def ridgeline(
    *args: str, db: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m ridgeline ARGS [--db DB]``; asserts that neither stream holds a
    traceback."""
    cmd = [*RIDGELINE, *args, *(["--db", str(db)] if db is not None else [])]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for stream in (res.stdout, res.stderr):
        assert "Traceback (most recent call last)" not in stream, (
            f"ridgeline {' '.join(args)} printed a traceback:\n{stream[-3000:]}"
        )
    return res
