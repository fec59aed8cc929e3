"""Is a step the server's result, or the generator's? A pure rule.

A step whose generator fell behind (p99 lateness above the bound), that could not send
every scheduled request, or that was interrupted is invalid, with the reason; it is
never reported as the server's result.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ridgeline.telemetry.records import Outcome, Records


class ValidityConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    lateness_p99_bound_s: float = Field(
        0.001, gt=0, description="largest p99 of (actual send − scheduled send) for a valid step"
    )


def assess_validity(
    rec: Records, cfg: ValidityConfig, *, interrupted: bool = False
) -> tuple[bool, str | None]:
    """(valid, reason): the reason names every rule the step broke, and how to fix it."""
    reasons: list[str] = []
    if interrupted:
        reasons.append("interrupted before its end")
    not_sent = rec.count(Outcome.NOT_SENT)
    if not_sent and not interrupted:
        reasons.append(f"{not_sent} of {len(rec)} scheduled requests were never sent")
    lateness = rec.lateness[np.isfinite(rec.lateness)]
    if lateness.size:
        p99 = float(np.percentile(lateness, 99))
        bound = cfg.lateness_p99_bound_s
        if p99 > bound:
            reasons.append(
                f"generator fell behind: p99 lateness {p99 * 1e3:.3f} ms > {bound * 1e3:g} ms "
                "(lower the rate, add generator processes, or raise the bound)"
            )
    if rec.outstanding_limited:
        reasons.append(
            f"{rec.outstanding_limited} sends waited for the outstanding-request limit "
            "(the server is not keeping up, or raise --max-outstanding)"
        )
    if not reasons:
        return True, None
    return False, "; ".join(reasons)
