"""What every command module shares: the consoles, the shared options, the error exit."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from ridgeline.errors import ConfigError, RidgelineError, RunInterrupted
from ridgeline.telemetry.store import RunStore, default_store_path

out = Console()
err = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"run store: a SQLite file path (default {default_store_path()}, or $RIDGELINE_DB)",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object")]
ArrivalOption = Annotated[
    str,
    typer.Option(
        help="constant | poisson | gamma:cv=2 | ramp:from=10,to=100 | steps:rates=10/20,step=5"
        " | diurnal:amplitude=0.5,period=60"
    ),
]
"""An arrival process (``workload.arrivals``), for the commands that make arrivals."""
ZooOption = Annotated[
    Path | None, typer.Option(help="model zoo directory (default $RIDGELINE_ZOO or cache)")
]
HostOption = Annotated[str, typer.Option(help="address to bind")]
ServerTokenOption = Annotated[str | None, typer.Option(help="require this bearer token")]
ProcessesOption = Annotated[int, typer.Option(help="local generator processes")]


def emit(text: str) -> None:
    """Write ``text`` and a newline to stdout, all of it. A pipe's O_NONBLOCK belongs to
    the open file, which other processes share: on a non-blocking stdout, Python's
    writer dropped what a full pipe would not take and the command still exited 0 (a
    probe's 570 kB of JSON reached a busy reader as its first 64 KiB). Written to the
    descriptor directly, waiting for the pipe whenever it is full (a stdout with no
    descriptor, a test's capture, is written as usual)."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError):  # io.UnsupportedOperation: a captured stdout
        sys.stdout.write(text + "\n")
        return
    data = memoryview((text + "\n").encode())
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            select.select([], [fd], [])


def fail(exc: RidgelineError) -> NoReturn:
    """Print ``error: ...`` to stderr and exit 2 (130 for an interrupted run): the one
    error-printing path of the CLI. The message is printed as plain text: a message
    holding rich markup (``[/versions/V]``, ``[red]``) reads literally."""
    err.print(error_line(exc), highlight=False, soft_wrap=True)
    raise typer.Exit(130 if isinstance(exc, RunInterrupted) else 2)


def error_line(exc: BaseException) -> Text:
    """``error: <message>``, the message as literal text on one line."""
    return _labelled("error:", "red", " ".join(str(exc).split()) or type(exc).__name__)


def warn(message: str) -> None:
    """Print ``warning: <message>`` to stderr, the message as literal text."""
    err.print(_labelled("warning:", "yellow", message), highlight=False, soft_wrap=True)


def _labelled(label: str, style: str, message: str) -> Text:
    return Text.assemble((label, style), " ", message)


@contextmanager
def opened_store(db: str | None) -> Iterator[RunStore]:
    """The run store a command writes to or reads. On leaving, stderr is told what it
    could not write and where that went (a full disk), and which runs it found left
    ``running`` by a process that had ended (marked ``interrupted`` on opening)."""
    with RunStore(db) as store:
        try:
            yield store
        finally:
            if store.recovered:
                ids = ", ".join(map(str, store.recovered))
                err.print(
                    f"note: run(s) {ids} were left running by a process that has ended "
                    "(killed?); marked interrupted, what they stored is kept",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
            if store.unsaved is not None:
                err.print(
                    f"warning: {store.unsaved}", markup=False, highlight=False, soft_wrap=True
                )


@contextmanager
def failing(*, values: bool = False) -> Iterator[None]:
    """Turn a ``RidgelineError`` raised inside into :func:`fail`'s exit; a pydantic
    ``ValidationError`` (a setting built from options) becomes one line naming each field,
    its bound and the value given; any other ``ValueError`` too, when ``values``."""
    try:
        yield
    except RidgelineError as exc:
        fail(exc)
    except ValidationError as exc:
        from ridgeline._yaml_config import problems  # yaml loads only on this path

        fail(ConfigError(f"invalid {exc.title}: {problems(exc)}"))
    except ValueError as exc:
        if not values:
            raise
        fail(ConfigError(str(exc)))
