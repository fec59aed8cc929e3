"""``ridgeline demo``: the whole loop on the embedded defaults — the example traffic
pipeline (``data/demo-spec.yaml``: detector → car classifier and face model, real ONNX
models from the local zoo), profiled on this host's CPU, planned, served on 127.0.0.1,
verified at its demand, then taken through a demand step up and back down while the
controller reconfigures it live; one HTML report and a five-line summary at the end."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from rich.console import Console

from ridgeline.loadgen.runloop import run_coroutine
from ridgeline.loop import LoopConfig, LoopResult, run_loop
from ridgeline.loop_report import write_loop_report
from ridgeline.pipeline.spec import PipelineSpec, load_spec
from ridgeline.serve.loading import zoo_dir

SHORT = LoopConfig(
    batches=(1, 4),
    profile_s=0.8,
    verify_s=4.0,
    verify_search=False,
    phases=((1.0, 4.0), (4.0, 6.0), (1.0, 6.0)),
)
"""A quick preset (tests, a first look): fewer points, shorter phases, no margin search."""


def demo_spec() -> PipelineSpec:
    with resources.as_file(resources.files("ridgeline") / "data" / "demo-spec.yaml") as p:
        return load_spec(p)


def run_demo(
    out_dir: Path,
    *,
    spec: PipelineSpec | None = None,
    zoo: Path | None = None,
    cfg: LoopConfig | None = None,
    console: Console | None = None,
) -> tuple[LoopResult, Path]:
    """Run the loop; the result and the report's path."""
    con = console or Console()
    result = run_coroutine(
        run_loop(spec or demo_spec(), zoo or zoo_dir(), out_dir, cfg or LoopConfig(), con.print)
    )
    report = write_loop_report(result, out_dir / "report.html")
    for line in summary(result, report):
        con.print(line)
    return result, report


def summary(r: LoopResult, report: Path) -> list[str]:
    """Five lines: the plan, the verify verdict, the reconfiguration, requests, report."""
    tasks = ", ".join(f"{t} {p.variant}×{p.instances}" for t, p in r.planned.tasks.items())
    peak = max((sum(e.instances.values()) for e in r.events), default=0)
    return [
        f"plan: {tasks} on {r.planned.slices_used:g} cores, accuracy "
        f"{r.planned.accuracy:.3f} of the best",
        f"verify: {r.verified.summary()}",
        f"reconfigure: {len(r.events)} changes, up to {peak} instances in all",
        f"requests: {r.sent} sent, {r.answered} answered, {r.lost} lost",
        f"report: {report}",
    ]
