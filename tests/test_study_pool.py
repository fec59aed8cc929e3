"""The studies' process pool (``study._pool.as_finished``): a task that fails ends the
study at once, not after every task queued behind it."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from ridgeline.study._pool import as_finished

pytestmark = pytest.mark.timeout(60)


def test_a_failed_task_ends_the_study_without_waiting_for_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # time.sleep(-1) raises at once; the others would run an hour each: a pool that
    # waited for them (the executor's own exit) fails this test on its timeout
    tasks = [-1.0, 3600.0, 3600.0, 3600.0]
    # the pool's own workers, as the executor starts them: counting every child alive
    # after the study (less those alive before it) counted a process of an earlier test
    # that started during this one (CI, stop 47)
    workers: list[multiprocessing.process.BaseProcess] = []
    spawn = ProcessPoolExecutor._spawn_process  # type: ignore[attr-defined]

    def spawned(executor: ProcessPoolExecutor) -> None:
        spawn(executor)
        workers.extend(executor._processes.values())

    monkeypatch.setattr(ProcessPoolExecutor, "_spawn_process", spawned)
    with pytest.raises(ValueError, match="non-negative"):
        for _ in as_finished(time.sleep, tasks, jobs=2):
            pass
    # and no worker outlives it (one that did kept the interpreter from exiting)
    assert len(set(workers)) == 2
    assert [(p.name, p.exitcode) for p in set(workers) if p.is_alive()] == []


def test_every_task_is_yielded_once_when_none_fails() -> None:
    assert sorted(as_finished(abs, [-3, 1, -2, 0], jobs=2)) == [0, 1, 2, 3]
