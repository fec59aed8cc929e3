"""What every command module shares: the consoles, the shared options, the error exit."""

from __future__ import annotations

import functools
import inspect
import os
import re
import select
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from ridgeline._fields import MAX_PORT
from ridgeline._kind_names import arrival_help
from ridgeline.errors import ConfigError, RidgelineError, RunInterrupted
from ridgeline.telemetry._sqlite import default_store_path
from ridgeline.v2.limits import ConnectionLimits
from ridgeline.v2.security import TOKEN_ENV

if TYPE_CHECKING:
    from ridgeline.telemetry.store import RunStore

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
ArrivalOption = Annotated[str, typer.Option(help=arrival_help())]
"""An arrival process (``workload.arrivals``), for the commands that make arrivals."""
RateOption = Annotated[
    float | None,
    typer.Option(
        help="mean arrival rate, requests/s (of --arrival; of --trace without --target-rate)"
    ),
]
"""The mean rate of the arrivals ``run`` sends and ``simulate`` serves."""
TraceOption = Annotated[
    Path | None,
    typer.Option(help="arrivals from a recorded trace (CSV/JSONL) instead of --arrival"),
]
"""A recorded trace as the arrivals of ``run`` and ``simulate``."""
TargetRateOption = Annotated[
    float | None, typer.Option(help="the mean rate to bring --trace to, requests/s")
]
"""The rate a trace is brought to: by ``run`` time-scaled, by ``simulate`` as its
``--trace-scale`` says."""
TraceScaleOption = Annotated[
    str,
    typer.Option(
        help="how --trace is brought to a rate: overlay (copies of it at their own pace, "
        "from random starting points: that many times its users) or speed (the one trace "
        "sped up, every burst shortened: the stress case)"
    ),
]
"""How ``simulate`` and ``probe`` bring a recorded trace to a rate (default ``overlay``)."""
PlanArgument = Annotated[Path, typer.Argument(help="the plan YAML (hand-written or from `plan`)")]
"""The plan a command serves, simulates or exports."""
DropOption = Annotated[bool, typer.Option(help="drop requests that cannot meet the SLO")]
"""Early dropping, as ``serve`` runs a plan and ``simulate`` serves it."""
ZooOption = Annotated[
    Path | None, typer.Option(help="model zoo directory (default $RIDGELINE_ZOO or cache)")
]
HostOption = Annotated[str, typer.Option(help="address to bind")]
ServerTokenOption = Annotated[
    str | None,
    typer.Option(
        help=f"require this bearer token (shown by ps: prefer --token-file or ${TOKEN_ENV})"
    ),
]
ProcessesOption = Annotated[
    int,
    typer.Option(help="generator processes on this machine, or Ray actors with --workers"),
]


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


def usage_line(exc: Any) -> Text:
    """A click usage error as one ``error:`` line: its message, and where the help is
    (``ridgeline run --help``) when it came from a command."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return _labelled("error:", "red", f"{message}{where}")


def error_line(exc: BaseException) -> Text:
    """``error: <message>``, the message as literal text on one line."""
    return _labelled("error:", "red", " ".join(str(exc).split()) or type(exc).__name__)


def warn(message: str) -> None:
    """Print ``warning: <message>`` to stderr, the message as literal text."""
    err.print(_labelled("warning:", "yellow", message), highlight=False, soft_wrap=True)


def _labelled(label: str, style: str, message: str) -> Text:
    return Text.assemble((label, style), " ", message)


@contextmanager
def opened_store(db: str | None, *, reading: bool = False) -> Iterator[RunStore]:
    """The run store a command writes to or reads. On leaving, stderr is told what it
    could not write and where that went (a full disk), and which runs it found left
    ``running`` by a process that had ended (marked ``interrupted`` on opening).
    ``reading``: a command that only reads opens a store it cannot write (read-only
    media, another user's file) read-only, rather than failing."""
    import sqlite3

    from ridgeline.errors import StoreError
    from ridgeline.telemetry.store import RunStore

    try:
        try:
            store = RunStore(db)
        except StoreError:
            if not reading:
                raise
            store = RunStore(db, readonly=True)  # still its error when it cannot be read
        with store, _reported(store):
            yield store
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and not _damaged(exc):
            raise  # locked, busy: not the file's fault
        path = db or os.environ.get("RIDGELINE_DB") or default_store_path()
        fail(
            StoreError(
                f"the run store {path} is damaged ({exc}); what can still be read: "
                f"`sqlite3 {path} .recover | sqlite3 recovered.sqlite`; or move it aside and "
                "a new one is started"
            )
        )


def _damaged(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "corrupt" in text


@contextmanager
def _reported(store: RunStore) -> Iterator[None]:
    """On leaving, what ``opened_store`` tells of ``store``."""
    try:
        yield
    finally:
        if store.recovered:
            ids = ", ".join(map(str, store.recovered))
            message = (
                f"run(s) {ids} were left running by a process that has ended (killed?); "
                "marked interrupted, what they stored is kept"
            )
            err.print(_labelled("note:", "cyan", message), highlight=False, soft_wrap=True)
        if store.unsaved is not None:
            warn(store.unsaved)


@contextmanager
def failing(*, values: bool = False, flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Turn a ``RidgelineError`` raised inside into :func:`fail`'s exit; a pydantic
    ``ValidationError`` (a setting built from options) becomes one line naming each field,
    its bound and the value given; any other ``ValueError`` too, when ``values``.
    ``flags``: the option that sets each field (``{"window_s": "--window"}``), named in
    the line instead of the field, so that it says which option to change."""
    flags = flags or {}
    try:
        yield
    except RidgelineError as exc:
        fail(_naming(exc, flags))
    except ValidationError as exc:
        from ridgeline._yaml_config import error_paths, problems  # yaml loads only here

        what = "" if error_paths(exc) <= flags.keys() else f"invalid {exc.title}: "
        fail(ConfigError(f"{what}{problems(exc, flags)}"))
    except ValueError as exc:
        if not values:
            raise
        fail(ConfigError(str(exc)))


@contextmanager
def from_option(flag: str) -> Iterator[None]:
    """A ``ConfigError`` raised inside is about the value of ``flag``: its line names
    the option (``--slo: SLO 'p99': cannot read part 1 …``)."""
    try:
        yield
    except ConfigError as exc:
        raise _led(exc, flag) from None


def _naming(exc: RidgelineError, flags: Mapping[str, str]) -> RidgelineError:
    """``exc``, led by the option in ``flags`` that set its field, if any."""
    flag = flags.get(getattr(exc, "field", None) or "")
    return exc if flag is None else _led(exc, flag)


def _led(exc: RidgelineError, flag: str) -> RidgelineError:
    return exc if flag in str(exc) else ConfigError(f"{flag}: {exc}")


# --- servers and their clients: ports, connections, TLS, the bearer token ---------------


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str, flag: str) -> float:
    """Seconds from ``10m``, ``90s``, ``1h30m`` or a plain number of seconds; a
    ``ConfigError`` naming ``flag`` for anything else, or for nothing."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None or not any(m.groups()):
        raise ConfigError(
            f"{flag} must be a duration such as 10m, 90s, 1h30m or 600 (seconds), got {text!r}"
        )
    h, mins, secs = (float(g) if g else 0.0 for g in m.groups())
    seconds = 3600 * h + 60 * mins + secs
    if seconds <= 0:
        raise ConfigError(f"{flag} must be longer than 0 s, got {text!r}")
    return seconds


def port_option(what: str) -> Any:
    """The one declaration of a port option: 0 to 65535 (0: any free one)."""
    return typer.Option(min=0, max=MAX_PORT, help=f"{what}; 0: any free port")


def _limit(flag: str, field: str, kind: type) -> Any:
    spec = ConnectionLimits.model_fields[field]
    return Annotated[kind, typer.Option(flag, help=spec.description)]


_LIMIT_FLAGS = {
    "idle_timeout_s": "--idle-timeout",
    "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout",
    "max_connections": "--max-connections",
    "max_body_bytes_in_flight": "--max-body-bytes-in-flight",
}
DEFAULT_LIMITS = ConnectionLimits()
IdleTimeoutOption = _limit("--idle-timeout", "idle_timeout_s", float)
HeaderTimeoutOption = _limit("--header-timeout", "header_timeout_s", float)
BodyTimeoutOption = _limit("--body-timeout", "body_timeout_s", float)
MaxConnectionsOption = _limit("--max-connections", "max_connections", int)
MaxBodyBytesInFlightOption = _limit("--max-body-bytes-in-flight", "max_body_bytes_in_flight", int)
TlsCertOption = Annotated[
    Path | None, typer.Option(help="serve TLS (https://, grpcs://) with this PEM certificate")
]
TlsKeyOption = Annotated[Path | None, typer.Option(help="the PEM private key of --tls-cert")]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(help="read the bearer token from this file (unlike --token, not shown by ps)"),
]
ClientTokenOption = Annotated[
    str | None,
    typer.Option(
        help=f"bearer token for the endpoint (shown by ps: prefer --token-file or ${TOKEN_ENV})"
    ),
]
TlsCaOption = Annotated[
    Path | None,
    typer.Option(help="trust this PEM CA bundle too, for https:// and grpcs:// endpoints"),
]


_SERVER_OPTIONS: dict[str, tuple[Any, Any]] = {
    "token": (ServerTokenOption, None),
    "token_file": (TokenFileOption, None),
    "tls_cert": (TlsCertOption, None),
    "tls_key": (TlsKeyOption, None),
    "idle_timeout": (IdleTimeoutOption, DEFAULT_LIMITS.idle_timeout_s),
    "header_timeout": (HeaderTimeoutOption, DEFAULT_LIMITS.header_timeout_s),
    "body_timeout": (BodyTimeoutOption, DEFAULT_LIMITS.body_timeout_s),
    "max_connections": (MaxConnectionsOption, DEFAULT_LIMITS.max_connections),
    "max_body_bytes_in_flight": (
        MaxBodyBytesInFlightOption,
        DEFAULT_LIMITS.max_body_bytes_in_flight,
    ),
}
"""The options every server command takes, after its own: (annotation, default)."""


def expanded(
    name: str, options: Mapping[str, tuple[Any, Any]], build: Callable[..., Any]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """One block of options declared once for several commands: the command's parameter
    ``name`` becomes ``options`` (name → (annotation, default)), in its place in the
    command's options, and the command gets ``build(**their values)`` as ``name``."""

    def expand(command: Callable[..., None]) -> Callable[..., None]:
        params: list[inspect.Parameter] = []
        for p in inspect.signature(command, eval_str=True).parameters.values():
            if p.name != name:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
                continue
            params += [
                inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
                for n, (a, d) in options.items()
            ]

        @functools.wraps(command)
        def run(**given: Any) -> None:
            values = {n: given.pop(n) for n in options}
            with failing():
                block = build(**values)
            command(**given, **{name: block})

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return expand


def server_security(
    token: str | None,
    token_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    idle_timeout: float,
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    max_body_bytes_in_flight: int,
) -> dict[str, Any]:
    """A server's ``token``, ``tls`` and ``limits`` keyword arguments from its options."""
    from ridgeline.v2.security import resolve_token, tls_files

    return {
        "token": resolve_token(token, token_file),
        "tls": tls_files(tls_cert, tls_key),
        "limits": connection_limits(
            idle_timeout_s=idle_timeout,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            max_connections=max_connections,
            max_body_bytes_in_flight=max_body_bytes_in_flight,
        ),
    }


def connection_limits(**flags: float) -> ConnectionLimits:
    """``ConnectionLimits`` from the options of those names; a bad value is named by its
    option in one line."""
    from pydantic import ValidationError

    try:
        return ConnectionLimits.model_validate(flags)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0])
        raise ConfigError(
            f"{_LIMIT_FLAGS.get(field, field)} {flags.get(field)!r}: {first['msg'].lower()}"
        ) from None


with_server_options = expanded("security", _SERVER_OPTIONS, server_security)
"""A server command: ``_SERVER_OPTIONS`` in place of its parameter ``security`` (its
last), which gets a server's ``token`` (from --token, --token-file or $RIDGELINE_TOKEN),
``tls`` and ``limits`` keyword arguments."""
