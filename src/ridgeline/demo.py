"""``ridgeline demo``: the best end-to-end job available so far — start the built-in fake
inference server on 127.0.0.1 and drive it open-loop over v2 HTTP and gRPC."""

from __future__ import annotations

from rich.console import Console

from ridgeline.display import step_table
from ridgeline.fakeserver import capacity_rps, load_preset, running_in_process
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, run_step
from ridgeline.telemetry.store import RunStore
from ridgeline.workload.arrivals import parse_arrival


def run_demo(
    duration_s: float = 5.0, db: str | None = None, console: Console | None = None
) -> None:
    con = console or Console()
    model = load_preset("default")
    capacity = capacity_rps(model)
    rate = round(0.7 * capacity)
    con.print(f"[bold]fake server[/]: preset 'default', modelled capacity {capacity:.0f} req/s")
    with running_in_process(model) as srv, RunStore(db) as store:
        for url in (srv.model_url, srv.grpc_url or ""):
            schedule = from_arrival(parse_arrival("poisson", rate), duration_s, seed=1)
            con.print(f"driving {url} open-loop at {rate} req/s (Poisson) for {duration_s:g} s")
            result = run_step(url, schedule, StepConfig(metrics_url=srv.metrics_url), store=store)
            con.print(step_table(result.summary, url))
    con.print(f"runs stored in {store.path}; `ridgeline runs list --db {store.path}` lists them")
