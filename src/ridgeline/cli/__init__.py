"""The ``ridgeline`` command: one module per command group, each command a few lines over a
library call. A command imports what it needs when it runs, and a group that is only a
group (``models``, ``study``, ``export``) is imported when one of its commands is asked
for, so ``ridgeline --help`` loads no numpy, onnx, grpc, aiohttp, HiGHS or onnxruntime."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer
from typer.core import TyperGroup

from ridgeline._importing import import_attr
from ridgeline._version import __version__
from ridgeline.cli import fake, loop, measure, planning, runs, serving, simulate, sizing
from ridgeline.cli._exit import EPILOG
from ridgeline.errors import RidgelineError

if TYPE_CHECKING:
    from typer._click import Command, Context  # typer's own click


def _interrupted() -> None:
    from ridgeline.cli._common import err

    err.print(
        "error: interrupted (Ctrl-C or SIGTERM) before the command could stop cleanly; "
        "what it had stored is kept",
        highlight=False,
        soft_wrap=True,
    )


def _as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C is, outside a command's own handling."""
    raise KeyboardInterrupt


class _OneLineErrors(TyperGroup):
    """The top group: a usage error (a missing argument, a bad choice, ``--rate abc``)
    is one ``error:`` line naming what was wrong and where the help is, exit 2, as every
    other error is (``_common.fail``), not click's five-line box. No arguments at all
    still print the help."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
        from typer.exceptions import Abort

        from ridgeline.cli._common import err, usage_line

        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except NoArgsIsHelpError as e:
            typer.echo(e.format_message())  # the help, as `--help` prints it
            sys.exit(e.exit_code)
        except ClickException as e:
            err.print(usage_line(e), highlight=False, soft_wrap=True)
            sys.exit(e.exit_code)
        except Abort:
            err.print("error: aborted", highlight=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _interrupted()
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=_OneLineErrors,
    # click's plain help, not rich's panels: at 80 columns (and in a pipe, which rich
    # takes for 80) the panels squeezed an option's help to 20 columns and cut what did
    # not fit with "…" (the SLO examples, the arrival kinds, the store's path); click's
    # wraps it in 46, whole, and reads the same at any width past 80
    rich_markup_mode=None,
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


class _LazyGroup(TyperGroup):
    """A command group whose commands are those of the typer app ``target``
    (``module:attribute``), imported when one of them is listed or asked for (an unknown
    one too: its error suggests the near names); until then the group is its help alone."""

    target: ClassVar[str]

    def list_commands(self, ctx: Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        self._load()
        return super().get_command(ctx, cmd_name)

    def _load(self) -> None:
        if not self.commands:
            group = typer.main.get_command(import_attr(self.target))
            assert isinstance(group, TyperGroup), self.target
            self.commands.update(group.commands)


def _lazy_group(name: str, target: str, help: str) -> None:
    """Mount the typer app ``target`` as the group ``name``, imported when it is used."""
    cls = type(f"_Lazy{name.title()}", (_LazyGroup,), {"target": target})
    app.add_typer(
        typer.Typer(cls=cls, rich_markup_mode=None), name=name, help=help, no_args_is_help=True
    )


app.add_typer(runs.app, name="runs")
app.command("allocate")(sizing.allocate_command)
app.add_typer(sizing.registry_app, name="registry")
app.command("report")(runs.report_command)
app.command("analyze")(runs.analyze_command)
app.command("profile")(planning.profile_command)
app.command("plan")(planning.plan_command)
app.command("run")(measure.run)
app.command("probe")(measure.probe)
app.command("fake-server")(fake.fake_server)
app.command("serve")(serving.serve)
app.command("simulate")(simulate.simulate)
app.command("calibrate")(simulate.calibrate)
app.command("verify")(loop.verify)
app.command("demo")(loop.demo)
_lazy_group(
    "models", "ridgeline.cli.models:app", help="The local model zoo: real ONNX model families."
)
_lazy_group(
    "study",
    "ridgeline.cli.study:app",
    help="Studies: how far a probe's estimate can be trusted (vanguard); what each "
    "JigsawServe feature buys the planner (jigsaw).",
)
_lazy_group(
    "export",
    "ridgeline.cli.export:app",
    help="Write a plan for another serving engine: Ray Serve, KServe or a Triton model "
    "repository, validated against that engine's own schema.",
)


def main() -> None:
    """The ``ridgeline`` command. A project error that escapes a command's own handling
    (an option's callback, say) still takes the one error path: ``error: ...``, exit 2."""
    import signal

    from ridgeline.cli._common import fail

    # from here a signal is an interrupt a command handles (run, probe, serve... install
    # their own handlers and store what they measured); one that reaches no handler is
    # one line and exit 130 (``_OneLineErrors.invoke``)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        app(prog_name="ridgeline")
    except KeyboardInterrupt:  # while typer was still building the command
        _interrupted()
        raise SystemExit(130) from None
    except RidgelineError as exc:
        try:
            fail(exc)
        except typer.Exit as done:
            raise SystemExit(done.exit_code) from None
