"""One schedule sharded across generator actors on a Ray cluster (``--workers``).

Worker k replays every N-th arrival (k, k+N, ...), as ``shard.py``'s processes do, but
from a Ray actor, the actors spread over the cluster's nodes (the SPREAD strategy). The
driver waits until every actor has connected to the target, then picks one start on the
wall clock a short lead ahead; each actor maps it onto its own ``time.perf_counter()``
(a monotonic clock is not shared across machines). Every record is timed on one
machine's clock from that start, so the workers' records merge exactly
(``Records.merge``); the wall clocks' disagreement (NTP: milliseconds) only shifts when a
worker's share begins, never a latency.

Each worker is also judged on its own: one late worker among many can hide in the merged
lateness, and still move the latency of its share. A step is invalid, naming the worker,
when one fell behind (its own records break the lateness rule) or was lost (its process
or node died): the survivors' records are kept, and the lost worker's requests stay in
the step's count as never measured (``NOT_SENT``), never silently dropped.

Ray is imported only here, only when a step asks for it; every node needs ridgeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import warnings
from dataclasses import dataclass
from typing import Any

from ridgeline._fields import MAX_PORT
from ridgeline.errors import ConfigError, TargetError, TargetUnreachableError
from ridgeline.loadgen.replayer import Progress, replay
from ridgeline.loadgen.shard import Sending
from ridgeline.loadgen.validity import ValidityConfig, fell_behind
from ridgeline.targets.base import Target
from ridgeline.targets.factory import make_target
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import WorkerLoad, lateness_ms

WORKER_FORMS = "ray://HOST:PORT (a Ray client address) or ray:auto (the running cluster)"
ACTOR_PREFIX = "ridgeline-generator-"
"""Generator actors are named ``ridgeline-generator-<step token>-<worker>`` (``ray list
actors`` shows whose they are)."""

_START_LEAD_S = 0.5
_POLL_S = 0.1
_GRACE_S = 30.0
"""A worker silent this long after its share (and its requests' timeout) should have
ended is given up as lost: its node hung or was cut off."""
_RAY = "pip install 'ridgeline[ray]'"


def ray_address(workers: str) -> str:
    """The address ``ray.init`` takes for a ``--workers`` value; ConfigError naming the
    accepted forms for any other."""
    if workers == "ray:auto":
        return "auto"
    if workers.startswith("ray://"):
        host, colon, port = workers.removeprefix("ray://").rpartition(":")
        if host and colon and "/" not in host and port.isdigit() and 0 < int(port) <= MAX_PORT:
            return workers
    raise ConfigError(f"not a worker address: give {WORKER_FORMS}")


class GeneratorWorker:
    """One worker's share of the schedule, replayed from a Ray actor (``ray.remote``
    wraps this class when a step asks for Ray). Async: ``progress`` and ``stop`` are
    answered between sends."""

    def __init__(self, share: Sending) -> None:
        self._share = share
        self._target: Target | None = None
        self._stop = asyncio.Event()
        self._progress = Progress()

    async def connect(self) -> str:
        """Connect to the target; the id of the node this worker runs on."""
        import ray

        self._target = make_target(self._share.url, self._share.options)
        await self._target.connect(self._share.cfg.max_outstanding)
        return str(ray.get_runtime_context().get_node_id())

    async def run(self, epoch: float) -> Records:
        """Replay the share from ``epoch`` (wall-clock seconds), mapped onto this
        machine's ``perf_counter``."""
        start_at = time.perf_counter() + (epoch - time.time())
        target = self._target
        if target is None:
            raise TargetError("a generator worker was asked to run before it connected")
        share = self._share
        try:
            return await replay(
                target,
                share.times,
                share.shapes,
                share.cfg,
                start_at=start_at,
                stop=self._stop,
                progress=self._progress,
            )
        finally:
            await target.close()

    async def progress(self) -> tuple[int, int, int]:
        """(sent, answered, failed) so far."""
        p = self._progress
        return p.sent, p.answered, p.failed

    async def stop(self) -> None:
        """Stop sending (Ctrl-C at the driver); in-flight requests drain as in ``replay``."""
        self._stop.set()


@dataclass
class DistributedRun:
    """What the workers of one step sent and measured."""

    records: Records
    """Every worker's records merged; a lost worker's requests are there, NOT_SENT."""
    measured: Records
    """The records of the workers that finished, merged: what the step's validity judges."""
    parts: list[Records | None]
    """Each worker's own records (None: lost), in worker order."""
    workers: list[WorkerLoad]
    problems: list[str]
    """Why a worker makes the step invalid (behind, lost), one line each."""


async def replay_on_ray(
    sending: Sending,
    *,
    workers: str,
    count: int | None = None,
    validity: ValidityConfig | None = None,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
    place_timeout_s: float = 60.0,
) -> DistributedRun:
    """Replay ``sending`` from ``count`` Ray actors (default: one per alive node with a
    CPU) on the cluster at ``workers`` (``ray://HOST:PORT`` or ``ray:auto``; a Ray
    already initialised in this process is used as it is). Raises TargetError when a
    worker cannot connect to the target, ConfigError when Ray is missing, unreachable,
    or cannot place the actors within ``place_timeout_s``."""
    ray = _connected(workers)
    n = count if count is not None and count > 1 else _alive_nodes(ray)
    split = sending.shares(n)
    times, cfg = sending.times, sending.cfg
    remote = ray.remote(num_cpus=1)(GeneratorWorker)
    token = secrets.token_hex(4)
    actors = [
        remote.options(name=f"{ACTOR_PREFIX}{token}-{k}", scheduling_strategy="SPREAD").remote(
            share
        )
        for k, share in enumerate(split)
    ]
    try:
        nodes = await _all_connected(ray, actors, place_timeout_s)
        epoch = time.time() + _START_LEAD_S
        runs = [_future(a.run.remote(epoch)) for a in actors]
        if progress is not None:
            progress.total = int(times.shape[0])
        last = float(times[-1]) if times.size else 0.0
        end = time.monotonic() + _START_LEAD_S + last + cfg.timeout_s + (cfg.drain_s or 0.0)
        reported = await _follow(actors, runs, stop, progress, end + _GRACE_S)
    finally:
        for a in actors:
            with contextlib.suppress(Exception):  # already dead: nothing to end
                ray.kill(a)
    parts: list[Records | None] = [
        None if r.cancelled() or r.exception() else r.result() for r in runs
    ]
    judged = [
        _judged(k, nodes[k], rec, validity or ValidityConfig())
        if rec is not None
        else _lost(k, nodes[k], len(split[k].times), reported[k][0], runs[k])
        for k, rec in enumerate(parts)
    ]
    survivors = [p for p in parts if p is not None]
    whole = [
        p if p is not None else Records.empty(share.times)
        for p, share in zip(parts, split, strict=True)
    ]
    records = Records.merge(whole)
    if progress is not None:
        progress.sent = len(records) - records.count(Outcome.NOT_SENT)
        progress.answered = progress.sent
    return DistributedRun(
        records=records,
        measured=Records.merge(survivors) if survivors else Records.empty(times[:0]),
        parts=parts,
        workers=[load for load, _ in judged],
        problems=[problem for _, problem in judged if problem is not None],
    )


def _connected(workers: str) -> Any:
    """The ``ray`` module, connected to the cluster ``workers`` names (or as it is, when
    this process already initialised it)."""
    address = ray_address(workers)
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"--workers {workers} needs Ray here and on every node: {_RAY}") from exc
    if not ray.is_initialized():
        try:
            with warnings.catch_warnings():  # a client's timeout: said in the error below
                warnings.filterwarnings("ignore", category=UserWarning, module=r"ray\.")
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"cannot reach the Ray cluster at {workers} ({_first_line(exc)}): start one "
                "with `ray start --head` and join nodes with `ray start --address HEAD:6379`, "
                f"or check the address ({WORKER_FORMS})"
            ) from exc
    return ray


def _alive_nodes(ray: Any) -> int:
    """The alive nodes that can hold a worker (one CPU at least)."""
    nodes = ray.nodes()
    return max(1, sum(1 for n in nodes if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1))


def _future(ref: Any) -> asyncio.Future[Any]:
    """A Ray object reference as an asyncio future of this loop (a Ray client's too)."""
    return asyncio.wrap_future(ref.future())


async def _all_connected(ray: Any, actors: list[Any], timeout_s: float) -> list[str]:
    """Each worker's node (its address, as the cluster knows it) once all have connected
    to the target; the first failure raised, naming its worker."""
    hellos = [_future(a.connect.remote()) for a in actors]
    _, waiting = await asyncio.wait(hellos, timeout=timeout_s)
    for f in waiting:
        f.cancel()
    for k, f in enumerate(hellos):
        if f in waiting:
            unplaced = ", ".join(str(j) for j, g in enumerate(hellos) if g in waiting)
            raise ConfigError(
                f"generator worker(s) {unplaced} of {len(actors)} were not started within "
                f"{timeout_s:g} s: each needs 1 free CPU on a node (the cluster has "
                f"{ray.available_resources().get('CPU', 0):g} free; `ray status`): give fewer "
                "--processes, or add nodes"
            )
        exc = f.exception()
        if exc is not None:
            kind = TargetUnreachableError if _cause(exc, TargetUnreachableError) else TargetError
            raise kind(f"generator worker {k} could not start: {_why(exc)}")
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return [str(address.get(f.result(), f.result())) for f in hellos]


async def _follow(
    actors: list[Any],
    runs: list[asyncio.Future[Any]],
    stop: asyncio.Event | None,
    progress: Progress | None,
    deadline: float,
) -> list[tuple[int, int, int]]:
    """Wait for every worker's run, forwarding ``stop`` and summing their counts into
    ``progress``; each worker's last (sent, answered, failed) reported. One question to
    an actor at a time: a worker on a hung node never holds up the others; one still
    running at ``deadline`` (``time.monotonic``) is given up (its run cancelled)."""
    counts = [(0, 0, 0)] * len(actors)
    asking: dict[int, asyncio.Future[Any]] = {}
    stopped = False
    pending = set(runs)
    while pending:
        if time.monotonic() > deadline:
            for run in pending:
                run.cancel()
            break
        _, pending = await asyncio.wait(pending, timeout=_POLL_S)
        if stop is not None and stop.is_set() and not stopped:
            stopped = True
            for k, a in enumerate(actors):
                if runs[k] in pending:
                    a.stop.remote()
        for k, a in enumerate(actors):
            asked = asking.get(k)
            if asked is not None and asked.done():
                del asking[k]
                if asked.exception() is None:
                    counts[k] = asked.result()
            if k not in asking and runs[k] in pending:
                asking[k] = _future(a.progress.remote())
        if progress is not None:
            progress.sent, progress.answered, progress.failed = map(sum, zip(*counts, strict=True))
    for asked in asking.values():
        asked.cancel()
    return counts


def _judged(
    k: int, node: str, rec: Records, validity: ValidityConfig
) -> tuple[WorkerLoad, str | None]:
    """A finished worker's load, and why it makes the step invalid (None: it does not)."""
    late = lateness_ms(rec)
    behind = fell_behind(rec, validity)
    load = WorkerLoad(
        worker=k,
        node=node,
        scheduled=len(rec),
        sent=len(rec) - rec.count(Outcome.NOT_SENT),
        lateness_p99_ms=late.p99,
        lateness_max_ms=late.max,
        state="ok" if behind is None else "behind",
        reason=behind,
    )
    if behind is None:
        return load, None
    return load, (
        f"generator worker {k} (node {node}) fell behind: {behind} (lower the rate, or add "
        "workers: --processes)"
    )


def _lost(
    k: int, node: str, scheduled: int, sent: int, run: asyncio.Future[Any]
) -> tuple[WorkerLoad, str]:
    """A lost worker's load (``sent``: the last count it reported), and the reason it
    makes the step invalid."""
    exc = None if run.cancelled() else run.exception()
    why = f"silent {_GRACE_S:g} s past its share's end" if exc is None else _why(exc)
    load = WorkerLoad(worker=k, node=node, scheduled=scheduled, sent=sent, state="lost", reason=why)
    return load, (
        f"generator worker {k} (node {node}) died after {sent} of {scheduled} sends: {why}; "
        "its requests have no results (counted as not sent), the other workers' are kept"
    )


def _cause(exc: BaseException, kind: type[BaseException]) -> bool:
    return isinstance(exc, kind) or isinstance(getattr(exc, "cause", None), kind)


def _why(exc: BaseException) -> str:
    """One line for what ended a worker: the exception raised in the actor (a Ray task
    error carries it as ``cause``), else Ray's own (the actor or its node died)."""
    cause = getattr(exc, "cause", None)
    shown = cause if isinstance(cause, BaseException) else exc
    return f"{type(shown).__name__}: {_first_line(shown)}"[:300]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
