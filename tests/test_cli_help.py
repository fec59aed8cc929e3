"""Issue 33, fault 25: at 80 columns (and in a pipe, which reads as 80) every command's
help shows its examples and values whole, and a bad option's one ``error:`` line names
the option to change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ridgeline.cli import app

pytestmark = pytest.mark.timeout(120)

SLO_EXAMPLES = {
    "probe": ["'p99<100ms,errors<0.1%'", "'ttft_p99<200ms,itl_p99<50ms,errors<1%'"],
    "run": ["'ttft_p99<200ms,itl_p99<50ms'"],
}
"""The commands taking ``--slo``, and the examples their help gives."""


def _commands(command: object, path: list[str]) -> Iterator[list[str]]:
    yield path
    if isinstance(command, typer.core.TyperGroup):
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), [*path, name])


COMMANDS = list(_commands(typer.main.get_command(app), []))


def _help(path: list[str]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_and_group_is_walked() -> None:
    assert {" ".join(p) for p in COMMANDS} >= {"probe", "run", "runs list", "export kserve"}
    assert len(COMMANDS) == 30


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "ridgeline")
def test_help_at_80_columns_cuts_nothing(path: list[str]) -> None:
    """Rich's panels squeezed an option's help to 20 columns and cut what did not fit
    with an ellipsis; no line passes 80 columns, none is cut, no option name or example
    value is split at its hyphen."""
    text = _help(path)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80
    assert "…" not in text
    split = [
        line for line in lines if re.search(r"(^|\s)(--[\w-]*|[\w.-]*[:=/][\w.:=/-]*)-$", line)
    ]
    assert split == []


@pytest.mark.parametrize("command", sorted(SLO_EXAMPLES))
def test_the_slo_examples_are_whole_on_one_line(command: str) -> None:
    lines = _help([command]).splitlines()
    for example in SLO_EXAMPLES[command]:
        assert any(example in line for line in lines), (example, lines)


def test_the_ray_extra_reads_as_typed() -> None:
    for command in ("serve", "run", "probe"):
        assert "pip install 'ridgeline[ray]'" in " ".join(_help([command]).split())


RUN = ["run", "null://", "--rate", "5", "--duration", "0.1"]
PROBE = ["probe", "sim:vision"]
PLAN = ["plan", "examples/specs/traffic-cpu.yaml", "--profiles"]
PLAN += ["examples/profiles/traffic-cpu.csv", "--no-check"]
BAD = {
    "probe --slo p99": ([*PROBE, "--slo", "p99"], "error: --slo: SLO 'p99': cannot read"),
    "run --slo p99": ([*RUN, "--slo", "p99"], "error: --slo: SLO 'p99': cannot read"),
    "probe --min-rate 0": (
        [*PROBE, "--min-rate", "0"],
        "error: --min-rate: search strategy 'adaptive' field 'min_rate': Input should be "
        "greater than 0, got 0.0",
    ),
    "probe --confidence 1.5": (
        [*PROBE, "--confidence", "1.5"],
        "error: --confidence: Input should be less than 1, got 1.5",
    ),
    "probe --warmup-rate -1": (
        [*PROBE, "--warmup-rate", "-1"],
        "error: --warmup-rate: Input should be greater than 0, got -1.0",
    ),
    "probe --metrics-url ftp://x": (
        [*PROBE, "--metrics-url", "ftp://x"],
        "error: --metrics-url must be an http:// or https:// URL",
    ),
    "run --duration 0": ([*RUN[:-1], "0"], "error: --duration: duration must be > 0 s, got 0.0"),
    "run --max-outstanding 0": (
        [*RUN, "--max-outstanding", "0"],
        "error: --max-outstanding: Input should be greater than or equal to 1, got 0",
    ),
    "run --output-tokens uniform:5-1": (
        [*RUN, "--output-tokens", "uniform:5-1"],
        "error: --output-tokens 'uniform:5-1': ",
    ),
    "plan --gpus 8xZ100": (
        [*PLAN, "--gpus", "8xZ100"],
        "error: --gpus: unknown GPU type 'Z100'; valid GPU types are: ",
    ),
    "plan --features X": ([*PLAN, "--features", "X"], "error: --features: features X: write"),
    "simulate --noise-cv -1": (
        ["simulate", "examples/plans/traffic-cpu.yaml", "--rate", "5", "--noise-cv", "-1"],
        "error: --noise-cv: Input should be greater than or equal to 0, got -1.0",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_option_names_the_option(case: str, tmp_path: Path) -> None:
    args, starts = BAD[case]
    if args[0] in ("run", "probe"):
        args = [*args, "--db", f"{tmp_path}/runs.sqlite"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]]
    assert result.stderr.startswith(starts), result.stderr
