"""Agreement and repeatability statistics, pure functions over numbers.

* ``bland_altman`` — the bias and 95 % limits of agreement of estimates against a truth,
  on the relative error (estimate / truth − 1): a method is judged by its bias and by how
  wide the band is in which 95 % of its errors fall (Bland & Altman 1986).
* ``icc`` — intraclass correlation from a cases × runs table (Shrout & Fleiss 1979):
  ``"1,1"`` one-way random (how alike repeated runs of one case are, against the spread
  between cases), ``"2,1"`` two-way random with absolute agreement, ``"3,1"`` two-way
  mixed, consistency.
* ``cv`` — the coefficient of variation of repeated runs (sample SD over mean).
* ``linear_fit`` — least squares of a response on predictors, with R²: an estimate on the
  truth (R² and slope), or the error on server parameters (which behaviours cost it).
* ``calibration`` — the factor that maps estimates measured on one hardware onto the
  truth of another (the geometric mean of truth / estimate), and the bias it leaves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ridgeline.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Agreement:
    n: int
    bias: float
    """Mean relative error (estimate / truth − 1)."""
    sd: float
    """Sample standard deviation of the relative errors."""
    low: float
    high: float
    """The 95 % limits of agreement: bias ∓ 1.96·sd."""


def _vector(values: ArrayLike, what: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or not bool(np.all(np.isfinite(a))):
        raise ConfigError(f"{what} must be a non-empty list of finite numbers")
    return a


def relative_errors(estimates: ArrayLike, truths: ArrayLike) -> np.ndarray:
    """estimate / truth − 1, pair by pair."""
    e, t = _vector(estimates, "estimates"), _vector(truths, "truths")
    if e.shape != t.shape:
        raise ConfigError(f"{e.size} estimates against {t.size} truths: pair them one to one")
    if not bool(np.all(t > 0)):
        raise ConfigError("every truth must be > 0 (a capacity, requests per second)")
    return np.asarray(e / t - 1.0)


def bland_altman(estimates: ArrayLike, truths: ArrayLike) -> Agreement:
    err = relative_errors(estimates, truths)
    bias = float(err.mean())
    sd = float(err.std(ddof=1)) if err.size > 1 else 0.0
    z = NormalDist().inv_cdf(0.975)  # 1.96: 95 % of normal errors lie within ±z·sd
    return Agreement(int(err.size), bias, sd, bias - z * sd, bias + z * sd)


def cv(values: ArrayLike) -> float:
    """Sample SD over mean of repeated runs (0 for a single run)."""
    v = _vector(values, "values")
    if v.mean() == 0:
        raise ConfigError("the coefficient of variation needs a non-zero mean")
    return float(v.std(ddof=1) / abs(v.mean())) if v.size > 1 else 0.0


def icc(table: ArrayLike, form: Literal["1,1", "2,1", "3,1"] = "2,1") -> float:
    """Intraclass correlation of a cases × runs table (rows: cases; columns: runs, or
    raters), from the two-way ANOVA mean squares (Shrout & Fleiss 1979)."""
    y = np.asarray(table, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 2 or y.shape[1] < 2 or not bool(np.all(np.isfinite(y))):
        raise ConfigError("an ICC needs a table of finite numbers: at least 2 cases × 2 runs")
    n, k = int(y.shape[0]), int(y.shape[1])
    grand = float(y.mean())
    ss_rows = k * float(((y.mean(axis=1) - grand) ** 2).sum())
    ss_cols = n * float(((y.mean(axis=0) - grand) ** 2).sum())
    ss_total = float(((y - grand) ** 2).sum())
    ss_err = ss_total - ss_rows - ss_cols
    bms = float(ss_rows / (n - 1))
    jms = float(ss_cols / (k - 1))
    ems = float(ss_err / ((n - 1) * (k - 1)))
    wms = float((ss_cols + ss_err) / (n * (k - 1)))
    if form == "1,1":
        return (bms - wms) / (bms + (k - 1) * wms)
    if form == "2,1":
        return (bms - ems) / (bms + (k - 1) * ems + k * (jms - ems) / n)
    if form == "3,1":
        return (bms - ems) / (bms + (k - 1) * ems)
    raise ConfigError(f"ICC form {form!r}: use '1,1', '2,1' or '3,1'")


@dataclass(frozen=True, slots=True)
class Fit:
    coefficients: tuple[float, ...]
    """The intercept, then one slope per predictor."""
    r_squared: float


def linear_fit(response: ArrayLike, predictors: Sequence[ArrayLike]) -> Fit:
    """Least squares of ``response`` on an intercept and ``predictors`` (each as long as
    the response), with the R² of the fit."""
    y = _vector(response, "the response")
    cols = [np.ones_like(y)] + [_vector(p, "a predictor") for p in predictors]
    if any(c.shape != y.shape for c in cols):
        raise ConfigError("every predictor must have one value per response value")
    if y.size <= len(cols):
        raise ConfigError(f"{y.size} points cannot fit {len(cols)} coefficients; add points")
    x = np.column_stack(cols)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ beta
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return Fit(tuple(float(b) for b in beta), r2)


@dataclass(frozen=True, slots=True)
class Calibration:
    factor: float
    """Multiply an estimate measured on the source hardware by this for the target's."""
    bias_before: float
    bias_after: float
    """Mean relative error against the target's truth, without and with the factor."""


def calibration(estimates: ArrayLike, truths: ArrayLike) -> Calibration:
    """The factor (geometric mean of truth / estimate) that removes the bias of estimates
    measured on one hardware against the truth of another."""
    err = relative_errors(estimates, truths)
    e, t = np.asarray(estimates, dtype=np.float64), np.asarray(truths, dtype=np.float64)
    if not bool(np.all(e > 0)):
        raise ConfigError("every estimate must be > 0 to calibrate")
    factor = math.exp(float(np.log(t / e).mean()))
    after = float((e * factor / t - 1.0).mean())
    return Calibration(factor, float(err.mean()), after)
