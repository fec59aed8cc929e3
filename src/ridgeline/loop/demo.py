"""``ridgeline demo``: the whole loop on the embedded defaults — the example traffic
pipeline (``data/demo-spec.yaml``: detector → car classifier and face model, real ONNX
models from the local zoo), profiled on this host's CPU, planned, served on 127.0.0.1,
verified at its demand, then taken through a demand step up and back down while the
controller reconfigures it live. ``run_demo`` returns the result; ``report.loop_html``
writes its HTML report (``REPORT`` in the output directory) and ``report.terminal`` its
five-line summary."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from ridgeline.aio import cancelled_on_signal, run_coroutine
from ridgeline.errors import HostTooSmall, RunInterrupted
from ridgeline.loop.run import LoopConfig, LoopResult, run_loop
from ridgeline.pipeline.spec import PipelineSpec, load_spec
from ridgeline.serve.controller import ReconfigEvent
from ridgeline.serve.loading import zoo_dir
from ridgeline.telemetry.store import RunStore

SHORT = LoopConfig(
    batches=(1, 4),
    profile_s=0.8,
    verify_s=4.0,
    verify_search=False,
    phases=((1.0, 4.0), (4.0, 6.0), (1.0, 6.0)),
)
"""A quick preset (tests, a first look): fewer points, shorter phases, no margin search.
Its phases after a change of demand are no longer than the settling seconds, so its
verdict judges the first phase alone (the summary says how many requests it judged)."""

REPORT = "report.html"
"""The report's file name in the output directory (as the run store records it)."""


def demo_spec() -> PipelineSpec:
    with resources.as_file(resources.files("ridgeline") / "data" / "demo-spec.yaml") as p:
        return load_spec(p)


def run_demo(
    out_dir: Path,
    *,
    spec: PipelineSpec | None = None,
    zoo: Path | None = None,
    cfg: LoopConfig | None = None,
    say: Callable[[str], None] = print,
    db: str | None = None,
    store: RunStore | None = None,
) -> LoopResult:
    """Run the loop; ``say`` gets its progress lines. The run, and every reconfiguration
    with its reason as it happens, go to the run store, with the path of the report
    (``out_dir / REPORT``, which ``report.loop_html.write_loop_report`` writes). Ctrl-C
    stops it cleanly: the servers stop, the run is stored as interrupted, and
    ``RunInterrupted`` names what was kept. ``store``: an open store to use (else the
    one at ``db``)."""
    spec = spec or demo_spec()
    stage = ["starting"]

    def told(line: str) -> None:
        if line.startswith("["):
            stage[0] = line
        say(line)

    with contextlib.nullcontext(store) if store is not None else RunStore(db) as store:
        run_id = store.create_run("demo", spec.name, {"out": str(out_dir), "spec": spec.name})
        events: list[dict[str, Any]] = []

        def logged(e: ReconfigEvent) -> None:
            events.append(asdict(e))
            store.finish_run(run_id, "running", "reconfiguring", {"reconfigurations": events})

        got: list[int] = []
        try:
            result = run_coroutine(
                cancelled_on_signal(
                    run_loop(spec, zoo or zoo_dir(), out_dir, cfg or LoopConfig(), told, logged),
                    got,
                )
            )
        except (KeyboardInterrupt, asyncio.CancelledError):
            kept = sorted(p.name for p in out_dir.glob("*")) if out_dir.exists() else []
            how = "SIGTERM" if got and got[-1] == signal.SIGTERM else "Ctrl-C"
            store.finish_run(
                run_id, "interrupted", f"{how} during {stage[0]}", {"reconfigurations": events}
            )
            raise RunInterrupted(
                run_id,
                f"interrupted during {stage[0]}; the servers are stopped; kept in "
                f"{out_dir}: {', '.join(kept) or 'nothing yet'}; run {run_id} in {store.path} "
                "is marked interrupted",
            ) from None
        except HostTooSmall as exc:  # the host's, not the plan's: INCONCLUSIVE
            store.finish_run(
                run_id,
                "complete",
                f"INCONCLUSIVE during {stage[0]}: {exc}",
                {"verdict": "INCONCLUSIVE", "reconfigurations": events},
            )
            raise
        except Exception as exc:  # a failure ends the run as failed, never left running
            store.finish_run(
                run_id,
                "failed",
                f"{type(exc).__name__} during {stage[0]}: {exc}",
                {"reconfigurations": events},
            )
            raise
        store.finish_run(
            run_id,
            "complete",
            None,
            {
                "verify": result.verified.to_json(),
                "verdict": result.verdict,
                "phases_judged": result.misses.judged,
                "phases_missed": result.misses.missed,
                "reconfigurations": events,
                "sent": result.sent,
                "answered": result.answered,
                "lost": result.lost,
                "report": str(out_dir / REPORT),
            },
        )
    return result
