"""Early dropping as a pure policy: answer at once a request that can no longer make its
deadline, instead of spending a batch slot on an answer nobody will use.

A request at a task expects to wait for the batches queued ahead of it (spread over the
task's instances), perhaps for its own batch to fill (the queue delay, or less when the
rows arriving at the task's recent pace fill it first), then for one execution of that
batch with the rows it will have gathered; after this task come the tasks on its
longest remaining path, each with its own wait and execution as the request will find
it there (``reached``: the rows ahead of it upstream get there first). If now plus that
expectation passes the deadline, the request is dropped: it gets a clear "dropped:
cannot meet SLO" answer, counted apart from errors. Execution times come from an
``ExecModel`` per task: base and per-row time from warm-up batches, scaled by a moving
mean of how much slower served batches ran.

The expectation is a model, and on shared cores batch times swing past it. So each place
a request is judged (the pipeline's arrival; at each task, joining its queue and its
batch forming) scales what it expects the request still needs by the ``Slack`` the
answers showed there: a low quantile (``SLACK_QUANTILE``) of how many times longer than
expected from that place they took, over a recent window (``Trail``, ``learn``). A
request is dropped only when it is nearly sure to come late: a drop is an SLO violation
as sure as a late answer, so a drop that might have made it loses what a late answer
would not. The law this keeps (``benchmarks/drop_rule.py``, ``tests/test_plansim.py``):
on the same arrivals, the share of requests dropped or late with dropping on is not
above the share late with it off, within sampling error.

A plan's per-task latency budgets are not deadlines: they are the planner's shares of
the SLO, each at its task's worst, and a request behind its share at one task may still
make the end-to-end deadline. Dropping a request that had spent its budget through a
task broke the law that dropping never loses more than it saves (the AR assistant's
A100 plan at its own maximum under gamma CV 3 arrivals: 1.43 % dropped against 0.09 %
late with no dropping; without that rule 0.05 %).

A request that arrives at an idle server (nothing queued, no instance busy, at any task
on its way) is never dropped, here or later:
it is the best the server can do for it, and when everything has been dropped it is how
the execution model and the slack learn again (both learn only from work done).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ExecModel:
    """Batch execution time as ``scale·(base + per_row·rows)``: base and per-row time
    from two warm-up batches (one row, a full batch), ``scale`` a moving mean of how
    much slower measured batches ran than that (contention, a slower input)."""

    base_s: float = 0.0
    per_row_s: float = 0.0
    scale: float = 1.0

    @classmethod
    def from_warmup(cls, one_s: float, rows: int, full_s: float) -> ExecModel:
        per_row = max(0.0, (full_s - one_s) / (rows - 1)) if rows > 1 else 0.0
        return cls(base_s=max(0.0, one_s - per_row), per_row_s=per_row)

    def time(self, rows: float) -> float:
        return self.scale * (self.base_s + self.per_row_s * rows)

    def observe(self, rows: int, took_s: float) -> ExecModel:
        """The model after a batch of ``rows`` took ``took_s``."""
        modelled = self.base_s + self.per_row_s * rows
        if modelled <= 0.0:  # nothing measured yet: this batch is the model
            return ExecModel(base_s=took_s, per_row_s=0.0)
        return replace(self, scale=moving_mean(self.scale, took_s / modelled))


@dataclass(frozen=True, slots=True)
class TaskTiming:
    """A snapshot of one task: its execution model and its queue."""

    exec: ExecModel
    queued_rows: int
    batch_size: int
    instances: int
    max_queue_delay_s: float
    busy: int = 0
    """Instances executing a batch now."""
    gap_s: float = 0.0
    """The mean gap between rows arriving at the task lately (``arrival_gap``; 0: none
    seen yet)."""

    @property
    def fill_s(self) -> float:
        """How long its batch waits to go, when it would not go full now: the queue delay,
        or less if the rows arriving meanwhile fill it first."""
        return self.filling()[0]

    @property
    def batch_rows(self) -> float:
        """Rows its batch runs with: those queued for it so far and those arriving while it
        waits to go. With only the first, a batch that waits out its delay while others
        join it ran far longer than expected (a detector's batch of 4 takes 3 times its
        batch of 1), and the slack, a high quantile of those errors, came off every
        deadline: the traffic app on 64 A100s, whole GPUs, at the most they serve (2,925
        req/s), simulated: 13.8 % dropped, expected 50 ms short at the median, against
        none late without dropping; with the rows that arrive, none dropped."""
        return self.filling()[1]

    def filling(self) -> tuple[float, float]:
        """``(fill_s, batch_rows)``, worked out together (the simulator asks for both per
        request and task)."""
        own, gap = self.queued_rows % self.batch_size + 1, self.gap_s
        missing = self.batch_size - own
        if missing <= 0:
            fill = 0.0
        elif gap > 0.0:
            fill = min(self.max_queue_delay_s, missing * gap)
        else:
            fill = self.max_queue_delay_s
        return fill, (min(float(self.batch_size), own + fill / gap) if gap > 0.0 else float(own))

    @property
    def own_rows(self) -> int:
        """Rows of the batch a request joining now would go in."""
        return self.queued_rows % self.batch_size + 1


def expected_wait_s(t: TaskTiming) -> float:
    """Expected time from joining the queue to the start of its batch: when an instance
    is free for it, or when its batch is ready (full, or the queue delay out:
    ``TaskTiming.fill_s``), whichever is later; the two overlap, as the queue starts a
    batch when a free instance finds it ready. Their sum expected 40 ms where 31 came
    (the example plan at 30 req/s, whose requests mostly wait out a 10 ms delay while a
    batch runs), and with a tight SLO (32 ms) dropped requests of which fewer than half
    would have come late (``benchmarks/drop_rule.py``'s example-plan row).

    Batches go to instances in turn as they come free. An idle instance is free now; the
    ``busy`` ones come free in order at the mean order statistics of uniform residuals,
    ``S·i/(busy + 1)`` for the i-th, ``S`` a full batch's time (the first of 43 busy
    instances frees in ``S/44``, not ``S/2``). The request's batch, with ``j`` full ones
    ahead, starts when its instance in that turn is free, ``j // instances`` full rounds
    later."""
    return _wait_s(t, t.filling()[0])


def _wait_s(t: TaskTiming, fill_s: float) -> float:
    """``expected_wait_s`` with the batch's ``TaskTiming.fill_s`` given."""
    full = t.exec.time(t.batch_size)
    ahead = t.queued_rows // t.batch_size
    rounds, turn = divmod(ahead, t.instances)
    idle = max(0, t.instances - t.busy)
    busy = t.instances - idle
    free = 0.0 if turn < idle else full * (turn - idle + 1) / (busy + 1)
    return max(free + rounds * full, fill_s)


def reached(t: TaskTiming, ahead_rows: float, elapsed_s: float) -> TaskTiming:
    """The task as a request finds it ``elapsed_s`` from now, when ``ahead_rows`` rows
    queued ahead of it upstream reach the task before it: its backlog is the rows queued
    now and those, less what its instances serve meanwhile at full batches (a fluid
    queue, never below empty), and while rows wait every instance is busy.

    Without it a request joining the first task expected the second task's queue as it
    is now: the rows ahead of it at the first task, which reach a slower second task
    first, were not counted (two tasks, the second the slower, gamma CV 4 arrivals at
    half the capacity: in a burst 457 ms expected where 553 came, and the slack learnt
    from such answers then dropped 19 requests, 10 of which would have made it, where
    without dropping 9 came late); and a queue that drains before the request gets
    there was counted whole."""
    if ahead_rows <= 0.0 and elapsed_s <= 0.0:
        return t
    full = t.exec.time(t.batch_size)
    served = elapsed_s * t.instances * t.batch_size / full if full > 0.0 else math.inf
    backlog = max(0, round(t.queued_rows + ahead_rows - served))
    busy = t.instances if backlog else t.busy
    if backlog == t.queued_rows and busy == t.busy:
        return t
    # built, not ``dataclasses.replace``d: this runs per request and task in the simulator
    return TaskTiming(
        t.exec, backlog, t.batch_size, t.instances, t.max_queue_delay_s, busy, t.gap_s
    )


class After(Protocol):
    """The expected time of the tasks after one (its longest path), for a request that
    leaves it ``elapsed_s`` from now with ``ahead_rows`` rows ahead of it there."""

    def __call__(self, ahead_rows: float = 0.0, elapsed_s: float = 0.0, /) -> float: ...


def nothing_after(ahead_rows: float = 0.0, elapsed_s: float = 0.0, /) -> float:
    """``After`` of a task with no tasks after it."""
    return 0.0


def expected_here_s(t: TaskTiming, after: After, ahead_rows: float, elapsed_s: float) -> float:
    """Expected time from joining ``t`` (as ``reached`` finds it) to the end of its
    longest path: its wait, its batch, and ``after`` with the rows queued ahead of it
    here, which go on ahead of it."""
    t = reached(t, ahead_rows, elapsed_s)
    fill, rows = t.filling()
    own = _wait_s(t, fill) + t.exec.time(rows)
    return own + after(t.queued_rows, elapsed_s + own)


def expected_remaining_s(
    task: str,
    timings: Mapping[str, TaskTiming],
    children: Mapping[str, Sequence[str]],
    ahead_rows: float = 0.0,
    elapsed_s: float = 0.0,
) -> float:
    """Expected time from joining ``task``'s queue ``elapsed_s`` from now, with
    ``ahead_rows`` reaching it first, to the end of its longest path."""

    def after(ahead: float = 0.0, elapsed: float = 0.0, /) -> float:
        paths = (expected_remaining_s(c, timings, children, ahead, elapsed) for c in children[task])
        return max(paths, default=0.0)

    return expected_here_s(timings[task], after, ahead_rows, elapsed_s)


DROP_MARGIN = 0.0
"""A share of the SLO the drop deadline may keep back for time neither the execution
model nor the ``Slack`` sees (the frontend's own time is measured and kept back apart).
None by default: with the drop rule before issue 32's (an additive slack at its 0.9
quantile), answers served for real on this
2-core host with real ONNX models and a tight SLO came late for 1.1 % of those answered
(0.7 % with 10 % kept back), well inside the 10 % the quantile allows, and 10 % kept
back dropped more that would have made it (on time: 53 % of requests against 62 %)."""


ARRIVAL_SMOOTHING = 0.1
"""The weight of each new gap in ``arrival_gap``'s moving mean (about the last ten
arrivals)."""


def arrival_gap(gap_s: float, last_s: float | None, now: float, rows: int) -> float:
    """The mean gap between rows arriving at a task after ``rows`` more came at ``now``
    (the last came at ``last_s``): an exponentially weighted mean, updated per arrival."""
    if last_s is None or rows < 1:
        return gap_s
    sample = (now - last_s) / rows
    if gap_s == 0.0:
        return sample
    return gap_s + ARRIVAL_SMOOTHING * (sample - gap_s)


def should_drop(now: float, deadline: float, expected_s: float) -> bool:
    """Whether a request expected to need ``expected_s`` more can still make it."""
    return now + expected_s > deadline


EXEC_SMOOTHING = 0.05
"""The weight of each batch in ``ExecModel.scale``'s moving mean (about the last twenty
batches). A mean, not an upper envelope: a request behind ``k`` batches waits their sum,
which swings far less than ``k`` times one batch's worst. An envelope (up by half of each
slower batch, down by 5 % of each faster one) expected that worst of every batch ahead,
and on servers whose batch times swing (noise CV 0.7–1.0) dropped requests at arrival
that would all have made it: 22 of 150 random plans broke the drop law, against 2 of
150 with the mean (``tests/test_plansim.py``'s generator, seeds 0–149, slack quantile
0.1)."""


def moving_mean(old: float, sample: float, weight: float = EXEC_SMOOTHING) -> float:
    """An exponentially weighted mean; the first sample (old == 0) sets it."""
    if old == 0.0:
        return sample
    return old + weight * (sample - old)


SLACK_QUANTILE = 0.05
"""The drop decision's confidence: a request is dropped when it is more than ``1 −
SLACK_QUANTILE`` likely to come late (its expectation times the ``quantile`` of the
latency-to-expected ratios of answers expected about as long passes its deadline). A
drop is a certain SLO violation and a late answer only a likely one, so a drop pays only
for a request nearly sure to be late (and for the time it would take from those behind
it). Set on the development set of ``benchmarks/drop_rule.py`` (the jigsaw study's
plans on 8 A100-80GB at their own maximum demand, under Poisson, gamma CV 3 and the
Azure code trace): the largest of 0.9, 0.5, 0.25, 0.1 and 0.05 under which dropping
never missed more than no dropping. With one slack for all answers that was 0.1; with
the slack kept apart by expectation (2026-12-06), 0.1 broke the law in 1 of the 144
development cells (6 drops where none came late, under Poisson), 0.05 in none; H100
plans and the conversation trace are judged on it. At 0.9 with an additive slack and an
upper-envelope ``ExecModel`` (the rule before, less its per-task budgets as deadlines: a
drop when more than 10 % likely late) 24 of the 144 development cells broke it, the
worst by 11.7 points."""


SLACK_BIN_BASE_S = 0.001
"""The ``Slack``'s answers are kept apart by how long they were expected to take, in
bins a factor of two wide from this up (all below twice it share the first)."""

SLACK_BINS = 16
"""How many such bins (the last holds every expectation past ``2**15`` ms)."""


def expectation_bin(expected_s: float) -> int:
    """The ``Slack`` bin of an answer expected to take ``expected_s``: ``⌊log2(expected /
    SLACK_BIN_BASE_S)⌋``, within ``[0, SLACK_BINS)``."""
    if expected_s < 2.0 * SLACK_BIN_BASE_S:
        return 0
    return min(SLACK_BINS - 1, math.frexp(expected_s / SLACK_BIN_BASE_S)[1] - 1)


class _Window:
    """The last ``size`` ratios, in order and sorted (a quantile after each answer costs
    a bisection, not a sort)."""

    __slots__ = ("ordered", "recent")

    def __init__(self, size: int) -> None:
        self.recent: deque[float] = deque(maxlen=size)
        self.ordered: list[float] = []

    def add(self, value: float) -> None:
        recent, ordered = self.recent, self.ordered
        if len(recent) == recent.maxlen:
            del ordered[bisect_left(ordered, recent[0])]
        recent.append(value)
        insort(ordered, value)


class Slack:
    """How many times longer than expected answers take from one place they are judged
    (``Trail``): the ``quantile`` of the time to the answer ÷ the time expected there,
    over the last ``window`` answers expected about as long as the request in question
    (the same ``expectation_bin``). The drop decision there scales a request's
    expectation by it (``judge``), so that a request is dropped only when more than ``1
    − quantile`` of answers expected as it is came late (``SLACK_QUANTILE``). Below 1
    when the model is pessimistic: then it admits more.

    A ratio, not a difference: a request behind many batches has an error that grows with
    its expectation, and the rare deep queues where drops are decided are where an
    additive error drawn from the many shallow ones misjudged it (with the moving-mean
    ``ExecModel``, 2 of 150 random plans broke the drop law with differences, none of 300
    with ratios).

    Kept apart by expectation, because the ratio is not the same at every depth: what the
    queue model does not see (the hops between processes, the frontend's parsing) is a
    large part of a short expectation and a small part of a long one. With one window for
    all, the ratio learnt from the many shallow answers (1.5–2 on this host) was put on
    the deep queues where drops are decided, and requests were dropped that would have
    made it: the example plan served at a tight SLO missed 37.1 % with dropping against
    31.4 % without (CI, stop 39), and the AR assistant's H100 plan under the conversation
    trace dropped 0.98 % against none late (``benchmarks/drop_rule.py``).

    A bin with fewer than ``min_answers`` answers borrows the lowest factor of those that
    have them, and never more than ``initial`` (1: the model as it is): without evidence
    at its depth, a request is dropped only when every depth known (and the model) says it
    would be late. It cannot wait for evidence of its own: in an overload the queue
    deepens faster than answers come back, and each deeper bin would be empty when asked
    (a plan at twice its capacity for 3 s dropped nothing). That is the pipeline's own
    check at arrival, which sheds an overload. A task's checks do not borrow
    (``borrow=False``): a bin there without answers enough has factor 0, so that a
    request is dropped there only once its deadline has passed. Borrowed, the lowest
    factor known there was near 1 where the rare deep expectations ran at 0.4 of what was
    expected: the example plan's face classifier, served for real at a tight SLO, would
    have dropped 42 requests of which 28 came late (its joining check 13, of which 1);
    with no borrowing at the tasks, 25 of which 25, and over seven such runs 212 of
    which 209, where the one factor carried from arrival (the rule before) would have
    dropped 262 of which 206 (replayed from each run's log, on its requests kept from
    dropping). With
    ``by_expectation=False``
    all answers share one bin and ``initial`` is its factor until it fills (the rule
    before). The quantile is ``np.quantile``'s default (linear) estimate, to the bit
    (``quantile_sorted``)."""

    def __init__(
        self,
        quantile: float = SLACK_QUANTILE,
        window: int = 400,
        min_answers: int = 20,
        initial: float = 1.0,
        *,
        by_expectation: bool = True,
        borrow: bool = True,
    ) -> None:
        self.initial, self.quantile, self.min_answers = initial, quantile, min_answers
        self.window, self.by_expectation, self.borrow = window, by_expectation, borrow
        self._bins: dict[int, _Window] = {}
        self._factors: dict[int, float] = {}
        self._lowest: float | None = None
        """The factor of a bin without answers enough (``None``: to be worked out)."""
        self.last = initial
        """The factor of the latest ``deadline``."""

    def _bin(self, expected_s: float) -> int:
        return expectation_bin(expected_s) if self.by_expectation else 0

    def _known(self, b: int) -> float | None:
        """Bin ``b``'s factor, or ``None`` while it has too few answers."""
        f = self._factors.get(b)
        if f is None:
            w = self._bins.get(b)
            if w is None or len(w.ordered) < self.min_answers:
                return None
            f = self._factors[b] = quantile_sorted(w.ordered, self.quantile)
        return f

    def factor_for(self, expected_s: float) -> float:
        """The factor a request expected to take ``expected_s`` is scaled by: its bin's,
        drawn linearly (in the expectation's logarithm) toward the next bin's from the
        bin's middle on, when both are known, so that the factor has no cliff at a bin's
        edge."""
        b = self._bin(expected_s)
        f = self._known(b)
        if f is not None:
            if not self.by_expectation or expected_s <= 0.0:
                return f
            x = math.log2(expected_s / SLACK_BIN_BASE_S) - (b + 0.5)  # from the middle
            step = 1 if x >= 0.0 else -1
            g = self._known(b + step) if 0 <= b + step < SLACK_BINS else None
            return f if g is None else f + (g - f) * min(1.0, abs(x))
        if not self.borrow:
            return 0.0
        if self._lowest is None:
            known = (self._known(k) for k in self._bins)
            self._lowest = min([self.initial, *(k for k in known if k is not None)])
        return self._lowest

    @property
    def factor(self) -> float:
        """The factor of a request expected to take no time (with ``by_expectation=False``,
        of every request)."""
        return self.factor_for(0.0)

    def judge(self, expected_s: float) -> float:
        """The factor a request judged now, expected to take ``expected_s``, is scaled by
        (``factor_for``), remembered as ``last``: it is dropped when ``factor ·
        expected_s`` passes what is left of its budget.

        Each place that judges keeps its own ``Slack``, learnt from what it expected
        (``Trail``): the pipeline's at arrival, and at each task one as a request joins
        its queue and one as its batch forms. One factor found at arrival and carried to
        every task's check (the rule before) was learnt on the whole pipeline's
        expectation and put on each task's remainder, whose errors differ: served for
        real on this host, the example plan's car classifier was judged with 0.58 where
        the answers from joining its queue showed a 5 % quantile of 0.38–0.46, and the
        face classifier's checks erred both ways; the requests that could be dropped
        missed more than those kept from dropping, by up to 7.7 points on CI (stop 47)."""
        self.last = self.factor_for(expected_s)
        return self.last

    def observe(self, latency_s: float, expected_s: float) -> None:
        """An answer that took ``latency_s`` where ``expected_s`` was expected (nothing
        is learnt from one with no expectation)."""
        if expected_s <= 0.0:
            return
        b = self._bin(expected_s)
        w = self._bins.get(b)
        if w is None:
            w = self._bins[b] = _Window(self.window)
        w.add(latency_s / expected_s)
        self._factors.pop(b, None)
        self._lowest = None


Trail = list[tuple[Slack, float, float]]
"""What the checks on one request's way expected, in order: per check, the ``Slack`` of
the place it was made (the pipeline's arrival, a task's queue as the request joined it,
a task's batch as it formed), when, and the time expected from then to the request's
answer. Shared by the request's entries at every task; ``learn`` once it is answered."""


def learn(trail: Trail, answered_at: float) -> None:
    """Each check on an answered request's way learns how long the answer took from it."""
    for slack, at, expected_s in trail:
        slack.observe(answered_at - at, expected_s)


class Holdout:
    """Which requests an A/B holdout keeps from dropping (``serve --drop-holdout``): a
    ``share`` of them, in permuted blocks: of each ``block`` requests in arrival order
    (the share's denominator, at most 100), ``kept`` (its numerator) are kept, which ones
    drawn at random. Neighbours in time meet the same queues, so a block holds both arms
    of much the same moment. Drawn independently (the rule before), which arm met the
    bursts is one random draw, and with a fixed seed and a fixed schedule the same draw
    at every run: the example plan served for real, the requests that could be dropped
    missed more than those kept in every one of 13 runs (2.7 points on the mean, under
    three drop rules); four other seeds gave −0.8 to +3.6."""

    def __init__(self, share: float, seed: int = 0) -> None:
        if not 0.0 <= share < 1.0:
            raise ValueError(f"holdout share {share:g} is not in [0, 1)")
        frac = Fraction(share).limit_denominator(100)
        self.kept, self.block = frac.numerator, frac.denominator
        self._rng = random.Random(seed)
        self._left: list[bool] = []

    def keeps(self) -> bool:
        """Whether the next request is kept from dropping."""
        if not self.kept:  # no holdout: no draw per request
            return False
        if not self._left:
            self._left = [True] * self.kept + [False] * (self.block - self.kept)
            self._rng.shuffle(self._left)
        return self._left.pop()


def quantile_sorted(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ascending ``values`` as ``np.quantile`` computes it by
    default (linear interpolation between the order statistics around ``(n − 1)·q``,
    the same floating-point operations in the same order)."""
    n = len(values)
    virtual = (n - 1) * q
    if virtual >= n - 1:
        return float(values[n - 1])
    if virtual < 0:
        return float(values[0])
    lo = math.floor(virtual)
    a, b, t = values[lo], values[lo + 1], virtual - lo
    diff = b - a
    return float(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
