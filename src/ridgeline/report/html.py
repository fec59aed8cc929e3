"""One self-contained HTML file telling a run's story; it opens offline.

plotly.js is embedded once, inline, with the first figure; the others reuse it. For a
probe: latency and throughput against offered rate per step, the health state of every
window in time order (warmup shaded), and the search trajectory with the estimate and
its confidence interval. For a plain run: throughput and latency over its windows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

import plotly.graph_objects as go  # type: ignore[import-untyped]

from ridgeline.errors import ConfigError
from ridgeline.report import figures
from ridgeline.report._view import RunView, StepView, facts, server_lines, step_label, view_of

PROBE_FIGURES = ("latency-vs-rate", "throughput-vs-rate", "health-timeline", "search-trajectory")
"""The div ids of a probe run's figures, in page order."""
RUN_FIGURES = ("throughput-over-time", "latency-over-time")
"""The div ids of a plain run's figures, in page order."""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #212121; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; }
.sub { color: #616161; margin-top: 0; }
dl { display: grid; grid-template-columns: max-content auto; gap: .25rem 1.2rem; }
dt { color: #616161; } dd { margin: 0; font-weight: 600; }
table { border-collapse: collapse; margin-top: 1rem; font-size: .9rem; }
th, td { border-bottom: 1px solid #e0e0e0; padding: .25rem .6rem; text-align: right; }
th { background: #fafafa; } .bad { color: #c62828; }
"""


def _figures_of(view: RunView) -> list[tuple[str, go.Figure]]:
    if view.probe is not None:
        figs = [
            figures.latency_vs_rate(view),
            figures.throughput_vs_rate(view),
            figures.health_timeline(view),
            figures.trajectory(view),
        ]
        return list(zip(PROBE_FIGURES, figs, strict=True))
    return list(zip(RUN_FIGURES, figures.over_time(view), strict=True))


def _settled_state(view: RunView, step: StepView) -> str:
    states = [w.state for w in view.windows if w.step == step.index and w.state is not None]
    return states[-1] if states else "-"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _steps_table(view: RunView) -> str:
    head = ["step", "offered req/s", "achieved req/s", "p50 ms", "p99 ms", "errors", "valid"]
    tokens = any(s.summary.ttft_ms is not None for s in view.steps)
    if tokens:
        head += ["TTFT p99 ms", "ITL p99 ms", "TPOT p99 ms", "goodput req/s"]
    if view.probe is not None:
        head.append("settled state")
    rows = []
    for s in view.steps:
        m = s.summary
        cells = [
            str(s.index + 1),  # as step_label numbers it
            f"{m.offered_rps:,.1f}",
            f"{m.achieved_rps:,.1f}",
            _ms(m.latency_ms.p50),
            _ms(m.latency_ms.p99),
            f"{m.error_rate:.2%}",
            "yes" if m.valid else f"<span class=bad>no: {escape(m.invalid_reason or '')}</span>",
        ]
        if tokens:
            cells += [_ms(p.p99 if p else None) for p in (m.ttft_ms, m.itl_ms, m.tpot_ms)]
            cells.append("-" if m.goodput_rps is None else f"{m.goodput_rps:,.1f}")
        if view.probe is not None:
            cells.append(escape(_settled_state(view, s)))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
    return f"<table>{header}{''.join(rows)}</table>"


def _server_metrics(view: RunView) -> str:
    """What the server's metrics (``--metrics-url``) said, step by step; empty if unscraped."""
    parts = []
    for s in view.steps:
        if s.summary.server is not None:
            head, *lines = server_lines(s.summary.server)
            items = "".join(f"<li>{escape(line)}</li>" for line in lines)
            parts.append(f"<h3>{escape(step_label(s.index))}: {escape(head)}</h3><ul>{items}</ul>")
    return f"<h2>Server metrics</h2>{''.join(parts)}" if parts else ""


def figures_html(figures: list[tuple[str, go.Figure]]) -> str:
    """The figures as HTML divs with these ids, plotly.js inline once (with the first),
    so the page opens offline."""
    return "".join(
        str(
            fig.to_html(
                full_html=False,
                include_plotlyjs=k == 0,
                div_id=div_id,
                config={"displaylogo": False},
            )
        )
        for k, (div_id, fig) in enumerate(figures)
    )


def render(run: dict[str, Any]) -> str:
    """The report page for ``run`` (as ``RunStore.get_run`` returns it), as text."""
    view = view_of(run)
    header = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts(view))
    plots = figures_html(_figures_of(view))
    title = f"ridgeline {view.kind} {view.id}"
    started = datetime.fromtimestamp(view.started_at, UTC)
    return (
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}"
        f"</title><style>{_CSS}</style></head><body><h1>{escape(title)}</h1>"
        f"<p class=sub>started {started:%Y-%m-%d %H:%M:%S} UTC</p><dl>{header}</dl>{plots}"
        f"<h2>Steps</h2>{_steps_table(view)}{_server_metrics(view)}</body></html>\n"
    )


def write_report(run: dict[str, Any], path: Path) -> Path:
    """Write ``run``'s report to ``path`` (one self-contained HTML file) and return it."""
    page = render(run)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the report to {path}: {exc.strerror or exc}; "
            "pass --out with a writable path"
        ) from exc
    return path
