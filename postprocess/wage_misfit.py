"""What the wage model's misfit adds to a tabulation cell's squared error, estimated from the release.

The wage fit shrinks each industry's wage per employee toward its parent's rate and each cell toward
its prior (``postprocess.wages``). Its stated variance V of a tabulation total is the posterior
variance of a normal model: right on average over the cells, but a cell whose industry pays far
above (or below) its parent's rate carries a shrinkage bias the normal prior does not state, and
its margin misses (at a small wage share, where the estimate is mostly the prior).

Where the release holds a direct measurement of the cell, the bias can be estimated cell by cell.
Let B be an unbiased measurement of the cell's true total T made of the plan's pnc group answers
(the groups of one query that tile the cell, summed; several queries' sums combined by inverse
variance), N its exact noise variance, and T^ the release's estimate. When the fit weighs those
answers at their exact variances (it does: pnc variances are public and exact), the covariance of
B's noise with T^'s error is V, whatever the priors' errors, so

    m = (B - T^)^2 - N + 2 V

is unbiased for T^'s mean squared error given the truth (the conditional MSE of a shrinkage
estimator; in the one-prior case m = k^2 N + (B - T^)^2 - (1 - k)^2 N with k = V / N, the squared
bias estimated by (B - T^)^2 less its noise). Under the model B - T^ has variance N - V and is
uncorrelated with T^'s error.

The margin takes max(V, m) where the direct measurement carries at least ``least_weight`` of the
cell (k = V / N >= least_weight) and V elsewhere: where k is small, m is mostly B's noise (its sd
about sqrt(2) N, far above V) and the estimate's error is mostly the prior's, which V states. A
function of the release's answers and protected wages only (postprocessing).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import Groupings

#: The least share k = V / N of a cell's direct measurement in its estimate for the misfit term to
#: apply (module docstring); chosen on Rhode Island's synthesized state under `baseline`.
LEAST_WEIGHT = 0.1


def direct_measurements(answers: Sequence[NoisyAnswer], groupings: Groupings, tab_codes: np.ndarray, n_tab: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Per tabulation cell (``tab_codes`` per establishment, -1: not tabulated): the inverse-variance
    combination B of the sums of every pnc group answer whose groups tile the cell exactly, and its
    noise variance N (inf: no query tiles it; 0: an exact answer does, and B is that answer)."""
    inside = tab_codes >= 0
    counts = np.bincount(tab_codes[inside], minlength=n_tab)
    precision, weighted = np.zeros(n_tab), np.zeros(n_tab)
    exact = np.zeros(n_tab, dtype=bool)
    exact_value = np.zeros(n_tab)
    for answer in answers:
        if answer.mechanism != "pnc" or answer.query.is_identity:
            continue
        codes = groupings(answer.query.by).codes
        n_groups = len(answer.estimate)
        low = np.full(n_groups, np.iinfo(np.int64).max)
        high = np.full(n_groups, -1, dtype=np.int64)
        np.minimum.at(low, codes, tab_codes)
        np.maximum.at(high, codes, tab_codes)
        whole = (low == high) & (low >= 0)  # a group inside one tabulation cell
        tiled = (np.bincount(tab_codes[inside], weights=whole[codes[inside]].astype(float), minlength=n_tab)
                 == counts) & (counts > 0)
        owner = np.where(whole, low, 0)
        total = np.bincount(owner[whole], weights=answer.estimate[whole], minlength=n_tab)
        noise = np.bincount(owner[whole], weights=np.asarray(answer.variance, dtype=float)[whole], minlength=n_tab)
        pinned = tiled & (noise <= 0)
        exact_value = np.where(pinned & ~exact, total, exact_value)
        exact |= pinned
        use = tiled & (noise > 0)
        precision[use] += 1.0 / noise[use]
        weighted[use] += total[use] / noise[use]
    direct = np.divide(weighted, precision, out=np.zeros(n_tab), where=precision > 0)
    variance = np.divide(1.0, precision, out=np.full(n_tab, np.inf), where=precision > 0)
    return np.where(exact, exact_value, direct), np.where(exact, 0.0, variance)


def misfit_variances(estimate: np.ndarray, stated: np.ndarray, direct: np.ndarray, noise: np.ndarray,
                     least_weight: float = LEAST_WEIGHT, covariance: np.ndarray | None = None) -> np.ndarray:
    """Per cell, the variance its margin states: max(V, m), m = (B - T^)^2 - N + 2 C (module
    docstring; C the covariance of B's noise with T^'s error, ``covariance``, V when not given), where
    a direct measurement (B, N) carries at least ``least_weight`` of the cell (V >= least_weight x N,
    N finite and positive); V elsewhere."""
    applies = np.isfinite(noise) & (noise > 0) & (stated >= least_weight * np.where(np.isfinite(noise), noise, 0.0))
    moment = misfit_moment(estimate, stated if covariance is None else covariance,
                           np.where(applies, direct, estimate), np.where(applies, noise, 0.0))
    return np.where(applies, np.maximum(stated, moment), stated)


def misfit_moment(estimate: np.ndarray, covariance: np.ndarray, direct: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """m = (B - T^)^2 - N + 2 C per cell: unbiased for T^'s mean squared error given the truth when B
    (variance N) is an unbiased measurement of the cell and C the covariance of its noise with T^'s
    error (V when the fit weighs B at N and V is the fit's own variance: module docstring)."""
    return (direct - estimate) ** 2 - noise + 2 * covariance
