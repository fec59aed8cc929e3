"""Repeated probes of one endpoint: how alike they are, and how far from a known truth.

``repeatability(capacities)`` gives the mean, the sample SD and the coefficient of
variation of the capacities repeated probes found; with ``truth`` (a long-run capacity
measured apart, or a simulated server's), the Bland–Altman bias and 95 % limits of
agreement of the relative error too. What ``ridgeline analyze RUN_IDS`` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ridgeline.analysis.agreement import Agreement, bland_altman, cv
from ridgeline.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Repeatability:
    n: int
    mean: float
    sd: float
    cv: float
    low: float
    high: float
    """The lowest and the highest capacity found."""
    agreement: Agreement | None = None
    """Against the truth, when one was given."""


def repeatability(capacities: Sequence[float], truth: float | None = None) -> Repeatability:
    if not capacities:
        raise ConfigError("no capacities to analyse: give the runs of repeated probes")
    v = np.asarray(capacities, dtype=np.float64)
    agreement = None
    if truth is not None:
        agreement = bland_altman(v, np.full(v.shape, truth))
    sd = float(v.std(ddof=1)) if v.size > 1 else 0.0
    return Repeatability(
        int(v.size), float(v.mean()), sd, cv(v), float(v.min()), float(v.max()), agreement
    )
