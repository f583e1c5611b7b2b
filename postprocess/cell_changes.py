"""The change each establishment's cell's month pattern implies: the implicates' change priors' offset.

The point release smooths each establishment's months toward its sector's month pattern g_t moved by
its county x NAICS-6 cell's own movement as far as the cell's answers show it (``postprocess.months``,
"Cells that move": the cell's trend and curvature contrasts shrunk by empirical Bayes). The implicates'
change priors are one per size band, statewide, with an atom at no change; an establishment of a cell
that clearly moves is drawn from them toward no change. With ``postprocess.implicates.CELL_CHANGES``
its changes from month 1 are delta_k = b_k + eps_k, eps_k from its band's prior (its atom: "moves with
its cell"), b_k the change in psi scale its cell's pattern p_t implies at its level L:

    b_k = psi(L p_k) - psi(L p_1),   L = psi^-1(mean_t omega_t) / mean_t p_t,

p_t = g_t (1 + d_t), d_t its cell's relative deviation estimated from the cell's OTHER establishments'
answers (``others_deviation``: the release's posterior mean with the establishment's own answers left
out, under the band mixtures the release fits on whole cells). Left out, b is independent of the
establishment's own answers' noise given the others' (the mean of its three answers, which sets L,
is independent of their differences when the months' sds are equal), so the band priors fitted on the
answers' differences less b deconvolve the same noise as before; with its own answers in, a cell of
one establishment would take its own noise into its prior. Everything here is a function of the
release's identity answers, their public sds and public columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.special import log_ndtr, logsumexp

from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.change_scale import ScaledFit, scaled_fit_arguments
from gedp.postprocess.deconvolve import BINS_PER_SD, Likelihood, Mixture, MixtureFit, binned, draw_posterior
from gedp.postprocess.months import (
    PATTERN_FLOOR,
    _month_sums,
    band_mixtures,
    cell_contrasts,
    group_pattern,
    month_contrasts,
    posterior_shares,
    row_means,
)
from gedp.postprocess.prior_components import change_fit

if TYPE_CHECKING:
    from gedp.postprocess.implicates import StateAnswers


def others_deviation(y: np.ndarray, noise_variance: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Per establishment and month: its cell's relative month deviation (``months.cell_patterns``' posterior
    mean d_t) from the answers ``y`` (establishments x months, on the group pattern's scale) of the cell's
    other establishments; the band mixtures fitted on whole cells (as the release fits them), the band the
    cell's. 0 for an establishment alone in its cell or whose others' level is not positive."""
    contrasts = month_contrasts(y.shape[1])
    sums, noise = _month_sums(cells, y), _month_sums(cells, noise_variance)
    level, z, n = cell_contrasts(sums, noise, contrasts)
    alone = np.bincount(cells)[cells] < 2
    others_level, others_z, others_n = cell_contrasts(sums[cells] - y, noise[cells] - noise_variance, contrasts)
    kept = np.zeros_like(others_z)
    for band, mixtures in band_mixtures(level, z, n):
        rows = band[cells] & ~alone & (others_level > 0)
        for k, weights in enumerate(mixtures):
            share = posterior_shares(others_z[rows, k][:, None], others_n[rows], 1, weights)[0]
            kept[rows, k] = share * others_z[rows, k]
    return kept @ contrasts.T


def change_offsets(omega: np.ndarray, month_sd: np.ndarray, psi: NeighborFunction, sectors: np.ndarray,
                   cells: np.ndarray) -> np.ndarray:
    """b (establishments x 2, psi scale): the changes from month 1 to months 2 and 3 that each
    establishment's cell's month pattern implies at its level (module docstring). ``omega``: the months'
    identity answers in psi scale (establishments x 3), ``month_sd`` their sds, ``sectors`` and ``cells``
    integer codes of the establishments' statewide sectors and county x NAICS-6 cells."""
    sd = np.asarray(month_sd, dtype=float).reshape(1, -1)
    y = np.asfortranarray(psi.unbiased_estimate(omega, sd))
    pattern = np.broadcast_to(group_pattern(y, sd, psi, sectors), y.shape)
    scaled = y / pattern
    at = np.maximum(row_means(scaled), 0.0)[:, None]
    deviation = others_deviation(scaled, psi.estimate_variance(at * pattern, sd) / pattern**2, cells)
    pattern = pattern * np.maximum(1.0 + deviation, PATTERN_FLOOR)
    level = psi.inverse(omega.mean(axis=1)) / pattern.mean(axis=1)
    theta = psi(level[:, None] * pattern)
    return theta[:, 1:] - theta[:, :1]


#: How the offsets enter a change prior (``postprocess.implicates.CELL_CHANGES``): "" not at all; "all": the
#: whole prior moved by b (its atom: "moves with its cell"); "changers": its continuous part moved by b,
#: its atom kept at no change (an establishment keeps its headcount, or changes around its cell's movement);
#: "fitted": the whole prior moved by beta b, beta fitted per change band (``band_slopes``).
CELL_CHANGE_MODES = ("", "all", "changers", "fitted")


def band_slopes(difference: np.ndarray, offset: np.ndarray, band: np.ndarray, cells: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per change band (``band``: each establishment's, 0..): beta, the least-squares slope of the answers'
    differences (establishments x changes, omega_k - omega_1) on the offsets b (same shape) with an intercept
    per change, and its standard error clustered by ``cells`` (an establishment's offset holds its cell's others'
    noise, theirs its own). The model is delta_k = beta b_k + eps_k with eps independent of b; the difference is
    delta_k plus noise independent of b (b is from the cell's other establishments, the establishment's own
    level from the mean of its answers), so the slope is unbiased for beta given b. 0 (standard error inf) in a
    band whose offsets do not vary."""
    n_bands = int(band.max(initial=-1)) + 1
    beta, se = np.zeros(n_bands), np.full(n_bands, np.inf)
    for b in range(n_bands):
        rows = band == b
        x = offset[rows] - offset[rows].mean(axis=0)
        y = difference[rows] - difference[rows].mean(axis=0)
        sxx = float((x * x).sum())
        if sxx <= 0.0:
            continue
        beta[b] = float((x * y).sum()) / sxx
        score = np.bincount(cells[rows], weights=(x * (y - beta[b] * x)).sum(axis=1))
        se[b] = float(np.sqrt((score * score).sum())) / sxx
    return beta, se


def is_atom(prior: Mixture) -> np.ndarray:
    """Which components of a change prior are its atom at no change."""
    return (prior.sds == 0) & (prior.means == 0)


class ChangersFit(MixtureFit):
    """A change prior's fit with the changers' components moved by each answer's offset ("changers"): the
    answers are rows (difference of the answers, offset b), binned on both; the atom's likelihood is at
    the difference, each other component's at the difference less b."""

    @classmethod
    def of(cls, observed: np.ndarray, sd: float, means: np.ndarray, sds: np.ndarray,
           basis: bool = False) -> ChangersFit:
        centers, counts = binned(np.asarray(observed, dtype=float), sd / BINS_PER_SD)
        atom = (sds == 0) & (means == 0)
        spread = np.sqrt(sds**2 + sd * sd)
        residual = centers[:, :1] - np.where(atom, 0.0, 1.0)[None, :] * centers[:, 1:]
        likelihood = np.exp(-0.5 * ((residual - means[None, :]) / spread) ** 2) / spread
        return cls(means, sds, counts, Likelihood.of(likelihood, basis=basis))


def change_fit_arguments(difference: np.ndarray, offset: np.ndarray, sd: float, step: float, mode: str,
                         scale: np.ndarray | None = None) -> tuple:
    """A change prior's fit arguments for ``fit_kind(mode)``: the differences less the offsets with their sd and
    components (``change_fit``), with "changers" the rows (difference, offset) instead; with each row's ``scale``
    (``change_scale``, no offsets), ``scaled_fit_arguments``."""
    if scale is not None:
        return scaled_fit_arguments(difference, scale, sd, step)
    arguments = change_fit(difference - offset, sd, step)
    return arguments if mode != "changers" else (np.column_stack([difference, offset]), *arguments[1:])


def fit_kind(mode: str, scaled: bool = False) -> type[MixtureFit]:
    """The change priors' fit of a CELL_CHANGE_MODES ``mode`` (``scaled``: ScaledFit, ``change_scale``)."""
    return ScaledFit if scaled else ChangersFit if mode == "changers" else MixtureFit


def moved_draws(prior: Mixture, center: np.ndarray, spread: np.ndarray, lower: np.ndarray, offset: np.ndarray,
                rng: np.random.Generator, mode: str) -> np.ndarray:
    """Exact draws of a change whose likelihood is N(center, spread^2), bounded below by ``lower``, under
    ``prior`` moved by ``offset`` (``mode`` "changers": its atom kept at 0, drawn with its posterior
    probability, else the moved continuous part's posterior; otherwise the whole prior moved)."""
    atom = is_atom(prior)
    if mode != "changers" or not atom.any() or atom.all():
        return draw_posterior(center - offset, spread, prior, lower - offset, rng) + offset
    changers = Mixture(prior.means[~atom], prior.sds[~atom], prior.weights[~atom] / prior.weights[~atom].sum())
    total = changers.sds[None, :] ** 2 + spread[:, None] ** 2
    residual = (center - offset)[:, None]
    mean = (changers.means[None, :] * spread[:, None] ** 2 + residual * changers.sds[None, :] ** 2) / total
    sd = changers.sds[None, :] * spread[:, None] / np.sqrt(total)
    log_changers = logsumexp(np.log(changers.weights)[None, :] - 0.5 * (residual - changers.means) ** 2 / total
                             - 0.5 * np.log(total) + log_ndtr((mean - (lower - offset)[:, None]) / sd), axis=1)
    with np.errstate(divide="ignore"):
        log_atom = np.where(lower <= 0.0, np.log(prior.weights[atom].sum()) - 0.5 * (center / spread) ** 2
                            - np.log(spread), -np.inf)
    stays = rng.random(len(center)) < np.exp(log_atom - np.logaddexp(log_atom, log_changers + np.log1p(
        -prior.weights[atom].sum())))
    moved = draw_posterior(center - offset, spread, changers, lower - offset, rng) + offset
    return np.where(stays, 0.0, moved)


def mode_offsets(answers: StateAnswers, psi: NeighborFunction, band: np.ndarray, mode: str
                 ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """The offsets of a CELL_CHANGE_MODES ``mode`` for a state's answers (``implicates.StateAnswers`` with
    ``change_cell``) whose establishments are in change bands ``band``: b (``change_offsets``), with "fitted"
    each row's b times its band's slope beta; and the slopes with their standard errors (None but "fitted")."""
    offset = change_offsets(answers.months, answers.month_sd, psi, answers.industry, answers.change_cell)
    if mode != "fitted":
        return offset, None
    omega = answers.months
    slopes = band_slopes(omega[:, 1:] - omega[:, :1], offset, band, answers.change_cell)
    return offset * slopes[0][band][:, None], slopes



def slopes_summary(slopes: tuple[np.ndarray, np.ndarray] | None) -> dict:
    """The fitted slopes (``mode_offsets``) in public numbers for a prior summary ({} without them)."""
    if slopes is None:
        return {}
    return {"change_slopes": [float(f"{b:.3g}") for b in slopes[0]],
            "change_slopes_se": [float(f"{e:.3g}") for e in slopes[1]]}
