"""A study's tasks run side by side: both studies hand theirs to ``as_finished``."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def as_finished(run: Callable[[T], R], tasks: Sequence[T], jobs: int) -> Iterator[R]:
    """``run(task)`` for each task, yielded as it finishes: in this process for one job,
    else in ``jobs`` fresh processes at most (spawned: nothing of the caller's state leaks
    into a task; ``run`` and the tasks must pickle). A task that raises (or a caller that
    stops early) ends the rest at once: the tasks not started are cancelled and the
    running ones stopped. (The executor's own exit waited for every task queued:
    a study's one failed solve was reported after the hours its other tasks took.)"""
    if jobs == 1:
        yield from map(run, tasks)
        return
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)) or 1, mp_context=ctx)
    try:
        futures: list[Future[R]] = [pool.submit(run, t) for t in tasks]
        for f in as_completed(futures):
            yield f.result()
    except BaseException:
        # no public way to stop running workers before Python 3.14's terminate_workers();
        # taken before shutdown, which forgets them (a list taken after it was empty, and
        # the workers outlived the study: the interpreter's exit then waited on them)
        running = list((pool._processes or {}).values())
        # shutdown forgets it too (typeshed types it as the thread's wakeup pipe)
        manager: threading.Thread | None = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in running:
            proc.terminate()
        for proc in running:
            proc.join(timeout=30)
        # the executor's own thread reaps the workers it sees die: a join racing it here
        # returned while the worker, already gone, still read as alive (2 of 12 tries);
        # once that thread has ended, every worker's exit is recorded
        if manager is not None:
            manager.join(timeout=30)
        raise
    pool.shutdown(wait=True)
