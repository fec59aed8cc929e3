"""The public API is small and pinned: a name added or removed is a decision."""

import ast
import inspect
import os
import subprocess
import sys

import pytest

import ridgeline
from ridgeline import errors

# fmt: off
PUBLIC = [
    "BackendConfigError", "BatchingConfig", "CapacityEstimate", "ConfigError", "DatasetError",
    "FakeServer",
    "Features", "GpuUnavailableError", "HealthState", "HostTooSmall", "InfeasiblePlan",
    "InferFailed",
    "InvalidRequest", "LatencyModel", "ModelNotFoundError", "NetworkDriver", "Outcome",
    "PipelineSpec", "PlacementError", "Plan", "PlanCheckFailed", "PlanError", "PlanServer",
    "ProbeConfig",
    "ProbeResult", "ProfileTable", "Progress", "Records", "ReplayConfig", "Reply",
    "RequestShape", "RidgelineError", "RunInterrupted", "RunStore", "SLOPolicy", "Schedule",
    "SimDriver", "StepConfig", "StepResult", "StepSummary", "StoreError", "Target",
    "TargetError", "TargetUnreachableError", "TokenizerError", "Trace", "TraceFormatError",
    "UnknownKindError", "ValidityConfig", "Window", "WorkerCrashed", "WorkerError",
    "WorkerStartError", "allocate", "assess_validity", "capacity_rps", "from_arrival",
    "from_trace", "load_plan", "load_preset", "load_profiles", "load_spec", "make_driver",
    "make_target", "measure_step", "parse_arrival", "parse_slo", "parse_strategy", "place",
    "plan_pipeline", "probe", "read_trace", "replay", "run_coroutine", "run_probe",
    "run_step", "to_plan",
]
# fmt: on
"""``ridgeline.__all__``, sorted: the names a user may import from ``ridgeline``."""

HEAVY = ("grpc", "aiohttp", "highspy", "onnxruntime", "numpy", "onnx")
"""What neither ``import ridgeline`` nor ``ridgeline --help`` may load."""


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert sorted(PUBLIC) == PUBLIC
    assert ridgeline.__all__ == PUBLIC
    for name in ridgeline.__all__:
        assert getattr(ridgeline, name) is not None, name
        assert name in dir(ridgeline), name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = ridgeline.no_such_name  # type: ignore[attr-defined]


def test_a_subpackage_does_not_shadow_the_public_name() -> None:
    import ridgeline.probe.api  # binds the subpackage `probe` on its parent: the name wins

    assert callable(ridgeline.probe) and ridgeline.probe.__name__ == "probe"


def test_every_error_is_exported_and_shares_one_root() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, Exception)
        and value.__module__ == errors.__name__
    }
    assert defined <= set(ridgeline.__all__), defined - set(ridgeline.__all__)
    for name in [*defined, "InfeasiblePlan"]:
        assert issubclass(getattr(ridgeline, name), ridgeline.RidgelineError), name


def _heavy_modules_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport sys\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return list(ast.literal_eval(run.stdout.strip().splitlines()[-1]))


def test_import_ridgeline_loads_no_heavy_module() -> None:
    assert _heavy_modules_after("import ridgeline") == []


def test_ridgeline_help_loads_none_of_them_either() -> None:
    code = (
        "import sys\nfrom ridgeline.cli import main\nsys.argv = ['ridgeline', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert _heavy_modules_after(code) == []


LAZY_GROUPS = ("ridgeline.cli.export", "ridgeline.cli.models", "ridgeline.cli.study")
"""The command modules the app mounts lazily: imported when their group is used."""


def _help_and_lazy_modules(*argv: str) -> tuple[str, list[str]]:
    code = (
        "import sys\nfrom ridgeline.cli import main\n"
        f"sys.argv = ['ridgeline', *{list(argv)!r}, '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(set({LAZY_GROUPS!r}) & set(sys.modules)))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "250"},
    )
    *text, last = run.stdout.strip().splitlines()
    return "\n".join(text), list(ast.literal_eval(last))


def test_a_lazy_group_is_listed_by_its_help_and_imported_when_used() -> None:
    text, loaded = _help_and_lazy_modules()
    assert loaded == []
    assert "The local model zoo: real ONNX model families." in text
    text, loaded = _help_and_lazy_modules("models")
    assert loaded == ["ridgeline.cli.models"]
    assert "Show the models of a built zoo." in text  # `models list`
    text, loaded = _help_and_lazy_modules("models", "build")
    words = " ".join(text.split())  # click's help wraps at 80 columns on any terminal
    assert "a family to build, repeatable: detector, classifier, face, captioner, tts" in words


def test_a_lazy_group_suggests_the_command_meant() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ridgeline", "models", "buil"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert run.returncode == 2 and "No such command 'buil'. Did you mean 'build'?" in run.stderr
