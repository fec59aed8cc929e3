"""Agreement statistics against published and constructed cases, computed by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ridgeline.analysis.agreement import (
    bland_altman,
    calibration,
    cv,
    icc,
    linear_fit,
    relative_errors,
)
from ridgeline.errors import ConfigError
from ridgeline.probe.api import make_driver, run_probe
from ridgeline.probe.orchestrator import ProbeConfig
from ridgeline.telemetry.store import RunStore

# Shrout & Fleiss (1979), Table 2: 6 targets rated by 4 judges; their Table 4 gives
# ICC(1,1) = 0.17, ICC(2,1) = 0.29, ICC(3,1) = 0.71
SHROUT_FLEISS = [
    [9, 2, 5, 8],
    [6, 1, 3, 2],
    [8, 4, 6, 8],
    [7, 1, 2, 6],
    [10, 5, 6, 9],
    [6, 2, 4, 7],
]


@pytest.mark.parametrize(("form", "published"), [("1,1", 0.17), ("2,1", 0.29), ("3,1", 0.71)])
def test_icc_reproduces_shrout_and_fleiss(form: str, published: float) -> None:
    assert icc(SHROUT_FLEISS, form) == pytest.approx(published, abs=0.005)  # type: ignore[arg-type]


def test_runs_that_agree_perfectly_have_an_icc_of_one() -> None:
    cases = np.array([[100.0] * 5, [400.0] * 5, [900.0] * 5])
    assert icc(cases, "1,1") == pytest.approx(1.0)
    assert icc(cases, "2,1") == pytest.approx(1.0)


def test_bland_altman_bias_and_limits() -> None:
    # errors of +2 %, −2 %, +4 %, 0 %: mean +1 %, sample SD sqrt(20/3) %
    a = bland_altman([102, 98, 104, 100], [100, 100, 100, 100])
    sd = math.sqrt((1 + 9 + 9 + 1) / 3) / 100
    assert (a.n, a.bias, a.sd) == (4, pytest.approx(0.01), pytest.approx(sd))
    assert (a.low, a.high) == (
        pytest.approx(0.01 - 1.96 * sd, abs=1e-4),
        pytest.approx(0.01 + 1.96 * sd, abs=1e-4),
    )


def test_cv_of_repeated_runs() -> None:
    assert cv([98.0, 100.0, 102.0]) == pytest.approx(0.02)
    assert cv([5.0]) == 0.0


def test_a_linear_fit_recovers_its_line_and_says_how_well() -> None:
    x = np.arange(10.0)
    fit = linear_fit(3.0 + 2.0 * x, [x])
    assert fit.coefficients == (pytest.approx(3.0), pytest.approx(2.0))
    assert fit.r_squared == pytest.approx(1.0)
    noisy = linear_fit(3.0 + 2.0 * x + np.array([1, -1] * 5), [x])
    assert 0.9 < noisy.r_squared < 1.0


def test_calibration_removes_a_constant_hardware_bias() -> None:
    truths = np.array([100.0, 250.0, 800.0])
    c = calibration(truths / 1.25, truths)  # the other hardware measures 20 % low
    assert c.factor == pytest.approx(1.25)
    assert c.bias_before == pytest.approx(-0.2) and c.bias_after == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: relative_errors([1.0, 2.0], [1.0]), "pair them one to one"),
        (lambda: relative_errors([1.0], [0.0]), "truth must be > 0"),
        (lambda: bland_altman([], []), "non-empty list"),
        (lambda: icc([[1.0, 2.0]]), "at least 2 cases"),
        (lambda: linear_fit([1.0, 2.0], [[1.0, 2.0]]), "cannot fit"),
        (lambda: cv([float("nan")]), "finite"),
    ],
)
def test_bad_input_says_what_is_wrong(call: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.slow
def test_analyze_summarises_repeated_probes_of_one_endpoint(tmp_path: Path) -> None:
    """Three seeded probes of the vision class, stored; `ridgeline analyze` reads their
    capacities back: their mean and spread, and the agreement with a truth given."""
    db = tmp_path / "runs.sqlite"
    found = []
    with RunStore(db) as store:
        for seed in range(3):
            cfg = ProbeConfig(
                slo="p99<50ms,errors<0.1%",
                strategy="binary",
                strategy_options={"min_rate": 400.0, "step_duration_s": 5.0},
                seed=seed,
            )
            r = run_probe(make_driver("sim:vision"), cfg, store=store)
            assert r.capacity_rps is not None
            found.append(r.capacity_rps)
        store.create_run("run", "http://127.0.0.1:1/x", {})  # not a probe: run 4
    cmd = [sys.executable, "-m", "ridgeline", "analyze", "1", "2", "3", "--db", str(db)]
    res = subprocess.run(
        [*cmd, "--truth", "850", "--json"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["n"] == 3 and out["runs"] == [1, 2, 3]
    assert out["mean"] == pytest.approx(sum(found) / 3)
    assert out["low"] == min(found) and out["high"] == max(found)
    assert out["agreement"]["bias"] == pytest.approx(sum(found) / 3 / 850 - 1)
    bad = subprocess.run([*cmd, "4"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "run 4 (run, running) has no capacity" in bad.stderr
