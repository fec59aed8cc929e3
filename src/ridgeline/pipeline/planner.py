"""The planner: per task a variant, a segment type, a batch size and an instance count,
by a MILP solved with HiGHS (the JigsawServe method).

The types it works in (``Features``, ``Config``, ``PlannedTask``, ``PlannerOptions``,
``PlanResult``) live in ``pipeline.choices`` and are re-exported here.

Every task ``t`` picks one configuration ``c`` = (variant, segment type, batch size)
from the profile table. Its demand is the pipeline's rate times the factors along its
incoming paths, which may depend on the upstream variants; so the model's choices are
options (configuration, scenario of those upstream variants, instance count), each
with its exact demand. From the fewest instances that keep each at most
``max_utilisation`` busy, an option may add instances while that shortens the wait for a
free one. An option's latency is the time its batch may wait to fill (``(batch − 1)``
over the demand, at most one execution time: the queue delay the plan sets), plus the
wait for a free instance at the 99th percentile (``queueing``: a batch-service G/G/c
approximation), plus the batch execution. The constraints, each as its English
statement in the code:

* one option per task, its scenario agreeing with what the upstream tasks chose;
* latency: on every source-to-sink path, the sum of the chosen latencies ≤ the SLO
  (task-graph budgeting: the budgets fall out of the solve; switch T off for equal
  per-task budgets of SLO / the longest path's task count);
* accuracy: on every path, the product of the chosen variants' accuracies (each a
  fraction of its task's best) ≥ the floor, as a sum of logarithms;
* resources, per pool: CPU cores used ≤ those available; on a GPU type, compute slices
  ≤ those available, and the MIG instances laid out exactly. An integer ``y[l]`` counts
  the GPUs that take layout ``l`` (``gpu.layouts``: every maximal set of instances one GPU
  holds, NVIDIA's valid combinations); at most ⌈available / 7⌉ GPUs take one, and each
  profile's instances are at most what the chosen layouts hold. MPS clients of a
  profile need whole slices of it: an integer ``m[p] ≥`` the sum of their shares (a
  half and a third share a slice; ``placement`` packs them so). So every plan the MILP
  returns can be placed, and ``placement.place`` finds a layout for it.

Objective: the least cost, then the highest accuracy (``objective="accuracy"``: the
reverse), solved in two passes: the first optimum becomes a bound for the second. An
instance's cost is what it takes of its GPU's two resources, in compute slices: the mean
of its compute slices and 7/8 of its memory slices (``instance_cost``), so a whole GPU
costs 7, a ``1g.10gb`` 0.9375 and an H100 ``1g.20gb`` 1.375 (the same compute, twice the
memory). It adds up over a GPU's instances and never past 7. Compute slices, memory
slices and cost are all reported.

Switches (``Features``): A (accuracy scaling: other variants than each task's best),
S (spatial partitioning: MIG slices and MPS shares; off: whole GPUs only), T
(task-graph budgeting). All off is the "none" baseline; A+T is Loki-like.

An infeasible request says which constraint binds (``InfeasiblePlan``): the fastest path
already over the SLO, the accuracy floor out of reach within the SLO, or the slices
needed against those available.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import highspy
import numpy as np

from ridgeline.errors import InfeasiblePlan, PlanError
from ridgeline.pipeline._highs import Row, integer_model
from ridgeline.pipeline.choices import (
    ALL_FEATURES,
    DEFAULT_OPTIONS,
    AccuracyScope,
    Config,
    Features,
    Objective,
    PlannedTask,
    PlannerOptions,
    PlanResult,
)
from ridgeline.pipeline.gpu import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    NO_MIG,
    MigProfile,
    gpu_type,
    layouts,
)
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.segments import CPU, parse_segment, segment_cost
from ridgeline.pipeline.spec import PipelineSpec

__all__ = [
    "AccuracyScope",
    "Config",
    "Features",
    "Objective",
    "PlanResult",
    "PlannedTask",
    "PlannerOptions",
    "candidates",
    "demand_in",
    "instance_cost",
    "mig_instances",
    "plan_pipeline",
    "scenarios",
]


def candidates(
    spec: PipelineSpec, table: ProfileTable, pools: Sequence[str], features: Features
) -> dict[str, list[Config]]:
    """Every configuration each task may take, under the feature switches."""
    out: dict[str, list[Config]] = {}
    for name, task in spec.tasks.items():
        best = task.best_accuracy()
        variants = [v for v in task.variants if features.accuracy_scaling or v.accuracy == best]
        configs = []
        for v in variants:
            for pool in pools:
                rows = table.for_variant(v.name, pool)
                if not features.spatial:
                    rows = [r for r in rows if _whole(pool, r.segment, table)]
                configs += [
                    Config(name, r, v.accuracy / best, segment_cost(pool, r.segment)) for r in rows
                ]
        if not configs:
            missing = ", ".join(v.name for v in variants)
            raise PlanError(
                f"task {name!r} has no profile rows for its variants ({missing}) on "
                f"{', '.join(pools)}; run `ridgeline profile` or add the rows"
            )
        out[name] = configs
    return out


def _whole(pool: str, label: str, table: ProfileTable) -> bool:
    """Whether ``label`` is a whole device: the host's largest CPU segment, or a whole GPU
    with MIG off (not the ``7g`` profile: MIG keeps 10 of an A100's 108 SMs back)."""
    if pool == CPU:
        largest = max(segment_cost(CPU, r.segment) for r in table if r.pool == CPU)
        return segment_cost(CPU, label) == largest
    return parse_segment(pool, label).profile == NO_MIG


def plan_pipeline(
    spec: PipelineSpec,
    table: ProfileTable,
    available: Mapping[str, float],
    features: Features = ALL_FEATURES,
    options: PlannerOptions = DEFAULT_OPTIONS,
) -> PlanResult:
    """The plan with the fewest slices (then the highest accuracy) that meets the
    demand, the SLO on every path and the accuracy floor within ``available`` slices
    per pool (``{"A100-80GB": 56}``: 8 GPUs); ``InfeasiblePlan`` says what binds."""
    configs = candidates(spec, table, list(available), features)
    started = time.perf_counter()
    solved = _Milp(spec, configs, available, features, options).solve()
    if solved is None:
        raise _diagnose(spec, configs, available, features, options)
    chosen, gap = solved
    return _result(spec, features, chosen, available, gap, started)


Scenario = tuple[tuple[str, str], ...]
"""Variants of the upstream tasks a task's demand depends on: ((task, variant), ...)."""


def scenarios(spec: PipelineSpec, task: str) -> list[Scenario]:
    """Every combination of variants of the tasks upstream of ``task`` whose edge
    factors depend on their variant (one empty scenario when none do)."""
    deps = sorted(
        {
            e.source
            for e in spec.edges
            if isinstance(e.factor, dict) and e.target in _upstream(spec, task) | {task}
        }
    )
    names = [[(d, v.name) for v in spec.tasks[d].variants] for d in deps]
    return [tuple(c) for c in itertools.product(*names)]


def _upstream(spec: PipelineSpec, task: str) -> set[str]:
    out: set[str] = set()
    for e in spec.parents(task):
        out |= {e.source} | _upstream(spec, e.source)
    return out


def demand_in(spec: PipelineSpec, task: str, scenario: Scenario) -> float:
    """Requests/s reaching ``task`` when its upstream tasks run the variants given."""
    chosen = dict(scenario)
    if not spec.parents(task):
        return spec.demand_rps
    return sum(
        demand_in(spec, e.source, scenario)
        * (e.factor[chosen[e.source]] if isinstance(e.factor, dict) else e.factor)
        for e in spec.parents(task)
    )


class _Milp:
    """The MILP in labelled sections: data, variables, constraints, objective, solve,
    status check.

    One binary ``w[t, o]`` per task ``t`` and option ``o`` = (configuration, scenario of
    the upstream variants its demand depends on, instance count). An option's demand is
    exact, so are its slices and its latency; the layout integers (``_gpu_rows``) are
    the only general integers, and the LP relaxation is tight enough for HiGHS to close
    the gap fast."""

    def __init__(
        self,
        spec: PipelineSpec,
        configs: Mapping[str, list[Config]],
        available: Mapping[str, float],
        features: Features,
        options: PlannerOptions,
        *,
        resources: bool = True,
        accuracy: bool = True,
    ) -> None:
        # --- data ---------------------------------------------------------------------
        self.spec, self.options, self.features = spec, options, features
        self.available = available
        self.resources, self.accuracy = resources, accuracy
        self.paths = [tuple(p) for p in spec.paths()]
        self.options_of: dict[str, list[tuple[PlannedTask, Scenario]]] = {}
        for t, cs in configs.items():
            opts = []
            for sc in scenarios(spec, t):
                d = demand_in(spec, t, sc)
                fit = [
                    p
                    for c in cs
                    for p in PlannedTask.candidates(c, d, options)
                    if p.latency_ms <= options.bound_ms(spec)
                    and (not resources or float(p.slices) <= available.get(c.row.pool, 0.0))
                ]
                opts += [(p, sc) for p in _frontier(fit)]
            self.options_of[t] = opts

    def solve(self) -> tuple[dict[str, PlannedTask], float] | None:
        """The chosen option per task and the first pass's gap; None if infeasible."""
        if any(not o for o in self.options_of.values()):
            return None
        spec, inf = self.spec, math.inf
        rows: list[tuple[float, float, dict[int, float]]] = []
        # --- variables: w[t][i] = 1 when task t takes option i -------------------------
        w: dict[str, list[int]] = {}
        k = 0
        for t, opts in self.options_of.items():
            w[t] = list(range(k, k + len(opts)))
            k += len(opts)
        # --- constraints ----------------------------------------------------------------
        for t, opts in self.options_of.items():
            # Each task takes exactly one option.
            rows.append((1, 1, dict.fromkeys(w[t], 1.0)))
            # Its scenario agrees with what the upstream tasks chose: for each task a it
            # depends on and each variant v of a, t's options assuming v are taken
            # exactly when a runs v.
            deps = {a for _, sc in opts for a, _ in sc}
            for a in sorted(deps):
                for v in spec.tasks[a].variants:
                    terms: dict[int, float] = {}
                    for i, (_, sc) in zip(w[t], opts, strict=True):
                        if dict(sc)[a] == v.name:
                            terms[i] = 1.0
                    for i, (p, _) in zip(w[a], self.options_of[a], strict=True):
                        if p.variant == v.name:
                            terms[i] = terms.get(i, 0.0) - 1.0
                    rows.append((0, 0, terms))
        slo = self.options.bound_ms(spec)
        if self.features.graph_budgets:
            # Latency: on every path the chosen latencies add up to the SLO or less.
            for path in self.paths:
                terms = {}
                for t in path:
                    for i, (p, _) in zip(w[t], self.options_of[t], strict=True):
                        terms[i] = p.latency_ms
                rows.append((-inf, slo, terms))
        else:
            # Latency, equal budgets: each task within SLO / the longest path's length.
            share = slo / max(len(p) for p in self.paths)
            for t, opts in self.options_of.items():
                terms = {i: p.latency_ms for i, (p, _) in zip(w[t], opts, strict=True)}
                rows.append((-inf, share, terms))
        if self.accuracy and self.options.accuracy_scope == "graph":
            # Accuracy over the whole graph: Σ over every task ln(accuracy / best) ≥ ln(floor).
            terms = {
                i: math.log(p.config.accuracy)
                for t, opts in self.options_of.items()
                for i, (p, _) in zip(w[t], opts, strict=True)
            }
            rows.append((math.log(spec.accuracy_floor), inf, terms))
        elif self.accuracy:
            # Accuracy: on every path, Σ ln(accuracy / the task's best) ≥ ln(floor).
            for path in self.paths:
                terms = {}
                for t in path:
                    for i, (p, _) in zip(w[t], self.options_of[t], strict=True):
                        terms[i] = math.log(p.config.accuracy)
                rows.append((math.log(spec.accuracy_floor), inf, terms))
        upper = [1.0] * k  # the w are binaries; the resource columns follow them
        cost_of: dict[int, float] = {}  # the resource columns' cost (a host slice's)
        if self.resources:
            for pool, cap in self.available.items():
                if pool == CPU:
                    # Resources: cores used ≤ those available.
                    terms = {
                        i: float(p.slices)
                        for t, opts in self.options_of.items()
                        for i, (p, _) in zip(w[t], opts, strict=True)
                        if p.config.row.pool == pool
                    }
                    if terms:
                        rows.append((-inf, cap, terms))
                    continue
                rows += self._gpu_rows(pool, cap, w, upper, cost_of)
        # --- objective --------------------------------------------------------------------
        n = len(upper)
        slices, lost = np.zeros(n), np.zeros(n)
        for t, opts in self.options_of.items():
            for i, (p, _) in zip(w[t], opts, strict=True):
                slices[i] = _option_cost(p) if self.resources else float(p.slices)
                lost[i] = -math.log(p.config.accuracy)  # accuracy lost, to minimise
        for i, c in cost_of.items():
            slices[i] = c
        first, second = (slices, lost) if self.options.objective == "slices" else (lost, slices)
        # --- solve, in two passes: the first optimum bounds the second ------------------
        o = self.options
        h = integer_model(upper, rows, time_limit_s=o.time_limit_s, mip_gap=o.mip_gap)
        gap = 0.0
        for n_pass, objective in enumerate((first, second)):
            h.changeColsCost(n, np.arange(n, dtype=np.int32), objective)
            h.run()
            # --- status check --------------------------------------------------------------
            status = h.getModelStatus()
            if status == highspy.HighsModelStatus.kInfeasible:
                return None
            if status == highspy.HighsModelStatus.kTimeLimit:
                if not h.getInfo().primal_solution_status:
                    raise PlanError(
                        f"HiGHS found no plan within {self.options.time_limit_s:g} s; raise "
                        "the time limit or give fewer profile rows"
                    )
            elif status != highspy.HighsModelStatus.kOptimal:
                raise PlanError(f"HiGHS ended with status {h.modelStatusToString(status)}")
            if n_pass == 0:
                gap = float(h.getInfo().mip_gap)
                best = h.getInfo().objective_function_value
                nz = np.nonzero(objective)[0].astype(np.int32)
                h.addRow(-inf, best + 1e-6, len(nz), nz, objective[nz])
        values = h.getSolution().col_value
        chosen = {
            t: self.options_of[t][int(np.argmax([values[i] for i in w[t]]))][0]
            for t in self.options_of
        }
        return chosen, gap

    def _gpu_rows(
        self,
        pool: str,
        cap: float,
        w: Mapping[str, list[int]],
        upper: list[float],
        cost_of: dict[int, float],
    ) -> list[Row]:
        """The rows that lay one GPU type's instances out exactly, adding their integer
        columns to ``upper`` (and an MPS host slice's cost to ``cost_of``)."""
        g = gpu_type(pool)
        gpus = math.ceil(cap / COMPUTE_SLICES - 1e-9)
        whole: dict[str, dict[int, float]] = {p.name: {} for p in g.profiles}
        shared: dict[str, dict[int, float]] = {}
        budget: dict[int, float] = {}
        no_mig: dict[int, float] = {}  # instances on whole GPUs with MIG off
        for t, opts in self.options_of.items():
            for i, (p, _) in zip(w[t], opts, strict=True):
                if p.config.row.pool != pool:
                    continue
                seg = parse_segment(pool, p.config.row.segment)
                if seg.profile == NO_MIG:
                    no_mig[i] = float(p.instances)
                    budget[i] = float(p.slices)
                elif seg.share == 1:
                    whole[seg.profile][i] = float(p.instances)
                    budget[i] = float(p.slices)
                else:
                    shared.setdefault(seg.profile, {})[i] = float(seg.share * p.instances)
        if not budget and not shared:
            return []
        rows: list[Row] = []
        # MPS clients of a profile take whole slices of it: m[p] ≥ the sum of their
        # shares (m[p] is also counted with that profile's whole instances below).
        for name, terms in shared.items():
            m = len(upper)
            upper.append(float(gpus * COMPUTE_SLICES))
            cost_of[m] = instance_cost(g.profile(name))
            whole[name][m] = 1.0
            budget[m] = float(g.profile(name).compute)
            rows.append((0.0, math.inf, {m: 1.0} | {i: -v for i, v in terms.items()}))
        # Compute slices used ≤ those available.
        rows.append((-math.inf, cap, budget))
        # y[l]: the GPUs that take layout l; they and the GPUs with MIG off (one per
        # instance) are at most the GPUs available.
        y = {}
        for layout in layouts(pool):
            y[len(upper)] = layout.counts
            upper.append(float(gpus))
        rows.append((-math.inf, float(gpus), dict.fromkeys(y, 1.0) | no_mig))
        # Each profile's instances ≤ what the chosen layouts hold.
        for name, terms in whole.items():
            if terms:
                held = {j: -float(c[name]) for j, c in y.items() if c.get(name)}
                rows.append((-math.inf, 0.0, terms | held))
        return rows


def _frontier(planned: Iterable[PlannedTask]) -> list[PlannedTask]:
    """The options worth a column: per (variant, pool, segment), those no other beats on
    both instances and latency (the batch sizes and instance counts on the Pareto front).
    One with as many instances, or fewer, and no more latency costs as much or less and
    leaves every path more room; its variant, and so its accuracy and what it sends
    downstream, is the same."""
    groups: dict[tuple[str, str, str], list[PlannedTask]] = {}
    for p in planned:
        row = p.config.row
        groups.setdefault((row.variant, row.pool, row.segment), []).append(p)
    kept: list[PlannedTask] = []
    for group in groups.values():
        best = math.inf
        for p in sorted(group, key=lambda q: (q.instances, q.latency_ms)):
            if p.latency_ms < best:
                kept.append(p)
                best = p.latency_ms
    return kept


def instance_cost(profile: MigProfile) -> float:
    """What one instance of ``profile`` takes of its GPU, in compute slices: the mean of
    its compute slices and 7/8 of its memory slices (the memory slices as compute-slice
    equivalents: 8 of them are a GPU, as 7 compute slices are)."""
    memory = COMPUTE_SLICES * profile.memory_slices / MEMORY_SLICES
    return (profile.compute + memory) / 2


def _option_cost(p: PlannedTask) -> float:
    """An option's own cost in the objective: cores, or its whole MIG instances' cost
    (an MPS option's is carried by the host slices it needs)."""
    row = p.config.row
    if row.pool == CPU:
        return float(p.slices)
    seg = parse_segment(row.pool, row.segment)
    if seg.share != 1:
        return 0.0
    return instance_cost(gpu_type(row.pool).profile(seg.profile)) * p.instances


def _result(
    spec: PipelineSpec,
    features: Features,
    chosen: Mapping[str, PlannedTask],
    available: Mapping[str, float],
    gap: float,
    started: float,
) -> PlanResult:
    slices: dict[str, float] = {}
    memory: dict[str, float] = {}
    cost: dict[str, float] = {}
    for (pool, profile), n in mig_instances(chosen.values()).items():
        if profile is None:  # CPU cores
            slices[pool] = cost[pool] = slices.get(pool, 0.0) + n
            continue
        slices[pool] = slices.get(pool, 0.0) + profile.compute * n
        memory[pool] = memory.get(pool, 0.0) + profile.memory_slices * n
        cost[pool] = cost.get(pool, 0.0) + instance_cost(profile) * n
    paths = [tuple(p) for p in spec.paths()]
    accuracy = min(math.prod(chosen[t].config.accuracy for t in p) for p in paths)
    graph_accuracy = math.prod(p.config.accuracy for p in chosen.values())
    latency = {p: sum(chosen[t].latency_ms for t in p) for p in paths}
    return PlanResult(
        spec,
        features,
        dict(chosen),
        slices,
        dict(available),
        accuracy,
        time.perf_counter() - started,
        gap,
        latency,
        memory,
        cost,
        graph_accuracy,
    )


def mig_instances(
    planned: Iterable[PlannedTask],
) -> dict[tuple[str, MigProfile | None], float]:
    """MIG instances per (GPU pool, profile) that planned tasks take, MPS clients packed
    into whole slices (their shares' sum rounded up); a CPU pool's cores under
    ``(pool, None)``."""
    out: dict[tuple[str, MigProfile | None], float] = {}
    shares: dict[tuple[str, MigProfile], Fraction] = {}
    for p in planned:
        row = p.config.row
        if row.pool == CPU:
            out[row.pool, None] = out.get((row.pool, None), 0.0) + float(p.slices)
            continue
        seg = parse_segment(row.pool, row.segment)
        profile = gpu_type(row.pool).profile(seg.profile)
        if seg.share == 1:
            out[row.pool, profile] = out.get((row.pool, profile), 0.0) + p.instances
        else:
            key = (row.pool, profile)
            shares[key] = shares.get(key, Fraction(0)) + seg.share * p.instances
    for key, total in shares.items():
        out[key] = out.get(key, 0.0) + math.ceil(total)
    return out


def _diagnose(
    spec: PipelineSpec,
    configs: Mapping[str, list[Config]],
    available: Mapping[str, float],
    features: Features,
    options: PlannerOptions,
) -> InfeasiblePlan:
    """Which constraint binds: re-solve without resources, then without accuracy."""
    loose = _Milp(spec, configs, available, features, options, resources=False).solve()
    if loose is not None:
        need: dict[str, float] = {}
        for p in loose[0].values():
            need[p.config.row.pool] = need.get(p.config.row.pool, 0.0) + float(p.slices)
        short = ", ".join(
            f"{need.get(p, 0.0):g} {'cores' if p == CPU else 'slices'} needed on {p}, "
            f"{cap:g} available"
            for p, cap in available.items()
        )
        return InfeasiblePlan(
            f"not enough resources for {spec.demand_rps:g} req/s: {short}; add GPUs, lower "
            "the demand or the accuracy floor",
            "resources",
        )
    fastest = {
        t: min(
            PlannedTask.candidates(c, demand_in(spec, t, sc), options)[-1].latency_ms
            for c in cs
            for sc in scenarios(spec, t)
        )
        for t, cs in configs.items()
    }
    worst = max(spec.paths(), key=lambda p: sum(fastest[t] for t in p))
    bound = options.bound_ms(spec)
    over = sum(fastest[t] for t in worst) - bound
    if over > 0 or not features.graph_budgets:
        detail = (
            f"the fastest path {' -> '.join(worst)} already takes "
            f"{sum(fastest[t] for t in worst):.1f} ms, {over:.1f} ms over the SLO "
            f"{spec.slo_ms:g} ms (paths may use {options.slo_share:.0%} of it)"
            if over > 0
            else f"with equal per-task budgets (T off), some task cannot fit "
            f"{bound / max(len(p) for p in spec.paths()):.1f} ms"
        )
        return InfeasiblePlan(
            f"{detail}; raise the SLO, or profile faster segments or smaller variants",
            "latency",
        )
    return InfeasiblePlan(
        f"the accuracy floor {spec.accuracy_floor:g} needs variants whose latency does not "
        f"fit the SLO {spec.slo_ms:g} ms on any path; lower the floor or raise the SLO",
        "accuracy",
    )
