"""Work on threads (``months.on_threads``): the bits of one thread, errors raised in the caller."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from gedp.config import load_config
from gedp.measure.workflows import measure
from gedp.postprocess import months
from gedp.postprocess.attributes import MONTHS
from gedp.postprocess.months import deviation_variance, on_threads, smooth_months


def _answers(n: int, n_months: int, seed: int) -> np.ndarray:
    """Noisy monthly answers of establishments of many sizes (Fortran order, as ``smooth_months`` holds them)."""
    rng = np.random.default_rng(seed)
    level = np.exp(rng.uniform(0.0, 8.0, n))[:, None]
    return np.asfortranarray(level * rng.lognormal(0.0, 0.1, (n, n_months)) + rng.normal(0.0, 3.0, (n, n_months)))


def _noise(x: np.ndarray, other_months: list[int], rows: slice | None = None) -> np.ndarray:
    """A noise variance linear in the level, its slope differing by month."""
    return np.column_stack([(1.0 + 0.1 * month) * np.maximum(x[:, 0], 0.0) + 9.0 for month in other_months])


@pytest.mark.parametrize("n_months", [3, 12])
def test_deviation_variance_on_threads_has_the_bits_of_one_thread(monkeypatch, n_months):
    y = _answers(200_000, n_months, seed=n_months)
    monkeypatch.setattr(months, "usable_cpus", lambda: 1)
    alone = deviation_variance(y, _noise)
    monkeypatch.setattr(months, "usable_cpus", lambda: 4)
    both_running, calls, lock = threading.Barrier(2, timeout=60), [], threading.Lock()

    def noise(x, other_months, rows):
        with lock:
            calls.append(threading.get_ident())
            first_two = len(calls) <= 2
        if first_two:  # returns only once two months run at the same time (else BrokenBarrierError)
            both_running.wait()
        return _noise(x, other_months, rows)

    together = deviation_variance(y, noise)
    assert len(set(calls[:2])) == 2
    assert alone.tobytes() == together.tobytes()
    assert np.all(alone > 0)  # a fit that moved: the months move beyond their noise


def test_a_tasks_error_is_raised_in_the_caller_after_every_task_ran(monkeypatch):
    monkeypatch.setattr(months, "usable_cpus", lambda: 2)
    ran = []

    def task(item: int) -> int:
        ran.append(item)
        if item in (1, 3):
            raise (ValueError if item == 1 else KeyError)(f"item {item}")
        return item

    with pytest.raises(ValueError, match="item 1"):  # the first in the tasks' order
        on_threads([lambda item=item: task(item) for item in range(5)])
    assert sorted(ran) == [0, 1, 2, 3, 4]
    assert on_threads([lambda item=item: task(item) for item in (0, 2, 4)]) == [0, 2, 4]


def test_a_noise_error_surfaces_from_deviation_variance(monkeypatch):
    monkeypatch.setattr(months, "usable_cpus", lambda: 2)

    def noise(x, other_months, rows):
        raise FloatingPointError("noise variance undefined")

    with pytest.raises(FloatingPointError, match="undefined"):
        deviation_variance(_answers(1_000, 3, seed=0), noise)


def test_one_processor_runs_the_tasks_in_order_in_the_callers_thread(monkeypatch):
    monkeypatch.setattr(months, "usable_cpus", lambda: 1)
    seen = on_threads([lambda item=item: (item, threading.get_ident()) for item in range(4)])
    assert seen == [(item, threading.get_ident()) for item in range(4)]


@pytest.mark.parametrize(("n_cpu", "per_row_sd"), [(1, False), (2, False), (2, True)])
def test_smoothed_months_by_blocks_have_the_bits_of_the_whole_state(small_state, monkeypatch, n_cpu, per_row_sd):
    """The months are smoothed a block of establishments at a time (``months.BLOCK_ROWS``): blocks of
    97 (the last one short), on one thread or two, give the estimates, variances, slopes and pattern
    loadings of one block of every establishment, toward the sectors' patterns and with the cells',
    also with a noise sd of its own for each establishment."""
    plan = load_config("baseline").plan
    answers = {m: measure(small_state, plan, rng=np.random.default_rng(8)).for_attribute(m) for m in MONTHS}
    keys = next(a for a in answers["m1emp"] if a.query.is_identity).keys["estab_id"]
    if per_row_sd:  # sds of their own per establishment: the blocks take their rows of them too
        spread = np.random.default_rng(9).uniform(0.8, 1.25, len(keys))
        answers = {m: [dataclasses.replace(a, sd=a.sd * spread) if a.query.is_identity else a for a in answers[m]]
                   for m in MONTHS}
    cells = months.pattern_cells(small_state, keys)
    groups = months.pattern_cells(small_state, keys, columns=months.PATTERN_GROUP)
    monkeypatch.setattr(months, "usable_cpus", lambda: n_cpu)

    def smoothed(block_rows: int) -> list[bytes]:
        monkeypatch.setattr(months, "BLOCK_ROWS", block_rows)
        out = smooth_months(answers, plan.psi, cells, groups)
        return [getattr(a, field).tobytes() for m in MONTHS for a in out[m] if a.query.is_identity
                for field in ("estimate", "variance", "variance_slope", "pattern_loading")]

    assert len(small_state) % 97 and len(months.row_blocks(len(small_state))) == 1
    whole = smoothed(len(small_state))
    assert smoothed(97) == whole
    assert len(whole) == 4 * len(MONTHS) and len(set(whole)) == len(whole)  # every array its own


@pytest.mark.parametrize("n", [9, 17, 18])
def test_deviation_variance_by_blocks_has_the_bits_of_one_block_for_many_months(monkeypatch, n):
    """Twelve months (numpy sums 8 or more of a row pairwise when the row stands alone, one after the
    other among several rows): blocks of 8 give one block's bits also when 1 row is left over after
    the full blocks (that row goes with the block before it) or 2 are."""
    monkeypatch.setattr(months, "BLOCK_ROWS", 8)
    assert all(block.stop - block.start > 1 for block in months.row_blocks(n))
    assert [i for block in months.row_blocks(n) for i in range(block.start, block.stop)] == list(range(n))
    for seed in range(30):
        y = _answers(n, 12, seed=seed)
        monkeypatch.setattr(months, "BLOCK_ROWS", 8)
        blocks = deviation_variance(y, _noise)
        monkeypatch.setattr(months, "BLOCK_ROWS", n)
        assert deviation_variance(y, _noise).tobytes() == blocks.tobytes(), seed


def test_smoothed_months_on_threads_have_the_bits_of_one_thread(small_state, monkeypatch):
    plan = load_config("baseline").plan
    answers = {m: measure(small_state, plan, rng=np.random.default_rng(5)).for_attribute(m) for m in MONTHS}

    def smoothed(n_cpu: int) -> list[bytes]:
        monkeypatch.setattr(months, "usable_cpus", lambda: n_cpu)
        monkeypatch.setattr(months, "BLOCK_ROWS", 256)  # several blocks, on the threads at once
        out = smooth_months(answers, plan.psi)
        return [getattr(a, field).tobytes() for m in MONTHS for a in out[m] if a.query.is_identity
                for field in ("estimate", "variance", "variance_slope")]

    alone, together = smoothed(1), smoothed(2)
    assert together == alone
    assert len(alone) == 3 * len(MONTHS)
