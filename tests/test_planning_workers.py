"""The planner's worker processes: the same results, in the same order, as one process."""

import os
import signal

import numpy as np
import pytest

from gedp.errors import GedpError
from gedp.planning.workers import parallel_map


def _noisy_sum(shared, item):
    """A task drawing from its own seeded generator, on a shared array."""
    seed, scale = item
    return float(shared.sum() + scale * np.random.default_rng(seed).normal())


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_give_one_process_results_in_order(workers):
    shared = np.arange(10.0)
    items = [(seed, 1 + seed % 3) for seed in range(7)]
    expected = [45.0 + scale * np.random.default_rng(seed).normal() for seed, scale in items]
    told = []
    got = parallel_map(_noisy_sum, shared, items, on_result=lambda index, result: told.append((index, result)),
                       workers=workers)
    assert got == expected
    assert told == list(enumerate(expected))


def test_a_failing_task_raises_in_the_caller():
    with pytest.raises(ZeroDivisionError):
        parallel_map(lambda shared, item: shared / item, 1.0, [1.0, 0], workers=2)


def _killed_at_one(shared, item):
    """A task whose worker is killed (as the system kills a process short of memory) at item 1."""
    if item == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return item


def test_a_killed_worker_is_reported_not_waited_for():
    """multiprocessing.Pool waits for ever for the result of a worker that died; the planner says so."""
    import multiprocessing

    with pytest.raises(GedpError, match="a planner worker process stopped"):
        parallel_map(_killed_at_one, None, [0, 1, 2, 3], workers=2)
    assert multiprocessing.active_children() == []
