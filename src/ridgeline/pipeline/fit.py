"""The GPU roofline's constants, fitted to public per-MIG-slice measurements.

**Data.** ``ridgeline/data/migprofiler_a100_80gb.csv``: MIGProfiler's inference latencies on
an A100-SXM4-80GB (GitHub ``HuaizhengZhang/MIGProfiler`` at ``5462a7c``, MIT; see
``data/ATTRIBUTION.md``): ResNet-50, ViT-B/16 and BERT-base (sequences of 64 tokens) on
the 1g.10gb, 2g.20gb, 3g.40gb and 7g.80gb slices at batches 1 to 256, 108 rows. They are
PyTorch 1.12 in eager mode, FP32 weights (cuDNN convolutions on TF32 tensor cores, matmuls
in FP32), each batch's forward pass timed by CUDA events on the GPU (no host copies):
the constants fitted to them describe that software stack.

**Model.** ``roofline.latency_ms`` itself, with its occupancy term, and what the planner
knows of a variant: its FLOPs per item only (``MEASURED_GFLOPS``), its bytes derived from
them. Three constants are fitted: ``overhead_ms``, ``efficiency`` and
``saturation_gflop_per_sm``. The bytes per GFLOP stay at their stated guesses: with the
compute roof this low, memory binds on none of these rows, so the data cannot tell them.

**Fit.** Least squares on log latency (every row's relative error counts alike, a 5 ms
row as much as a 4 s one), by Levenberg–Marquardt in the logs of the constants (so they
stay positive), from a fixed grid of starts, the best kept: deterministic. The constants
are rounded to four significant figures, and every error is that of the rounded ones,
the constants shipped.

**Evaluation.** Fitted on the development models (ResNet-50 and BERT-base) only; the
error is reported on them, on the held-out ViT-B/16, and on all rows; and the 7 × 1g ÷ 7g
throughput ratio (seven 1g slices against one whole GPU) fitted beside measured.
``benchmarks/roofline_fit.py`` runs it and writes ``ridgeline/data/roofline_fit.json``,
which ``roofline.fitted_roofline`` loads.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from importlib import resources
from types import MappingProxyType

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import PlanError
from ridgeline.pipeline.roofline import (
    CPU_ROOFLINE,
    FIT_FILE,
    Cost,
    Roof,
    Roofline,
    Work,
    latency_ms,
)
from ridgeline.pipeline.segments import parse_segment

GPU = "A100-80GB"
"""The GPU type the measurements were taken on (MIG enabled: 7g.80gb has 98 SMs)."""
DATA_FILE = "migprofiler_a100_80gb.csv"
REPOSITORY = "HuaizhengZhang/MIGProfiler"
COMMIT = "5462a7c1bf586a8121fa695a80d4cedb935d4425"
LICENCE = "MIT (the repository's LICENSE, added in f5d3a96; see data/ATTRIBUTION.md)"
DEVELOPMENT = ("resnet50", "bert-base-seq64")
HELD_OUT = ("vit-b16",)
RATIO_BATCHES = (1, 8, 32, 256)
COMMAND = "python benchmarks/roofline_fit.py --write"

MEASURED_GFLOPS: Mapping[str, float] = MappingProxyType(
    {
        # torchvision's weights tables print 4.09 and 17.56 "GFLOPS", counted as
        # multiply-adds (fvcore); FLOPs are twice that
        "resnet50": 2 * 4.09,
        "vit-b16": 2 * 17.56,
        # bert-base-multilingual-cased at 64 tokens: 12 layers of 4·768² + 2·768·3072
        # weights (84.9 M), 2 FLOPs each per token, plus attention's 4·64·768 per token
        # per layer: 64 × (169.9 + 2.4) MFLOPs
        "bert-base-seq64": 11.0,
    }
)
"""FLOPs per item (billions) of each measured model, as the planner would know them."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured row: a model's batch on a MIG slice of the A100-80GB."""

    model: str
    profile: str
    batch: int
    latency_ms: float
    latency_std_ms: float
    throughput: float
    source: str


def load_measurements(text: str | None = None) -> list[Measurement]:
    """The shipped measurements (``ridgeline/data/migprofiler_a100_80gb.csv``), or the CSV
    ``text`` in its columns."""
    if text is None:
        text = resources.files("ridgeline").joinpath("data", DATA_FILE).read_text()
    out = []
    for rec in csv.DictReader(io.StringIO(text)):
        if rec["model"] not in MEASURED_GFLOPS:
            raise PlanError(
                f"measurement of {rec['model']!r}: no FLOPs per item for it in "
                f"fit.MEASURED_GFLOPS (known: {', '.join(MEASURED_GFLOPS)})"
            )
        out.append(
            Measurement(
                rec["model"],
                rec["profile"],
                int(rec["batch"]),
                float(rec["latency_ms"]),
                float(rec["latency_std_ms"]),
                float(rec["throughput"]),
                rec["source"],
            )
        )
    return out


Predict = Callable[[Roofline], list[float]]


def predictor(rows: Sequence[Measurement], base: Roofline = CPU_ROOFLINE) -> Predict:
    """The roofline's latency of each row under a model (its work and roofs found once;
    the bytes per GFLOP are ``base``'s)."""
    cases = [
        (
            Work.of(Cost(r.model, MEASURED_GFLOPS[r.model]), base),
            Roof.gpu(parse_segment(GPU, r.profile)),
            r.batch,
        )
        for r in rows
    ]
    return lambda model: [latency_ms(w, roof, b, model) for w, roof, b in cases]


_FITTED = ("overhead_ms", "efficiency", "saturation_gflop_per_sm")
_STARTS = tuple(itertools.product((1.0, 5.0), (0.05, 0.3), (0.1, 1.0)))
"""Starting constants (overhead ms, efficiency, saturation GFLOP/SM), each tried."""


def fit_roofline(rows: Sequence[Measurement], base: Roofline = CPU_ROOFLINE) -> Roofline:
    """``base`` with overhead, efficiency and saturation fitted to ``rows`` by least
    squares on log latency, rounded to four significant figures, and marked as
    calibrated on the measurements' GPU."""
    if not rows:
        raise PlanError("no measurements to fit the roofline to")
    predict = predictor(rows, base)
    measured = np.log([r.latency_ms for r in rows])

    def residuals(theta: np.ndarray) -> np.ndarray:
        model = base.model_copy(update=dict(zip(_FITTED, np.exp(theta).tolist(), strict=True)))
        return np.log(predict(model)) - measured

    best = min(
        (_levenberg_marquardt(residuals, np.log(start)) for start in _STARTS),
        key=lambda found: found[1],
    )
    values = {k: _round(v) for k, v in zip(_FITTED, np.exp(best[0]).tolist(), strict=True)}
    return Roofline.model_validate({**base.model_dump(), **values, "calibrated_on": (GPU,)})


def _levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray], theta: np.ndarray
) -> tuple[np.ndarray, float]:
    """Minimise the sum of squared ``residuals`` from ``theta``: Gauss–Newton steps
    damped by ``lam`` (raised until a step lowers the cost, lowered after it); central
    differences for the Jacobian. Returns the constants and their cost."""
    r = residuals(theta)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(200):
        jac = np.empty((r.size, theta.size))
        for j in range(theta.size):
            h = np.zeros_like(theta)
            h[j] = 1e-6
            jac[:, j] = (residuals(theta + h) - residuals(theta - h)) / 2e-6
        grad, hess = jac.T @ r, jac.T @ jac
        while lam < 1e10:
            step = np.linalg.solve(hess + lam * np.diag(np.diag(hess) + 1e-12), -grad)
            trial = residuals(theta + step)
            trial_cost = float(trial @ trial)
            if math.isfinite(trial_cost) and trial_cost < cost:
                break
            lam *= 4.0
        else:
            return theta, cost
        theta, r, lam = theta + step, trial, lam / 3.0
        done = cost - trial_cost < 1e-12 * cost
        cost = trial_cost
        if done:
            break
    return theta, cost


def _round(x: float) -> float:
    return float(f"{x:.4g}")


class Error(BaseModel):
    """How far a model's latencies are from the measured ones over some rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: int = Field(ge=1, description="measured rows compared")
    rms_log: float = Field(ge=0, description="root mean square of ln(model / measured)")
    bias_log: float = Field(description="mean of ln(model / measured): > 0, model too slow")
    median_abs: float = Field(ge=0, description="median of |model / measured − 1|")
    max_abs: float = Field(ge=0, description="largest |model / measured − 1|")


def error(model: Roofline, rows: Sequence[Measurement]) -> Error:
    """The error of ``model``'s latencies against ``rows``."""
    if not rows:
        raise PlanError("no measured rows to compare the roofline with")
    ratio = np.array(predictor(rows, model)(model)) / np.array([r.latency_ms for r in rows])
    logs = np.log(ratio)
    rel = np.abs(ratio - 1.0)
    return Error(
        rows=len(rows),
        rms_log=_round(float(np.sqrt(np.mean(logs**2)))),
        bias_log=_round(float(np.mean(logs))),
        median_abs=_round(statistics.median(rel.tolist())),
        max_abs=_round(float(rel.max())),
    )


class Ratio(BaseModel):
    """Seven 1g slices' throughput over one 7g slice's, at one batch size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    batch: int = Field(ge=1)
    fitted: float = Field(gt=0)
    measured: float = Field(gt=0)


def seven_to_one(model: Roofline, rows: Sequence[Measurement]) -> list[Ratio]:
    """``7 × throughput(1g) / throughput(7g)`` fitted and measured, for every model and
    batch (of ``RATIO_BATCHES``) measured on both slices."""
    small, whole = "1g.10gb", "7g.80gb"
    at = {(r.model, r.profile, r.batch): r for r in rows}
    out = []
    for name in dict.fromkeys(r.model for r in rows):
        for b in RATIO_BATCHES:
            pair = [at.get((name, p, b)) for p in (small, whole)]
            if pair[0] is None or pair[1] is None:
                continue
            one, seven = predictor([pair[0], pair[1]], model)(model)
            fitted = 7 * seven / one
            measured = 7 * pair[1].latency_ms / pair[0].latency_ms
            out.append(Ratio(model=name, batch=b, fitted=_round(fitted), measured=_round(measured)))
    return out


class Fit(BaseModel):
    """A fit as shipped (``ridgeline/data/roofline_fit.json``): the constants, where the
    data came from, and how far the constants are from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    roofline: Roofline
    data: str = Field(description="the measurements' file in ridgeline/data/")
    repository: str
    commit: str
    licence: str
    development: tuple[str, ...] = Field(description="the models the constants were fitted to")
    held_out: tuple[str, ...] = Field(description="models measured but not fitted to")
    errors: dict[str, Error] = Field(
        description="development, held_out, all, and each model by its name"
    )
    ratios: list[Ratio]
    fitted: date
    command: str


def run_fit(
    rows: Sequence[Measurement],
    today: date,
    development: Iterable[str] = DEVELOPMENT,
) -> Fit:
    """Fit on the ``development`` models' rows, and report the error everywhere."""
    dev = tuple(development)
    held = tuple(sorted({r.model for r in rows} - set(dev)))
    model = fit_roofline([r for r in rows if r.model in dev])
    groups = {
        "development": dev,
        "held_out": held,
        "all": (*dev, *held),
        **{name: (name,) for name in (*dev, *held)},
    }
    errors = {
        k: error(model, [r for r in rows if r.model in names])
        for k, names in groups.items()
        if names
    }
    return Fit(
        roofline=model,
        data=DATA_FILE,
        repository=REPOSITORY,
        commit=COMMIT,
        licence=LICENCE,
        development=dev,
        held_out=held,
        errors=errors,
        ratios=seven_to_one(model, rows),
        fitted=today,
        command=COMMAND,
    )


def to_json(fit: Fit) -> str:
    return json.dumps(fit.model_dump(mode="json"), indent=2) + "\n"


def load_fit() -> Fit:
    """The shipped fit (``ridgeline/data/roofline_fit.json``)."""
    text = resources.files("ridgeline").joinpath("data", FIT_FILE).read_text()
    return Fit.model_validate_json(text)
