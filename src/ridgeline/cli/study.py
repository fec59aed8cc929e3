"""``ridgeline study``: validation studies of the probe against simulated servers whose
capacity is known (``vanguard``), and the JigsawServe reproduction of the planner's
features (``jigsaw``)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol, Self, TypeVar

import typer

from ridgeline.cli._common import err, failing

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # plain help, as the top's
"""Mounted by ``ridgeline.cli``, which holds its help and imports this module when the
group is used."""


JobsOption = Annotated[int, typer.Option(help="processes")]
DocumentOption = Annotated[
    Path,
    typer.Option(
        help="the document the tables are written into, between markers (created if "
        "missing; the project's own docs/ page only when named here)"
    ),
]
JsonFileOption = Annotated[
    Path | None, typer.Option("--json", help="write all the study found as JSON here")
]


def _commit() -> str | None:
    """The checkout's commit, when run from one."""
    try:
        run = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return None
    return run.stdout.strip() or None if run.returncode == 0 else None


class _Config(Protocol):
    """A study's config: validated from a mapping, or over its ``--quick`` defaults."""

    @classmethod
    def quick(cls, **overrides: Any) -> Self: ...

    @classmethod
    def model_validate(cls, obj: Any) -> Self: ...


C = TypeVar("C", bound=_Config)
T = TypeVar("T")


_WRITES = ("out", "json_file", "calibration", "kept")
"""The options that say where a study writes, not what it runs."""


def _options(ctx: typer.Context) -> dict[str, object]:
    """What a study runs with, as its options gave it, in the command's order: read by
    its config (``_config``) and written as its command line (``_command_line``)."""
    names = [p.name for p in ctx.command.params]
    return {name: ctx.params[name] for name in names if name and name not in _WRITES}


def _config(cls: type[C], options: Mapping[str, object], **renamed: str) -> C:
    """A study's config from its options (some under another name: ``spec="specs"``),
    over its ``--quick`` defaults or its own: one unset (None, no value of a repeatable
    option) is left to them, a repeated one becomes a tuple."""
    given = {
        renamed.get(name, name): tuple(value) if isinstance(value, list) else value
        for name, value in options.items()
        if name != "quick" and value is not None and value != []
    }
    return cls.quick(**given) if options["quick"] else cls.model_validate(given)


def _printing(line: Callable[[T], str]) -> Callable[[T], None]:
    """Print each line a study reports as it goes (one case, one task) to stderr."""
    return lambda done: err.print(line(done), markup=False, highlight=False)


def _command_line(command: str, options: Mapping[str, object]) -> str:
    """The command line that makes a study's tables again, written beside them: a flag
    that is on, each value of a repeated option, each option given."""
    words = [command]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words += [flag] if value else []
        elif isinstance(value, list):
            words += [f"{flag} {v}" for v in value]
        elif value is not None:
            words.append(f"{flag} {value}")
    return " ".join(words)


class _Result(Protocol):
    """A study's result, as both studies return one."""

    wall_s: float

    def model_dump_json(self, *, indent: int | None = None) -> str: ...


def _written(out: Path, result: _Result, json_file: Path | None) -> None:
    """Say where a study's tables went; write all it found as JSON to ``json_file``."""
    err.print(f"tables written to {out} ({result.wall_s:,.0f} s)", highlight=False)
    if json_file is not None:
        json_file.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")


@app.command("vanguard")
def vanguard(
    ctx: typer.Context,
    seeds: Annotated[
        int | None,
        typer.Option(help="probes per held-out case and strategy (default 5; --quick 2)"),
    ] = None,
    dev_seeds: Annotated[
        int | None,
        typer.Option(help="probes per dev case and strategy (default 3; --quick 2)"),
    ] = None,
    jobs: JobsOption = 2,
    out: DocumentOption = Path("ridgeline-runs/reproduction-vanguard.md"),
    json_file: JsonFileOption = None,
    calibration: Annotated[
        Path | None,
        typer.Option(help="write the dev pairs' a → b calibration here, for `allocate`"),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(help="every held-out case and a dev sample, 2 seeds, 1 per ablation"),
    ] = False,
    case: Annotated[list[str], typer.Option(help="only this bank case (repeatable)")] = [],  # noqa: B006
    ablation_seeds: Annotated[
        int | None, typer.Option(help="probes per case and ablation (default 2; --quick 1)")
    ] = None,
) -> None:
    """Probe every case of the validation bank as `ridgeline probe` does by default, and
    set the estimates beside each server's true capacity (computed again from another seed
    set: the figures are also given over the cases whose truth reproduces within 2 %)."""
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
        options = _options(ctx)
        cfg = _config(StudyConfig, options, case="cases")
        commit = _commit()
        result = run_study(cfg, on_case=_printing(case_line))
        if json_file is not None:  # first: what was measured outlives any table's fault
            json_file.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
        run = options | {"seeds": result.seeds, "dev_seeds": result.dev_seeds}
        command = _command_line("ridgeline study vanguard", run)
        blocks = {
            BANK: bank_markdown(result),
            RESULTS: results_markdown(result, command=command, commit=commit),
        }
        update_document(out, blocks)
        _written(out, result, None)  # its JSON is written already
        if calibration is not None:
            measured = measured_calibration(result, f"ridgeline study vanguard ({commit})")
            if measured is None:
                err.print("no dev pair gave a capacity on hardware a: no calibration written")
            else:
                write_calibration(measured, calibration)
                err.print(f"calibration {measured.factor:.3f} written to {calibration}")


@app.command("jigsaw")
def jigsaw(
    ctx: typer.Context,
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
    served: Annotated[
        bool,
        typer.Option(
            help="also size every plan for Poisson, gamma CV 3 and the bundled trace, the "
            "spec's SLO and half of it, and serve it in the simulator with dropping on and "
            "off (hours on 2 cores for 2 GPU sets: 96 jobs of 160-780 s each)"
        ),
    ] = False,
    time_limit: Annotated[
        float | None,
        typer.Option(
            help="HiGHS's limit on one solve, in wall-clock seconds (default 60); raise it "
            "where the study shares its cores (a study starved by other work ran past 60 s)",
        ),
    ] = None,
    jobs: JobsOption = 2,
    out: DocumentOption = Path("ridgeline-runs/reproduction-jigsawserve.md"),
    json_file: JsonFileOption = None,
    kept: Annotated[
        Path | None,
        typer.Option(
            "--kept",
            help="with --served: a file (JSON lines) each served job's cells are added to as "
            "it finishes; a job already there (same --requests) is not served again, so the "
            "study can be stopped and run on later",
        ),
    ] = None,
) -> None:
    """What each of JigsawServe's features (accuracy scaling, spatial partitioning,
    task-graph budgeting) buys in max demand on the example applications, over the
    calibration's error and the SLO, and its plans served in the plan simulator."""
    from ridgeline.report.jigsaw import blocks, served_line, task_line, update_document
    from ridgeline.study.jigsaw import JigsawConfig, run_jigsaw
    from ridgeline.study.jigsaw_result import ServedCell
    from ridgeline.study.jigsaw_served import kept_line, load_kept, run_served

    with failing(values=True):
        options = _options(ctx)
        cfg = _config(JigsawConfig, options, spec="specs", time_limit="time_limit_s")
        commit = _commit()
        result = run_jigsaw(cfg, on_task=_printing(task_line))
        if cfg.served:
            began = time.perf_counter()
            earlier = []
            if kept is not None and kept.exists():
                earlier = load_kept(kept.read_text(encoding="utf-8"), cfg.requests, cfg.seed)
                err.print(f"{len(earlier)} served cells kept in {kept}: not served again")
            said = _printing(served_line)

            def done(cells: list[ServedCell]) -> None:
                said(cells)
                if kept is not None:
                    with kept.open("a", encoding="utf-8") as f:
                        f.write(kept_line(cells, cfg.requests, cfg.seed))

            cells = run_served(
                cfg.specs,
                cfg.gpus,
                requests=cfg.requests,
                seed=cfg.seed,
                jobs=cfg.jobs,
                batches=cfg.batches,
                on_done=done,
                kept=earlier,
            )
            wall = result.wall_s + time.perf_counter() - began
            result = result.model_copy(update={"served": cells, "wall_s": wall})
        command = _command_line("ridgeline study jigsaw", options)
        update_document(out, blocks(result, command=command, commit=commit))
        _written(out, result, json_file)
