"""The loop's report: one self-contained HTML file (plotly.js inline, opens offline) with
the profiles, the plan, the verify step, and the reconfiguration timeline — demand,
instances, latency and drops — and every request accounted for."""

from __future__ import annotations

from html import escape
from pathlib import Path

import plotly.graph_objects as go  # type: ignore[import-untyped]

from ridgeline.loop.run import LoopResult
from ridgeline.report.html import figures_html

FIGURES = ("profiles", "demand", "instances", "latency")
"""The div ids of the report's figures, in page order."""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #212121; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: .9rem; }
th, td { border-bottom: 1px solid #e0e0e0; padding: .25rem .6rem; text-align: right; }
th { background: #fafafa; } .pass { color: #2e7d32; } .fail { color: #c62828; }
.inconclusive { color: #ef6c00; }
"""


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=340
    )
    return fig


def _profiles(r: LoopResult) -> go.Figure:
    fig = go.Figure()
    for variant in dict.fromkeys(row.variant for row in r.table):
        rows = sorted((x for x in r.table if x.variant == variant), key=lambda x: x.batch)
        fig.add_trace(
            go.Scatter(
                x=[x.batch for x in rows],
                y=[x.latency_ms for x in rows],
                mode="lines+markers",
                name=variant,
            )
        )
    return _layout(fig, "Profiles: batch latency on one core", "batch size", "latency (ms)")


Series = tuple[list[float], list[float], list[float], list[float | None], list[int]]


def _timeline(r: LoopResult) -> Series:
    """Per window over the demand phases: time, offered, answered, p99, drops."""
    t: list[float] = []
    offered: list[float] = []
    done: list[float] = []
    p99: list[float | None] = []
    drops: list[int] = []
    start = 0.0
    for _, step in r.phases:
        for w in step.windows:
            t.append(start + w.start_s)
            offered.append(w.offered_rps)
            done.append(w.achieved_rps)
            p99.append(w.latency_ms.p99)
            drops.append(w.dropped)
        start += step.summary.duration_s
    return t, offered, done, p99, drops


def _demand(r: LoopResult) -> go.Figure:
    t, offered, done, _, drops = _timeline(r)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=t, y=offered, name="offered req/s", line_shape="hv"))
    fig.add_trace(go.Scatter(x=t, y=done, name="answered ok req/s", line_shape="hv"))
    fig.add_trace(go.Bar(x=t, y=drops, name="dropped per window", opacity=0.5))
    return _layout(fig, "Demand moved up and back down", "time (s)", "requests")


def _instances(r: LoopResult) -> go.Figure:
    fig = go.Figure()
    start = {t: p.instances for t, p in r.planned.tasks.items()}
    end = sum(step.summary.duration_s for _, step in r.phases)
    for task, n0 in start.items():
        xs, ys = [0.0], [n0]
        for e in r.events:
            xs.append(e.t_s)
            ys.append(e.instances[task])
        xs.append(end)
        ys.append(ys[-1])
        fig.add_trace(go.Scatter(x=xs, y=ys, name=task, line_shape="hv", mode="lines+markers"))
    return _layout(fig, "Instances per task (reconfiguration)", "time (s)", "instances")


def _latency(r: LoopResult) -> go.Figure:
    t, _, _, p99, _ = _timeline(r)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=t, y=p99, name="p99 of answered", mode="lines+markers"))
    fig.add_hline(y=r.spec.slo_ms, line_dash="dash", annotation_text="SLO")
    return _layout(fig, "Latency during the demand moves", "time (s)", "p99 (ms)")


def _plan_table(r: LoopResult) -> str:
    head = "<tr><th>task</th><th>variant</th><th>segment</th><th>batch</th><th>instances</th>"
    head += "<th>latency ms</th><th>busy</th></tr>"
    rows = "".join(
        f"<tr><td>{escape(t)}</td><td>{escape(p.variant)}</td>"
        f"<td>{escape(p.config.row.segment)}</td><td>{p.config.row.batch}</td>"
        f"<td>{p.instances}</td><td>{p.latency_ms:.1f}</td><td>{p.utilisation:.0%}</td></tr>"
        for t, p in r.planned.tasks.items()
    )
    return f"<table>{head}{rows}</table>"


def _events_table(r: LoopResult) -> str:
    if not r.events:
        return "<p>No reconfiguration: demand stayed within the band.</p>"
    rows = "".join(
        f"<tr><td>{e.t_s:.1f}</td><td>{e.estimate_rps:.1f}</td><td>{e.planned_rps:.1f}</td>"
        f"<td>{escape(', '.join(f'{t} {n}' for t, n in e.instances.items()))}</td>"
        f"<td style='text-align:left'>{escape(e.reason)}</td>"
        f"<td style='text-align:left'>"
        f"{escape('; '.join(e.applied) if e.applied else 'none: the plan came out the same')}"
        f"{escape('; skipped: ' + '; '.join(e.skipped)) if e.skipped else ''}</td></tr>"
        for e in r.events
    )
    head = "<tr><th>t (s)</th><th>estimate</th><th>planned</th><th>instances</th>"
    head += "<th>reason</th><th>changed</th></tr>"
    return f"<table>{head}{rows}</table>"


def render(r: LoopResult) -> str:
    figs = [_profiles(r), _demand(r), _instances(r), _latency(r)]
    plots = figures_html(list(zip(FIGURES, figs, strict=True)))
    v = r.verified
    css_class = {"PASS": "pass", "FAIL": "fail"}.get(v.verdict, "inconclusive")
    loop_class = {"PASS": "pass", "FAIL": "fail"}.get(r.verdict, "inconclusive")
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>ridgeline demo: {escape(r.spec.name)}</title><style>{_CSS}</style></head>"
        f"<body><h1>ridgeline: profile → plan → serve → verify → reconfigure "
        f"({escape(r.spec.name)})</h1>"
        f"<p class={loop_class}>{r.verdict}: {escape(r.misses.describe(r.settle_s))}</p>"
        f"<h2>Verify at {v.demand_rps:g} req/s</h2>"
        f"<p class={css_class}>{escape(v.summary())}</p>"
        f"<h2>Plan ({r.planned.slices_used:g} cores, accuracy {r.planned.accuracy:.3f} of the "
        f"best)</h2>{_plan_table(r)}"
        f"<h2>Reconfiguration</h2><p>Requests: {escape(r.counts())}.</p>{_events_table(r)}"
        f"<h2>Figures</h2>{plots}</body></html>\n"
    )


def write_loop_report(r: LoopResult, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(r), encoding="utf-8")
    return path
