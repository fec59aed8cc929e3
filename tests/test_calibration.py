"""The simulator calibrated to a served plan: each task's served batch time, the front
end and the spread fitted (``plansim.calibration``), measured against a served plan by
``ridgeline calibrate`` and applied by ``ridgeline simulate --calibrate-from``."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _cli import ridgeline
from _timing import running
from ridgeline.errors import ConfigError, PlanError, RunInterrupted
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loop.calibrate import Steps, calibrate, stored_calibration
from ridgeline.pipeline.plan import Plan, dump_plan
from ridgeline.plansim import SimConfig, simulate_plan
from ridgeline.plansim.calibration import (
    Calibration,
    Executed,
    HostFit,
    ServedLine,
    executed,
    fit_host,
    served_lines,
    served_ms,
)
from ridgeline.telemetry.store import RunStore
from ridgeline.workload.arrivals import parse_arrival

pytestmark = pytest.mark.timeout(120)


def synthetic(base_ms: float, per_item_ms: float, batch: int) -> dict[str, Any]:
    return {
        "variant": "synthetic",  # one variant for every task: lines are per task
        "synthetic": {"base_ms": base_ms, "per_item_ms": per_item_ms},
        "segment": {"kind": "cpu", "cores": 1},
        "batch_size": batch,
        "max_queue_delay_ms": 5,
        "instances": 1,
        "latency_budget_ms": 150,
    }


def three_tasks(demand_rps: float = 40.0) -> Plan:
    """detect → car (×2) and face (×1), synthetic."""
    return Plan.model_validate(
        {
            "name": "traffic",
            "slo_ms": 400,
            "demand_rps": demand_rps,
            "tasks": {
                "detect": synthetic(5, 1, 8),
                "car": synthetic(3, 0.5, 16),
                "face": synthetic(3, 0.5, 16),
            },
            "edges": [
                {"source": "detect", "target": "car", "factor": 2},
                {"source": "detect", "target": "face", "factor": 1},
            ],
        }
    )


# --- the model, in virtual time --------------------------------------------------------


def test_the_servers_counters_give_each_tasks_batches() -> None:
    increase = {
        'ridgeline_task_compute_seconds_sum{task="detect"}': 0.5,
        'ridgeline_task_compute_seconds_count{task="detect"}': 100.0,
        'ridgeline_task_batch_size_sum{task="detect"}': 250.0,
        'ridgeline_task_compute_seconds_bucket{le="0.005",task="detect"}': 40.0,
        'ridgeline_task_compute_seconds_count{task="face"}': 0.0,
        'ridgeline_requests_total{pipeline="traffic"}': 90.0,
    }
    got = executed(increase)
    assert got == {"detect": Executed(100.0, 0.5, 250.0)}
    assert got["detect"].mean_rows == 2.5
    assert got["detect"].mean_ms == pytest.approx(5.0)


def test_served_lines_pass_through_two_sizes_or_scale_the_model_through_one() -> None:
    """detect served 5 ms at 1 row and 11 ms at 3: the line 2 + 3·rows. car was seen at
    one size (2 rows, 8 ms) where its model (3 + 0.5·rows) says 4 ms: the model × 2.
    face ran no batch: left out, the simulator keeps its model."""
    steps = [
        {"detect": Executed(100, 0.5, 100), "car": Executed(10, 0.08, 20)},
        {"detect": Executed(50, 0.55, 150)},
    ]
    lines = served_lines(three_tasks(), steps)
    assert set(lines) == {"detect", "car"}
    assert lines["detect"].base_ms == pytest.approx(2.0)
    assert lines["detect"].per_row_ms == pytest.approx(3.0)
    assert lines["car"].base_ms == pytest.approx(6.0)
    assert lines["car"].per_row_ms == pytest.approx(1.0)
    assert "× 2.00" in lines["car"].source


def test_a_served_time_replaces_the_tasks_model_in_the_simulator() -> None:
    """Each task's batches take its served time, not its model's: at a rate where nothing
    queues and no spread, an answer takes detect's then the slower classifier's time."""
    plan = three_tasks()
    lines = {name: ServedLine(base_ms=10.0, per_row_ms=0.0, source="t") for name in plan.tasks}
    sparse = from_arrival(parse_arrival("constant", 1.0), 20.0, seed=0)
    cfg = SimConfig(noise_cv=0.0, served_ms=served_ms(lines), drop=False)
    r = simulate_plan(plan, sparse, cfg)
    # detect's 5 ms batching delay (1 row of 8) and 10 ms, then car and face side by
    # side: each waits out its delay (2 rows of 16, 1 of 16) and takes 10 ms
    assert r.latency_ms["p50"] == pytest.approx(5 + 10 + 5 + 10, abs=0.05)
    assert {t.service for t in r.tasks} == {"served (calibrated)"}
    with pytest.raises(PlanError, match="ghost"):
        simulate_plan(plan, sparse, SimConfig(served_ms={"ghost": (1.0, 1.0)}))


@pytest.mark.parametrize(("frontend_ms", "cv"), [(4.0, 0.4), (1.0, 0.15)])
def test_a_fit_finds_the_front_end_and_spread_a_simulated_server_was_served_with(
    frontend_ms: float, cv: float
) -> None:
    """A served step made by the simulator itself with a known front end and spread (on
    other arrivals and batch-time draws than the fit's): the fit finds both. One task,
    busy 40 % of the time: requests overlap, and a simulation is cheap."""
    plan = Plan.model_validate(
        {"name": "one", "slo_ms": 400, "tasks": {"detect": synthetic(5, 1, 8)}, "edges": []}
    )
    lines = {"detect": ServedLine(base_ms=4.0, per_row_ms=1.5, source="t")}
    rate = 60.0
    served = simulate_plan(
        plan,
        from_arrival(parse_arrival("poisson", rate), 5000 / rate, seed=21),
        SimConfig(seed=21, frontend_ms=frontend_ms, noise_cv=cv, served_ms=served_ms(lines)),
    ).latency_ms
    fit = fit_host(
        plan,
        lines,
        rate_rps=rate,
        p50_ms=served["p50"] or 0.0,
        p90_ms=served["p90"] or 0.0,
        cpu_cores=None,
        requests=5000,
    )
    assert fit.frontend_ms == pytest.approx(frontend_ms, abs=0.75)
    assert fit.noise_cv == pytest.approx(cv, abs=0.08)
    assert fit.p90_ms == pytest.approx(served["p90"] or 0.0, rel=0.03)


def test_a_fit_to_no_answers_or_another_plan_is_refused() -> None:
    plan = three_tasks()
    with pytest.raises(ConfigError, match="p90 ≥ p50"):
        fit_host(plan, {}, rate_rps=10, p50_ms=20, p90_ms=10, cpu_cores=None)
    fit = HostFit(frontend_ms=1, noise_cv=0.2, rate_rps=10, bare_p50_ms=9, p50_ms=10, p90_ms=12)
    other = Calibration(plan="other", lines={}, fit=fit, cpu_cores=2)
    with pytest.raises(ConfigError, match="measured on plan 'other'"):
        other.config(plan)
    mine = Calibration(plan="traffic", lines={}, fit=fit, cpu_cores=2)
    assert mine.config(plan, noise_cv=0.5).noise_cv == 0.5  # what the user gives wins
    assert mine.config(plan).cpu_cores == 2


# --- against a served plan, in real time -----------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The synthetic plan served by ``ridgeline serve`` in its own process: (its plan
    file, its pipeline's v2 HTTP URL)."""
    where = tmp_path_factory.mktemp("calibrate")
    path = where / "traffic.yaml"
    path.write_text(dump_plan(three_tasks()))
    cmd = [sys.executable, "-m", "ridgeline", "serve", str(path), "--port", "0"]
    with running([*cmd, "--grpc-port", "0"]) as stdout:
        line = stdout.wait_for("v2 HTTP", timeout=60)
        found = re.search(r"(http://\S+/v2/models/traffic)", line)
        assert found is not None, line
        yield path, found.group(1)


@pytest.mark.timeout(240)
def test_calibrate_stores_a_served_plans_calibration_and_simulate_applies_it(
    served: tuple[Path, str], tmp_path: Path
) -> None:
    path, url = served
    db = tmp_path / "runs.sqlite"
    res = ridgeline("calibrate", str(path), url, "--scale", "0.1", "--json", db=db, timeout=200)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    with RunStore(db) as store:
        run = store.get_run(got["run_id"])
        cal = stored_calibration(store, got["run_id"])
    assert run["kind"] == "calibrate" and run["status"] == "complete"
    assert [s["summary"]["sent"] > 0 for s in run["steps"]] == [True, True, True]
    assert set(cal.lines) == {"detect", "car", "face"}
    for name, base in (("detect", 5.0), ("car", 3.0), ("face", 3.0)):
        # a batch sleeps its model's time at least; the served time is that and the hops
        assert cal.lines[name].ms(1) >= 0.9 * base, cal.lines[name]
    assert cal.fit.rate_rps == pytest.approx(20.0, rel=0.25)
    assert cal.fit.p50_ms >= cal.fit.bare_p50_ms
    sim = ridgeline(
        "simulate", str(path), "--rate", "20", "--calibrate-from", str(got["run_id"]), "--json",
        db=db,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    tasks = json.loads(sim.stdout)["tasks"]
    assert {t["service"] for t in tasks.values()} == {"served (calibrated)"}
    wrong = ridgeline("simulate", str(path), "--rate", "20", "--calibrate-from", "999", db=db)
    assert wrong.returncode != 0 and "no run 999" in wrong.stderr


@pytest.mark.timeout(120)
async def test_a_calibration_stopped_keeps_its_steps_marked_interrupted(
    served: tuple[Path, str], tmp_path: Path
) -> None:
    """Stopped as its second step begins: the first step is stored, the run is marked
    interrupted and names itself, and there is no calibration to apply."""
    _, url = served
    stop = asyncio.Event()

    def say(line: str) -> None:
        if line.startswith("step 2/3"):
            stop.set()

    steps = Steps.for_demand(40.0, scale=0.05)
    with RunStore(tmp_path / "runs.sqlite") as store:
        with pytest.raises(RunInterrupted, match="stored as run") as stopped:
            await calibrate(
                three_tasks(),
                url,
                metrics_url=url.split("/v2/")[0] + "/metrics",
                store=store,
                steps=steps,
                cpu_cores=2,
                say=say,
                stop=stop,
            )
        run_id = stopped.value.run_id
        assert run_id is not None
        run = store.get_run(run_id)
        assert run["status"] == "interrupted"
        assert run["steps"][0]["summary"]["sent"] > 0
        with pytest.raises(Exception, match="holds no fit"):
            stored_calibration(store, run_id)


def test_calibrate_refuses_bad_inputs_and_stores_a_run_that_could_not_reach_its_server(
    tmp_path: Path,
) -> None:
    """A bad --scale or a plan without demand is refused before anything is sent; a
    server that does not answer fails the command with the connect check's message, and
    the run it opened is stored, marked failed, not left running."""
    path = tmp_path / "traffic.yaml"
    path.write_text(dump_plan(three_tasks()))
    db = tmp_path / "runs.sqlite"
    url = "http://127.0.0.1:9/v2/models/traffic"  # the discard port: nothing listens
    scale = ridgeline("calibrate", str(path), url, "--scale", "0", db=db)
    assert scale.returncode != 0 and "--scale must be > 0" in scale.stderr
    no_demand = tmp_path / "no-demand.yaml"
    no_demand.write_text(dump_plan(three_tasks().model_copy(update={"demand_rps": None})))
    demand = ridgeline("calibrate", str(no_demand), url, db=db)
    assert demand.returncode != 0 and "give --rate R" in demand.stderr
    bare = tmp_path / "no-times.yaml"  # no synthetic model, and no --profiles given
    plain = three_tasks()
    plain = plain.model_copy(
        update={
            "tasks": {n: t.model_copy(update={"synthetic": None}) for n, t in plain.tasks.items()}
        }
    )
    bare.write_text(dump_plan(plain))
    began = time.monotonic()
    untimed = ridgeline("calibrate", str(bare), url, db=db)
    assert untimed.returncode == 2 and "--profiles" in untimed.stderr, untimed.stderr
    assert time.monotonic() - began < 30  # said before the 3.5 minutes of load
    grpc = ridgeline("calibrate", str(path), "grpc://127.0.0.1:9/traffic", db=db)
    assert grpc.returncode != 0 and "give --metrics-url" in grpc.stderr
    down = ridgeline("calibrate", str(path), url, db=db)
    assert down.returncode != 0 and "connect" in down.stderr.lower()
    with RunStore(db) as store:
        (run,) = store.list_runs()
        assert (run["kind"], run["status"]) == ("calibrate", "failed")
