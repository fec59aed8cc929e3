"""One open-loop step, end to end: schedule → connect check → replay → summary → store.

``measure_step`` is the building block (the capacity search runs many of them in one
run); ``run_step`` is the single-step job behind ``ridgeline run``: it opens a run in
the store, turns Ctrl-C or SIGTERM into a clean stop, and stores the (possibly partial) step.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ridgeline.aio import run_coroutine, signal_name, stopping_on_signal
from ridgeline.errors import RunInterrupted
from ridgeline.loadgen.distributed import ray_address
from ridgeline.loadgen.generators import InLoop, InProcesses, LoadGenerator, OnRay
from ridgeline.loadgen.replayer import Progress, ReplayConfig
from ridgeline.loadgen.schedule import Schedule
from ridgeline.loadgen.validity import ValidityConfig, assess_validity, validity_warning
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.records import Records
from ridgeline.telemetry.scrape import Scraper
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import StepSummary, summarize
from ridgeline.telemetry.windows import Window, windows


class StepConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="generator processes: local ones, or Ray actors with workers (where 1 "
        "means one per alive node)",
    )
    workers: str | None = Field(
        None,
        description="send from generator actors on a Ray cluster: ray://HOST:PORT (a Ray "
        "client address) or ray:auto (the running cluster); None: from this machine",
    )
    apart: bool = Field(
        False,
        description="send from a process of its own even with one generator: the caller's "
        "event loop also runs the server measured (a generator sharing it falls behind)",
    )
    window_s: float = Field(1.0, gt=0, description="telemetry window width")
    replay: ReplayConfig = ReplayConfig()
    validity: ValidityConfig = ValidityConfig()
    metrics_url: str | None = Field(None, description="Prometheus endpoint to scrape beside")
    store_requests: bool = Field(False, description="keep one row per request in the store")

    @field_validator("metrics_url")
    @classmethod
    def _scrapable(cls, value: str | None) -> str | None:
        """An http(s) URL with a host: the scraper speaks nothing else (``ftp://`` was
        taken, and every scrape then failed in silence)."""
        if value is not None:
            scheme, _, rest = value.partition("://")
            if scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
                raise ValueError(
                    "--metrics-url must be an http:// or https:// URL with a host, such as "
                    "http://127.0.0.1:8000/metrics"
                )
        return value

    @field_validator("workers")
    @classmethod
    def _worker_address(cls, value: str | None) -> str | None:
        if value is not None:
            ray_address(value)  # ConfigError naming the accepted forms
        return value


@dataclass
class StepResult:
    summary: StepSummary
    windows: list[Window]
    records: Records
    interrupted: bool
    scrape_failures: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    worker_records: list[Records | None] | None = None
    """Each Ray generator worker's own records (None: it was lost), when sent from Ray."""


def joined(first: StepResult, then: StepResult) -> StepResult:
    """Two steps at one rate as one: ``then``'s requests and windows follow ``first``'s
    (times shifted by ``first``'s length), the summary over both. How a probe pools runs
    the step caps will not lengthen (``--max-step-s``) into the evidence of a longer one."""
    shift = first.summary.duration_s
    r = then.records
    later = Records(
        scheduled=r.scheduled + shift,
        sent=r.sent + shift,
        done=r.done + shift,
        outcome=r.outcome,
        first_token=r.first_token + shift,
        output_tokens=r.output_tokens,
        errors=dict(r.errors),
        prompt_tokens=r.prompt_tokens,
        gaps=r.gaps,
        gap_start=r.gap_start,
        outstanding_limited=r.outstanding_limited,
        client_failures=r.client_failures,
    )
    records = Records.merge([first.records, later])
    n = len(first.windows)
    wins = [*first.windows] + [
        w.model_copy(
            update={"index": n + w.index, "start_s": w.start_s + shift, "end_s": w.end_s + shift}
        )
        for w in then.windows
    ]
    valid = first.summary.valid and then.summary.valid
    reason = first.summary.invalid_reason or then.summary.invalid_reason
    summary = summarize(
        records, shift + then.summary.duration_s, valid=valid, invalid_reason=reason
    )
    return StepResult(
        summary,
        wins,
        records,
        interrupted=then.interrupted,
        scrape_failures=first.scrape_failures + then.scrape_failures,
        extra=then.extra,
    )


def generator_for(target_url: str, target_options: TargetOptions, cfg: StepConfig) -> LoadGenerator:
    """Where a step sends from, chosen once from its settings: Ray actors (``workers``),
    local processes (``processes`` > 1, or ``apart``), or this event loop."""
    if cfg.workers is not None:
        return OnRay(
            target_url, target_options, cfg.replay, cfg.workers, cfg.processes, cfg.validity
        )
    if cfg.processes > 1 or cfg.apart:
        return InProcesses(target_url, target_options, cfg.replay, cfg.processes)
    return InLoop(target_url, target_options, cfg.replay)


async def measure_step(
    target_url: str,
    schedule: Schedule,
    cfg: StepConfig,
    *,
    target_options: TargetOptions | None = None,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> StepResult:
    """Replay ``schedule`` against ``target_url``; raises TargetUnreachableError before
    sending anything if the endpoint does not answer its connect check (made by every
    worker, with ``cfg.workers``)."""
    stop = stop or asyncio.Event()
    generator = generator_for(target_url, target_options or TargetOptions(), cfg)
    await generator.connect()
    scraper = Scraper(cfg.metrics_url, cfg.window_s) if cfg.metrics_url else None
    scrape_stop = asyncio.Event()
    scrape_task = None
    try:
        if scraper is not None:
            scrape_task = asyncio.get_running_loop().create_task(
                scraper.run(time.perf_counter(), scrape_stop)
            )
        sent = await generator.run(schedule, stop=stop, progress=progress)
    finally:
        scrape_stop.set()
        if scrape_task is not None:
            await scrape_task
        await generator.close()
    interrupted = stop.is_set()
    records = sent.records
    valid, reason = assess_validity(sent.measured, cfg.validity, interrupted=interrupted)
    if sent.problems:
        valid, reason = False, "; ".join([*sent.problems, *([reason] if reason else [])])
    summary = summarize(
        records,
        schedule.duration_s,
        valid=valid,
        invalid_reason=reason,
        interrupted=interrupted,
        processes=sent.processes,
        warning=validity_warning(sent.measured, cfg.validity) if valid else None,
    )
    summary.workers = sent.workers
    wins = windows(records, schedule.duration_s, cfg.window_s)
    if scraper is not None:
        scraper.attach(wins)
        summary.server = scraper.summary()
    return StepResult(
        summary,
        wins,
        records,
        interrupted,
        scraper.failures if scraper is not None else 0,
        worker_records=sent.parts,
    )


def run_step(
    target_url: str,
    schedule: Schedule,
    cfg: StepConfig,
    *,
    store: RunStore,
    target_options: TargetOptions | None = None,
    progress: Progress | None = None,
) -> StepResult:
    """The ``ridgeline run`` job: one stored step. Ctrl-C or SIGTERM stops sending, waits for
    in-flight requests, stores the partial step marked interrupted and raises
    RunInterrupted naming the run."""

    async def main() -> StepResult:
        stop, got = asyncio.Event(), list[int]()
        run_id: int | None = None
        with stopping_on_signal(stop, got):
            config = {"schedule": schedule.description, "step": cfg.model_dump()}
            result = await measure_step(
                target_url,
                schedule,
                cfg,
                target_options=target_options,
                stop=stop,
                progress=progress,
            )
            run_id = store.create_run("run", target_url, config)
            step_id = store.add_step(
                run_id,
                0,
                result.summary,
                result.windows,
                result.records if cfg.store_requests else None,
            )
            result.summary.run_id, result.summary.step_id = run_id, step_id
            status = "interrupted" if result.interrupted else "complete"
            store.finish_run(
                run_id, status, result.summary.invalid_reason, result.summary.model_dump()
            )
        if result.interrupted:
            raise RunInterrupted(
                run_id,
                f"interrupted by {signal_name(got)}: the partial step "
                f"({result.summary.sent} requests sent) is stored as run {run_id}, marked "
                f"interrupted; `ridgeline runs show {run_id}`",
            )
        return result

    return run_coroutine(main())
