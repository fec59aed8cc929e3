"""All terminal output: a run's summary (the report's header and a probe's search path),
tables for step results, runs, probes, plans, profiles, allocations, the registry and the
model zoo, a live progress line, and the demo's five-line summary."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ridgeline.report._view import facts, server_lines, token_facts, view_of

if TYPE_CHECKING:
    from ridgeline.analysis.repeats import Repeatability
    from ridgeline.loadgen.replayer import Progress
    from ridgeline.loop.profiling import Modelled
    from ridgeline.loop.run import LoopResult
    from ridgeline.pipeline.planner import PlanResult
    from ridgeline.pipeline.profiles import ProfileTable
    from ridgeline.probe.orchestrator import ProbeResult
    from ridgeline.search.base import StepPlan, StepVerdict
    from ridgeline.sizing.allocator import Allocation
    from ridgeline.sizing.registry import RegistryEntry
    from ridgeline.telemetry.summary import Percentiles, StepSummary
    from ridgeline.zoo.manifest import Manifest


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


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct_row(name: str, p: Percentiles) -> list[str]:
    return [name, _ms(p.p50), _ms(p.p90), _ms(p.p99), _ms(p.p999), _ms(p.max)]


def step_table(s: StepSummary, title: str = "step") -> Group:
    """A step's latency table, its title and counts above and below it at the console's
    width (a table's own title and caption wrap at the table's), and what the server's
    metrics said, when scraped."""
    verdict = "[green]valid[/]" if s.valid else f"[red]INVALID[/]: {escape(s.invalid_reason or '')}"
    t = Table()
    for col in ("latency (ms)", "p50", "p90", "p99", "p99.9", "max"):
        t.add_column(col, justify="right")
    t.add_row(*_pct_row("from schedule", s.latency_ms))
    t.add_row(*_pct_row("from send", s.latency_from_send_ms))
    t.add_row(*_pct_row("lateness", s.lateness_ms))
    for label, p in (
        ("TTFT from schedule", s.ttft_ms),
        ("TTFT from send", s.ttft_from_send_ms),
        ("ITL (every gap)", s.itl_ms),
        ("TPOT (per request)", s.tpot_ms),
    ):
        if p is not None:
            t.add_row(*_pct_row(label, p))
    counts = (
        f"offered {s.offered_rps:.1f}/s  achieved {s.achieved_rps:.1f}/s  "
        f"sent {s.sent}  ok {s.ok}  errors {s.errors}  timeouts {s.timeouts}  "
        f"dropped {s.dropped}  error rate {s.error_rate:.2%}"
        + (f"  run {s.run_id}" if s.run_id is not None and s.run_id > 0 else "")
        + ("  run not yet stored" if s.run_id is not None and s.run_id < 0 else "")
    )
    tokens = "  ".join(
        f"{k} {v}" for k, v in token_facts(s) if not k.startswith(("TTFT", "ITL", "TPOT"))
    )
    parts: list[Text | Table] = [Text.from_markup(f"{escape(title)} — {verdict}"), t, Text(counts)]
    if tokens:
        parts.append(Text(tokens))
    if s.server is not None:
        head, *lines = server_lines(s.server)
        parts += [Text(head, style="bold"), *(Text(f"  {line}") for line in lines)]
    return Group(*parts)


def runs_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="runs")
    for col in ("id", "kind", "target", "status", "steps", "started"):
        # a narrow terminal folds a URL or a reason onto more lines, never cuts it
        t.add_column(col, overflow="fold" if col in ("target", "status") else "ellipsis")
    for r in rows:
        started = datetime.fromtimestamp(r["started_at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        status = r["status"] + (f" ({r['status_reason']})" if r["status_reason"] else "")
        t.add_row(str(r["id"]), r["kind"], r["target"], status, str(r["steps"]), started)
    return t


@contextmanager
def live_progress(
    progress: Progress, console: Console, enabled: bool, started: str | None = None
) -> Iterator[None]:
    """A one-line progress display on ``console`` while a replay runs (if enabled); else
    ``started``, once, when the replay sends its first request (a log, not a terminal:
    a minute of silence reads as a hang)."""
    if not enabled and started is None:
        yield
        return
    done = threading.Event()

    def show() -> None:
        if not enabled:
            while not done.wait(0.25):
                if progress.sent:
                    console.print(started, highlight=False, soft_wrap=True)
                    return
            return
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


def _bound(ms: float) -> str:
    return f"{ms:.1f}" if math.isfinite(ms) else "∞"


def probe_line(console: Console) -> Callable[[int, StepPlan, StepVerdict], None]:
    """A progress line per finished step: step, purpose, rate, state, e2e p99, the judged
    bound's interval (named when a token bound), samples."""

    def show(index: int, plan: StepPlan, v: StepVerdict) -> None:
        colour = {"healthy": "green", "warn": "yellow"}.get(v.state.value, "red")
        p99 = "-" if v.p99_ms is None else f"{v.p99_ms:.1f} ms"
        interval = ""
        if v.interval_ms is not None:
            lo, hi = v.interval_ms
            interval = f" [{_bound(lo)}, {_bound(hi)}]"
            if "_" in v.judged:  # a token bound (itl_p99): name it beside the e2e p99
                interval = f"  {v.judged}{interval}"
        console.print(
            f"step {index:>3}  {plan.purpose or 'step':<9} {plan.rate:>10.1f}/s  "
            f"[{colour}]{v.state.value:<10}[/] score {v.score:5.2f}  p99 {p99}{interval}  "
            f"n={v.samples:,} beyond={v.beyond}"
            + ("" if v.valid else "  [red]invalid[/]")
            + ("" if v.decided else "  [yellow]undecided: again, longer[/]"),
            highlight=False,
            soft_wrap=True,
        )

    return show


LONG_STEP_S = 30.0
"""A step at least this long is announced as it starts: the line it ends with may be
minutes away."""


def probe_start(console: Console) -> Callable[[int, StepPlan], None]:
    """A line as a warmup step or a long step starts: what it is, how long, how many
    requests (a warmup step ends with no verdict to tell, and the steps after it are
    numbered on from it, as ``runs show`` and the report number them)."""

    def show(index: int, plan: StepPlan) -> None:
        if plan.duration_s >= LONG_STEP_S or plan.purpose == "warmup":
            console.print(
                f"step {index:>3}  {plan.purpose or 'step':<9} {plan.rate:>10.1f}/s  "
                f"running {plan.duration_s:,.0f} s (~{plan.rate * plan.duration_s:,.0f} "
                "requests) …",
                highlight=False,
                soft_wrap=True,
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
        ("test-seconds", f"{r.test_seconds:,.0f} (warmup included)"),
        ("requests sent", f"{r.requests_sent:,}"),
        ("wall time", _wall(r)),
        ("warmup excluded", f"{r.warmup_excluded_s:,.0f} s"),
        ("confirmed", "-" if r.confirmed is None else str(r.confirmed).lower()),
        ("valid", str(r.valid).lower()),
        ("status", r.status),
        ("run", "not yet stored" if r.run_id is not None and r.run_id < 0 else str(r.run_id)),
    ]
    if r.at_capacity is not None:
        rows[1:1] = [(f"at it: {k}", v) for k, v in token_facts(r.at_capacity)]
    if r.reason:
        rows.append(("reason", r.reason))
    for k, v in rows:
        t.add_row(k, v)
    return t


def repeatability_table(r: Repeatability, target: str) -> Table:
    t = Table(title=f"repeated probes of {target}", title_justify="left", show_header=False)
    rows = [
        ("runs", str(r.n)),
        ("capacity mean", f"{r.mean:,.1f} req/s"),
        ("SD", f"{r.sd:,.1f} req/s"),
        ("CV", f"{r.cv:.2%}"),
        ("range", f"{r.low:,.1f} .. {r.high:,.1f} req/s"),
    ]
    if r.agreement is not None:
        a = r.agreement
        rows += [
            ("bias", f"{a.bias:+.2%}"),
            ("95 % limits of agreement", f"[{a.low:+.2%}, {a.high:+.2%}]"),
        ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def plan_table(r: PlanResult) -> Table:
    t = Table(title=f"plan: {r.spec.name} at {r.spec.demand_rps:g} req/s", title_justify="left")
    for col in ("task", "variant", "segment", "batch", "instances", "latency ms", "busy"):
        t.add_column(col, justify="right" if col not in ("task", "variant", "segment") else "left")
    for name, p in r.tasks.items():
        row = p.config.row
        t.add_row(
            name,
            p.variant,
            f"{row.pool} {row.segment}",
            str(row.batch),
            str(p.instances),
            f"{p.latency_ms:.1f}",
            f"{p.utilisation:.0%}",
        )
    used = "; ".join(_pool_use(r, pool) for pool in r.slices)
    worst = max(r.path_latency_ms.values())
    t.caption = (
        f"{used}; accuracy {r.accuracy:.3f} of the best (floor "
        f"{r.spec.accuracy_floor:g}); slowest path {worst:.1f} ms of {r.spec.slo_ms:g}; "
        f"features {r.features.label}; solved in {r.solve_s * 1000:.0f} ms"
    )
    t.caption_justify = "left"
    return t


def _pool_use(r: PlanResult, pool: str) -> str:
    """What a plan takes of one pool: cores, or compute slices, memory slices and cost."""
    if pool not in r.memory_slices:
        return f"{r.slices[pool]:g} of {r.available[pool]:g} cores"
    return (
        f"{pool}: {r.slices[pool]:g} of {r.available[pool]:g} compute slices, "
        f"{r.memory_slices[pool]:g} memory slices, cost {r.cost[pool]:g}"
    )


def measured_table(table: ProfileTable) -> Table:
    measured = [r for r in table if r.source == "measured"]
    t = Table(title=f"measured on this host's CPU ({len(measured)} rows)", title_justify="left")
    for col in ("variant", "segment", "batch", "latency ms", "rows/s"):
        t.add_column(col, justify="left" if col in ("variant", "segment") else "right")
    for r in measured:
        rate = f"{r.throughput_rps:,.1f}"
        t.add_row(r.variant, r.segment, str(r.batch), f"{r.latency_ms:.2f}", rate)
    return t


def profile_summary(modelled: Modelled | None, out_path: Path) -> str:
    note = f"written to {out_path}"
    if modelled is None:
        return note
    pools: dict[str, dict[str, None]] = {}  # by source, the pools in order
    for r in modelled.rows:
        pools.setdefault(r.source, {})[r.pool] = None
    kinds = "; ".join(
        f"{sum(r.source == source for r in modelled.rows)} {source} on {', '.join(names)}"
        for source, names in pools.items()
    )
    cpu = (
        f"this host's CPU runs ×{modelled.cpu_factor:.3g} its roofline by {modelled.basis} "
        "measured rows (not carried over to GPUs)"
        if modelled.basis
        else "no measured row's model has known FLOPs to compare the CPU roofline with"
    )
    return f"{len(modelled.rows)} GPU rows ({kinds or 'none'}); {cpu}; {note}"


def allocation_table(a: Allocation) -> Table:
    t = Table(title="allocation", title_justify="left", show_header=False)
    t.add_column("what", style="dim")
    t.add_column("value", justify="right")
    i, n, s = a.inputs, a.naive, a.overprovisioning_avoided
    t.add_row("demand × (1 + headroom)", f"{a.planned_rps:,.1f} req/s")
    t.add_row("per replica (capacity × calibration)", f"{a.per_replica_rps:,.1f} req/s")
    t.add_row("replicas", str(a.replicas))
    t.add_row("GPUs", f"{a.gpus:g}")
    t.add_row("utilisation at peak", f"{a.utilisation_at_peak:.0%}")
    t.add_row(
        f"naive: peak at {n.rule.target_utilisation:.0%} of max {n.max_throughput_rps:,.1f} req/s",
        f"{n.replicas} replicas, {n.gpus:g} GPUs",
    )
    t.add_row("GPUs avoided vs naive", f"{s.gpus:g} ({s.fraction:.0%}), {s.replicas} replicas")
    t.caption = f"{i.demand_rps:,.1f} req/s at {i.capacity_rps:,.1f} req/s per replica"
    t.caption_justify = "left"
    return t


def entries_table(entries: list[RegistryEntry]) -> Table:
    t = Table(title="registry", title_justify="left")
    for col in ("model", "version", "rev", "hardware", "capacity", "CI", "SLO", "run", "created"):
        t.add_column(col)
    for e in entries:
        c = e.capacity
        ci = "-" if c.ci_low is None or c.ci_high is None else f"{c.ci_low:.1f}–{c.ci_high:.1f}"
        t.add_row(
            Text(e.model),
            Text(e.version),
            str(e.revision),
            Text(e.hardware),
            f"{c.capacity_rps:,.1f} req/s",
            ci,
            Text(c.slo),
            "-" if c.run_id is None else str(c.run_id),
            e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    return t


def zoo_table(manifest: Manifest, families: list[str] | None = None) -> Table:
    t = Table(title="model zoo", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("variant", "left"),
        ("GFLOPs/item", "right"),
        ("params", "right"),
        ("file", "right"),
        ("published accuracy", "right"),
        ("metric", "left"),
    ]
    for name, justify in columns:
        t.add_column(name, justify=justify)
    for v in manifest.variants:
        if families and v.family not in families:
            continue
        acc = v.accuracy
        t.add_row(
            v.name,
            f"{v.gflops_per_item:.3f}",
            f"{v.params / 1e6:.2f} M",
            f"{v.size_bytes / 2**20:.1f} MiB",
            f"{acc.value:g}" if acc else "-",
            acc.metric if acc else "none published",
        )
    return t


def demo_summary(r: LoopResult, report: Path) -> list[str]:
    """Six lines: the plan, the verify verdict, the reconfiguration, requests, the loop's
    verdict (verify's, then the demand phases as their users saw them), report."""
    tasks = ", ".join(f"{t} {p.variant}×{p.instances}" for t, p in r.planned.tasks.items())
    peak = max((sum(e.instances.values()) for e in r.events), default=0)
    return [
        f"plan: {tasks} on {r.planned.slices_used:g} cores, accuracy "
        f"{r.planned.accuracy:.3f} of the best",
        f"verify: {r.verified.summary()}",
        f"reconfigure: {len(r.events)} re-plans, {sum(1 for e in r.events if e.applied)} "
        f"of them changing the served tasks, up to {peak} instances in all",
        f"requests: {r.counts()}",
        f"verdict: {r.verdict}: {r.misses.describe(r.settle_s)}{_why(r)}",
        f"report: {report}",
    ]


def _why(r: LoopResult) -> str:
    """What decided a verdict other than the demand phases' share."""
    if r.lost:
        return f"; {r.lost} requests got no answer at all"
    if r.verified.verdict != "PASS":
        return f"; verify at the demand said {r.verified.verdict}"
    if r.verdict == "INCONCLUSIVE":
        return f"; the host was too busy to measure ({r.misses.invalid}): run it on a quieter host"
    return ""


def _wall(r: ProbeResult) -> str:
    """The probe's seconds as a budget counts them, and its budget when it had one."""
    spent = f"{r.wall_s / 60:,.1f} min" if r.wall_s >= 120 else f"{r.wall_s:,.0f} s"
    return spent if r.budget_s is None else f"{spent} of a {r.budget_s:g} s budget"
