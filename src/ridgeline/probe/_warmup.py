"""The warm-up phase of a probe, excluded from every verdict: rounds at a rising rate
until the server's p50 has stopped trending (the rules in ``health.warmup``), within
its share of a budget when one is set. Driven through ``probe._run.Run``; what it did
is a ``Warmed``.
"""

from __future__ import annotations

import asyncio

from ridgeline.health.judge import judge
from ridgeline.health.warmup import (
    WarmupConfig,
    round_healthy,
    warmup_ceiling,
    warmup_round,
    warmup_start,
)
from ridgeline.probe._run import Run, Warmed
from ridgeline.probe.config import ProbeConfig
from ridgeline.search.base import StepPlan

__all__ = ["WARMUP_SHARE", "budgeted_warmup", "warmup"]


WARMUP_SHARE = 0.2
"""Under a budget, the warm-up may take at most this share of it…"""
TREND_SHARE = 0.5
"""…and its trend is fitted to at most this share of those seconds' windows (the rest
for the ramp): a server still warming then is said to be (``Warmed.capped``)."""


def budgeted_warmup(cfg: ProbeConfig) -> WarmupConfig:
    """The warm-up's settings within the probe's budget (``WARMUP_SHARE``,
    ``TREND_SHARE``); as configured without one."""
    wc = cfg.warmup_config
    if cfg.budget_s is None:
        return wc
    cap = min(wc.max_s, WARMUP_SHARE * cfg.budget_s)
    windows = max(MIN_TREND_WINDOWS, int(TREND_SHARE * cap / wc.window_s))
    return wc.model_copy(
        update={
            "max_s": cap,
            "trend_windows": min(wc.trend_windows, windows),
            "min_windows": min(wc.min_windows, BUDGET_ROUND_WINDOWS),
            "growth": max(wc.growth, BUDGET_GROWTH),
        }
    )


MIN_TREND_WINDOWS = 10
BUDGET_ROUND_WINDOWS = 5
BUDGET_GROWTH = 2.0
"""Under a budget the ramp climbs in rounds of at most this many windows, by at least
this factor: from 1 req/s to 500 in some 45 s rather than 150."""


async def warmup(run: Run, first_rate: float, stop: asyncio.Event) -> Warmed:
    """The warm-up phase, excluded from every verdict: rounds of ``min_windows`` windows
    at a rate that starts at the search's first (``rate_fraction`` of it, or ``rate``,
    held) and rises while each round is well inside the SLO (``health.warmup``'s
    ``round_healthy`` and ``warmup_round``), until the p50 at the held rate has stopped
    trending and ``requests`` requests were sent, or ``max_s`` (a safety cap) has
    passed with them sent. Its length is kept in ``run.warmup_s`` and
    ``run.warmup_requests``; what it did is returned, and kept as ``run.warmed``: when
    the cap ended it still trending, ``capped`` and a ``note`` for the probe's reason."""
    wc = budgeted_warmup(run.cfg)
    given = run.cfg.strategy_options.get("max_rate")
    max_rate = float(given) if given is not None else None
    ceiling = warmup_ceiling(wc, max_rate)
    state = warmup_start(first_rate, wc, max_rate)
    sent, wanted = 0, wc.requests or 0
    while True:
        plan = StepPlan(state.rate, wc.window_s * wc.min_windows, "warmup")
        if run.on_start is not None:
            run.on_start(run.index + 1, plan)  # numbered as stored: the steps that follow
        result = await run.measure(plan, run.cfg.seed + 10_000 + run.index, stop)
        sent += result.summary.sent
        run.warmup_s += plan.duration_s
        run.warmup_requests += result.summary.sent
        run.t_s += plan.duration_s
        p50s: list[float | None] = []
        for w in result.windows:
            w.excluded = True
            p50s.append((w.latency_ms.p50 or 0.0) if w.offered else None)
            run.timeline.append(
                {
                    "t_s": run.t_s - plan.duration_s + w.start_s,
                    "step": -1,
                    "state": "warmup",
                    "score": 0.0,
                    "reason": "warmup",
                }
            )
        # a round the generator fell behind in measured the host: no reason to climb
        # (the search would start where it cannot send: over HTTP, 1.2 MB frames at
        # 16 req/s on two cores)
        healthy = result.summary.valid and round_healthy(judge(result.records, run.policy), wc)
        state = warmup_round(state, p50s, healthy, wc, ceiling)
        if run.store is not None and run.run_id is not None:
            run.store.add_step(run.run_id, run.index, result.summary, result.windows)
        run.index += 1  # with a store or without: every later step's seed follows from it
        if result.interrupted or (sent >= wanted and (state.steady or run.warmup_s >= wc.max_s)):
            break
    capped = not state.steady and not result.interrupted
    budgeted = run.cfg.budget_s is not None and wc.max_s < run.cfg.warmup_config.max_s
    cap_name = "its share of --budget" if budgeted else "warmup_config.max_s"
    note = ""
    if capped:
        seen = (
            f"{state.fall:.1%} over {state.fall_windows} windows at one rate"
            if state.fall_windows
            else "not yet tested"
        )
        note = (
            f"the warm-up reached its {wc.max_s:g} s cap ({cap_name}) after "
            f"{sent:,} requests at up to {state.healthy_rate or state.rate:.4g} req/s, "
            f"before its p50 had stopped falling (the last trend tested: a fall of {seen}): "
            "the server may not have been warm, and its capacity may be under-estimated; "
            "raise the cap for a server that warms this slowly"
        )
    run.warmed = Warmed(
        healthy_rate=state.healthy_rate,
        seconds=run.warmup_s,
        requests=sent,
        windows=state.windows,
        rate=state.rate,
        steady=state.steady and sent >= wanted,
        capped=capped,
        fall=state.fall,
        fall_windows=state.fall_windows,
        note=note,
    )
    return run.warmed
