"""Each tool's output read back into one shape, ``Figures``, compared like with like.

The three tools name the same quantities differently; what each figure is read from
(ridgeline: ``run --json``; GuideLLM 0.8.1: ``--output kind=json``; AIPerf 0.13: the
artifact directory's ``profile_export_aiperf.json`` and ``profile_export.jsonl``):

- ``ttft_p50_ms``: ``ttft_ms`` (``ttft_from_send_ms`` where present); GuideLLM
  ``time_to_first_token_ms``; AIPerf ``time_to_first_token``.
- ``tpot_p50_ms``, the per-request mean gap (e2e − ttft)/(n − 1): ``tpot_ms`` (before
  issue 15's metrics land, ``itl_ms``, then that same per-request mean); GuideLLM
  ``inter_token_latency_ms``; AIPerf ``inter_token_latency``. Both peers call it ITL.
- ``itl_pooled_p50_ms``, every gap of every answer pooled (vLLM's ITL): ``itl_ms`` once
  ``tpot_ms`` exists; GuideLLM keeps no per-token times (None); AIPerf
  ``inter_chunk_latency``.
- ``e2e_p50_ms``: ``latency_from_send_ms``; GuideLLM ``request_latency`` (s); AIPerf
  ``request_latency``.
- ``out_tok_s``: ``output_tokens_per_s``; GuideLLM ``output_tokens_per_second`` (all
  requests, the ones cut at the end included); AIPerf ``output_token_throughput``.
- ``send_rps``: ridgeline ``sent`` / duration (its schedule is fixed: falling behind shows
  as lateness and an INVALID verdict); the peers' sends per second between their first
  and last send.
- ``lateness_p99_ms``: ``lateness_ms`` (send − schedule); GuideLLM request start −
  targeted start; AIPerf records no intended time (None).

All three time TTFT and E2E from the actual send here (ridgeline also from the schedule;
at a rate the generator holds the two agree). Percentiles are each tool's own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Figures:
    """One tool's result at one offered rate."""

    tool: str
    offered_rps: float
    duration_s: float
    sent: int
    ok: int
    errors: int
    send_rps: float
    achieved_rps: float
    """The tool's own throughput figure (its definitions differ: see the module)."""
    ttft_p50_ms: float
    tpot_p50_ms: float
    itl_pooled_p50_ms: float | None
    e2e_p50_ms: float
    out_tok_s: float
    lateness_p99_ms: float | None
    invalid_reason: str | None = None
    """The tool's own verdict that the step is not the server's result (ridgeline's)."""


def _p99(values: list[float]) -> float | None:
    """The nearest-rank 99th percentile, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _send_rate(starts: list[float]) -> float:
    """Sends per second between the first and the last: a constant schedule held gives
    its rate exactly, whatever the window's edges."""
    starts = sorted(starts)
    if len(starts) < 2 or starts[-1] <= starts[0]:
        return 0.0
    return (len(starts) - 1) / (starts[-1] - starts[0])


def ridgeline(doc: dict[str, Any]) -> Figures:
    """``ridgeline run --json`` output."""
    pooled = "tpot_ms" in doc  # issue 15's metrics: itl_ms pooled, tpot_ms per request
    ttft = doc.get("ttft_from_send_ms") or doc["ttft_ms"]
    return Figures(
        tool="ridgeline",
        offered_rps=float(doc["offered_rps"]),
        duration_s=float(doc["duration_s"]),
        sent=int(doc["sent"]),
        ok=int(doc["ok"]),
        errors=int(doc["errors"]) + int(doc.get("timeouts", 0)),
        send_rps=int(doc["sent"]) / float(doc["duration_s"]),
        achieved_rps=float(doc["achieved_rps"]),
        ttft_p50_ms=float(ttft["p50"]),
        tpot_p50_ms=float((doc["tpot_ms"] if pooled else doc["itl_ms"])["p50"]),
        itl_pooled_p50_ms=float(doc["itl_ms"]["p50"]) if pooled else None,
        e2e_p50_ms=float(doc["latency_from_send_ms"]["p50"]),
        out_tok_s=float(doc["output_tokens_per_s"]),
        lateness_p99_ms=float(doc["lateness_ms"]["p99"]),
        invalid_reason=None if doc.get("valid", True) else str(doc.get("invalid_reason")),
    )


def guidellm(path: Path, offered_rps: float) -> Figures:
    """GuideLLM's JSON report (one benchmark: one constant rate)."""
    bench = json.loads(path.read_text())["benchmarks"][0]
    metrics, requests = bench["metrics"], bench["requests"]
    everyone = [r for kind in ("successful", "errored", "incomplete") for r in requests[kind]]
    starts = [float(r["request_start_time"]) for r in everyone if r["request_start_time"]]
    late = [
        1000.0 * (r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"])
        for r in everyone
        if r["info"]["timings"].get("targeted_start") and r["info"]["timings"].get("request_start")
    ]

    def median(name: str, scale: float = 1.0) -> float:
        return scale * float(metrics[name]["successful"]["median"])

    return Figures(
        tool="GuideLLM",
        offered_rps=offered_rps,
        duration_s=float(bench["duration"]),
        sent=len(starts),
        ok=len(requests["successful"]),
        errors=len(requests["errored"]),
        send_rps=_send_rate(starts),
        achieved_rps=float(metrics["requests_per_second"]["successful"]["mean"]),
        ttft_p50_ms=median("time_to_first_token_ms"),
        tpot_p50_ms=median("inter_token_latency_ms"),
        itl_pooled_p50_ms=None,
        e2e_p50_ms=median("request_latency", 1000.0),
        out_tok_s=float(metrics["output_tokens_per_second"]["total"]["mean"]),
        lateness_p99_ms=_p99(late),
    )


def aiperf(artifacts: Path, offered_rps: float) -> Figures:
    """AIPerf's artifact directory: the summary JSON and the per-request JSONL."""
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    records = [
        json.loads(line)
        for line in (artifacts / "profile_export.jsonl").read_text().splitlines()
        if line.strip()
    ]
    starts = [r["metadata"]["request_start_ns"] / 1e9 for r in records]
    errors = sum(1 for r in records if r.get("error"))

    def p50(name: str) -> float:
        return float(summary[name]["p50"])

    return Figures(
        tool="AIPerf",
        offered_rps=offered_rps,
        duration_s=float(summary["benchmark_duration"]["avg"]),
        sent=len(records),
        ok=len(records) - errors,
        errors=errors,
        send_rps=_send_rate(starts),
        achieved_rps=float(summary["request_throughput"]["avg"]),
        ttft_p50_ms=p50("time_to_first_token"),
        tpot_p50_ms=p50("inter_token_latency"),
        itl_pooled_p50_ms=p50("inter_chunk_latency"),
        e2e_p50_ms=p50("request_latency"),
        out_tok_s=float(summary["output_token_throughput"]["avg"]),
        lateness_p99_ms=None,
    )
