"""``ridgeline study``: validation studies of the probe against simulated servers whose
capacity is known (``vanguard``), and the JigsawServe reproduction of the planner's
features (``jigsaw``)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import err, failing

app = typer.Typer(
    help="Studies: how far a probe's estimate can be trusted (vanguard); what each "
    "JigsawServe feature buys the planner (jigsaw).",
    no_args_is_help=True,
)


def _commit() -> str | None:
    """The checkout's commit, when run from one."""
    try:
        run = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return None
    return run.stdout.strip() or None if run.returncode == 0 else None


@app.command("vanguard")
def vanguard(
    seeds: Annotated[
        int | None,
        typer.Option(help="probes per held-out case and strategy (default 5; --quick 2)"),
    ] = None,
    dev_seeds: Annotated[
        int | None,
        typer.Option(help="probes per dev case and strategy (default 3; --quick 2)"),
    ] = None,
    jobs: Annotated[int, typer.Option(help="processes")] = 2,
    out: Annotated[
        Path, typer.Option(help="the document the tables are written into, between markers")
    ] = Path("docs/reproduction-vanguard.md"),
    json_file: Annotated[
        Path | None, typer.Option("--json", help="write every probe and truth as JSON here")
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(help="write the dev pairs' a → b calibration here, for `allocate`"),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="11 cases, 2 seeds, 1 per ablation: a few minutes' look")
    ] = False,
    case: Annotated[list[str], typer.Option(help="only this bank case (repeatable)")] = [],  # noqa: B006
    ablation_seeds: Annotated[
        int | None, typer.Option(help="probes per case and ablation (default 2; --quick 1)")
    ] = None,
) -> None:
    """Probe every case of the validation bank as `ridgeline probe` does by default, and
    set the estimates beside each server's true capacity."""
    from ridgeline.report.vanguard import (
        BANK,
        RESULTS,
        bank_markdown,
        case_line,
        results_markdown,
        update_document,
    )
    from ridgeline.sizing.calibration import write_calibration
    from ridgeline.study.stats import measured_calibration
    from ridgeline.study.vanguard import StudyConfig, run_study

    with failing(values=True):
        given: dict[str, object] = {"jobs": jobs}
        if seeds is not None:
            given["seeds"] = seeds
        if dev_seeds is not None:
            given["dev_seeds"] = dev_seeds
        if case:
            given["cases"] = tuple(case)
        if ablation_seeds is not None:
            given["ablation_seeds"] = ablation_seeds
        cfg = StudyConfig.quick(**given) if quick else StudyConfig.model_validate(given)
        commit = _commit()
        result = run_study(
            cfg, on_case=lambda done: err.print(case_line(done), markup=False, highlight=False)
        )
        command = " ".join(
            [
                "ridgeline study vanguard",
                f"--seeds {result.seeds}",
                f"--dev-seeds {result.dev_seeds}",
                f"--jobs {jobs}",
            ]
            + (["--quick"] if quick else [])
            + [f"--case {c}" for c in case]
            + ([f"--ablation-seeds {ablation_seeds}"] if ablation_seeds is not None else [])
        )
        blocks = {
            BANK: bank_markdown(result),
            RESULTS: results_markdown(result, command=command, commit=commit),
        }
        update_document(out, blocks)
        err.print(f"tables written to {out} ({result.wall_s:,.0f} s)", highlight=False)
        if json_file is not None:
            json_file.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
        if calibration is not None:
            measured = measured_calibration(result, f"ridgeline study vanguard ({commit})")
            if measured is None:
                err.print("no dev pair gave a capacity on hardware a: no calibration written")
            else:
                write_calibration(measured, calibration)
                err.print(f"calibration {measured.factor:.3f} written to {calibration}")


@app.command("jigsaw")
def jigsaw(
    quick: Annotated[
        bool, typer.Option(help="the central inputs only, 5,000 simulated requests a plan")
    ] = False,
    gpus: Annotated[
        list[str],
        typer.Option(help="a GPU set, COUNTxTYPE[,...] (repeatable; default 8xA100-80GB)"),
    ] = [],  # noqa: B006
    central_gpus: Annotated[
        list[str],
        typer.Option(help="a GPU set planned on the central inputs only (repeatable)"),
    ] = [],  # noqa: B006
    spec: Annotated[
        list[Path], typer.Option(help="a pipeline spec (repeatable; default: the three examples)")
    ] = [],  # noqa: B006
    grid: Annotated[
        bool, typer.Option(help="every latency × SLO pair of the ranges, not one at a time")
    ] = False,
    requests: Annotated[
        int | None, typer.Option(help="simulated requests a plan (default 20,000; --quick 5,000)")
    ] = None,
    jobs: Annotated[int, typer.Option(help="processes")] = 2,
    out: Annotated[
        Path, typer.Option(help="the document the tables are written into, between markers")
    ] = Path("docs/reproduction-jigsawserve.md"),
    json_file: Annotated[
        Path | None, typer.Option("--json", help="write every row as JSON here")
    ] = None,
) -> None:
    """What each of JigsawServe's features (accuracy scaling, spatial partitioning,
    task-graph budgeting) buys in max demand on the example applications, over the
    calibration's error and the SLO, and its plans served in the plan simulator."""
    from ridgeline.report.jigsaw import blocks, task_line, update_document
    from ridgeline.study.jigsaw import JigsawConfig, run_jigsaw

    with failing(values=True):
        given: dict[str, object] = {"grid": grid, "jobs": jobs}
        if gpus:
            given["gpus"] = tuple(gpus)
        if central_gpus:
            given["central_gpus"] = tuple(central_gpus)
        if spec:
            given["specs"] = tuple(spec)
        if requests is not None:
            given["requests"] = requests
        cfg = JigsawConfig.quick(**given) if quick else JigsawConfig.model_validate(given)
        commit = _commit()
        result = run_jigsaw(
            cfg, on_task=lambda done: err.print(task_line(done), markup=False, highlight=False)
        )
        command = " ".join(
            ["ridgeline study jigsaw"]
            + (["--quick"] if quick else [])
            + [f"--gpus {g}" for g in gpus]
            + [f"--central-gpus {g}" for g in central_gpus]
            + [f"--spec {s}" for s in spec]
            + (["--grid"] if grid else [])
            + ([f"--requests {requests}"] if requests is not None else [])
            + [f"--jobs {jobs}"]
        )
        update_document(out, blocks(result, command=command, commit=commit))
        err.print(f"tables written to {out} ({result.wall_s:,.0f} s)", highlight=False)
        if json_file is not None:
            json_file.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
