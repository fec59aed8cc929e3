"""The ``ridgeline`` command: one module per command group, each command a few lines over a
library call. A command imports what it needs when it runs, so ``ridgeline --help`` loads
no grpc, aiohttp, HiGHS or onnxruntime."""

from __future__ import annotations

from typing import Annotated

import typer

from ridgeline._version import __version__
from ridgeline.cli import (
    export,
    fake,
    loop,
    measure,
    models,
    planning,
    runs,
    serving,
    simulate,
    sizing,
    study,
)
from ridgeline.cli._exit import EPILOG
from ridgeline.errors import RidgelineError

app = typer.Typer(
    help="ridgeline: what is the least GPU that serves demand D within my SLO, and does it "
    "really? Open-loop load, capacity search, planning and serving for ML inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    epilog=EPILOG,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ridgeline {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """The options every command shares (``--version``)."""


app.add_typer(runs.app, name="runs")
app.command("allocate")(sizing.allocate_command)
app.add_typer(sizing.registry_app, name="registry")
app.command("report")(runs.report_command)
app.command("analyze")(runs.analyze_command)
app.add_typer(models.app, name="models", help="The local model zoo: real ONNX model families.")
app.command("profile")(planning.profile_command)
app.command("plan")(planning.plan_command)
app.command("run")(measure.run)
app.command("probe")(measure.probe)
app.command("fake-server")(fake.fake_server)
app.command("serve")(serving.serve)
app.command("simulate")(simulate.simulate)
app.command("verify")(loop.verify)
app.command("demo")(loop.demo)
app.add_typer(study.app, name="study")
app.add_typer(export.app, name="export")


def main() -> None:
    """The ``ridgeline`` command. A project error that escapes a command's own handling
    (an option's callback, say) still takes the one error path: ``error: ...``, exit 2."""
    from ridgeline.cli._common import fail

    try:
        app(prog_name="ridgeline")
    except RidgelineError as exc:
        try:
            fail(exc)
        except typer.Exit as done:
            raise SystemExit(done.exit_code) from None
