"""A plan simulation (``ridgeline simulate``) in the terminal: the end-to-end outcome,
one row per task, and where each task's batch times came from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ridgeline.loop.calibrate import CalibrationRun
    from ridgeline.plansim.result import PlanSimResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def simulation_report(r: PlanSimResult) -> Group:
    """The outcome (latency percentiles of the answered, violations, drops), the tasks,
    and the run's facts."""
    verdict = (
        "[green]no violations[/]"
        if r.violations == 0
        else f"[red]{r.violation_rate:.2%} violate the SLO[/]"
    )
    head = Table(
        title=f"simulated plan {r.plan} — {r.slo_ms:g} ms SLO, {verdict}", title_justify="left"
    )
    for col in ("latency (ms)", "mean", "p50", "p90", "p99", "p99.9"):
        head.add_column(col, justify="right")
    lat = r.latency_ms
    head.add_row("answered", *(_ms(lat[k]) for k in ("mean", "p50", "p90", "p99", "p999")))

    tasks = Table(
        title="tasks (ms/batch: base + per row; batch: mean rows; wait: mean queue wait)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("task", "segment", "inst", "ms/batch", "reqs", "drops", "batch", "busy"):
        left = col in ("task", "segment")
        tasks.add_column(col, justify="left" if left else "right", no_wrap=True)
    tasks.add_column("wait ms", justify="right", no_wrap=True)
    tasks.caption = "reqs: requests that reached the task's queue, each at most a batch"
    tasks.caption_justify = "left"
    for t in r.tasks:
        tasks.add_row(
            t.name,
            t.segment,
            str(t.instances),
            f"{t.base_ms:.3g}+{t.per_row_ms:.3g}n",
            f"{t.requests:,}",
            f"{t.drops:,}",
            f"{t.mean_batch:.2f}",
            f"{t.utilisation:.0%}",
            f"{t.mean_queue_wait_ms:.2f}",
        )
    segments = ", ".join(f"{n} × {label}" for label, n in r.segments.items())
    lines = [
        f"requests {r.requests:,}: answered {r.answered:,}, dropped {r.dropped:,} "
        f"({r.dropped_at_arrival:,} on arrival), late {r.late:,}; violations "
        f"{r.violations:,} ({r.violation_rate:.2%})",
        f"arrivals {r.arrivals}",
        f"segments {segments} ({r.cpu_cores} cores, {r.gpu_slices:g} GPU slices)",
        "batch times: "
        + "; ".join(f"{t.name} from {t.service}, cv {t.noise_cv:g}" for t in r.tasks),
        f"simulated {r.simulated_s:,.1f} s in {r.wall_s:,.2f} s "
        f"({r.requests_per_wall_minute:,.0f} requests a minute)",
    ]
    return Group(head, tasks, *(Text(line) for line in lines))


def calibration_report(done: CalibrationRun) -> Group:
    """A calibration (``ridgeline calibrate``): what each step measured, each task's served
    batch time, and the front end and spread fitted."""
    steps = Table(title="served steps (latency of the answered, ms)", title_justify="left")
    for col in ("step", "arrivals", "sent", "p50", "p90", "p99", "failed", "valid"):
        steps.add_column(col, justify="left" if col in ("step", "arrivals") else "right")
    for name, result in done.steps:
        s = result.summary
        lat = s.latency_ms
        steps.add_row(
            name,
            f"{s.offered_rps:.1f}/s",
            f"{s.sent:,}",
            _ms(lat.p50),
            _ms(lat.p90),
            _ms(lat.p99),
            f"{s.errors + s.timeouts + s.dropped:,}",
            "yes" if s.valid else f"no: {s.invalid_reason}",
        )
    tasks = Table(title="served batch times", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("task", "ms/batch", "from"):
        tasks.add_column(col, justify="left")
    for task, line in done.calibration.lines.items():
        tasks.add_row(task, f"{line.base_ms:.2f} + {line.per_row_ms:.2f}n", line.source)
    fit = done.calibration.fit
    said = Text(
        f"fitted at {fit.rate_rps:.1f} req/s: front end {fit.frontend_ms:.2f} ms, batch-time "
        f"spread (CV) {fit.noise_cv:.2f}; simulated there p50 {fit.p50_ms:.1f} ms, p90 "
        f"{fit.p90_ms:.1f} ms; on {done.calibration.cpu_cores} cores"
    )
    return Group(steps, tasks, said)
