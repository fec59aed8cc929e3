"""Terminal output: tables for step results and runs, and a live progress line."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ridgeline.loadgen.replayer import Progress
from ridgeline.telemetry.summary import Percentiles, StepSummary

if TYPE_CHECKING:
    from ridgeline.probe.orchestrator import ProbeResult
    from ridgeline.search.base import StepPlan, StepVerdict


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct_row(name: str, p: Percentiles) -> list[str]:
    return [name, _ms(p.p50), _ms(p.p90), _ms(p.p99), _ms(p.p999), _ms(p.max)]


def step_table(s: StepSummary, title: str = "step") -> Table:
    verdict = "[green]valid[/]" if s.valid else f"[red]INVALID[/]: {s.invalid_reason}"
    t = Table(title=f"{title} — {verdict}", title_justify="left")
    for col in ("latency (ms)", "p50", "p90", "p99", "p99.9", "max"):
        t.add_column(col, justify="right")
    t.add_row(*_pct_row("from schedule", s.latency_ms))
    t.add_row(*_pct_row("from send", s.latency_from_send_ms))
    t.add_row(*_pct_row("lateness", s.lateness_ms))
    if s.ttft_ms is not None:
        t.add_row(*_pct_row("time to 1st token", s.ttft_ms))
    if s.itl_ms is not None:
        t.add_row(*_pct_row("inter-token", s.itl_ms))
    t.caption = (
        f"offered {s.offered_rps:.1f}/s  achieved {s.achieved_rps:.1f}/s  "
        f"sent {s.sent}  ok {s.ok}  errors {s.errors}  timeouts {s.timeouts}  "
        f"dropped {s.dropped}  error rate {s.error_rate:.2%}"
        + (f"  run {s.run_id}" if s.run_id is not None else "")
    )
    t.caption_justify = "left"
    return t


def runs_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="runs")
    for col in ("id", "kind", "target", "status", "steps", "started"):
        t.add_column(col)
    for r in rows:
        started = datetime.fromtimestamp(r["started_at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        status = r["status"] + (f" ({r['status_reason']})" if r["status_reason"] else "")
        t.add_row(str(r["id"]), r["kind"], r["target"], status, str(r["steps"]), started)
    return t


@contextmanager
def live_progress(progress: Progress, console: Console, enabled: bool) -> Iterator[None]:
    """A one-line progress display on ``console`` while a replay runs (if enabled)."""
    if not enabled:
        yield
        return
    done = threading.Event()

    def show() -> None:
        with console.status("") as status:
            while not done.wait(0.25):
                status.update(
                    f"sent {progress.sent}/{progress.total}  answered {progress.answered}"
                    f"  failed {progress.failed}"
                )

    th = threading.Thread(target=show, daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join(timeout=1)


def probe_line(console: Console) -> Callable[[int, StepPlan, StepVerdict], None]:
    """A progress line per finished step: step, purpose, rate, state, p99."""

    def show(index: int, plan: StepPlan, v: StepVerdict) -> None:
        colour = {"healthy": "green", "warn": "yellow"}.get(v.state.value, "red")
        p99 = "-" if v.p99_ms is None else f"{v.p99_ms:.1f} ms"
        console.print(
            f"step {index:>3}  {plan.purpose or 'step':<9} {plan.rate:>10.1f}/s  "
            f"[{colour}]{v.state.value:<10}[/] score {v.score:5.2f}  p99 {p99}"
            + ("" if v.valid else "  [red]invalid[/]"),
            highlight=False,
        )

    return show


def probe_table(r: ProbeResult) -> Table:
    t = Table(title=f"probe {r.target} — {r.slo}", title_justify="left", show_header=False)
    cap = "none" if r.capacity_rps is None else f"{r.capacity_rps:,.1f} req/s"
    ci = "-" if r.ci_low is None or r.ci_high is None else f"[{r.ci_low:,.1f}, {r.ci_high:,.1f}]"
    rows = [
        ("capacity", cap),
        ("interval", ci),
        ("strategy", r.strategy),
        ("steps", str(r.steps)),
        ("test-seconds", f"{r.test_seconds:,.0f}"),
        ("warmup excluded", f"{r.warmup_excluded_s:,.0f} s"),
        ("confirmed", "-" if r.confirmed is None else str(r.confirmed).lower()),
        ("valid", str(r.valid).lower()),
        ("status", r.status),
        ("run", str(r.run_id)),
    ]
    if r.reason:
        rows.append(("reason", r.reason))
    for k, v in rows:
        t.add_row(k, v)
    return t
