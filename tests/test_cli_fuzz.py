"""Every command's options, fuzzed (issue 33): random strings and numbers for each
option with a value, one at a time. Whatever the value, the command answers as a user
can read: exit 2 with exactly one ``error:`` line on stderr, its last, when it refuses
it (or fails after taking it: the closed port below), or its
own outcome (0, 1, 3) when the value is one it takes; never a traceback.

Each command gets required arguments that end it quickly once its options are checked:
an endpoint on a closed loopback port (its connect check fails), a file that does not
exist, a run id that is not in a fresh store. ``demo`` and ``fake-server``, which run
for minutes or until stopped once their options hold, are fuzzed only as far as their
options parse: a value they parse is not run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ridgeline.cli import app

CLOSED = "http://127.0.0.1:9/v2/models/none"
"""The discard port: nothing listens on loopback there, the connect check fails."""

ARGUMENTS: dict[str, list[str]] = {
    "analyze": ["999999"],
    "calibrate": ["missing-plan.yaml", CLOSED],
    "plan": ["missing-spec.yaml"],
    "probe": [CLOSED],
    "profile": ["missing-spec.yaml"],
    "registry show": ["no-such-model"],
    "report": ["999999"],
    "run": [CLOSED],
    "runs show": ["999999"],
    "serve": ["missing-plan.yaml"],
    "simulate": ["missing-plan.yaml"],
    "verify": ["missing-plan.yaml", CLOSED],
}
PARSE_ONLY = {"demo", "fake-server"}


def _commands() -> dict[str, Any]:
    found: dict[str, Any] = {}

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in sorted(command.commands.items()):
                walk(sub, [*path, name])
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = _commands()


def _options(command: Any) -> list[str]:
    return sorted(
        max(p.opts, key=len)
        for p in command.params
        if p.param_type_name == "option" and not p.is_flag and p.name != "help"
    )


VALUES = st.one_of(
    st.text(st.characters(blacklist_characters="\x00", codec="utf-8"), max_size=24),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        ["", " ", "-1", "0", "nan", "inf", "-inf", "1e400", "abc", "1/0", "10m", "5%", "--"]
    ),
)


def test_every_command_is_fuzzed() -> None:
    leaves = set(COMMANDS)
    assert leaves >= {"run", "probe", "plan", "simulate", "serve", "verify", "demo"}
    assert all(_options(COMMANDS[name]) for name in ("run", "probe", "serve"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(COMMANDS))
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same cases every run: CI lands on the code, not on luck
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_fuzzed_option_is_one_error_line_or_taken_never_a_traceback(
    name: str, data: st.DataObject
) -> None:
    command = COMMANDS[name]
    options = _options(command)
    if not options:
        return
    option = data.draw(st.sampled_from(options), label="option")
    value = data.draw(VALUES, label="value")
    args = [*name.split(), *ARGUMENTS.get(name, []), option, value]
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        if name in PARSE_ONLY and _parses(command, name, args[1:]):
            return  # a value it takes: it would run until stopped
        env = {**os.environ, "RIDGELINE_DB": str(Path(tmp) / "runs.sqlite")}
        result = CliRunner().invoke(app, args, env=env)
    said = f"{args!r}: exit {result.exit_code}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), said
    assert "Traceback" not in result.output, said
    assert result.exit_code in (0, 1, 2, 3), said
    if result.exit_code == 2:  # one error line, the last (progress may come before it)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1 and lines[-1].startswith("error: "), said


def _parses(command: Any, name: str, args: list[str]) -> bool:
    """Whether ``args`` pass ``command``'s own parsing (types, ranges, choices)."""
    try:
        command.make_context(name, list(args), resilient_parsing=False)
    except Exception:
        return False
    return True
