"""One rooted exception tree. Every error a user can meet says what was wrong and how to fix it.

RidgelineError
├── ConfigError              a setting, spec or command-line value is invalid
│   ├── UnknownKindError     a name (arrival kind, preset, scheme) is not a valid one
│   ├── TraceFormatError     a trace file is malformed (names file, line, column)
│   ├── DatasetError         a prompt dataset is missing, empty or malformed (names file, line)
│   ├── TokenizerError       a tokenizer cannot be loaded, or cannot make a prompt that long
│   ├── PlanError            a plan or pipeline spec is invalid (names the field and fix)
│   │   ├── InfeasiblePlan   no plan meets every constraint (says which binds: .binding)
│   │   └── PlanCheckFailed  no plan held the SLO in simulation (the best one: .best)
│   ├── GpuUnavailableError  no GPU can be monitored the way asked
│   ├── PlacementError       a worker cannot be placed as asked (serve.affinity)
│   └── BackendConfigError   a backend cannot be built or load its model (serve backends)
│       └── ModelNotFoundError   the model file a backend should load does not exist
├── TargetError              talking to an inference endpoint failed
│   └── TargetUnreachableError   the endpoint did not answer the connect check
├── StoreError               the run store could not be read or written
├── HostTooSmall             the demo's profiles on this host leave no plan (INCONCLUSIVE)
├── RunInterrupted           a run was stopped (Ctrl-C); its partial results are stored
├── WorkerError              a serving worker failed a batch (serve.workers)
│   ├── WorkerStartError     it could not start or load its backend
│   └── WorkerCrashed        its process died; the batch failed, the worker restarted
├── InvalidRequest           a v2 request the model cannot run: 400 / INVALID_ARGUMENT
└── InferFailed              a request a served model dropped, refused or failed
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal


class RidgelineError(Exception):
    """Root of every error ridgeline raises on purpose."""


class ConfigError(RidgelineError, ValueError):
    """A setting, spec or command-line value is invalid. ``field`` names the setting at
    fault where one does (``min_rate``), so that a command can name the option that set
    it (``--min-rate``)."""

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field


class UnknownKindError(ConfigError):
    """A name is not one of the valid ones; the message lists them."""

    def __init__(self, what: str, name: str, valid: Iterable[str]) -> None:
        self.what = what
        self.name = name
        self.valid = sorted(valid)
        super().__init__(
            f"unknown {what} {name!r}; valid {_plural(what)} are: {', '.join(self.valid)}"
        )


def _plural(noun: str) -> str:
    if noun.endswith("y") and not noun.endswith(("ay", "ey", "oy", "uy")):
        return noun[:-1] + "ies"
    return noun + "s"


class TraceFormatError(ConfigError):
    """A trace file is malformed; the message names the file, line and column."""

    def __init__(self, path: str, line: int, column: str | int, problem: str) -> None:
        self.path = path
        self.line = line
        self.column = column
        self.problem = problem
        super().__init__(f"{path}, line {line}, column {column}: {problem}")


class DatasetError(ConfigError):
    """A prompt dataset is missing, empty or malformed; the message names the file and line."""


class TokenizerError(ConfigError):
    """A tokenizer cannot be loaded, or cannot make a prompt of the length asked."""


class PlanError(ConfigError):
    """A plan or pipeline spec is invalid; the message names the field and the fix."""


class InfeasiblePlan(PlanError):
    """No plan meets every constraint; the message says which binds and by how much."""

    def __init__(self, message: str, binding: str) -> None:
        super().__init__(message)
        self.binding = binding
        """``latency``, ``accuracy`` or ``resources``."""


class HostTooSmall(RidgelineError):
    """The demo cannot be planned on this host: the profiles it measured here (a slow or
    busy host) leave no plan within its core budget. Says nothing of the planner or the
    plan: its verdict is INCONCLUSIVE."""


class PlanCheckFailed(PlanError):
    """No plan held the SLO when served in simulation (``plansim.check``); ``best`` is the
    closest one found, with the runs that judged it (None if none could be made)."""

    def __init__(self, message: str, best: object | None) -> None:
        super().__init__(message)
        self.best = best


class PlacementError(ConfigError):
    """A worker cannot be placed as asked (a core that does not exist, say)."""


class GpuUnavailableError(ConfigError):
    """No GPU can be monitored this way; ``reason`` says why in a few words."""

    def __init__(self, reason: str, fix: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}; {fix}")


class TargetError(RidgelineError):
    """Talking to an inference endpoint failed."""


class TargetUnreachableError(TargetError):
    """The endpoint did not answer the connect check made before a step."""


class StoreError(RidgelineError):
    """The run store could not be read or written."""


class WorkerError(RidgelineError):
    """A worker could not run a batch: its backend raised, it was stopped, or it is down."""


class WorkerStartError(WorkerError):
    """A worker's process could not load its backend."""


class WorkerCrashed(WorkerError):
    """A worker's process died with a batch in flight; ``exit_code`` says how."""

    def __init__(self, message: str, exit_code: int | None) -> None:
        self.exit_code = exit_code
        super().__init__(message)


class RunInterrupted(RidgelineError):
    """A run was stopped before its end; partial results were stored under ``run_id``."""

    def __init__(self, run_id: int | None, message: str) -> None:
        self.run_id = run_id
        super().__init__(message)


class BackendConfigError(ConfigError):
    """A backend cannot be built or loaded as configured; the message says how to fix it."""


class ModelNotFoundError(BackendConfigError):
    """The model file a backend should load does not exist."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"model file {path} does not exist (resolved: {Path(path).resolve()}); fix the "
            "backend's path (a relative path is read from the serving process's directory)"
        )

    def __reduce__(self) -> tuple[type[ModelNotFoundError], tuple[str]]:
        return type(self), (self.path,)  # crosses the worker's pipe intact


class InvalidRequest(RidgelineError):
    """A v2 request the model cannot run; answered with 400 / INVALID_ARGUMENT."""


FailureKind = Literal["dropped", "unavailable", "internal"]


class InferFailed(RidgelineError):
    """A request the model could not answer: dropped (cannot meet its SLO), unavailable
    (refused: full, shutting down) or internal (execution failed)."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        self.kind = kind
        super().__init__(f"dropped: {message}" if kind == "dropped" else message)
