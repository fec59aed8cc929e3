"""The studies' process pool (``study._pool.as_finished``): a task that fails ends the
study at once, not after every task queued behind it."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from ridgeline.study._pool import as_finished

pytestmark = pytest.mark.timeout(60)


def test_a_failed_task_ends_the_study_without_waiting_for_the_others() -> None:
    # time.sleep(-1) raises at once; the others would run an hour each: a pool that
    # waited for them (the executor's own exit) fails this test on its timeout
    tasks = [-1.0, 3600.0, 3600.0, 3600.0]
    # children of earlier tests still exiting are theirs, not the pool's (CI once saw
    # one such spawned process here, alive for a moment after its own test ended)
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="non-negative"):
        for _ in as_finished(time.sleep, tasks, jobs=2):
            pass
    # and no worker outlives it (one that did kept the interpreter from exiting)
    assert set(multiprocessing.active_children()) - before == set()


def test_every_task_is_yielded_once_when_none_fails() -> None:
    assert sorted(as_finished(abs, [-3, 1, -2, 0], jobs=2)) == [0, 1, 2, 3]
