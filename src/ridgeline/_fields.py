"""Constrained numbers every configuration declares its fields with: one definition of
each bound, so a rate, a duration or a fraction is checked alike everywhere."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

Share = Annotated[float, Field(gt=0, le=1)]
"""A fraction in (0, 1]."""
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite number > 0."""
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite number ≥ 0."""
Rate = Positive
"""A finite rate > 0, requests per second."""
MAX_STEP_RATE = 1_000_000.0
"""The highest rate a probe's step (or its warm-up) may send, requests/s: past what a
load generator here sends (tens of thousands a second a process), and a step of seconds
at it would hold more arrivals than a schedule may (``workload._unit.MAX_ARRIVALS``)."""
StepRate = Annotated[float, Field(gt=0, le=MAX_STEP_RATE, allow_inf_nan=False)]
"""A rate a probe sends at: finite, > 0, at most ``MAX_STEP_RATE``."""
NonNegativeRate = NonNegative
"""A finite rate ≥ 0, requests per second."""
Seconds = Positive
"""A finite duration > 0, seconds."""
MAX_PORT = 65535
"""The highest TCP port."""
Port = Annotated[int, Field(ge=0, le=MAX_PORT)]
"""A TCP port, 0 to 65535 (0: any free one)."""
Count = Annotated[int, Strict(), Field(ge=1)]
"""A whole number ≥ 1 (a batch size, instances, cores), strict: ``true``, ``2.5`` or
``"4"`` in a file is an error, not 1, 2 or 4."""
