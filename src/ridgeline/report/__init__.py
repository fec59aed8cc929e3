"""Reports of a stored run: one self-contained HTML file, and a terminal summary."""

from ridgeline.report.html import PROBE_FIGURES, RUN_FIGURES, render, write_report
from ridgeline.report.terminal import summary_table

__all__ = ["PROBE_FIGURES", "RUN_FIGURES", "render", "summary_table", "write_report"]
