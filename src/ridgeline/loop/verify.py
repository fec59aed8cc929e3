"""``ridgeline verify``: does a served plan really carry its planned demand within its SLO,
and by what margin?

1. A short warm-up at the planned demand, then a step of ``seconds`` at the demand
   under each arrival process the plan was checked under (``Plan.checked_arrivals``,
   written by ``ridgeline plan``: Poisson and the bundled trace by default; Poisson
   alone for a plan that names none), latency from the scheduled send. It passes when
   in every step the answered p99 (``health.judge``, the probe's own estimator) is
   within the plan's SLO and failures — errors, timeouts, and drops, since a dropped
   request was not served — are at most ``max_fail`` of those sent. A plan sized for
   bursts is verified under them, not under the smooth arrivals it was not sized for.
2. The margin: the capacity the probe's binary search measures under the same SLO
   (between a quarter and four times the demand), over the demand, minus one.

The verdict is PASS, FAIL (the server missed its SLO at the demand) or INCONCLUSIVE,
when the miss was the host's: the generator fell behind its schedule
(``loadgen.validity``) and the server, timed from each actual send, held the SLO; or the
capacity search then held the demand the step missed (the miss did not repeat). An
INCONCLUSIVE verdict says nothing of the plan either way: run it on a quieter host.

Latency counts from the scheduled send, so a send the generator makes late is already
in it; a step is judged valid by how far the generator's lateness moved its p99 against
the plan's SLO (``loadgen.validity``). A server in the caller's event loop (the demo's)
is verified with ``apart``: a generator sharing its loop would send late exactly while
the server is busy, and measure a server offered less than was asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ridgeline.errors import ConfigError
from ridgeline.health.judge import judge
from ridgeline.health.slo import LatencyBound, SLOPolicy
from ridgeline.loadgen.schedule import from_arrival, named_arrivals
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.pipeline.plan import Plan
from ridgeline.probe.drivers import NetworkDriver
from ridgeline.probe.orchestrator import ProbeConfig, probe
from ridgeline.telemetry.records import Outcome
from ridgeline.workload.arrivals import parse_arrival


@dataclass(frozen=True, slots=True)
class VerifyResult:
    demand_rps: float
    slo_ms: float
    sent: int
    ok: int
    dropped: int
    failed: int
    """Errors, timeouts and requests left unanswered."""
    p99_ms: float | None
    """Of the answered, from the scheduled send."""
    fail_rate: float
    """(failed + dropped) / sent."""
    passed: bool
    capacity_rps: float | None = None
    """Measured by the probe's binary search; None when not searched or none found."""
    invalid_reason: str | None = None
    """Why the step at the demand measured the generator rather than the server (None:
    it measured the server)."""
    server_missed: bool = True
    """Whether the server missed the SLO on its own: its p99 timed from each actual send
    (the generator's lateness left out) over the bound, or too many failures."""
    arrivals: tuple[str, ...] = ("poisson",)
    """The arrival processes replayed, one step each; the counts are their sums, the p99
    the worst step's."""

    @property
    def verdict(self) -> Literal["PASS", "FAIL", "INCONCLUSIVE"]:
        """PASS; FAIL, the server missed its SLO; INCONCLUSIVE, the miss was the host's."""
        if self.passed:
            return "PASS"
        if self.search_held or (self.invalid_reason is not None and not self.server_missed):
            return "INCONCLUSIVE"
        return "FAIL"

    @property
    def search_held(self) -> bool:
        """The capacity search held the demand the step missed: the miss did not repeat."""
        return self.capacity_rps is not None and self.capacity_rps >= self.demand_rps

    @property
    def margin(self) -> float | None:
        """Capacity over demand, minus one (0.25: 25 % headroom)."""
        if self.capacity_rps is None:
            return None
        return self.capacity_rps / self.demand_rps - 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "margin": self.margin, "verdict": self.verdict}

    def summary(self) -> str:
        p99 = "no answers" if self.p99_ms is None else f"p99 {self.p99_ms:.1f} ms"
        under = "" if self.arrivals == ("poisson",) else f" under {', '.join(self.arrivals)}"
        text = (
            f"{self.verdict}: {self.demand_rps:g} req/s{under}, {p99} (SLO {self.slo_ms:g} ms), "
            f"{self.ok} answered, {self.dropped} dropped, {self.failed} failed or lost of "
            f"{self.sent} ({self.fail_rate:.2%} not served)"
        )
        if self.margin is not None:
            text += f"; capacity {self.capacity_rps:,.1f} req/s, margin {self.margin:+.0%}"
        if self.verdict == "INCONCLUSIVE":
            why = (
                "the capacity search then held the demand the step missed"
                if self.search_held
                else f"the generator fell behind, the server held the SLO from each send: "
                f"{self.invalid_reason}"
            )
            text += f" — the host was too busy to measure ({why}); run it on a quieter host"
        return text


async def verify(
    plan: Plan,
    target: str,
    *,
    seconds: float = 10.0,
    warmup_s: float = 2.0,
    max_fail: float = 0.01,
    search: bool = True,
    step_s: float = 5.0,
    apart: bool = False,
    say: Callable[[str], None] | None = None,
) -> VerifyResult:
    """Verify ``plan`` served at ``target`` (a v2 URL of its pipeline model). ``apart``:
    send from a process of its own, as a server in this event loop needs (the demo's):
    a generator sharing the server's loop sends late while the server is busy, and the
    server then sees less load than was asked (a capacity of 90 req/s measured so, where
    18 s at 54 req/s sent apart had a p99 of 357 ms against 400)."""
    demand = plan.demand_rps
    if demand is None:
        raise ConfigError(
            f"plan {plan.name!r} has no demand_rps; verify needs the demand it was planned "
            "for (ridgeline plan writes it; add demand_rps to a hand-written plan)"
        )
    # latency counts from the scheduled send, so a late send is already in it: what the
    # generator's lateness moved the p99 by is judged against the SLO
    bound = ValidityConfig(latency_bound_ms=plan.slo_ms)
    step_cfg = StepConfig(validity=bound, apart=apart)
    processes = plan.checked_arrivals or ("poisson",)
    schedules = [named_arrivals(a, demand, seconds, seed=2) for a in processes]  # bad ones: now
    tell = say or (lambda _: None)
    if warmup_s > 0:
        tell(f"warm-up: {warmup_s:g} s at {demand:g} req/s")
        warm = from_arrival(parse_arrival("poisson", demand), warmup_s, seed=1)
        await measure_step(target, warm, step_cfg)
    p99_bound = LatencyBound(percentile="p99", bound_ms=plan.slo_ms)
    # the server's own time: its p99 from each actual send (the generator's lateness out)
    own = LatencyBound(percentile="p99", bound_ms=plan.slo_ms, metric="send")
    sent = answered = dropped = 0
    p99s: list[float] = []
    passed, server_missed, invalid = True, False, None
    for process, schedule in zip(processes, schedules, strict=True):
        tell(f"{demand:g} req/s under {process} for {seconds:g} s")
        step = await measure_step(target, schedule, step_cfg)
        s, rec = step.summary, step.records
        ok = rec.outcome == int(Outcome.OK)
        held = judge(rec, SLOPolicy(latency=(p99_bound,)), ok)  # answered; failures below
        if (v := held.value(p99_bound)) is not None:
            p99s.append(v)
        fails = (s.sent - s.ok) / s.sent if s.sent else 1.0  # dropped ones too
        passed = passed and held.latency_held and fails <= max_fail
        server_held = judge(rec, SLOPolicy(latency=(own,)), ok).latency_held
        server_missed = server_missed or not server_held or fails > max_fail
        if not s.valid and invalid is None:
            invalid = s.invalid_reason or "invalid"
        sent, answered, dropped = sent + s.sent, answered + s.ok, dropped + s.dropped
    failed = sent - answered - dropped
    fail_rate = (failed + dropped) / sent if sent else 1.0
    p99 = max(p99s) if p99s else None
    capacity = None
    if search:
        tell(
            f"the margin: a binary search between {demand / 4:g} and {demand * 4:g} req/s "
            f"in {step_s:g} s steps (a minute or two)"
        )
        cfg = ProbeConfig(
            slo=SLOPolicy(latency=(p99_bound,), max_error_rate=max_fail),
            strategy="binary",
            strategy_options={
                "min_rate": demand / 4,
                "max_rate": demand * 4,
                "start_rate": demand,
                "step_duration_s": step_s,
                "precision": 0.05,
            },
            confirm=False,
            # the warm-up and the step at the demand just ran: the server is warm, and a
            # second warm-up (ten stable windows, up to 90 s on a noisy host) adds nothing
            warmup=warmup_s <= 0,
        )
        capacity = (await probe(NetworkDriver(target, step_cfg), cfg)).capacity_rps
    return VerifyResult(
        demand,
        plan.slo_ms,
        sent,
        answered,
        dropped,
        failed,
        p99,
        fail_rate,
        passed,
        capacity,
        invalid,
        server_missed,
        tuple(processes),
    )
