"""A plan simulation (``ridgeline simulate``) in the terminal: the end-to-end outcome,
one row per task, and where each task's batch times came from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
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
