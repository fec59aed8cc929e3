"""Per-request records for store tests: ``n`` requests 10 ms apart, each answered in 10 ms."""

from __future__ import annotations

import numpy as np

from ridgeline.telemetry.records import Outcome, Records


def answered(n: int) -> Records:
    sched = np.arange(n) / 100.0
    rec = Records.empty(sched)
    rec.sent[:] = sched
    rec.done[:] = sched + 0.01
    rec.outcome[:] = int(Outcome.OK)
    return rec
