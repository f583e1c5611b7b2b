"""The months of a quarter smoothed across each other (postprocessing of the identity answers).

An establishment's employment barely moves between the months of a quarter, while each month's
identity answer carries its own psi-mechanism noise (at the baseline plan, sd about sqrt(2x)). Each
establishment's month answers y_t (unbiased, noise variance v_t) are therefore replaced by the best
linear unbiased predictor of its months m_t under the model

    m_t = L + d_t,   d_t independent with mean 0 and variance tau^2,   L free (flat prior),

    L^ = sum_t y_t / V_t / sum_t 1 / V_t,   V_t = tau^2 + v_t,   k_t = tau^2 / V_t,
    m^_t = L^ + k_t (y_t - L^),
    E(m^_t - m_t)^2 = (1 - k_t)^2 / sum_s 1 / V_s + tau^2 v_t / V_t,

and the weighted least squares then weighs each m^_t by that mean squared error (the margins of
error follow). All of this runs on y_t / g_t (noise variance v_t / g_t^2) and is scaled back: g_t is
the month pattern of the establishment's statewide sector (PATTERN_GROUP; each month's sum over its
establishments over the months' mean sum), so the months are shrunk toward their sector's movement
within the quarter (construction hires in March), not toward flat months. A sector's pattern keeps
only the part of its deviation from the common pattern (all the answers') that is not noise
(``month_pattern``): shrunk toward the state's, New Jersey's statewide supersector and sector totals
of month 3 were covered by their 95% margins 70-80% of the time (20 releases); toward their
sector's, 90-91%. Without the public sector column the common pattern serves all.
The noise variances are the psi-mechanism's releasable variances at max(L0, 0), L0 the plain mean of
the answers, the same for each month of equal noise; tau^2 = c (max(L0, 0) + 1)^p is fitted by moments
(``deviation_variance``): with establishments in bands that double in size by one month's answer, the
other months' spread about their mean, less their noise variance at that mean, estimates the band's
mean tau^2 without bias (the noise variance formula is linear in x for sqrt; the band does not select
on the noise of the moment), and log tau^2 is fitted to log size over the bands with a positive
estimate, each weighted by its estimate's precision. It takes three months; with fewer the answers
are left as they are.

The stated MSE is evaluated at a level estimated from the same answers, so it is smallest exactly
where the noise pulled them down (at 1-10 employees, 95% intervals from it covered 91% of cells on
Rhode Island). Each smoothed answer therefore also carries how its MSE moves with the level
(``variance_slope``: d MSE / d level through the noise variances), from which the margins of error
take the half-width of the score interval (``postprocess.moe``).

Shrinking toward the sector's pattern g_t alone errs alike for every establishment of a county x
NAICS-6 cell (PATTERN_CELL) whose months move otherwise (a seasonal industry, a plant that hires
or lays off): by about -(1 - k_t) L^ (pi_t - g_t) each, pi the cell's own pattern, which added up
to a biased cell total (cells moving by a third or more from month 1 to 3 were covered by their 95%
margins 77-81% of the time, statewide industries moving by 10%+ 47-76%). So each cell's own
pattern is estimated by empirical Bayes (``cell_patterns``) and the months are shrunk toward
g_t (1 + delta^_t): the cell's month sums on the g scale give two contrasts (trend, curvature),
each the cell's true contrast plus noise of known variance; the true contrasts of the cells of a
size band follow a scale mixture of normals whose mixing weights are a nonparametric maximum
likelihood estimate on a grid of variances (an NPMLE by EM: Jiang and Zhang 2009; Koenker and
Mizera 2014), and a cell keeps
the posterior share of its contrasts: a cell whose answers clearly move keeps its movement, a noisy
one is pulled toward its sector. What remains uncertain about the cell's pattern is an error its
establishments share: its sd, the posterior sd plus an unbiased estimate of the cell's squared
shrinkage bias (so a cell that does move is not stated as sure as its neighbours that do not),
loads each smoothed answer by a_t = (1 - k_t) L^ g_t (1 + delta^_t) sd_t
(``NoisyAnswer.pattern_loading``), and the margins of error add the covariances a_i a_j of the
answers of one cell (``postprocess.moe``). tau^2 is fitted on the g scale (before the cell
patterns, which would take the answers' own noise with them in cells of one establishment). The
estimates and the loadings need the public cells (``month_answers`` with the public microdata).

Why this is postprocessing (no privacy cost): its inputs are released identity answers and their
public noise scales and public columns (the sectors and cells); every constant is fixed here. The
module also holds the ``pooled`` mode (``pool_month_variances``: each month weighted at the other
months' answers) and ``month_answers``, which turns a release's answers by its variance mode before
the least squares and the margins.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.measure.queries import group_establishments
from gedp.postprocess.attributes import MONTHS
from gedp.postprocess.cpus import usable_cpus

#: Variance modes that turn the months' identity answers before the least squares (``month_answers``).
MONTH_MODES = ("smoothed", "pooled")
#: The groups whose month pattern the months are shrunk toward (public columns): statewide sectors.
PATTERN_GROUP = ("state", "sector")
#: The cells whose establishments share a month pattern of their own (public columns).
PATTERN_CELL = ("state", "county", "naics")
#: Prior variances of a cell's relative month deviations: the support of their scale mixture's NPMLE.
DEVIATION_GRID = np.r_[0.0, np.geomspace(1e-5, 1.0, 21)]
#: Bounds of the cells' size bands (their mean month sum), each band's mixture fitted on its own.
CELL_BANDS = (10.0, 100.0, 1000.0)
#: A size band of fewer positive cells joins its neighbour.
MIN_BAND_CELLS = 200
#: EM steps of the mixture's weights, and the most cells they are fitted on (taken evenly).
EM_STEPS = 100
MAX_FIT_CELLS = 5_000
#: The smallest month pattern an establishment's answers are divided by.
PATTERN_FLOOR = 0.01

T = TypeVar("T")


#: Establishments per block of the months' per-establishment steps (``row_blocks``): a block's arrays
#: (1.5 MB each for three months) are memory the allocator reuses, where arrays of a whole state's
#: establishments x months (34 MB at 1.4 million) are fresh memory at every step, which the kernel
#: allocates and zeroes page by page.
BLOCK_ROWS = 1 << 16


def row_blocks(n: int) -> list[slice]:
    """Consecutive slices of BLOCK_ROWS of ``n`` rows, in order (none for 0), the last one shorter, or
    longer where it would hold one row only: a single row is both C- and Fortran-contiguous, and
    numpy sums 8 or more months of one row pairwise (``row_sums``), of several rows one after the
    other, so a row alone would not have the bits it has among others."""
    starts = list(range(0, n, BLOCK_ROWS))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(start, end) for start, end in zip(starts, [*starts[1:], n])]


def _rows(values: np.ndarray, rows: slice) -> np.ndarray:
    """The ``rows`` of an array of one row per establishment; one row shared by all (or a vector of
    months) as it is."""
    return values[rows] if values.ndim == 2 and len(values) > 1 else values


def row_sums(values: np.ndarray) -> np.ndarray:
    """``values.sum(axis=1)`` of a float array, bit for bit, several times faster for the few columns
    of months: numpy adds fewer than 8 terms of a row one after the other from 0, which adding the
    columns does too, without numpy's strided loop over each short row."""
    if values.shape[1] >= 8 or values.dtype.kind != "f":  # numpy sums 8 or more terms pairwise
        return values.sum(axis=1)
    total = np.zeros(len(values), dtype=values.dtype)
    for column in values.T:
        total += column
    return total


def row_means(values: np.ndarray) -> np.ndarray:
    """``values.mean(axis=1)`` of a float array, bit for bit (``row_sums`` over the number of columns)."""
    return row_sums(values) / values.shape[1]


def on_threads(tasks: Sequence[Callable[[], T]]) -> list[T]:
    """Each task's result, in order, the tasks run on as many threads as this process has processors
    (``gedp.postprocess.cpus.usable_cpus``): for tasks of large numpy steps (which release the GIL) that write
    disjoint parts of any array they share (e.g. their own rows). Each computes what it would alone
    (no random draws inside); the first exception, in the tasks' order, is raised here once all are
    done."""
    workers = min(len(tasks), usable_cpus())
    if workers <= 1:
        return [task() for task in tasks]
    with ThreadPoolExecutor(workers) as pool:
        done = [pool.submit(task) for task in tasks]
    return [future.result() for future in done]


def deviation_variance(y: np.ndarray, noise: Callable[[np.ndarray, list[int], slice], np.ndarray]) -> np.ndarray:
    """tau^2 per establishment: c (level+ + 1)^p fitted by moments over size bands (module docstring).
    ``y``: answers (establishments x months, at least 3); ``noise(x, months, rows)``: the noise
    variances of the establishments ``rows`` (a slice) in those months (a list of their columns) at
    levels ``x`` (a column, or one per month, with a row per establishment of ``rows``), linear in x
    for an unbiased moment. Each
    month t in turn sorts the establishments into bands by its answer y_t while the other months give
    the moment, so the band a establishment falls in is independent of the noise in its moment. 0
    everywhere when no band shows months that move more than their noise."""
    months = y.shape[1]
    # month t's moments in row t: concatenated over the months without copies (keys: y month by month)
    levels, excesses, spreads = (np.empty((months, len(y))) for _ in range(3))

    def moments(rows: slice) -> None:
        """Every month's moments of the establishments ``rows``, written there only (so blocks of
        establishments can run on threads at once)."""
        for t in range(months):
            other_months = [s for s in range(months) if s != t]
            others = y[rows, other_months]  # a copy: squared deviations in place
            mean = row_means(others)[:, None]
            others -= mean
            np.divide(row_sums(np.square(others, out=others)), months - 2, out=spreads[t, rows])
            levels[t, rows] = mean[:, 0]  # the band's size: the other months' mean (not selected on)
            np.subtract(spreads[t, rows], row_means(noise(mean, other_months, rows)), out=excesses[t, rows])

    on_threads([functools.partial(moments, rows) for rows in row_blocks(len(y))])
    fit = _power_law(y.T.ravel(), levels.ravel(), excesses.ravel(), np.square(spreads.ravel(), out=spreads.ravel()))
    return fit(row_means(y))


def _power_law(key: np.ndarray, size: np.ndarray, excess: np.ndarray,
               second_moment: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """level -> c (level+ + 1)^p fitted to the mean ``excess`` (an unbiased moment per unit) of bands
    of ``key`` that double in size, at each band's mean ``size``; each band weighted by its log
    estimate's precision (count x mean excess^2 / mean ``second_moment``). Bands with no positive
    excess are left out; one size only gives a constant; none gives 0."""
    band = _size_band(key)
    n_bands = int(band.max(initial=0)) + 1
    count = np.bincount(band, minlength=n_bands)
    seen = np.maximum(count, 1)
    mean_excess = np.bincount(band, excess, n_bands) / seen
    second = np.bincount(band, second_moment, n_bands) / seen
    log_size = np.log(_scale(np.bincount(band, size, n_bands) / seen))
    fitted = (count > 0) & (mean_excess > 0) & (second > 0)
    if not fitted.any():
        return np.zeros_like
    if np.ptp(log_size[fitted]) == 0:  # one size only (one band, or levels all at or below 0): no slope
        constant = mean_excess[fitted] @ count[fitted] / count[fitted].sum()
        return lambda level: np.full(np.shape(level), constant)
    # var(log estimate) ~ second moment / (count * estimate^2): weights are its inverse
    weight = count[fitted] * mean_excess[fitted] ** 2 / second[fitted]
    power, intercept = np.polyfit(log_size[fitted], np.log(mean_excess[fitted]), 1, w=np.sqrt(weight))
    return lambda level: np.exp(intercept) * _scale(level) ** power


def _scale(level: np.ndarray) -> np.ndarray:
    scale = np.maximum(level, 0.0)
    scale += 1.0
    return scale


def _size_band(level: np.ndarray) -> np.ndarray:
    """Bands that double in size: 0 for levels below 1, then [1, 3), [3, 7), ... (``row_blocks`` of
    them at a time)."""
    band = np.empty(len(level), dtype=np.int64)
    for rows in row_blocks(len(level)):
        band[rows] = np.log2(_scale(level[rows])).astype(np.int64)  # log2 >= 0: truncation is the floor
    return band


def blup(y: np.ndarray, v: np.ndarray, tau2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """m^_t and E(m^_t - m_t)^2 (module docstring) for answers ``y`` (establishments x months) of noise
    variances ``v`` and month deviations of variance ``tau2`` (establishments x 1)."""
    total = tau2 + v
    precision = row_sums(1.0 / total)[:, None]
    level = row_sums(y / total)[:, None] / precision
    k = tau2 / total
    smoothed = y - level
    smoothed *= k
    smoothed += level  # level + k (y - level)
    return smoothed, _blup_mse(v, tau2, total, precision, k)


def blup_mse(v: np.ndarray, tau2: np.ndarray) -> np.ndarray:
    """E(m^_t - m_t)^2 of ``blup`` alone (what does not need the answers)."""
    total = tau2 + v
    return _blup_mse(v, tau2, total, row_sums(1.0 / total)[:, None], tau2 / total)


def _blup_mse(v: np.ndarray, tau2: np.ndarray, total: np.ndarray, precision: np.ndarray,
              k: np.ndarray) -> np.ndarray:
    """(1 - k)^2 / precision + tau2 v / total, each operation in its order, in two fresh arrays."""
    mse = 1.0 - k
    np.square(mse, out=mse)
    mse /= precision
    shared = tau2 * v
    shared /= total
    mse += shared
    return mse


def month_identity_answers(answers_by_attribute: Mapping[str, Sequence[NoisyAnswer]]) -> dict[str, NoisyAnswer]:
    """Each month's identity answer (months without one left out), checked to be over the same
    establishments in the same order."""
    identity = {month: next((a for a in answers_by_attribute.get(month, []) if a.query.is_identity), None)
                for month in MONTHS}
    identity = {month: answer for month, answer in identity.items() if answer is not None}
    keys = next(iter(identity.values())).keys if identity else None
    if not all(answer.keys.equals(keys) for answer in identity.values()):
        raise ValueError("the months' identity answers are not over the same establishments in the same order")
    return identity


def cell_patterns(y: np.ndarray, noise_variance: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per establishment and month: its cell's own relative month deviation from the pattern of ``y``
    (empirical Bayes, module docstring) and the sd of its error. ``y``: answers on the group
    pattern's scale (establishments x months), ``noise_variance`` theirs, ``cells`` each
    establishment's cell. A cell's month sums S over their mean give its orthonormal polynomial
    contrasts z_k = q_k' S / level (``month_contrasts``: for three months the trend and the
    curvature), each with noise variance n = mean_t (noise of S_t) / level^2; each contrast's true
    values follow a scale mixture of normals whose weights are an NPMLE on DEVIATION_GRID fitted
    per size band of cells (``cell_bands``). The posterior keeps the share B_k of z_k (B_k the
    posterior mean of s^2 / (s^2 + n)); the error's variance in month t is
    sum_k q_kt^2 (B_k n + (E B_k^2 - B_k^2) z_k^2 + (1 - B_k)^2 max(z_k^2 - n, 0)): the posterior
    variance plus an unbiased estimate of the squared shrinkage bias of this cell, so a cell that
    moves otherwise than its neighbours states what the shrinkage may have cost it. Cells without a
    positive level keep nothing, with their band's prior variance."""
    contrasts = month_contrasts(y.shape[1])
    level, z, n = cell_contrasts(_month_sums(cells, y), _month_sums(cells, noise_variance), contrasts)
    positive = level > 0
    kept, variance = np.zeros_like(z), np.zeros_like(z)
    for band, mixtures in band_mixtures(level, z, n):
        fitted = band & positive
        for k, weights in enumerate(mixtures):
            zk, nk = z[fitted, k], n[fitted]
            share, share2 = posterior_shares(zk[:, None], nk, 1, weights)
            kept[fitted, k] = share * zk
            variance[fitted, k] = (share * nk + (share2 - share**2) * zk**2
                                   + (1.0 - share) ** 2 * np.maximum(zk**2 - nk, 0.0))
            variance[band & ~positive, k] = weights @ DEVIATION_GRID
    deviation, error = kept @ contrasts.T, variance @ (contrasts**2).T
    return _rows_of(deviation, cells), _rows_of(np.sqrt(np.maximum(error, 0.0)), cells)


def cell_contrasts(sums: np.ndarray, noise: np.ndarray, contrasts: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell of month ``sums`` (cells x months) with ``noise`` variances: its level (the sums' mean),
    its ``contrasts`` of the sums over the level (0 without a positive level) and their noise variance."""
    level = sums.mean(axis=1)
    positive = level > 0
    scale = np.where(positive, level, 1.0)
    z = (sums / scale[:, None]) @ contrasts
    z[~positive] = 0.0
    return level, z, noise.mean(axis=1) / scale**2


def band_mixtures(level: np.ndarray, z: np.ndarray, n: np.ndarray) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Per size band of cells (``cell_bands``): its mask and, per contrast, the NPMLE weights on
    DEVIATION_GRID of its true values (``_scale_mixture``, fitted on the band's cells of positive level)."""
    positive = level > 0
    return [(band, [_scale_mixture(z[band & positive, k][:, None], n[band & positive], 1) for k in range(z.shape[1])])
            for band in cell_bands(level, positive)]


def month_contrasts(months: int) -> np.ndarray:
    """Orthonormal polynomial contrasts of ``months`` months (months x months - 1): columns orthogonal
    to the constant and to each other, of degree 1, 2, ... (for three months the trend
    (-1, 0, 1) / sqrt 2 and the curvature (1, -2, 1) / sqrt 6, up to sign)."""
    basis, _ = np.linalg.qr(np.vander(np.arange(months, dtype=float), months, increasing=True))
    return basis[:, 1:]


def cell_bands(level: np.ndarray, positive: np.ndarray) -> list[np.ndarray]:
    """Masks of cells by size band (CELL_BANDS of their level; those without a positive level go
    with the smallest), a band of fewer than MIN_BAND_CELLS positive cells merged into the band
    below it (the smallest into the one above); none without a positive cell."""
    band = np.searchsorted(np.asarray(CELL_BANDS, dtype=float), np.where(positive, level, 0.0), side="right")
    counts = np.bincount(band[positive], minlength=len(CELL_BANDS) + 1)
    merged = np.arange(len(counts))
    for b in range(len(counts) - 1, 0, -1):  # small bands join the one below
        if counts[b] < MIN_BAND_CELLS:
            merged[merged == b] = merged[b - 1]
            counts[b - 1] += counts[b]
            counts[b] = 0
    if counts[0] < MIN_BAND_CELLS and len(np.unique(merged)) > 1:
        merged[merged == 0] = np.unique(merged)[1]
    return [merged[band] == b for b in np.unique(merged) if positive[merged[band] == b].any()]


def _scale_mixture(deviation: np.ndarray, noise: np.ndarray, dimensions: int) -> np.ndarray:
    """The NPMLE weights on DEVIATION_GRID of a scale mixture of N(0, s^2 I) observed with noise
    N(0, n I) in ``dimensions`` directions (EM, EM_STEPS steps, at most MAX_FIT_CELLS cells taken
    evenly)."""
    step = max(1, len(noise) // MAX_FIT_CELLS)
    likelihood = _likelihoods(deviation[::step], noise[::step], dimensions)
    weights = np.full(len(DEVIATION_GRID), 1.0 / len(DEVIATION_GRID))
    for _ in range(EM_STEPS):
        posterior = likelihood * weights
        posterior /= posterior.sum(axis=1, keepdims=True)
        weights = posterior.mean(axis=0)
    return weights


def _likelihoods(deviation: np.ndarray, noise: np.ndarray, dimensions: int) -> np.ndarray:
    """Each cell's likelihood under each grid variance (cells x grid), up to a factor per cell: the
    centred deviations' sum of squares is the contrasts' (orthonormal) squared norm."""
    total = DEVIATION_GRID[None, :] + noise[:, None]
    log = -0.5 * dimensions * np.log(total) - 0.5 * np.square(deviation).sum(axis=1)[:, None] / total
    return np.exp(log - log.max(axis=1, keepdims=True))


def posterior_shares(deviation: np.ndarray, noise: np.ndarray, dimensions: int,
                      weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cell: the posterior means of B = s^2 / (s^2 + n) and of B^2 under the mixture ``weights``."""
    posterior = _likelihoods(deviation, noise, dimensions) * weights
    posterior /= posterior.sum(axis=1, keepdims=True)
    total = DEVIATION_GRID[None, :] + noise[:, None]
    share = np.divide(DEVIATION_GRID[None, :], total, out=np.ones_like(total), where=total > 0)
    return (posterior * share).sum(axis=1), (posterior * share**2).sum(axis=1)


def month_pattern(y: np.ndarray, noise_variance: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """Per establishment and month (or per month, without ``groups``): the month pattern its answers
    are shrunk toward (module docstring). ``y``: answers (establishments x months), ``noise_variance``
    their noise variances, ``groups`` each establishment's PATTERN_GROUP. The common pattern g_t is
    each month's sum over the months' mean sum; a group's own, h_gt, likewise over its establishments,
    kept in the share max(0, 1 - (T - 1) n_g / sum_t (h_gt - g_t)^2) of its deviation from g_t (T
    months; n_g the noise variance of its month sums over their mean squared, averaged over the
    months): the share of that deviation that is not noise, estimated per group (sectors' patterns
    are far from normal around the common one: most move with it, a few seasonal ones do not)."""
    totals = _column_sums_in_row_order(y)
    common = _pattern(totals, totals.mean())
    if groups is None:
        return common
    sums, months = _month_sums(groups, y), y.shape[1]
    mean = sums.mean(axis=1, keepdims=True)
    noise = _month_sums(groups, noise_variance).mean(axis=1)
    noise = np.divide(noise, mean[:, 0] ** 2, out=np.full(len(noise), np.inf), where=mean[:, 0] > 0)
    deviation = _pattern(sums, mean) - common
    spread = (deviation**2).sum(axis=1)
    keep = np.maximum(1.0 - np.divide((months - 1) * noise, spread, out=np.ones(len(spread)), where=spread > 0), 0.0)
    return _rows_of(common + keep[:, None] * deviation, groups)


def _column_sums_in_row_order(values: np.ndarray) -> np.ndarray:
    """``values.sum(axis=0)`` of a C-ordered array (each column added row after row) for any layout."""
    return np.array([np.add.accumulate(column)[-1] if len(column) else 0.0 for column in values.T])


def _rows_of(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``table[codes]`` (groups x months -> establishments x months) laid out month by month (Fortran
    order), so that arithmetic with the other month arrays runs along the establishments."""
    return np.take(table.T, codes, axis=1).T


def _pattern(sums: np.ndarray, mean: np.ndarray | float) -> np.ndarray:
    """Month sums over their mean (1 where a sum or the mean is not positive)."""
    mean = np.asarray(mean)
    return np.where((sums > 0) & (mean > 0), sums / np.where(mean > 0, mean, 1.0), 1.0)


def _month_sums(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each group's sums of ``values`` (establishments x months): groups x months."""
    n_groups = int(codes.max(initial=-1)) + 1
    return np.column_stack([np.bincount(codes, values[:, t], n_groups) for t in range(values.shape[1])])


def pattern_cells(public: pd.DataFrame, estab_ids: pd.Series | None = None,
                  columns: Sequence[str] = PATTERN_CELL) -> np.ndarray | None:
    """Each establishment's group of ``columns`` (PATTERN_CELL: its cell), in ``public``'s row order
    or, given ``estab_ids`` (an identity answer's keys), in theirs; None when ``public`` lacks them."""
    if not set(columns) <= set(public.columns):
        return None
    return group_establishments(_in_order(public, estab_ids), list(columns)).codes


def _in_order(public: pd.DataFrame, estab_ids: pd.Series | None) -> pd.DataFrame:
    """``public``'s rows in the order of ``estab_ids`` (an identity answer's keys; None: as they are)."""
    if estab_ids is None or public["estab_id"].equals(estab_ids):
        return public
    position = pd.Index(public["estab_id"]).get_indexer(estab_ids)
    if (position < 0).any():
        raise InputError("the months' identity answers hold establishments that the public microdata does not")
    return public.iloc[position]


def smooth_months(answers_by_attribute: Mapping[str, Sequence[NoisyAnswer]], psi: NeighborFunction,
                  cells: np.ndarray | None = None, groups: np.ndarray | None = None, *,
                  loadings: bool = True) -> dict[str, list[NoisyAnswer]]:
    """The answers with the months' identity answers smoothed across the months (module docstring):
    estimates m^_t, variances their mean squared errors; with ``groups`` (each identity answer's
    PATTERN_GROUP) shrunk toward their group's month pattern, else toward the common one; with
    ``cells`` (each identity answer's PATTERN_CELL, ``pattern_cells``) toward that pattern moved by
    their cell's own movement as far as its answers show it (``cell_patterns``) and, with
    ``loadings``, with the sd of the error shared within each cell (``NoisyAnswer.pattern_loading``).
    Fewer than three months with identity answers, other attributes and other queries are returned
    as they are."""
    identity = month_identity_answers(answers_by_attribute)
    out = {attribute: list(answers) for attribute, answers in answers_by_attribute.items()}
    if len(identity) < 3:
        return out
    # establishments x months, month by month in memory (Fortran order): every elementwise step below
    # then runs along the establishments, also where a per-establishment column broadcasts over months
    y = np.array([answer.estimate for answer in identity.values()], dtype=float).T
    sd = _month_sds([answer.sd for answer in identity.values()], len(y))
    # the months' movement, from the sums of the answers: smoothing works on y_t / g_t
    pattern = group_pattern(y, sd, psi, groups)
    scaled, pattern2 = y / pattern, pattern**2

    def noise(variance: Callable[[np.ndarray, np.ndarray], np.ndarray], level: np.ndarray,
              months: list[int] | slice, rows: slice) -> np.ndarray:
        """The months' noise variances (all months, or those) of the establishments ``rows`` at their
        ``level``, on the pattern's scale."""
        return (variance(level * _rows(pattern, rows)[..., months], _rows(sd, rows)[:, months])
                / _rows(pattern2, rows)[..., months])

    # tau^2 on the group pattern's scale: a cell pattern taken from the answers would take their noise with it
    tau2 = deviation_variance(scaled, lambda x, months, rows: noise(psi.estimate_variance, x, months, rows))[:, None]
    cell_sd = None
    if cells is not None:  # each cell's own movement, as far as its answers show it (empirical Bayes)
        pattern, cell_sd = with_cell_pattern(y, sd, psi, pattern, cells)
        scaled, pattern2 = y / pattern, pattern**2
    smoothed, mse, slope = (np.empty(y.shape, order="F") for _ in range(3))
    shrunk = np.empty(y.shape, order="F") if cell_sd is not None and loadings else None

    def smooth(rows: slice) -> None:
        """m^_t, its mse and the mse's slope of the establishments ``rows`` (so blocks of
        establishments can run on threads at once)."""
        block, deviation = scaled[rows], tau2[rows]
        at = np.maximum(row_means(block), 0.0)[:, None]
        v = noise(psi.releasable_variance, at, slice(None), rows)
        # d mse / d level through the noise variances (forward difference; exact for sqrt's linear v)
        step = 1e-3 * (1.0 + at)
        smoothed_rows, mse_rows = blup(block, v, deviation)
        slope_rows = blup_mse(noise(psi.releasable_variance, at + step, slice(None), rows), deviation)
        slope_rows -= mse_rows
        slope_rows /= step
        slope_rows *= _rows(pattern, rows)
        if shrunk is not None:  # (1 - k_t) L^: what a cell's pattern moves m^_t by
            shrunk[rows] = np.maximum(smoothed_rows - deviation / (deviation + v) * block, 0.0)
        smoothed_rows *= _rows(pattern, rows)
        mse_rows *= _rows(pattern2, rows)
        smoothed[rows], mse[rows], slope[rows] = smoothed_rows, mse_rows, slope_rows

    on_threads([functools.partial(smooth, rows) for rows in row_blocks(len(y))])
    loading = None
    if shrunk is not None and cell_sd is not None:  # per unit of relative pattern, times its posterior sd
        loading = shrunk * pattern * cell_sd
    for t, (month, answer) in enumerate(identity.items()):
        replaced = dataclasses.replace(answer, estimate=smoothed[:, t], variance=mse[:, t],
                                       variance_slope=slope[:, t],
                                       pattern_loading=None if loading is None else loading[:, t])
        out[month] = [replaced if a is answer else a for a in out[month]]
    return out


def group_pattern(y: np.ndarray, sd: np.ndarray, psi: NeighborFunction, groups: np.ndarray | None) -> np.ndarray:
    """The month pattern of each establishment's group (``month_pattern``) from the answers ``y``
    (establishments x months) of noise sds ``sd`` (``_month_sds``), their noise at the answers' mean."""
    return month_pattern(y, psi.estimate_variance(np.broadcast_to(np.maximum(row_means(y)[:, None], 0.0), y.shape),
                                                  sd), groups)


def with_cell_pattern(y: np.ndarray, sd: np.ndarray, psi: NeighborFunction, pattern: np.ndarray,
                      cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The group ``pattern`` moved by each establishment's cell's own movement as far as its answers show
    it (``cell_patterns`` on y / pattern, the noise at each establishment's mean there), floored at
    PATTERN_FLOOR, and the sd of that movement's error (per establishment and month)."""
    scaled = y / pattern
    at = np.maximum(row_means(scaled), 0.0)[:, None]
    own, cell_sd = cell_patterns(scaled, psi.estimate_variance(at * pattern, sd) / pattern**2, cells)
    return pattern * np.maximum(1.0 + own, PATTERN_FLOOR), cell_sd


def _month_sds(sds: Sequence[np.ndarray | float], n: int) -> np.ndarray:
    """The months' noise sds (each a number or one per establishment) as establishments x months:
    one row when every month's sd is one number (so the variances broadcast it), else a row for each
    establishment, month by month in memory (Fortran order)."""
    if n > 0 and all(np.all(np.asarray(sd) == np.ravel(sd)[0]) for sd in sds):
        return np.array([[np.ravel(sd)[0] for sd in sds]], dtype=float)
    return np.array([np.broadcast_to(sd, n) for sd in sds], dtype=float).T


def pool_month_variances(measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]],
                         psi: NeighborFunction) -> dict[str, list[NoisyAnswer]]:
    """The answers with each month's identity variances evaluated at the mean of the establishment's
    other months' identity estimates (floored at 0), not at the month's own estimate.

    The releasable variance at a month's own estimate grows with that answer's noise, so weighting by
    it pulls totals down (the E3 effect); the other months' answers carry independent noise, so
    weights taken from them are independent of the answer weighted. Postprocessing: released values
    only. Months without identity answers, and other attributes, are returned as they are.
    """
    identity = month_identity_answers(measurements_by_attribute)
    out = {attribute: list(answers) for attribute, answers in measurements_by_attribute.items()}
    if len(identity) < 2:
        return out
    for month, answer in identity.items():
        others = np.mean([other.estimate for name, other in identity.items() if name != month], axis=0)
        pooled = dataclasses.replace(answer, variance=psi.releasable_variance(np.maximum(others, 0.0), answer.sd))
        out[month] = [pooled if a is answer else a for a in out[month]]
    return out


def month_answers(measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]], variance_mode: str,
                  psi: NeighborFunction | None, public: pd.DataFrame | None = None, *,
                  loadings: bool = True) -> dict[str, list[NoisyAnswer]]:
    """The answers as the least squares of ``variance_mode`` weighs them: the months' identity answers
    smoothed across the months (``smoothed``: ``postprocess.months``; with ``public``, the release's
    public microdata, toward their PATTERN_GROUP's month pattern and, with ``loadings``, with their
    errors shared within PATTERN_CELL cells, which only the margins of error need) or weighted at the
    other months (``pooled``); as they are otherwise."""
    if variance_mode not in MONTH_MODES:
        return {attribute: list(answers) for attribute, answers in measurements_by_attribute.items()}
    if psi is None:
        raise ValueError(f"variance mode '{variance_mode}' needs the plan's psi")
    if variance_mode == "pooled":
        return pool_month_variances(measurements_by_attribute, psi)
    identity = month_identity_answers(measurements_by_attribute)
    keys = next(iter(identity.values())).keys if identity else None
    if public is None or keys is None:
        return smooth_months(measurements_by_attribute, psi)
    public = _in_order(public, keys["estab_id"])  # once, for both groupings
    return smooth_months(measurements_by_attribute, psi, pattern_cells(public),
                         pattern_cells(public, columns=PATTERN_GROUP), loadings=loadings)
