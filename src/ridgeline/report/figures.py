"""The report's plotly figures, one function each, all from a ``RunView``."""

from __future__ import annotations

import plotly.graph_objects as go  # type: ignore[import-untyped]

from ridgeline.report._view import STATES, RunView, WindowView, step_label

COLOURS = {
    "healthy": "#2e7d32",
    "warn": "#f9a825",
    "unhealthy": "#ef6c00",
    "overloaded": "#c62828",
    "critical": "#6a1b9a",
    "warmup": "#9e9e9e",
    "unassessed": "#bdbdbd",
}
_LAYOUT = {
    "template": "plotly_white",
    "height": 380,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
    "legend": {"orientation": "h", "y": -0.2},
}


def _figure(title: str, x: str, y: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, **_LAYOUT)
    return fig


def latency_vs_rate(view: RunView) -> go.Figure:
    """(a) p50 and p99 latency (from the scheduled send) against each step's offered rate."""
    fig = _figure("Latency vs offered rate, per step", "offered rate (req/s)", "latency (ms)")
    steps = sorted(view.steps, key=lambda s: s.summary.offered_rps)
    rates = [s.summary.offered_rps for s in steps]
    labels = [step_label(s.index) for s in steps]
    for name in ("p50", "p99"):
        ys = [getattr(s.summary.latency_ms, name) for s in steps]
        fig.add_trace(go.Scatter(x=rates, y=ys, name=name, mode="lines+markers", text=labels))
    return fig


def throughput_vs_rate(view: RunView) -> go.Figure:
    """(b) achieved against offered throughput per step, beside the line achieved = offered."""
    fig = _figure("Offered vs achieved throughput, per step", "offered (req/s)", "achieved (req/s)")
    steps = sorted(view.steps, key=lambda s: s.summary.offered_rps)
    rates = [s.summary.offered_rps for s in steps]
    achieved = [s.summary.achieved_rps for s in steps]
    top = max([*rates, *achieved], default=1.0)
    fig.add_trace(
        go.Scatter(
            x=rates,
            y=achieved,
            name="achieved",
            mode="lines+markers",
            text=[step_label(s.index) for s in steps],
        )
    )
    # drawn last, over the data: where the server keeps up, achieved lies on it and
    # covered it when drawn first
    fig.add_trace(
        go.Scatter(
            x=[0, top],
            y=[0, top],
            name="achieved = offered",
            mode="lines",
            line={"dash": "dash", "color": "#424242", "width": 2},
        )
    )
    return fig


def _state(w: WindowView) -> str:
    return w.state or "unassessed"


def health_timeline(view: RunView) -> go.Figure:
    """(c) every window's health state in time order; excluded (warmup) windows shaded."""
    fig = _figure("Health state per window", "time since the run began (s)", "state")
    order = ["unassessed", "warmup", *STATES]  # bottom to top of the axis
    present = [s for s in order if any(_state(w) == s for w in view.windows)]
    for state in present:
        mine = [w for w in view.windows if _state(w) == state]
        fig.add_trace(
            go.Scatter(
                x=[w.t_s for w in mine],
                y=[state] * len(mine),
                name=state,
                mode="markers",
                marker={"color": COLOURS[state], "symbol": "square", "size": 10},
                text=[
                    f"{step_label(w.step)}, window {w.window.index}, score "
                    + ("-" if w.window.score is None else f"{w.window.score:.2f}")
                    for w in mine
                ],
            )
        )
    for w in view.windows:
        if w.window.excluded:
            fig.add_vrect(
                x0=w.t_s,
                x1=w.t_s + w.window.end_s - w.window.start_s,
                fillcolor=COLOURS["warmup"],
                opacity=0.2,
                line_width=0,
            )
    for s in view.steps[1:]:
        fig.add_vline(x=s.start_s, line={"dash": "dot", "color": "#bdbdbd", "width": 1})
    fig.update_yaxes(categoryorder="array", categoryarray=[s for s in order if s in present])
    return fig


def trajectory(view: RunView) -> go.Figure:
    """(d) the rate of each search step coloured by its verdict, and the estimate with its CI."""
    fig = _figure("Search trajectory", "search step", "offered rate (req/s)")
    probe = view.probe
    points = probe.trajectory if probe is not None else []
    if probe is not None and probe.ci_low is not None and probe.ci_high is not None:
        fig.add_hrect(
            y0=probe.ci_low, y1=probe.ci_high, fillcolor="#1565c0", opacity=0.15, line_width=0
        )
    if probe is not None and probe.capacity_rps is not None:
        fig.add_hline(
            y=probe.capacity_rps,
            line={"color": "#1565c0", "width": 2},
            annotation_text=f"estimate {probe.capacity_rps:,.1f} req/s",
        )
    fig.add_trace(
        go.Scatter(
            x=list(range(1, len(points) + 1)),
            y=[p.rate for p in points],
            mode="lines",
            line={"color": "#bdbdbd"},
            showlegend=False,
        )
    )
    for state in [*STATES, "unassessed"]:
        mine = [(k, p) for k, p in enumerate(points, 1) if (p.state or "unassessed") == state]
        if not mine:
            continue
        fig.add_trace(
            go.Scatter(
                x=[k for k, _ in mine],
                y=[p.rate for _, p in mine],
                name=state,
                mode="markers",
                marker={
                    "color": COLOURS.get(state, COLOURS["unassessed"]),
                    "size": 11,
                    "symbol": ["circle" if p.valid else "x" for _, p in mine],
                },
                text=[f"{p.purpose}: {p.reason}" if p.reason else p.purpose for _, p in mine],
            )
        )
    return fig


def over_time(view: RunView) -> tuple[go.Figure, go.Figure]:
    """Throughput and latency over the windows, for a run without a search."""
    ts = [w.t_s for w in view.windows]
    thr = _figure("Throughput per window", "time (s)", "req/s")
    thr.add_trace(go.Scatter(x=ts, y=[w.window.offered_rps for w in view.windows], name="offered"))
    thr.add_trace(
        go.Scatter(x=ts, y=[w.window.achieved_rps for w in view.windows], name="achieved")
    )
    lat = _figure("Latency per window", "time (s)", "latency (ms)")
    for name in ("p50", "p99"):
        ys = [getattr(w.window.latency_ms, name) for w in view.windows]
        lat.add_trace(go.Scatter(x=ts, y=ys, name=name, mode="lines+markers"))
    return thr, lat
