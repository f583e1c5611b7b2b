"""The planner's worker processes: the same results, in the same order, as one process."""

import os
import signal
import time

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


def _logged(log, item):
    """A task that notes its start in a file (appended: one line per task, whatever the process)."""
    with open(log, "a", encoding="ascii") as file:
        file.write(f"{item}\n")
    return item * item


@pytest.mark.parametrize("workers", [1, 2])
def test_results_not_kept_are_told_in_order_with_few_tasks_ahead(tmp_path, workers):
    """keep=False: every result told in order, none returned, and when result i is told no task beyond
    i + AHEAD x workers has started (memory holds a few results, not all), though each result is told slowly
    (as a block is written). Power: every task given out at once (keep=True) reaches 11 ahead here."""
    from gedp.planning import workers as module

    log = tmp_path / "started"
    log.touch()
    told, ahead = [], []

    def tell(index, result):
        time.sleep(0.05)
        told.append((index, result))
        ahead.append(max(map(int, log.read_text().split())) - index)

    got = parallel_map(_logged, log, list(range(12)), on_result=tell, workers=workers, keep=False)
    assert got == [] and told == [(i, i * i) for i in range(12)]
    assert max(ahead) <= module.AHEAD * workers


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

    with pytest.raises(GedpError, match="a worker process stopped before its task was done.*nothing was planned"):
        parallel_map(_killed_at_one, None, [0, 1, 2, 3], workers=2)
    assert multiprocessing.active_children() == []


def _blas_threads(shared, item):
    """The BLAS thread count a task runs with (None: no BLAS library threadpoolctl knows)."""
    from threadpoolctl import threadpool_info

    counts = [library["num_threads"] for library in threadpool_info() if library["user_api"] == "blas"]
    return max(counts) if counts else None


def test_tasks_in_workers_run_on_one_blas_thread():
    """As many workers as cores: a task's BLAS threads beside them would only wait for a time slice (and
    spin, burning processor time): each task in a worker runs on one BLAS thread."""
    got = parallel_map(_blas_threads, None, list(range(4)), workers=2)
    if got[0] is None:
        pytest.skip("no BLAS library that threadpoolctl knows")
    assert got == [1, 1, 1, 1]


@pytest.fixture(scope="module")
def small_standin(small_state):
    from gedp.planning.predict import target_cells
    from gedp.planning.predictor import StandIn

    return StandIn(small_state, target_cells(small_state, None, (78, 75, 74, 54, 51), ["m1emp", "m2emp", "wage"]),
                   "small")


def test_predictions_in_workers_are_the_one_process_predictions_bit_for_bit(small_standin, monkeypatch):
    """The planner's batch of predictions (whole configs, wage and employment allocations) on two worker
    processes, as `gedp plan` runs it, against the same batch in this process: the same floats, bit for
    bit (what the workers change, one BLAS thread, must not change the plan or its summary)."""
    from gedp.config import load_config
    from gedp.planning import shapes, workers
    from gedp.planning.predictor import Predictor

    base = load_config("baseline")
    configs = [(base, ["m1emp", "wage"], "base plan")]
    wages = shapes.allocations(shapes.wage_sets()[:2], shapes.WAGE_IDENTITY_SHARES[:1], shapes.STATE_SHARES[:1])
    employment = shapes.allocations(shapes.query_sets()[:3], shapes.IDENTITY_SHARES[:1], shapes.STATE_SHARES)

    def run(cores):
        monkeypatch.setattr(workers, "usable_cpus", lambda: cores)
        return Predictor(small_standin, base, 2.3065, lambda label: None).run(configs, wages, employment)

    alone, pooled = run(1), run(2)
    assert pooled == alone
    assert all(np.isfinite(e) for errors in alone[0] for by in errors.values() for e in by.values())
