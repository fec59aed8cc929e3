"""``allocate``, ``registry`` and ``report`` as the main app mounts them, through CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from ridgeline.cli.runs import report_command
from ridgeline.cli.sizing import allocate_command, registry_app
from ridgeline.sizing import CapacityResult, Registry
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows

app = typer.Typer()
app.command("allocate")(allocate_command)
app.add_typer(registry_app, name="registry")
app.command("report")(report_command)

runner = CliRunner(env={"COLUMNS": "200"})


def test_allocate_json_prints_replicas_gpus_and_what_was_avoided() -> None:
    res = runner.invoke(
        app, ["allocate", "--capacity-rps", "120", "--demand-rps", "1000", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["replicas"], out["gpus"]) == (10, 10.0)
    assert out["overprovisioning_avoided"]["gpus"] == 3.0
    assert out["naive"]["replicas"] == 13


def test_allocate_takes_the_naive_rule_and_gpu_shares_from_options() -> None:
    res = runner.invoke(
        app,
        [
            "allocate",
            "--capacity-rps", "100",
            "--demand-rps", "300",
            "--headroom", "0",
            "--gpus-per-replica", "0.5",
            "--fractional-gpus",
            "--naive-max-rps", "200",
            "--naive-utilisation", "0.25",
            "--json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["replicas"], out["gpus"]) == (3, 1.5)
    assert (out["naive"]["replicas"], out["naive"]["gpus"]) == (6, 3.0)


def test_allocate_prints_a_table_by_default() -> None:
    res = runner.invoke(app, ["allocate", "--capacity-rps", "120", "--demand-rps", "1000"])
    assert res.exit_code == 0, res.output
    assert "replicas" in res.stdout
    assert "3 (23%), 3 replicas" in res.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--capacity-rps", "0", "--demand-rps", "10"], "capacity_rps"),
        (["--capacity-rps", "10", "--demand-rps", "-5"], "demand_rps"),
        (["--capacity-rps", "10", "--demand-rps", "5", "--headroom", "-1"], "headroom"),
        (["--capacity-rps", "10", "--demand-rps", "5", "--calibration", "0"], "calibration"),
        (["--capacity-rps", "10", "--demand-rps", "5", "--naive-utilisation", "2"], "target_util"),
    ],
)
def test_a_bad_allocate_option_exits_2_naming_it(args: list[str], field: str) -> None:
    res = runner.invoke(app, ["allocate", *args])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ")
    assert field in res.stderr


def test_registry_list_and_show_read_the_store(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    with RunStore(db) as store, Registry(store) as reg:
        for version, rps in (("1", 100.0), ("2", 140.0)):
            reg.register(
                "bert",
                version,
                artifact=f"sha256:{version * 8}",
                hardware="A10G",
                capacity=CapacityResult(
                    capacity_rps=rps, slo="p99<50ms", strategy="binary", run_id=4
                ),
                serving_config={"batch": 4},
            )
    listed = runner.invoke(app, ["registry", "list", "--db", str(db), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [e["version"] for e in json.loads(listed.stdout)] == ["1", "2"]
    latest = runner.invoke(app, ["registry", "show", "bert", "--db", str(db), "--json"])
    assert json.loads(latest.stdout)["capacity"]["capacity_rps"] == 140.0
    first = runner.invoke(app, ["registry", "show", "bert", "1", "--db", str(db)])
    assert first.exit_code == 0, first.output
    assert "100.0 req/s" in first.stdout
    assert "sha256:11111111" in first.stdout
    table = runner.invoke(app, ["registry", "list", "--model", "bert", "--db", str(db)])
    assert "140.0 req/s" in table.stdout
    missing = runner.invoke(app, ["registry", "show", "gpt", "--db", str(db)])
    assert missing.exit_code == 2
    assert "registered models are: bert" in missing.stderr


def test_report_writes_the_page_beside_you_and_prints_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "runs.sqlite"
    rec = Records.empty(np.arange(30) / 15.0)
    rec.sent[:] = rec.scheduled
    rec.done[:] = rec.scheduled + 0.005
    rec.outcome[:] = int(Outcome.OK)
    with RunStore(db) as store:
        run_id = store.create_run("run", "null://", {"rate": 15})
        summary = summarize(rec, 2.0, valid=True, invalid_reason=None)
        store.add_step(run_id, 0, summary, windows(rec, 2.0))
        store.finish_run(run_id, "complete")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["report", str(run_id), "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / f"ridgeline-run-{run_id}.html").is_file()
    assert f"report written to ridgeline-run-{run_id}.html" in res.stdout
    assert "offered 15.0 req/s" in res.stdout
    out = tmp_path / "sub" / "r.html"
    assert (
        runner.invoke(app, ["report", str(run_id), "--db", str(db), "--out", str(out)]).exit_code
        == 0
    )
    assert out.is_file()
    unknown = runner.invoke(app, ["report", "99", "--db", str(db)])
    assert unknown.exit_code == 2
    assert "runs list" in unknown.stderr
