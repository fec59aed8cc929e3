"""One record per request, held as columns: scheduled, sent, done, outcome, tokens.

Times are seconds from the step's start (the instant of scheduled offset 0). ``sent``
and ``done`` are NaN when the request was never sent or never answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray


class Outcome(IntEnum):
    OK = 0
    ERROR = 1
    """The server answered with an error, or the transport failed."""
    TIMEOUT = 2
    """No answer within the per-request timeout (latency = time until given up)."""
    DROPPED = 3
    """The server answered at once that the request could not meet its SLO."""
    NOT_SENT = 4
    """The step stopped (interrupted) before this request's scheduled time came."""
    INCOMPLETE = 5
    """Sent, but the step stopped waiting before an answer came (counted as an error)."""


FAILED = (Outcome.ERROR, Outcome.TIMEOUT, Outcome.INCOMPLETE)
"""Outcomes counted as errors in every error metric."""


@dataclass(slots=True)
class Records:
    scheduled: NDArray[np.float64]
    sent: NDArray[np.float64]
    done: NDArray[np.float64]
    outcome: NDArray[np.int8]
    first_token: NDArray[np.float64]
    output_tokens: NDArray[np.int32]
    errors: dict[str, int]
    """Error reasons (exception type or server message) and how often each came."""
    outstanding_limited: int = 0
    """Sends that waited because the outstanding-request limit was reached."""
    client_failures: int = 0
    """Requests that failed in the load generator itself (out of file descriptors, of
    memory, of local ports): the generator's failure, not the server's."""

    def __len__(self) -> int:
        return int(self.scheduled.shape[0])

    @property
    def latency_from_schedule(self) -> NDArray[np.float64]:
        return self.done - self.scheduled

    @property
    def latency_from_send(self) -> NDArray[np.float64]:
        return self.done - self.sent

    @property
    def lateness(self) -> NDArray[np.float64]:
        return self.sent - self.scheduled

    def count(self, *outcomes: Outcome) -> int:
        return int(np.isin(self.outcome, [int(o) for o in outcomes]).sum())

    @staticmethod
    def empty(scheduled: NDArray[np.float64]) -> Records:
        n = scheduled.shape[0]
        nan = np.full(n, np.nan)
        return Records(
            scheduled=scheduled.astype(np.float64, copy=True),
            sent=nan.copy(),
            done=nan.copy(),
            outcome=np.full(n, int(Outcome.NOT_SENT), dtype=np.int8),
            first_token=nan.copy(),
            output_tokens=np.zeros(n, dtype=np.int32),
            errors={},
        )

    @staticmethod
    def merge(parts: list[Records]) -> Records:
        """Concatenate shards and order them by scheduled time (stable)."""
        if not parts:
            raise ValueError("nothing to merge")
        cat = Records(
            scheduled=np.concatenate([p.scheduled for p in parts]),
            sent=np.concatenate([p.sent for p in parts]),
            done=np.concatenate([p.done for p in parts]),
            outcome=np.concatenate([p.outcome for p in parts]),
            first_token=np.concatenate([p.first_token for p in parts]),
            output_tokens=np.concatenate([p.output_tokens for p in parts]),
            errors={},
            outstanding_limited=sum(p.outstanding_limited for p in parts),
            client_failures=sum(p.client_failures for p in parts),
        )
        for p in parts:
            for k, v in p.errors.items():
                cat.errors[k] = cat.errors.get(k, 0) + v
        order = np.argsort(cat.scheduled, kind="stable")
        return Records(
            scheduled=cat.scheduled[order],
            sent=cat.sent[order],
            done=cat.done[order],
            outcome=cat.outcome[order],
            first_token=cat.first_token[order],
            output_tokens=cat.output_tokens[order],
            errors=cat.errors,
            outstanding_limited=cat.outstanding_limited,
            client_failures=cat.client_failures,
        )
