"""The run's summary for the terminal: the report's header, and a probe's search path."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from ridgeline.report._view import facts, view_of


def summary_table(run: dict[str, Any]) -> Table:
    """Headline numbers of ``run`` (as ``RunStore.get_run`` returns it) as a rich table."""
    view = view_of(run)
    t = Table(title=f"{view.kind} {view.id}", title_justify="left", show_header=False)
    t.add_column("what", style="dim")
    t.add_column("value")
    for label, text in facts(view):
        t.add_row(label, Text(text))
    if view.probe is not None:
        for k, p in enumerate(view.probe.trajectory, 1):
            p99 = "-" if p.p99_ms is None else f"{p.p99_ms:,.1f} ms"
            valid = "" if p.valid else " (invalid)"
            t.add_row(
                f"search {k}" + (f" ({p.purpose})" if p.purpose else ""),
                Text(
                    f"{p.rate:,.1f} req/s → {p.state}{valid}, achieved "
                    f"{p.achieved_rps:,.1f} req/s, p99 {p99}"
                ),
            )
    return t
