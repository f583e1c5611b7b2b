"""Implicates: draws of establishments' values from their posterior given a release's answers.

The model (``docs/method/implicates.md``), per state, in the neighbour function's scale theta = psi(x):

* each month's identity answer is omega_k = theta_k + N(0, sd_k^2) and the wage's omega_w =
  psi(w) + N(0, sd_w^2), independently (the psi-mechanism; the sds are public);
* month 1's level theta_1 has a prior g (a Gaussian mixture with an atom at psi(0): zero employment);
  with ``level_prior="quarter"``, the quarter's level theta_bar (the months' mean in psi scale,
  weighted by the answers' precisions) has it instead, deconvolved from the same mean of the answers
  (which is independent of their differences);
* the changes from month 1, delta_2 = theta_2 - theta_1 and delta_3 = theta_3 - theta_1, have priors
  h_2, h_3 with an atom at 0 (no change) and no mass in (0, the smallest change of one employee)
  (headcounts are whole numbers), one per size band of the answers' mean (a public function of the
  release), independent of each other and of the level (each change from month 1 is deconvolved
  from its own differences omega_k - omega_1). Of theta_1 they are not (a month 1 above the quarter's
  level goes with changes below 0); how that pairs with month 1's or the quarter's level: the method docs;
  with ``change_prior="joint"`` the two changes have one joint prior per band instead
  (``postprocess.joint_changes``), drawn together given the level; with CELL_CHANGES each
  establishment's band prior is moved by its cell's month pattern (``postprocess.cell_changes``);
* a wage per employee z = log(w / E), E the quarter's average employment, is z = s_g(log E) + r, s_g a line
  in log E per sector g (2-digit NAICS) placed from the answers, r with a prior on a grid per sector and
  size band of the months' answers' mean, with an atom at w = 0 (``postprocess.wage_priors``); an
  establishment with E = 0 has a prior on psi(w) itself (sectors: the method docs say why);
* with WHOLE_CHANGES the smallest establishments' months are whole numbers (``postprocess.whole_changes``).

Every prior is an NPMLE from the release's answers (``postprocess.deconvolve``). Draws are a Gibbs sampler
over (theta_bar, delta_2, delta_3), each step an exact draw from a Gaussian-mixture posterior given the
months' answers, accepted or not by a Metropolis-Hastings step on the wage's density given the new average
employment (``WageCoupling``), the wage's z drawn given the months every sweep. Employment is drawn as
whole numbers (the months rounded), wages as reals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gedp.errors import InputError
from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.cell_changes import change_fit_arguments, fit_kind, mode_offsets, moved_draws, slopes_summary
from gedp.postprocess.change_scale import ChangeScales, band_scales
from gedp.postprocess.deconvolve import Mixture, MixtureFit, SmoothFit, draw_posterior, truncated_normal
from gedp.postprocess.joint_changes import ChangeLikelihood, JointFit, JointPrior, draw_changes
from gedp.postprocess.prior_components import (
    CHANGE_PRIORS,
    LEVEL_PRIORS,
    atom_standard_error,
    checked_prior,
    level_components,
    level_groups,
    merged_bands,
)
from gedp.postprocess.wage_coupling import CurrentDensity, WageCoupling
from gedp.postprocess.wage_priors import (
    CELL_OFFSETS,
    SIZE_EDGES,
    WAGE_Z,
    WAGE_Z_CELLS,
    ShiftPoints,
    WageFit,
    cell_offsets,
    cell_sizes,
    draw_residuals,
    offset_likelihood,
    offsets_summary,
    residual_means,
    size_shift,
)
from gedp.postprocess.whole_changes import WholeChanges

MONTHS = ("m1emp", "m2emp", "m3emp")
#: Fewest establishments of a band with change priors of its own; smaller ones share the band below's.
#: (Size bands: SIZE_EDGES, of the answers' mean for the changes' priors, of a draw's average for wages.)
MIN_BAND = 400
BURN_IN, THIN = 8, 2  # Gibbs sweeps before the first implicate and between two implicates
#: A level prior's components reach LEVEL_CUT sds above psi(0) (``prior_components.level_components``); rows whose
#: answers' mean is above it draw from their likelihood alone (a prior that flat there changes nothing).
LEVEL_CUT = 40.0
#: The level prior's components' bandwidth in their steps.
LEVEL_WIDTH = 1.0
#: Whether the level prior's log weights are smooth (``deconvolve.SmoothFit``, its penalty chosen by cross-validation
#: on the answers) instead of the NPMLE (a measurement's knob: not shipped).
LEVEL_SMOOTH = False
#: Whether each sector (2-digit NAICS, a public column) with MIN_SECTOR_LEVEL or more level answers has a
#: level prior of its own, fitted on its answers alone (the others keep the state's; a measurement's knob).
LEVEL_BY_SECTOR = False
#: Whether each establishment's change priors are moved by the change its cell's month pattern implies, and how
#: (``cell_changes.CELL_CHANGE_MODES``: "" not, "all" or "changers"; a measurement's knob).
CELL_CHANGES = ""
#: Whether the smallest establishments' months are whole numbers (``postprocess.whole_changes``; a measurement's knob).
WHOLE_CHANGES = False
#: Whether a change's size scales with the level within its band (``postprocess.change_scale``; a measurement's knob).
CHANGE_SCALE = False
#: Fewest level answers of a sector with a level prior of its own (``prior_components.level_groups``).
MIN_SECTOR_LEVEL = 1000
WAGE_FLAT_STEPS = 2.0  # rows whose wage likelihood is narrower than this many z steps draw from it alone
WAGE_FIT_ROWS = 20_000  # establishments per state of the pass that fits the wage priors
#: Rounds of the cell offsets, then s placed again through the fitted priors' band levels (more rounds drifted
#: s's slope past the truth's on Rhode Island under elasticity 0.6: 0.6 -> 0.68 -> 0.8; the method docs).
CELL_ROUNDS = 1
#: Establishments of one block of the cell offsets' likelihood (rows x ~220 grid points).
CELL_BLOCK = 16_384


@dataclass
class StateAnswers:
    """One state's identity answers in psi scale, in release order."""

    months: np.ndarray  # (n, 3) omega of m1emp, m2emp, m3emp
    month_sd: np.ndarray  # (3,)
    wage: np.ndarray  # (n,)
    wage_sd: float
    industry: np.ndarray  # (n,) integer codes of the wage model's groups (the NAICS sector)
    cell: np.ndarray | None = None  # (n,) integer codes of the county x NAICS-6 cells (None: no cell offsets)
    change_cell: np.ndarray | None = None  # (n,) the same codes for the changes' offsets (CELL_CHANGES)


@dataclass
class Priors:
    """A state's fitted priors."""

    level: Mixture
    level_cut: float
    bands: np.ndarray  # edges in psi scale of the changes' bands
    changes: list[tuple[Mixture, Mixture]]  # per band: h_2, h_3
    wage_weights: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (sector or -1, band)
    zero_wage: Mixture | None = None  # psi(w) of establishments with no employment
    wage_table: np.ndarray | None = None  # sector x band x (z grid, w = 0): prior weights of the residual
    wage_shift: tuple[np.ndarray, np.ndarray] | None = None  # s per sector (``wage_priors.Shift``)
    cell_offset: np.ndarray | None = None  # per cell: its offset c of the log wage per employee
    joint: list[JointPrior] | None = None  # per band: the two changes' joint prior (``change_prior="joint"``)
    sector_levels: list[Mixture] = field(default_factory=list)  # per level group k >= 0: its level prior
    whole: dict | None = None  # WHOLE_CHANGES: the whole changes' weights per (band, change) (None: the fitted)


class PosteriorModel:
    """Priors of one state fitted on its answers, and draws of its establishments' values; ``level_prior``
    (LEVEL_PRIORS): the level prior's level, month 1's (the default) or the quarter's; ``change_prior``
    (CHANGE_PRIORS): the two changes independent (the default) or jointly distributed
    (``postprocess.joint_changes``)."""

    #: whether the level prior is the quarter's level (else month 1's)
    quarter = False
    #: whether the changes have a joint prior per band (else one each, independent)
    joint = False
    #: each establishment's level prior: -1 the state's, k >= 0 priors.sector_levels[k] (None: the state's)
    level_group: np.ndarray | None = None
    #: each establishment's changes' offsets b (``cell_changes``; None: 0, as without CELL_CHANGES)
    change_offset: np.ndarray | None = None
    change_slopes: tuple[np.ndarray, np.ndarray] | None = None  # "fitted": per band beta, its se (``band_slopes``)
    whole: WholeChanges | None = None  # the smallest establishments' whole changes (WHOLE_CHANGES)
    scales: ChangeScales | None = None  # CHANGE_SCALE: each establishment's changes' scales, their powers

    def __init__(self, answers: StateAnswers, psi: NeighborFunction, rng: np.random.Generator,
                 level_prior: str = "month1", change_prior: str = "independent") -> None:
        self.quarter = checked_prior("level", level_prior, LEVEL_PRIORS) == "quarter"
        self.joint = checked_prior("change", change_prior, CHANGE_PRIORS) == "joint"
        self.answers, self.psi = answers, psi
        self.floor = psi.at_zero if np.isfinite(psi.at_zero) else -np.inf
        #: each prior's fit (answers binned, likelihood made ready), kept by its fit for its replicates
        self.fits: dict[object, MixtureFit] = {}
        if CELL_CHANGES and not self.joint and answers.change_cell is not None:
            self.change_offset, self.change_slopes = mode_offsets(answers, psi, self.change_bands()[1], CELL_CHANGES)
        self.scales = band_scales(answers.months, answers.month_sd, psi, *self.change_bands()) if CHANGE_SCALE and \
            self.change_offset is None else None
        self.priors = Priors(*self._month_priors())
        self.whole = WholeChanges(self) if WHOLE_CHANGES else None
        if self.joint:
            self.priors.joint = self._joint_priors()
        if LEVEL_BY_SECTOR:
            sd = float(answers.month_sd[0])
            self.level_group = level_groups(answers.industry, self._level_answers() <= self.priors.level_cut + 6 * sd,
                                            MIN_SECTOR_LEVEL)
            self.priors.sector_levels = self._sector_levels()
        #: each establishment's size band of its months' answers' mean: its wage prior's band (public,
        #: and free of the division bias a band of drawn sizes has)
        self.wage_band = np.searchsorted(psi(SIZE_EDGES), answers.months.mean(axis=1))
        self._wage_priors(rng)

    @property
    def month_weights(self) -> np.ndarray:
        """The months' precision weights (1 / sd_k^2, summing to 1): the quarter's level is the weighted mean of the
        months in psi scale, and the same mean of the answers is independent of their differences (the changes'
        likelihood)."""
        if not self.quarter:
            return np.array([1.0, 0.0, 0.0])  # the level is month 1's
        precision = 1.0 / np.asarray(self.answers.month_sd, dtype=float) ** 2
        return precision / precision.sum()

    # --- priors -----------------------------------------------------------------------------------
    def replicate(self, rng: np.random.Generator) -> Priors:
        """A draw of the priors from their posterior (every NPMLE refitted on a Bayesian bootstrap of the answers; the
        wages' on their fit's sample, with the fitted size shift s): one per implicate makes the imputation proper (the
        spread between implicates carries the priors' estimation error)."""
        drawn = Priors(*self._month_priors(rng, self.priors))
        fitted = self.priors
        drawn.sector_levels = self._sector_levels(rng, fitted.sector_levels)
        if fitted.joint is not None:
            drawn.joint = self._joint_priors(rng, fitted.joint)
        drawn.wage_weights = self.wage_fit.solve(rng.exponential(size=len(self.wage_fit.likelihood)),
                                                 start=fitted.wage_weights)
        drawn.wage_table, drawn.wage_shift = self.wage_fit.table(drawn.wage_weights), fitted.wage_shift
        drawn.cell_offset, drawn.whole = fitted.cell_offset, None if self.whole is None else self.whole.weights(rng)
        if fitted.zero_wage is not None:
            drawn.zero_wage = self._zero_wage_prior(self.zero_wage_answers, rng, fitted.zero_wage)
        return drawn

    def _month_priors(self, rng: np.random.Generator | None = None, start: Priors | None = None
                      ) -> tuple[Mixture, float, np.ndarray, list[tuple[Mixture, Mixture]]]:
        """The level and change priors (fitted, or with ``rng`` a Bayesian bootstrap replicate started
        from the fitted ``start``)."""
        omega, sd = self.answers.months, self.answers.month_sd
        cut = (self.floor if np.isfinite(self.floor) else omega[:, 0].min()) + LEVEL_CUT * sd[0]
        level = self._fitted("level", rng, None if start is None else start.level, lambda: self._level_fit(cut),
                             SmoothFit if LEVEL_SMOOTH else MixtureFit)
        bands, band, steps = self.change_bands()
        changes = []
        for b, step in enumerate(steps):
            rows = band == b
            changes.append(tuple(self._fitted(("change", b, k), rng, None if start is None else start.changes[b][k - 1],
                                              lambda k=k, rows=rows, step=step: change_fit_arguments(
                                                  omega[rows, k] - omega[rows, 0], self.offsets(rows)[:, k - 1],
                                                  float(np.hypot(sd[0], sd[k])), step, CELL_CHANGES,
                                                  None if self.scales is None else self.scales.scale[rows, k - 1]),
                                              fit_kind(CELL_CHANGES, self.scales is not None))
                                 for k in (1, 2)))
        return level, cut, bands, changes

    def _joint_priors(self, rng: np.random.Generator | None = None, start: list[JointPrior] | None = None
                      ) -> list[JointPrior]:
        """Per change band, the joint prior of the changes (a, b) = (theta_2 - theta_1, theta_3 - theta_2),
        fitted on the band's answers' differences (with ``rng``, a Bayesian bootstrap replicate from
        ``start``)."""
        omega, sd = self.answers.months, self.answers.month_sd
        _, band, steps = self.change_bands()
        return [self._fitted(("joint", b), rng, None if start is None else start[b],
                             lambda rows=band == b, step=step: (np.diff(omega[rows], axis=1), sd, step), JointFit)
                for b, step in enumerate(steps)]

    def _sector_levels(self, rng: np.random.Generator | None = None, start: list[Mixture] | None = None
                       ) -> list[Mixture]:
        """Each level group's (``level_group`` k >= 0: a sector) level prior, fitted on its answers (with
        ``rng``, a Bayesian bootstrap replicate from ``start``)."""
        groups, cut = self.level_group, self.priors.level_cut
        return [] if groups is None else [
            self._fitted(("level", k), rng, None if start is None else start[k],
                         lambda k=k: self._level_fit(cut, groups == k), SmoothFit if LEVEL_SMOOTH else MixtureFit)
            for k in range(int(groups.max(initial=-1)) + 1)]

    def _level_answers(self) -> np.ndarray:
        """The level's answers: month 1's, or the quarter's (the months' weighted mean)."""
        return self.answers.months @ self.month_weights if self.quarter else self.answers.months[:, 0]

    def _level_fit(self, cut: float, rows: np.ndarray | None = None) -> tuple:
        """The level prior's fit arguments: the level's answers (of ``rows``, a mask, else all) up to 6
        month sds above the cut, their sd, components (spaced on a month's sd, placed on all the answers)."""
        sd = float(self.answers.month_sd[0])
        level = self._level_answers()
        kept = level <= cut + 6 * sd
        fitted = level[kept if rows is None else kept & rows]
        if fitted.size == 0:
            answers = "quarterly employment answers" if self.quarter else "month-1 employment answers"
            raise InputError(f"the release's {answers} are all more than {LEVEL_CUT + 6:g} answer sds above the "
                             f"smallest size: gedp implicates fits small establishments' sizes from those answers and "
                             f"has none to fit")
        level_sd = float(1.0 / np.sqrt((1.0 / np.asarray(self.answers.month_sd, dtype=float) ** 2).sum())
                         ) if self.quarter else sd
        means, sds = level_components(self.floor, cut + 6 * sd, sd, level.min(), level[kept])
        return fitted, level_sd, means, sds * LEVEL_WIDTH

    def change_bands(self) -> tuple[np.ndarray, np.ndarray, list[float]]:
        """The changes' size bands: their edges in psi scale, each establishment's band (of its answers'
        mean) and each band's one-employee change at twice its upper size (its components' smallest)."""
        mean = self.answers.months.mean(axis=1)
        edges = self.psi(SIZE_EDGES)
        kept = merged_bands(np.bincount(np.searchsorted(edges, mean), minlength=len(edges) + 1), MIN_BAND)
        bands = edges[[k - 1 for k in kept[1:-1]]]
        uppers = [SIZE_EDGES[kept[b + 1] - 1] for b in range(len(bands))] + [float(self.psi.inverse(mean.max()))]
        steps = [float(self.psi(np.array([2 * u + 1.0]))[0] - self.psi(np.array([2 * u]))[0]) for u in uppers]
        return bands, np.searchsorted(bands, mean), steps

    def no_change_standard_errors(self) -> list[list[float]]:
        """Per change band and month (2, 3): the standard error of its prior's no-change weight from the band's answers
        (``atom_standard_error``): where it is not small (above about 0.1) the release does not tell the share with no
        change in that band, and the NPMLE's atom weight there is arbitrary."""
        _, band, steps = self.change_bands()
        sd = self.answers.month_sd
        counts = np.bincount(band, minlength=len(steps))
        return [[atom_standard_error(int(counts[b]), step, float(np.hypot(sd[0], sd[k]))) for k in (1, 2)]
                for b, step in enumerate(steps)]

    def _fitted(self, key: object, rng: np.random.Generator | None, start: Mixture | JointPrior | None,
                arguments: Callable[..., tuple], kind: Any = MixtureFit) -> Any:
        """A prior's NPMLE (``rng`` None: its fit is made from ``arguments()``, the answers, sd and
        components, by ``kind.of``, and kept) or a bootstrap replicate of it (from the kept fit)."""
        if rng is None or key not in self.fits:
            self.fits[key] = kind.of(*arguments(), basis=True)
        return self.fits[key].solve(rng, start)

    def _wage_priors(self, rng: np.random.Generator) -> None:
        """Wage priors by stochastic EM on a sample of establishments: the size shift s placed from the answers
        (``ShiftPoints``) and a draw of the sample's months without wages, the residual priors fitted on that draw; with
        cells, s is the slope within cells (each cell's mean log size its level's regressor) and CELL_ROUNDS times the
        cells' offsets (``_cell_offsets``, on a draw of every establishment's months) and the residual priors given
        them; then the residual priors again on a draw of the months coupled to the fitted wages."""
        a = self.answers
        n = len(a.wage)
        rows = np.sort(rng.choice(n, size=min(n, WAGE_FIT_ROWS), replace=False))
        everyone = np.arange(n) if a.cell is not None else rows
        drawn = next(self.months_chain(everyone, rng, BURN_IN, 1)).mean(axis=1)
        first = drawn[rows] if a.cell is not None else drawn
        groups = int(a.industry.max()) + 1
        size = None if a.cell is None else cell_sizes(drawn, a.cell)
        points = ShiftPoints.of(self.psi, a.months[rows], a.wage[rows], a.wage_sd, first, a.industry[rows],
                                None if size is None else size[a.cell[rows]])
        self.priors.wage_shift, coefficient = points.shift(groups)
        if a.cell is None or size is None:
            self._fit_wages(rows, first, rng)
        else:
            sector = np.zeros(len(size), np.int64)
            sector[a.cell] = a.industry
            self.priors.cell_offset = coefficient[sector] * size  # the cells' level given their size
            self._fit_wages(rows, first, rng)
            for _ in range(CELL_ROUNDS):
                self.priors.cell_offset = self._cell_offsets(drawn, coefficient[sector] * size)
                self._fit_wages(rows, first, rng)
                # s again through the points' levels under the fitted priors (each band's level is right
                # in its residual prior, while E[log w] deconvolved from psi(w) puts the small bands'
                # low wages at w = 0: their levels too high, the slope too low)
                level = (size_shift(first, a.industry[rows], self.priors.wage_shift) + self.offset(rows, self.priors)
                         + residual_means(self.priors.wage_table)[a.industry[rows], self.wage_band[rows]])
                points = points.placed(level)
                self.priors.wage_shift, coefficient = points.shift(groups)
            self.priors.cell_offset = self._cell_offsets(drawn, coefficient[sector] * size)
        self._fit_wages(rows, next(self.months_chain(rows, rng, BURN_IN, 1)).mean(axis=1), rng)

    def _cell_offsets(self, average: np.ndarray, center: np.ndarray) -> np.ndarray:
        """Each county x NAICS-6 cell's offset of the log wage per employee (z = s + offset + r), empirical Bayes
        (``wage_priors.cell_offsets``) around its ``center``: the cell's likelihood of the offset is the product over
        its employing establishments (``average``: a draw of every establishment's months, without wages) of their wage
        answers' likelihood under their residual priors slid by it."""
        a, priors = self.answers, self.priors
        assert a.cell is not None and priors.wage_table is not None and priors.wage_shift is not None
        log_likelihood = np.zeros((len(center), len(CELL_OFFSETS)))
        employing = np.flatnonzero(average > 0)
        for start in range(0, len(employing), CELL_BLOCK):
            rows = employing[start:start + CELL_BLOCK]
            group, cell = a.industry[rows], a.cell[rows]
            likelihood = self.wage_likelihood(a.wage[rows], average[rows], group, priors.wage_shift, center[cell],
                                              grid=WAGE_Z_CELLS)
            slid = offset_likelihood(likelihood, group, self.wage_band[rows], priors.wage_table)
            np.add.at(log_likelihood, cell, np.log(np.maximum(slid, 1e-300)))
        return center + cell_offsets(log_likelihood)

    def offsets(self, rows: np.ndarray) -> np.ndarray:
        """The changes' offsets b of establishments ``rows`` (indices or a mask; rows x 2, 0 without them)."""
        return np.zeros((len(self.answers.months[rows]), 2)) if self.change_offset is None else self.change_offset[rows]

    def offset(self, rows: np.ndarray, priors: Priors) -> np.ndarray | float:
        """The cell offset c of each row's cell (0 without cells)."""
        if priors.cell_offset is None or self.answers.cell is None:
            return 0.0
        return priors.cell_offset[self.answers.cell[rows]]

    def _fit_wages(self, rows: np.ndarray, average: np.ndarray, rng: np.random.Generator) -> None:
        """Fit the wage priors of ``rows`` given their average employment (under the priors' size shift
        and cell offsets)."""
        omega = self.answers.wage[rows]
        zero = average == 0
        self.zero_wage_answers = omega[zero]
        self.priors.zero_wage = self._zero_wage_prior(omega[zero], None, None) if zero.any() else None
        band = self.wage_band[rows]
        group = self.answers.industry[rows]
        offset = self.offset(rows[~zero], self.priors)
        likelihood = self.wage_likelihood(omega[~zero], average[~zero], group[~zero], self.priors.wage_shift, offset)
        self.wage_fit = WageFit.of(likelihood, band[~zero], group[~zero],
                                   int(self.answers.industry.max()) + 1, rng)
        self.priors.wage_weights = self.wage_fit.solve(np.ones(len(likelihood)))
        self.priors.wage_table = self.wage_fit.table(self.priors.wage_weights)

    def _zero_wage_prior(self, omega: np.ndarray, rng: np.random.Generator | None, start: Mixture | None) -> Mixture:
        """The prior of psi(w) of establishments without employment (a bootstrap replicate with ``rng``)."""
        sd = self.answers.wage_sd
        top = max(float(omega.max()), float(self.psi(np.zeros(1))[0]) + sd) + 3 * sd
        return self._fitted("zero wage", rng, start, lambda: (
            omega, sd, *level_components(self.floor, top, sd, float(self.answers.wage.min()), omega)))

    def log_wage_prior(self, z: np.ndarray, average: np.ndarray, rows: np.ndarray, priors: Priors) -> np.ndarray:
        """log prior weight of the grid cell holding each z's residual r = z - s(log E), E the average
        employment, in the establishment's cell (z finite, E > 0)."""
        group = self.answers.industry[rows]
        step = WAGE_Z[1] - WAGE_Z[0]
        r = z - size_shift(average, group, priors.wage_shift) - self.offset(rows, priors)
        k = np.clip(np.rint((r - WAGE_Z[0]) / step).astype(np.int64), 0, len(WAGE_Z) - 1)
        return np.log(priors.wage_table[group, self.wage_band[rows], k])

    def wage_likelihood(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """``wage_log_likelihood``'s likelihood itself, each row scaled to its largest value."""
        log_lik = self.wage_log_likelihood(*args, **kwargs)
        return np.exp(log_lik - log_lik.max(axis=1, keepdims=True))

    def wage_log_likelihood(self, omega: np.ndarray, average: np.ndarray, group: np.ndarray,
                            shift: tuple[np.ndarray, np.ndarray], offset: np.ndarray | float = 0.0,
                            grid: np.ndarray = WAGE_Z) -> np.ndarray:
        """log likelihood (up to a constant) of wage answers at the residual's ``grid`` r (w = E e^(s(log E)
        + c + r), c the cell's ``offset``) and (last column) at w = 0."""
        sd = self.answers.wage_sd
        average = np.maximum(average, 1e-300)
        z = grid[None, :] + (size_shift(average, group, shift) + offset)[:, None]
        points = np.concatenate([self.psi(average[:, None] * np.exp(z)),
                                 np.full((len(omega), 1), self.psi(np.zeros(1))[0])], axis=1)
        return -0.5 * ((omega[:, None] - points) / sd) ** 2

    def summary(self) -> dict:
        """The fitted priors in a few public numbers (they are functions of the release's answers)."""
        p = self.priors
        return {"zero_employment_share": p.level.mass_at(self.floor) if np.isfinite(self.floor) else 0.0,
                "no_change_share": [[round(h.mass_at(0.0), 4) for h in pair] for pair in p.changes],
                "no_change_se": [[float(f"{e:.3g}") for e in pair] for pair in self.no_change_standard_errors()],
                "change_bands": [float(b) for b in self.psi.inverse(p.bands)], **slopes_summary(self.change_slopes),
                "wage_cells": sum(g >= 0 for g, _ in p.wage_weights), **(self.whole.summary() if self.whole else {}),
                **({} if p.cell_offset is None else {"cell_offsets": offsets_summary(p.cell_offset)}),
                **({} if self.scales is None else {"change_scale_powers": self.scales.beta.tolist()})}

    # --- draws ------------------------------------------------------------------------------------
    def months_chain(self, rows: np.ndarray, rng: np.random.Generator, burn_in: int, count: int, thin: int = THIN,
                     priors: Sequence[Priors] | None = None, whole: bool = True) -> Iterator[np.ndarray]:
        """``count`` draws of the months (whole numbers, rows x 3) of establishments ``rows``, after
        ``burn_in`` sweeps and ``thin`` sweeps apart; draw j under ``priors[j]`` (the fitted priors
        without them); with ``whole`` and WHOLE_CHANGES the smallest ones by ``whole_changes``."""
        if whole and self.whole is not None:
            return (yield from self.whole.chain(rows, rng, burn_in, count, thin, priors))
        omega, sd = self.answers.months[rows], self.answers.month_sd
        band = np.searchsorted(self.priors.bands, omega.mean(axis=1))
        group = None if self.level_group is None else self.level_group[rows]
        floor = self.floor if np.isfinite(self.floor) else -np.inf
        level = np.maximum(omega.mean(axis=1), floor if np.isfinite(floor) else omega.min())
        delta, offset = np.zeros((len(rows), 2)), self.offsets(rows)
        scale = np.ones((len(rows), 2)) if self.scales is None else self.scales.scale[rows]
        coupling = WageCoupling(self, rows) if self.priors.wage_table is not None else None
        sweeps = 0
        for j in range(count):
            prior = self.priors if priors is None else priors[j]
            if coupling is not None:
                coupling.priors = prior
            for _ in range(burn_in if sweeps == 0 else thin):
                state = None if coupling is None else CurrentDensity.of(coupling, self.average(level, delta))
                shift = self.level_shift(delta)
                level = self._coupled(state, level, delta, self._level_step(prior, omega, sd, delta, shift, floor,
                                                                             rng, group), None, rng)
                if self.joint:
                    proposal = self._joint_step(prior, omega, sd, level, delta, band, floor, rng)
                    delta = self._coupled(state, level, delta, proposal, 0, rng)
                for k in () if self.joint else (0, 1):
                    proposal = self._change_step(prior, omega, sd, level, delta, k, band, floor, rng, offset[:, k],
                                                 scale[:, k])
                    delta = self._coupled(state, level, delta, proposal, k, rng)
                if coupling is not None:
                    coupling.redraw(state.average, rng)
                sweeps += 1
            yield np.rint(self.psi.inverse(self.levels(level, delta)))

    def level_shift(self, delta: np.ndarray) -> np.ndarray:
        """The quarter's level less month 1's theta_1 given the changes from month 1: the changes (0,
        delta_2, delta_3) averaged with the months' precision weights."""
        return delta @ self.month_weights[1:]

    def levels(self, level: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """The three months (psi scale) of a chain's level and changes from month 1."""
        theta1 = level - self.level_shift(delta)
        return theta1[:, None] + np.concatenate([np.zeros((len(theta1), 1)), delta], axis=1)

    def average(self, level: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return self.psi.inverse(self.levels(level, delta)).mean(axis=1)

    def _coupled(self, state: CurrentDensity | None, level, delta, proposal, k, rng) -> np.ndarray:
        """A Metropolis-Hastings step: the proposal (an exact draw of the level with ``k`` None, or the
        changes after a draw of change k, given the months' answers) accepted with the ratio of the
        wage's density given the new and the current average employment (the wage's z held); ``state``:
        the current average and density, moved to the accepted ones."""
        if state is None:
            return proposal
        current = level if k is None else delta
        new_average = self.average(proposal, delta) if k is None else self.average(level, proposal)
        new_density = state.coupling.log_density(new_average)
        accept = np.log(rng.random(len(level))) < np.nan_to_num(new_density - state.density, nan=0.0)
        state.accept(accept, new_average, new_density)
        return np.where(accept if k is None else accept[:, None], proposal, current)

    @staticmethod
    def _level_step(priors: Priors, omega, sd, delta, shift, floor, rng, group=None) -> np.ndarray:
        """An exact draw of the quarter's level (theta_1 + ``shift``) given the changes: every month >= floor; under
        each row's level prior (``group``: -1 or None the state's, k priors.sector_levels[k])."""
        shifted = omega - np.concatenate([np.zeros((len(omega), 1)), delta], axis=1)
        precision = 1.0 / sd**2
        center = shifted @ precision / precision.sum() + shift
        spread = np.full(len(omega), 1.0 / np.sqrt(precision.sum()))
        lower = floor - np.minimum(0.0, delta.min(axis=1)) + shift
        flat = center > priors.level_cut
        out = np.empty(len(omega))
        out[flat] = truncated_normal(center[flat], spread[flat], lower[flat], rng)
        for k, prior in enumerate([priors.level, *priors.sector_levels] if group is not None else [priors.level]):
            rows = ~flat if group is None else ~flat & (group == k - 1)
            if k == 0 or rows.any():
                out[rows] = draw_posterior(center[rows], spread[rows], prior, lower[rows], rng)
        return out

    def _change_step(self, priors: Priors, omega, sd, level, delta, k, band, floor, rng, offset, scale) -> np.ndarray:
        """The changes after an exact draw of change k (from month 1) given the level and the other change. With month
        1's level, only month k + 2 moves with it (its answer less theta_1 is delta_k plus its noise). With the
        quarter's, every month does: month m is base_m + c_m delta_k (c = -v_k for month 1 and the other month, 1 - v_k
        for its own, v the precision weights), so its likelihood is Gaussian with the three answers' precision, and each
        month >= floor bounds it below (c_m > 0) or above (c_m < 0); the draw is exact below, and one above an upper
        bound is refused (the change kept: a Metropolis-Hastings step whose proposal is the conditional without that
        bound). The prior is the band's moved by each row's ``offset`` (CELL_CHANGES), scaled by its ``scale``."""
        moved = delta.copy()
        if not self.quarter:  # month k + 2's answer less month 1's level is delta_k plus its own noise
            out = self._mixture_draws(priors, omega[:, k + 1] - level, np.full(len(omega), float(sd[k + 1])),
                                      floor - level, band, k, rng, offset, scale)
            moved[:, k] = out
            return moved
        coefficients = -np.full(3, self.month_weights[k + 1])
        coefficients[k + 1] += 1.0
        moved[:, k] = 0.0
        base = self.levels(level, moved)  # the months without change k
        precision = coefficients**2 / sd**2
        center = ((omega - base) * (coefficients / sd**2)).sum(axis=1) / precision.sum()
        spread = np.full(len(omega), 1.0 / np.sqrt(precision.sum()))
        with np.errstate(divide="ignore", invalid="ignore"):
            bounds = (floor - base) / coefficients
        lower = bounds[:, coefficients > 0].max(axis=1)
        upper = bounds[:, coefficients < 0].min(axis=1, initial=np.inf)
        out = self._mixture_draws(priors, center, spread, lower, band, k, rng, offset, scale)
        moved[:, k] = np.where(out <= upper, out, delta[:, k])
        return moved

    def _joint_step(self, priors: Priors, omega: np.ndarray, sd: np.ndarray, level: np.ndarray, delta: np.ndarray,
                    band: np.ndarray, floor: float, rng: np.random.Generator) -> np.ndarray:
        """Both changes drawn at once given the level, exactly from their joint prior's posterior given the three
        answers (``joint_changes.draw_changes``: the months are level + M delta), without the months' bound; a draw with
        a month below it is refused (the changes kept). Given the level, that conditional does not depend on the current
        changes, so this is an independence Metropolis-Hastings step whose target is the proposal restricted to the
        bound: accepted exactly where it holds."""
        months = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]) - self.month_weights[1:][None, :]
        likelihood = ChangeLikelihood.of(months, sd)
        residual = omega - level[:, None]
        out = np.empty_like(delta)
        assert priors.joint is not None
        for b in np.unique(band):
            rows = band == b
            out[rows] = draw_changes(priors.joint[b], likelihood, residual[rows], rng)
        inside = (level[:, None] + out @ months.T >= floor).all(axis=1)
        return np.where(inside[:, None], out, delta)

    @staticmethod
    def _mixture_draws(priors: Priors, center, spread, lower, band, k, rng, offset, scale) -> np.ndarray:
        """Exact draws of change k = s r, r from each row's band's prior moved by ``offset`` / s, s its ``scale``."""
        out = np.empty(len(center))
        for b in np.unique(band):
            rows, s = band == b, scale[band == b]
            out[rows] = s * moved_draws(priors.changes[b][k], center[rows] / s, spread[rows] / s, lower[rows] / s,
                                        offset[rows] / s, rng, CELL_CHANGES)
        return out

    def wages(self, rows: np.ndarray, months: np.ndarray, rng: np.random.Generator,
              priors: Priors | None = None) -> np.ndarray:
        """A draw of the wages of ``rows`` given a draw of their months (under ``priors``, the fitted
        priors without them)."""
        return self.wage_draw(rows, months.mean(axis=1), rng, self.priors if priors is None else priors)[0]

    def wage_draw(self, rows: np.ndarray, average: np.ndarray, rng: np.random.Generator,
                  priors: Priors) -> tuple[np.ndarray, np.ndarray]:
        """A draw of the wages of ``rows`` given their average employment, and which were drawn on the z grid."""
        omega, sd = self.answers.wage[rows], self.answers.wage_sd
        floor = self.floor if np.isfinite(self.floor) else -np.inf
        out = np.empty(len(rows))
        zero = average == 0
        if zero.any():
            prior = priors.zero_wage
            out[zero] = (self.psi.inverse(draw_posterior(omega[zero], np.full(zero.sum(), sd), prior,
                                                         np.full(zero.sum(), floor), rng))
                         if prior is not None else self.psi.inverse(truncated_normal(
                             omega[zero], np.full(zero.sum(), sd), np.full(zero.sum(), floor), rng)))
        naive = np.maximum(self.psi.inverse(omega), 1e-9)
        z_sd = sd / (naive * self.psi.derivative(naive))
        flat = ~zero & (z_sd < WAGE_FLAT_STEPS * (WAGE_Z[1] - WAGE_Z[0]))
        out[flat] = self.psi.inverse(truncated_normal(omega[flat], np.full(flat.sum(), sd),
                                                      np.full(flat.sum(), floor), rng))
        band = self.wage_band[rows]
        group = self.answers.industry[rows]
        todo = ~zero & ~flat
        if todo.any():
            shift, offset = priors.wage_shift, self.offset(rows[todo], priors)
            r = draw_residuals(self.psi, omega[todo], sd, average[todo], group[todo], band[todo], priors.wage_table,
                               shift, rng, offset)
            out[todo] = average[todo] * np.exp(r + size_shift(average[todo], group[todo], shift) + offset)
        return out, todo
