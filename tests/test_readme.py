"""Every ``ridgeline`` command the README shows (issue 33, fault 24): it parses with the
command line's own parser (its types, ranges and choices), and every file it names ships
with the project or is written by a README line before it. What is a placeholder on
purpose (``...``, ``RUN``, a run id, another machine's address) is listed below. The
commands that need no server and end in seconds are run as written (``OFFLINE``); the
others serve until stopped or run for minutes, and are not run here. The ones that
failed as written (a ``--shared-prefix`` longer than the shortest prompt, files nobody
provided) now name what ships."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from ridgeline.cli import app

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDERS = ("...", "RUN", "SERVER", "10.0.0.5")
"""Words that mark a README line as a pattern to fill in, not a command to copy."""
WRITTEN = {"profiles.csv", "plan.yaml", "mig.yaml", "token", "cert.pem", "key.pem"}
"""Files README lines write (``--out``, ``echo … > token``, ``openssl … -out``)."""
FILE = re.compile(r"^[\w./-]+\.(csv|json|jsonl|yaml|yml|pem)$|^token$")


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    commands: list[str] = []
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S):
        current = ""
        for raw in block.splitlines():
            line = raw.strip()
            if not current and not line.startswith("ridgeline "):
                continue
            current = f"{current} {line}".strip()
            if current.endswith("\\"):
                current = current[:-1]
                continue
            commands.append(re.sub(r"\s+#.*$", "", current).rstrip(" &"))
            current = ""
    return commands


def _command(argv: list[str]) -> tuple[Any, str, list[str]]:
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    while hasattr(command, "commands") and argv and argv[0] in command.commands:
        path.append(argv[0])
        command = command.commands[argv.pop(0)]
    return command, " ".join(path), argv


def test_the_readme_shows_the_commands_it_should() -> None:
    commands = readme_commands()
    assert len(commands) >= 30
    assert any(c.startswith("ridgeline probe") for c in commands)


def test_every_readme_command_parses_and_names_only_files_that_exist() -> None:
    problems = []
    for line in readme_commands():
        argv = shlex.split(line)[1:]
        if any(word in PLACEHOLDERS for word in argv) or any(p in line for p in PLACEHOLDERS[2:]):
            continue
        command, name, args = _command(argv)
        try:
            command.make_context(name, list(args))
        except Exception as exc:  # a usage error: the line fails as written
            problems.append(f"{line}: {exc}")
            continue
        for word in args:
            if FILE.match(word) and word not in WRITTEN and not (ROOT / word).exists():
                problems.append(f"{line}: names {word}, which does not ship")
    assert not problems, "\n".join(problems)


OFFLINE = (
    "ridgeline allocate ",
    "ridgeline simulate examples/",
    "ridgeline export ",
    "ridgeline probe sim:vision --strategy",
)
"""README lines that need no server and end in seconds: run as written."""


@pytest.mark.timeout(300)
def test_the_readmes_offline_commands_run_as_written(tmp_path: Path) -> None:
    """Run from a folder holding the repository's ``examples`` and ``src`` (links), so
    what they write lands there; each exits 0 and prints no ``error:``."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "src").symlink_to(ROOT / "src")
    lines = [
        c
        for c in readme_commands()
        if c.startswith(OFFLINE) and not any(p in shlex.split(c) for p in PLACEHOLDERS)
    ]
    assert len(lines) >= 6, lines
    env = {**os.environ, "RIDGELINE_DB": str(tmp_path / "runs.sqlite")}
    for line in lines:
        argv = shlex.split(line)[1:]
        done = subprocess.run(
            [sys.executable, "-m", "ridgeline", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
        assert "error:" not in done.stderr, line
        assert "Traceback" not in done.stderr + done.stdout, line
