"""The public API is small and pinned: a name added or removed is a decision."""

import ridgeline


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert ridgeline.__all__ == sorted(ridgeline.__all__)
    assert len(ridgeline.__all__) == 64
    for name in ridgeline.__all__:
        assert getattr(ridgeline, name) is not None, name
    assert all(not name.startswith("_") for name in ridgeline.__all__)


def test_errors_share_one_root() -> None:
    for name in (
        "ConfigError",
        "UnknownKindError",
        "TraceFormatError",
        "TargetError",
        "TargetUnreachableError",
        "StoreError",
        "RunInterrupted",
        "PlanError",
        "InfeasiblePlan",
    ):
        assert issubclass(getattr(ridgeline, name), ridgeline.RidgelineError), name
