"""A HiGHS model from rows, for the planner's MILP and the exact MIG packer."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import highspy
import numpy as np

Row = tuple[float, float, dict[int, float]]
"""One constraint: (lower, upper, {column: coefficient})."""


def integer_model(
    upper: Sequence[float], rows: Sequence[Row], *, time_limit_s: float, mip_gap: float
) -> highspy.Highs:
    """A HiGHS model of integer columns in [0, ``upper[i]``] (1: a binary) and ``rows``;
    its costs are set by the caller (``changeColsCost``) before each run."""
    k = len(upper)
    h = new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", mip_gap)
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("threads", 1)
    empty_i, empty_f = np.array([], dtype=np.int32), np.array([], dtype=np.float64)
    h.addCols(
        k,
        np.zeros(k),
        np.zeros(k),
        np.asarray(upper, dtype=np.float64),
        0,
        empty_i,
        empty_i,
        empty_f,
    )
    h.changeColsIntegrality(
        k, np.arange(k, dtype=np.int32), np.full(k, highspy.HighsVarType.kInteger)
    )
    starts: list[int] = []
    index: list[int] = []
    value: list[float] = []
    for _, _, terms in rows:
        starts.append(len(index))
        index.extend(terms)
        value.extend(terms.values())
    h.addRows(
        len(rows),
        np.array([r[0] for r in rows], dtype=np.float64),
        np.array([r[1] for r in rows], dtype=np.float64),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value, dtype=np.float64),
    )
    return h


def new_highs() -> highspy.Highs:
    """A HiGHS instance. HiGHS prints a banner on stdout (the file descriptor, past
    Python) when a process makes its first one, which would break ``--json`` output: it
    is made with descriptor 1 pointed at /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()  # type: ignore[no-untyped-call]
    finally:
        os.dup2(saved, 1)
        os.close(saved)
