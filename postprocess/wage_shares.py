"""Step 4 of the wage fit (``postprocess.wages``): each cell's total shared among its establishments,
the least squares of their share measurements with the shares nonnegative and adding up to the cell's
total, by bisection on each cell's multiplier (the cells that stopped moving dropped as it goes), then
exactly on the final free set."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

#: Bisection steps of the shares (then solved exactly on the final free set).
SHARE_STEPS = 100
#: Steps between the checks for cells whose free set is settled (a check costs about two steps; at
#: 1.4M establishments every cell had stopped after 28 steps rather than 75).
SETTLE_EVERY = 4
#: Brackets with an end beyond this are bisected to the end, as before the check existed.
MAX_SETTLED = 2.0**1022
#: The bisection drops the establishments of cells that stopped moving once they are this share of
#: those it sums (each drop copies the rest: dropping a few at every step costs more than summing them).
COMPACT_SHARE = 0.5


def share_cells(totals: np.ndarray, cell_codes: np.ndarray, target: np.ndarray, variance: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """x = argmin sum_j (x_j - target_j)^2 / variance_j over x >= 0 with every cell adding up to its total.

    x_j = max(0, target_j + variance_j lambda_c); lambda_c by bisection per cell, then exactly on the
    final free set. Returns x and the free set (x_j > 0 or in a cell of positive total).

    A cell whose bracket a step left unchanged would stay unchanged (each step is a function of the
    cell's own bracket), and a cell whose free set is the same at both ends of its bracket has the
    free set it would end with (``_free_set_settled``, checked every SETTLE_EVERY steps): either
    stops, so later steps sum only over the establishments of cells still moving: the
    stopped cells' establishments are dropped once they are at least COMPACT_SHARE of those summed
    (their sums meanwhile are not used). The establishments are grouped by cell once (in their order
    within a cell), so each step's sums are ``_run_sums`` of contiguous runs: the same sums, in the
    same order, as ``np.bincount``.
    """
    n_cells = len(totals)
    order = np.argsort(cell_codes, kind="stable")  # each cell's establishments together, in their order
    counts = np.bincount(cell_codes, minlength=n_cells)  # the moving cells' establishments (0: stopped)
    moving_target, moving_variance = target[order], variance[order]  # of the moving cells' establishments
    low, high = _run_extremes(-moving_target / moving_variance, counts)  # x_j > 0 exactly when lambda > -t_j / v_j
    spare = totals - np.bincount(cell_codes, weights=target, minlength=n_cells)
    summed = np.bincount(cell_codes, weights=variance, minlength=n_cells)
    high = np.maximum(high, np.divide(spare, summed, out=np.zeros(n_cells), where=summed > 0))
    low = np.minimum(low, high)
    moving = np.ones(n_cells, dtype=bool)
    sums = _run_sums(counts)
    for step in range(1, SHARE_STEPS + 1):
        if step % SETTLE_EVERY == 0:
            moving &= ~_free_set_settled(low, high, counts, moving_target, moving_variance, sums)
        middle = (low + high) / 2
        x = _shifted(middle, counts, moving_target, moving_variance)
        shared = sums @ np.maximum(x, 0.0, out=x)  # the cells' sums of max(target + variance * middle, 0)
        above = shared > totals
        new_high, new_low = np.where(moving & above, middle, high), np.where(moving & ~above, middle, low)
        moving = (new_high != high) | (new_low != low)  # NaN brackets keep moving
        high, low = new_high, new_low
        if not moving.any():
            break
        if counts[~moving].sum() >= COMPACT_SHARE * len(moving_target):
            keep = np.repeat(moving, counts)
            moving_target, moving_variance = moving_target[keep], moving_variance[keep]
            counts = np.where(moving, counts, 0)
            sums = _run_sums(counts)
    free = (target + variance * high[cell_codes] > 0) & (totals[cell_codes] > 0)
    free_variance = np.bincount(cell_codes, weights=np.where(free, variance, 0.0), minlength=n_cells)
    free_target = np.bincount(cell_codes, weights=np.where(free, target, 0.0), minlength=n_cells)
    lam = np.divide(totals - free_target, free_variance, out=np.zeros(n_cells), where=free_variance > 0)
    return np.where(free, np.maximum(target + variance * lam[cell_codes], 0.0), 0.0), free


def _shifted(multipliers: np.ndarray, counts: np.ndarray, target: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """target + variance * the multiplier of each establishment's run (of ``counts``), in a new array."""
    values = np.repeat(multipliers, counts)
    values *= variance
    values += target
    return values


def _free_set_settled(low: np.ndarray, high: np.ndarray, counts: np.ndarray, target: np.ndarray,
                      variance: np.ndarray, sums: sp.csr_matrix) -> np.ndarray:
    """The cells (runs of ``counts`` establishments) in which no establishment's target + variance *
    lambda, computed as ``share_cells`` computes it, is <= 0 at ``low`` and > 0 at ``high``. In floating
    point as in exact numbers that value does not decrease as lambda grows (a product and a sum,
    each rounded monotonically), so every lambda of the bracket, the last bisection step's among
    them, gives such a cell the same free set. A bracket with an end beyond MAX_SETTLED (where the
    bisection's middle could overflow and leave it), infinite or NaN is not settled."""
    changing = (_shifted(high, counts, target, variance) > 0) & ~(_shifted(low, counts, target, variance) > 0)
    bounded = (np.abs(low) <= MAX_SETTLED) & (np.abs(high) <= MAX_SETTLED)  # (low + high) / 2 stays inside
    return (sums @ changing.astype(float) == 0) & bounded & (counts > 0)


def _run_extremes(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least and greatest of each of the contiguous runs of ``counts`` values (inf and -inf for an
    empty run): what ``np.minimum.at`` and ``np.maximum.at`` give by each value's run, without their
    per-value dispatch."""
    low, high = np.full(len(counts), np.inf), np.full(len(counts), -np.inf)
    filled = counts > 0
    if filled.any():
        starts = (np.cumsum(counts) - counts)[filled]
        low[filled], high[filled] = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
    return low, high


def _run_sums(counts: np.ndarray) -> sp.csr_matrix:
    """The cells x establishments matrix of ones summing contiguous runs of ``counts`` establishments:
    its product adds each run's values in order from 0 (the sparse product's row loop), the bits of
    ``np.bincount`` of the same values and their cells."""
    n = int(counts.sum())
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((np.ones(n), np.arange(n), indptr), shape=(len(counts), n))
