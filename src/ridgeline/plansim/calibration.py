"""The simulator calibrated to a served plan: what this host adds to the plan's own batch
times, fitted from what the server measured (``ridgeline calibrate``, ``loop.calibrate``).

Served on a real host, a plan's answers take longer than the simulator of its profiles
says, for three reasons the profile of one model alone does not see (each measured on
the example plan, `docs/benchmarks.md`, "The example plan, served and simulated"):

1. **Served batch times.** A batch crosses a pipe to its worker process both ways,
   pickled, on cores the server's own work shares, and grows faster with its rows than
   the profile's line: the line through each task's mean *served* batch time at two
   steps of different mean batch sizes (the server's ``ridgeline_task_compute_seconds``
   and ``ridgeline_task_batch_size``, sum and count over each step) replaces the profile's
   rows (``served_lines``, ``served_table``). One batch size seen scales the profile's
   line through it instead.
2. **The front end** (parsing, answering, the hops to the workers): one server the
   requests pass in turn (``plansim.api.through_frontend``), ``frontend_ms`` each.
3. **The spread** of batch times when requests overlap (the server's work and other
   batches slow a batch down): ``noise_cv``.

(2) and (3) are fitted together (``fit_host``) so that a long simulation at the fit
step's rate has the served p50 (the front end, the served p50 minus the simulated one
without it) and p90 (the spread, by bisection: the p90 rises with it) of that step; three
rounds. The p90, not the p99: 600 answers estimate a p90 with 60 above it. A fit at a
rate where requests overlap (half the demand by default), not at a quiet one, where
they almost never do. Nothing is fitted at the rates it is then judged at.

What this does not model: CPU time other processes or the hypervisor take from the host
while it serves (a busy host's tail is the host's, not the plan's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import ConfigError
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.plansim.api import SimConfig, simulate_plan
from ridgeline.plansim.service import service_times
from ridgeline.workload.arrivals import parse_arrival

FIT_REQUESTS = 20_000
"""Requests of the simulated side of the fit: its quantiles are the model's, not another
small sample's."""
FIT_ROUNDS = 3
CV_BISECTIONS = 10
MAX_NOISE_CV = 1.5
"""The largest spread the fit tries (a lognormal's p90 rises with its CV below 2)."""
MIN_SIZE_SPREAD = 0.5
"""Two steps' mean batch sizes this many rows apart or more give a line of their own."""

_SERIES = re.compile(
    r'^ridgeline_task_(compute_seconds|batch_size)_(sum|count)\{(?:.*,)?task="([^"]+)"'
)


@dataclass(frozen=True, slots=True)
class Executed:
    """One task's batches over a step, as the server counted them."""

    batches: float
    seconds: float
    rows: float

    @property
    def mean_rows(self) -> float:
        return self.rows / self.batches

    @property
    def mean_ms(self) -> float:
        return self.seconds / self.batches * 1000.0


def executed(increase: Mapping[str, float]) -> dict[str, Executed]:
    """Per task, its batches over a step, from the increase of the server's counters
    (``telemetry.summary.ServerMetrics.increase``, keyed ``name{label="v",...}``); tasks
    that ran no batch are left out."""
    got: dict[tuple[str, str], float] = {}
    for key, value in increase.items():
        m = _SERIES.match(key)
        if m:
            got[(m.group(3), f"{m.group(1)}_{m.group(2)}")] = value
    out = {}
    for task in {t for t, _ in got}:
        n = got.get((task, "compute_seconds_count"), 0.0)
        if n > 0:
            out[task] = Executed(
                n, got.get((task, "compute_seconds_sum"), 0.0), got.get((task, "batch_size_sum"), n)
            )
    return out


class ServedLine(BaseModel):
    """A task's served batch time, ``base_ms + per_row_ms·rows``, and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_ms: float = Field(ge=0.0)
    per_row_ms: float = Field(ge=0.0)
    source: str = Field(description="the steps it was drawn through")

    def ms(self, rows: float) -> float:
        return self.base_ms + self.per_row_ms * rows


def served_lines(
    plan: Plan, steps: Sequence[Mapping[str, Executed]], profiles: ProfileTable | None = None
) -> dict[str, ServedLine]:
    """Per task, the line through its mean served batch time at the steps' smallest and
    largest mean batch sizes; with sizes under ``MIN_SIZE_SPREAD`` rows apart, the
    profile's (or synthetic model's) line scaled to pass through the mean of them. A task
    that ran no batch in any step is left out (the simulator keeps its profile)."""
    services = service_times(plan, profiles)
    out: dict[str, ServedLine] = {}
    for name in plan.tasks:
        points = sorted((s[name].mean_rows, s[name].mean_ms) for s in steps if name in s)
        if not points:
            continue
        (ra, ta), (rb, tb) = points[0], points[-1]
        if rb - ra >= MIN_SIZE_SPREAD:
            per_row = max(0.0, (tb - ta) / (rb - ra))
            out[name] = ServedLine(
                base_ms=max(0.0, ta - per_row * ra),
                per_row_ms=per_row,
                source=f"served at {ra:.1f} and {rb:.1f} rows a batch",
            )
            continue
        n = sum(s[name].batches for s in steps if name in s)
        rows = sum(s[name].rows for s in steps if name in s) / n
        ms = sum(s[name].seconds for s in steps if name in s) / n * 1000.0
        svc = services[name]
        model_ms = svc.mean_s(rows) * 1000.0
        k = ms / model_ms if model_ms > 0 else 1.0
        out[name] = ServedLine(
            base_ms=svc.base_s * 1000.0 * k,
            per_row_ms=svc.per_row_s * 1000.0 * k,
            source=f"{svc.source} × {k:.2f} (served at {rows:.1f} rows a batch)",
        )
    return out


class HostFit(BaseModel):
    """The front-end time and batch-time spread whose long simulation at ``rate_rps`` has
    the served p50 and p90 there; ``bare_p50_ms`` is the simulated p50 without front
    end, ``p50_ms``/``p90_ms`` the simulated ones with both."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    frontend_ms: float = Field(ge=0.0)
    noise_cv: float = Field(ge=0.0)
    rate_rps: float = Field(gt=0.0)
    bare_p50_ms: float
    p50_ms: float
    p90_ms: float


def fit_host(
    plan: Plan,
    lines: Mapping[str, ServedLine],
    *,
    rate_rps: float,
    p50_ms: float,
    p90_ms: float,
    cpu_cores: int | None,
    profiles: ProfileTable | None = None,
    requests: int = FIT_REQUESTS,
    seed: int = 5,
) -> HostFit:
    """Fit ``frontend_ms`` and ``noise_cv`` to a served step's answered p50 and p90 at
    ``rate_rps`` (Poisson): see the module docstring."""
    if rate_rps <= 0 or p50_ms <= 0 or p90_ms < p50_ms:
        raise ConfigError(
            f"cannot fit to a step at {rate_rps:g} req/s with p50 {p50_ms:g} ms and p90 "
            f"{p90_ms:g} ms: give a served step with answers (p90 ≥ p50 > 0)"
        )
    long = from_arrival(parse_arrival("poisson", rate_rps), requests / rate_rps, seed=seed)

    def quantiles(frontend: float, cv: float) -> tuple[float, float]:
        cfg = SimConfig(
            seed=seed,
            frontend_ms=frontend,
            noise_cv=cv,
            cpu_cores=cpu_cores,
            served_ms=served_ms(lines),
        )
        lat = simulate_plan(plan, long, cfg, profiles).latency_ms
        return lat["p50"] or 0.0, lat["p90"] or 0.0

    frontend, cv, bare = 0.0, 0.1, 0.0
    for _ in range(FIT_ROUNDS):
        bare = quantiles(0.0, cv)[0]
        frontend = max(0.0, p50_ms - bare)
        lo, hi = 0.0, MAX_NOISE_CV
        for _ in range(CV_BISECTIONS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if quantiles(frontend, mid)[1] < p90_ms else (lo, mid)
        cv = (lo + hi) / 2
    p50, p90 = quantiles(frontend, cv)
    return HostFit(
        frontend_ms=frontend,
        noise_cv=cv,
        rate_rps=rate_rps,
        bare_p50_ms=bare,
        p50_ms=p50,
        p90_ms=p90,
    )


def served_ms(lines: Mapping[str, ServedLine]) -> dict[str, tuple[float, float]]:
    """``SimConfig.served_ms`` of served lines."""
    return {name: (line.base_ms, line.per_row_ms) for name, line in lines.items()}


class Calibration(BaseModel):
    """What ``ridgeline simulate --calibrate-from RUN`` applies: per task its served batch
    time, the front end and spread fitted at one rate, the host's cores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: str = Field(description="the name of the plan it was measured on")
    lines: dict[str, ServedLine]
    fit: HostFit
    cpu_cores: int | None = Field(None, ge=1)

    def config(self, plan: Plan, **overrides: object) -> SimConfig:
        """The simulator's settings for ``plan``: the served batch times, the fitted front
        end, spread and cores, with any of ``SimConfig``'s fields given here instead."""
        self.check(plan)
        base = {
            "served_ms": served_ms(self.lines),
            "frontend_ms": self.fit.frontend_ms,
            "noise_cv": self.fit.noise_cv,
            "cpu_cores": self.cpu_cores,
        }
        return SimConfig.model_validate({**base, **overrides})

    def check(self, plan: Plan) -> None:
        """Refuse another plan; a served time for a task ``plan`` lacks is refused where
        every served time is read (``service_times``)."""
        if plan.name != self.plan:
            raise ConfigError(
                f"the calibration was measured on plan {self.plan!r}, not {plan.name!r}: "
                f"calibrate this plan served (`ridgeline calibrate PLAN URL`)"
            )
