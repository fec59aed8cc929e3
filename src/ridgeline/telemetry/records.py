"""One record per request, held as columns: scheduled, sent, done, outcome, tokens.

Times are seconds from the step's start (the instant of scheduled offset 0). ``sent``
and ``done`` are NaN when the request was never sent or never answered.

Streamed answers also keep every gap between consecutive content chunks, pooled in one
flat array in request order (``gaps``) with each request's slice given by ``gap_start``
(``n + 1`` offsets, CSR-style): request ``i``'s gaps are
``gaps[gap_start[i]:gap_start[i + 1]]``. Pooled, they are vLLM's inter-token latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

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
    prompt_tokens: NDArray[np.int32]
    """Prompt tokens per request: the server's ``usage`` count, else what was asked; 0
    when the request carries no prompt."""
    gaps: NDArray[np.float64]
    """Every inter-chunk gap of every streamed answer, seconds, in request order."""
    gap_start: NDArray[np.int64]
    """``n + 1`` offsets into ``gaps``: request ``i`` owns ``gaps[gap_start[i]:gap_start[i+1]]``."""
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

    def gaps_of(self, i: int) -> NDArray[np.float64]:
        """Request ``i``'s inter-chunk gaps (empty when it streamed fewer than two)."""
        return self.gaps[self.gap_start[i] : self.gap_start[i + 1]]

    def gap_counts(self) -> NDArray[np.int64]:
        """How many gaps each request has."""
        return np.diff(self.gap_start)

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
            prompt_tokens=np.zeros(n, dtype=np.int32),
            gaps=np.empty(0, dtype=np.float64),
            gap_start=np.zeros(n + 1, dtype=np.int64),
        )

    @staticmethod
    def concat(parts: Sequence[Records]) -> Records:
        """The parts end to end, in the order given (no sort: a judgement over every
        request needs none); errors and generator counts summed."""
        if not parts:
            raise ValueError("nothing to merge")
        errors: dict[str, int] = {}
        for p in parts:
            for k, v in p.errors.items():
                errors[k] = errors.get(k, 0) + v
        offsets = np.cumsum([0, *(p.gaps.shape[0] for p in parts[:-1])])
        starts = [parts[0].gap_start[:1]]
        starts += [p.gap_start[1:] + o for p, o in zip(parts, offsets, strict=True)]

        def cat(column: str) -> Any:
            return np.concatenate([getattr(p, column) for p in parts])

        return Records(
            scheduled=cat("scheduled"),
            sent=cat("sent"),
            done=cat("done"),
            outcome=cat("outcome"),
            first_token=cat("first_token"),
            output_tokens=cat("output_tokens"),
            errors=errors,
            prompt_tokens=cat("prompt_tokens"),
            gaps=cat("gaps"),
            gap_start=np.concatenate(starts),
            outstanding_limited=sum(p.outstanding_limited for p in parts),
            client_failures=sum(p.client_failures for p in parts),
        )

    @staticmethod
    def merge(parts: Sequence[Records]) -> Records:
        """Concatenate shards and order them by scheduled time (stable); each request keeps
        its gaps, in their order."""
        cat = Records.concat(parts)
        order = np.argsort(cat.scheduled, kind="stable")
        gaps, gap_start = _reordered_gaps(cat, order)
        return Records(
            scheduled=cat.scheduled[order],
            sent=cat.sent[order],
            done=cat.done[order],
            outcome=cat.outcome[order],
            first_token=cat.first_token[order],
            output_tokens=cat.output_tokens[order],
            errors=cat.errors,
            prompt_tokens=cat.prompt_tokens[order],
            gaps=gaps,
            gap_start=gap_start,
            outstanding_limited=cat.outstanding_limited,
            client_failures=cat.client_failures,
        )


def _reordered_gaps(
    rec: Records, order: NDArray[np.intp]
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``gaps`` and ``gap_start`` of ``rec``'s requests taken in ``order``: each request's
    slice moved whole, by index arithmetic (no loop over requests; none at all without
    gaps, as answers that do not stream have none)."""
    n = order.shape[0]
    if rec.gaps.shape[0] == 0:
        return np.empty(0, dtype=np.float64), np.zeros(n + 1, dtype=np.int64)
    counts = rec.gap_counts()[order]
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    # output position p of request k (start[k] <= p < start[k + 1]) reads its source
    # slice at rec.gap_start[order[k]] + (p - start[k])
    shift = rec.gap_start[:-1][order] - start[:-1]
    source = np.arange(start[-1], dtype=np.int64) + np.repeat(shift, counts)
    return rec.gaps[source], start


def gaps_from(
    per_request: Sequence[Sequence[float] | NDArray[np.float64]],
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``gaps`` and ``gap_start`` for one list of gaps per request, in request order."""
    counts = np.fromiter((len(g) for g in per_request), dtype=np.int64, count=len(per_request))
    start = np.zeros(len(per_request) + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    flat = (
        np.concatenate([np.asarray(g, dtype=np.float64) for g in per_request])
        if int(start[-1])
        else np.empty(0, dtype=np.float64)
    )
    return flat, start
