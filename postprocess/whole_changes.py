"""Whole-employee month changes of the smallest establishments: the implicates' option WHOLE_CHANGES.

The implicates' change priors (``postprocess.implicates``) are Gaussian mixtures in psi scale with an atom
at no change; the months are drawn continuous and rounded. For an establishment of a few employees one
employee's change is 0.2-0.5 in sqrt scale against an answers' difference sd of 0.8, so a change that is
drawn as a fraction of an employee is rounded into whole ones (and the cells' offsets, which move the
whole prior, move the atom off 0). Here establishments whose three answers' mean is below psi(WHOLE_SIZE)
have months that are whole numbers x_1, x_2 = x_1 + j_2, x_3 = x_1 + j_3 on a grid 0..top, with

* month 1's prior G(n): the level prior's mass in n's rounding interval [psi(n - 1/2), psi(n + 1/2));
* each change's prior P(j = 0) = w_0 (no change), P(j = +s) = w_s q, P(j = -s) = w_s (1 - q), s = 1..top:
  a size distribution w and a direction q = expit(alpha + gamma m), m the change in employees the
  establishment's cell's month pattern implies at its level (``cell_changes.change_offsets``, from the
  cell's other establishments; 0 without offsets). The cell sets the probability and direction of a
  change, not its size;
* the answers omega_k = psi(x_k) + N(0, sd_k^2) (the psi-mechanism, exact for whole numbers).

The weights w are the NPMLE (``deconvolve.npmle_weights``) of each change band's answers' pairs
(omega_1, omega_k) given G: the likelihood of component s is sum_n G(n) N(omega_1; psi(n)) [q N(omega_k;
psi(n + s)) + (1 - q) N(omega_k; psi(n - s))], linear in w, so the fit is the same convex problem as the
other priors'; alpha and gamma maximize the profile likelihood (coordinate-wise, bounded Brent). A
month below 0 or above top has no mass (the draws' bound; the fit's pairs likewise). The draws are a
Gibbs sampler over (x_1, j_2, j_3), each step exact on the integer grid (x_1 given the changes, each
change given x_1), with the wage's Metropolis-Hastings coupling of the continuous chain.

Three measurements' knobs (off: every fit and draw as without them): PERSISTENCE, month 2's change kept in month 3
with a probability rho fitted per band (``Persisting``), SMOOTH_LEVEL, month 1's prior with smooth log
weights (``LevelFit``), and LEVEL_DIRECTION, a direction that depends on month 1's level (``directions``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit, log_ndtr

from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.deconvolve import (
    Likelihood,
    npmle_weights,
    pick_points,
    smooth_log_weights,
    softmax,
)
from gedp.postprocess.penalty_choice import chosen_penalty, held_out_fold_scores
from gedp.postprocess.wage_coupling import CurrentDensity, WageCoupling

if TYPE_CHECKING:
    from gedp.postprocess.implicates import PosteriorModel, Priors

#: Establishments whose answers' mean is below psi(WHOLE_SIZE) employees have whole-employee changes: the
#: BLS size classes' first bound (0-4 employees), where one employee's change in sqrt scale (0.24 at 4-5)
#: is under a third of the answers' difference sd (0.8) of the shipped plan.
WHOLE_SIZE = 5.0
#: The months' grid reaches this many answer sds above the largest answer of those establishments.
GRID_SDS = 6.0
#: Fewest establishments of a size band (edges below WHOLE_SIZE) with whole-change priors of its own.
MIN_WHOLE_BAND = 400
#: Month 1's whole-number prior reaches this many answer sds above the cut (``LevelFit``).
LEVEL_REACH = 3.0
#: Rounds of the changes' fits: the first each on its own answers' pairs, then each given the other's fit
#: (coordinate ascent of the three answers' likelihood: the third answer tells month 1 too).
JOINT_ROUNDS = 2
#: The direction's logit alpha and its slope gamma (per employee of the cell's implied change) searched in.
UP_LOGIT = (-4.0, 4.0)
CELL_SLOPE = (-2.0, 8.0)
#: Whether a month-2 change persists to month 3 with a probability rho fitted per band (``Persisting``; a
#: measurement's knob: False draws the two changes independent given month 1).
PERSISTENCE = False
#: The persistence rho searched in.
STAY = (0.0, 0.99)
#: Whether month 1's whole-number prior is smooth (``LevelFit``: log weights with a second-difference penalty
#: chosen by cross-validation, ``deconvolve.SmoothFit``'s) instead of the NPMLE (a measurement's knob).
SMOOTH_LEVEL = False
#: Whether a change's direction depends on month 1's level n too (``directions``; a measurement's knob): q(n) =
#: expit(alpha + gamma m + delta log n) for n >= 1 and q(0) = 1 (from no employees a change can only go up).
#: log n: hires that arrive at a rate that does not grow with the headcount and each employee leaving at a rate of
#: their own (a birth-death process) give P(up | change) = lambda / (lambda + mu n), a logit log(lambda / mu) - log n;
#: delta is estimated (-1 in that process), searched in LEVEL_SLOPE.
LEVEL_DIRECTION = False
LEVEL_SLOPE = (-6.0, 4.0)
#: alpha's range with the level term (the logit at one employee, where nearly every change can be up).
LEVEL_UP_LOGIT = (-6.0, 8.0)
#: The joint search's (Nelder-Mead over alpha, delta and with the cells' changes gamma: they are correlated, and a
#: coordinate search stopped 13 nats short on a simulated band) first steps and its tolerances.
LEVEL_STEP, LEVEL_TOLERANCE = 1.0, {"xatol": 0.02, "fatol": 0.01}


@dataclass
class LevelFit:
    """Month 1's prior on whole numbers among the establishments whose month-1 answer is below ``cut``: the NPMLE
    of G_sel(n), n = 0..reach, each answer's likelihood N(omega_1; psi(n)) / P(omega_1 < cut | n) (the answers
    are selected on omega_1), so that H(n) = G_sel(n) / P(omega_1 < cut | n) is the state's prior of month 1 up
    to a constant. ``reach``: LEVEL_REACH answer sds above the cut (further, the selection's likelihood is a
    spike at the cut that an NPMLE would use to explain answers there)."""

    likelihood: Likelihood
    log_selection: np.ndarray  # log P(omega_1 < cut | n), n = 0..reach
    weights: np.ndarray
    penalty: float | None = None  # SMOOTH_LEVEL: the penalty the answers chose (None: the NPMLE)

    @classmethod
    def of(cls, first: np.ndarray, sd: float, psi: NeighborFunction, cut: float) -> LevelFit:
        reach = int(np.ceil(float(psi.inverse(np.array([cut + LEVEL_REACH * sd]))[0])))
        log_selection = log_ndtr((cut - psi(np.arange(reach + 1.0))) / sd)
        log_lik = month_log_likelihood(first, sd, psi, reach) - log_selection[None, :]
        likelihood = Likelihood.of(np.exp(log_lik - log_lik.max(axis=1, keepdims=True)), basis=True)
        if not SMOOTH_LEVEL:
            return cls(likelihood, log_selection, npmle_weights(likelihood, np.ones(len(first))))
        counts, d = np.ones(likelihood.matrix.shape[0]), differences(reach)
        penalty = chosen_penalty(held_out_fold_scores(likelihood.matrix, counts, d))
        weights = softmax(smooth_log_weights(likelihood.matrix, counts, d, penalty))
        return cls(likelihood, log_selection, weights, penalty)

    def log_prior(self, weights: np.ndarray, top: int) -> np.ndarray:
        """log H(n), n = 0..top (-inf beyond the reach), of weights G_sel."""
        out = np.full(top + 1, -np.inf)
        reach = min(top, len(weights) - 1)
        with np.errstate(divide="ignore"):
            out[:reach + 1] = np.log(weights[:reach + 1]) - self.log_selection[:reach + 1]
        return out

    def replicate(self, rng: np.random.Generator) -> np.ndarray:
        """G_sel refitted on a Bayesian bootstrap of the answers, from the fitted weights (SMOOTH_LEVEL: the same
        penalty)."""
        counts = rng.exponential(size=self.likelihood.matrix.shape[0])
        if self.penalty is None:
            return npmle_weights(self.likelihood, counts, start=self.weights)
        start = np.log(np.maximum(self.weights, 1e-300))
        return softmax(smooth_log_weights(self.likelihood.matrix, counts, differences(len(self.weights) - 1),
                                          self.penalty, start))


def differences(top: int) -> np.ndarray:
    """The second differences of weights on 0..top (rows x top + 1)."""
    return np.diff(np.eye(top + 1), 2, axis=0)


def month_log_likelihood(omega: np.ndarray, sd: float, psi: NeighborFunction, top: int) -> np.ndarray:
    """log N(omega; psi(x), sd^2) up to a constant, rows x (x = 0..top)."""
    return -0.5 * ((omega[:, None] - psi(np.arange(top + 1.0))[None, :]) / sd) ** 2


def moves(weights: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The change's month given month 1 = n (0..top) by direction: A_up[x, n] = sum_s w_s [min(n + s, top) = x]
    and A_down[x, n] = sum_s w_s [max(n - s, 0) = x] (a change beyond the grid's ends stops there: a month of 0
    is an establishment that lost every employee)."""
    n, size = np.meshgrid(np.arange(top + 1), np.arange(1, top + 1), indexing="ij")
    up, down = np.zeros((top + 1, top + 1)), np.zeros((top + 1, top + 1))
    np.add.at(up, (np.minimum(n + size, top), n), weights[size])
    np.add.at(down, (np.maximum(n - size, 0), n), weights[size])
    return up, down


def given_first(like: np.ndarray, weights: np.ndarray, up: np.ndarray) -> np.ndarray:
    """sum_x P(x_k = x | x_1 = n) like[:, x], rows x n (``like``: rows x 0..top, the month's answer's likelihood;
    ``up``: each row's q, or rows x n: q at each month 1, ``directions``)."""
    rise, fall = moves(weights, like.shape[1] - 1)
    q = up[:, None] if up.ndim == 1 else up
    return weights[0] * like + q * (like @ rise) + (1 - q) * (like @ fall)


def correlate(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """rows x j = -top..top: sum_n u[:, n] v[:, clip(n + j, 0, top)]."""
    top = u.shape[1] - 1
    return shifted(u, v, range(-top, top + 1))


def shifted(u: np.ndarray, v: np.ndarray, changes: Sequence[int] | range) -> np.ndarray:
    """rows x j of ``changes``: sum_n u[:, n] v[:, clip(n + j, 0, top)]."""
    top = u.shape[1] - 1
    grid = np.arange(top + 1)
    return np.column_stack([np.einsum("ij,ij->i", u, v[:, np.clip(grid + j, 0, top)]) for j in changes])


def directions(up_logit: float, cell_slope: float, level_slope: float | None, movement: np.ndarray,
               top: int) -> np.ndarray:
    """Each row's probability q that a change is up: rows x 1, expit(alpha + gamma m) (``level_slope`` None: one
    direction whatever the level), or rows x n = 0..top, expit(alpha + gamma m + delta log n) and 1 at n = 0
    (LEVEL_DIRECTION)."""
    base = up_logit + cell_slope * np.asarray(movement, dtype=float)
    if level_slope is None:
        return expit(base)[:, None]
    logs = np.log(np.maximum(np.arange(top + 1.0), 1.0))
    q = expit(base[:, None] + level_slope * logs[None, :])
    q[:, 0] = 1.0
    return q


@dataclass
class Persisting:
    """PERSISTENCE: month 2's change persists to month 3 (x_3 = x_2) with probability rho, else month 3's change from
    month 1 is drawn from its prior, as is every month-3 change of an establishment without a month-2 change. The
    three answers' likelihood of a row, u(n) = G(n) N(omega_1; psi(n)), T_2 and C_3 the changes' sums over their
    month (``given_first``), S_2(n) = sum_{x != n} P_2(x | n) N_2(x) N_3(x):

        sum_n u(n) [rho S_2(n) + ((1 - rho) T_2(n) + rho w_2,0 N_2(n)) C_3(n)],

    linear in month 3's weights (its components (1 - rho) corr(u T_2) + rho (corr(u w_2,0 N_2) + sum_n u S_2),
    summing to 1) and in month 2's (the atom corr(u C_3), a change (1 - rho) corr(u C_3) + rho corr(u, N_2 N_3)):
    the same NPMLE, rho by the profile likelihood in month 3's fit."""

    correlation: np.ndarray  # the persisting term's ``correlate``
    constant: np.ndarray | None  # month 3's change: sum_n u(n) S_2(n) per row; month 2's: None

    @staticmethod
    def fit(u: np.ndarray, like: Sequence[np.ndarray], k: int, other: WholeFit, movement: np.ndarray) -> WholeFit:
        """Change k's (1: month 2's, 2: month 3's) fit given the other change's ``other``; ``u``: rows x n, ``like``:
        the three months' answers' likelihoods (rows x 0..top). Month 3's searches rho, month 2's holds other's."""
        assert other.weights is not None
        w, q = other.weights, other.up()
        if k == 2:
            both = like[1] * like[2]
            s2 = given_first(both, w, q) - w[0] * both
            main = correlate(u * given_first(like[1], w, q), like[2])
            part = Persisting(correlate(u * w[0] * like[1], like[2]), np.einsum("ij,ij->i", u, s2))
        else:
            main = correlate(u * given_first(like[2], w, q), like[1])
            part = Persisting(correlate(u, like[1] * like[2]), None)
        fit = WholeFit(main, np.asarray(movement, dtype=float), persist=part, stay=0.0 if k == 2 else other.stay)
        fit.search(bool(np.any(fit.movement != 0)))
        return fit


@dataclass
class WholeFit:
    """One change's whole-employee prior fitted on a band's answers (module docstring), kept for its replicates."""

    correlation: np.ndarray  # rows x j = -top..top: sum_n G(n) N(omega_1; psi(n)) N(omega_k; psi(clip(n + j)))
    movement: np.ndarray  # rows: m, the cell's implied change in employees
    up_logit: float = 0.0
    cell_slope: float = 0.0
    weights: np.ndarray | None = None
    likelihood: Likelihood | None = None
    persist: Persisting | None = None  # PERSISTENCE: the other change's persisting part (None: independent)
    stay: float = 0.0  # rho, the probability that a month-2 change persists to month 3
    level_slope: float | None = None  # LEVEL_DIRECTION: delta (None: one direction whatever month 1's level)
    parts: tuple[np.ndarray, np.ndarray] | None = None  # LEVEL_DIRECTION: u and v (rows x 0..top), ``components``

    @classmethod
    def of(cls, first: np.ndarray, later: np.ndarray, sds: tuple[float, float], level: np.ndarray,
           psi: NeighborFunction, movement: np.ndarray, other: np.ndarray | None = None,
           start: WholeFit | None = None) -> WholeFit:
        """The fit of answers ``first`` (month 1) and ``later`` (month k) with sds ``sds``, month 1's prior
        ``level`` (log H on 0..top), the cells' implied changes ``movement`` and ``other`` (rows x n: the other
        change's month's likelihood given month 1 = n, ``given_first``; None: left out); with LEVEL_DIRECTION
        the search starts at ``start``'s parameters (the change's fit of the round before; None: ``search``)."""
        top = len(level) - 1
        u = np.exp(month_log_likelihood(first, sds[0], psi, top) + level[None, :])
        if other is not None:
            u = u * other
        v = np.exp(month_log_likelihood(later, sds[1], psi, top))
        u, v = u / u.max(axis=1, keepdims=True), v / v.max(axis=1, keepdims=True)
        fit = cls(correlate(u, v), np.asarray(movement, dtype=float))
        if LEVEL_DIRECTION:
            fit.level_slope, fit.parts = 0.0, (u, v)
        fit.search(bool(np.any(fit.movement != 0)), start)
        return fit

    def components(self, up_logit: float, cell_slope: float, stay: float | None = None,
                   level: float | None = None) -> np.ndarray:
        """The likelihood of each row under each component (the atom, then sizes 1..top) at (alpha, gamma) and,
        with ``persist``, rho (``stay``; None: the fit's); with LEVEL_DIRECTION at delta (``level``; None: the
        fit's): sum_n u(n) [q(n) v(n + s), (1 - q(n)) v(n - s)] from ``parts``."""
        if self.parts is not None:
            u, v = self.parts
            top = u.shape[1] - 1
            q = directions(up_logit, cell_slope, self.level_slope if level is None else level, self.movement, top)
            return np.column_stack([self.correlation[:, top], shifted(u * q, v, range(1, top + 1))
                                    + shifted(u * (1 - q), v, range(-1, -top - 1, -1))])
        q = expit(up_logit + cell_slope * self.movement)[:, None]

        def mix(correlation: np.ndarray) -> np.ndarray:
            top = (correlation.shape[1] - 1) // 2
            up, down = correlation[:, top + 1:], correlation[:, top - 1::-1]
            return np.column_stack([correlation[:, top], q * up + (1 - q) * down])

        out = mix(self.correlation)
        if self.persist is None:
            return out
        rho, part = self.stay if stay is None else stay, mix(self.persist.correlation)
        if self.persist.constant is not None:
            return (1 - rho) * out + rho * (part + self.persist.constant[:, None])
        out[:, 1:] = (1 - rho) * out[:, 1:] + rho * part[:, 1:]
        return out

    def profile(self, up_logit: float, cell_slope: float, stay: float | None = None, level: float | None = None,
                start: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """The log-likelihood at the NPMLE of w given (alpha, gamma) (and rho, delta), and that w (the solver
        started at ``start``: the weights of nearby parameters)."""
        matrix = self.components(up_logit, cell_slope, stay, level)
        weights = npmle_weights(matrix, np.ones(len(matrix)), start=start)
        return float(np.log(np.maximum(matrix @ weights, 1e-300)).sum()), weights

    def search(self, with_cells: bool, start: WholeFit | None = None) -> None:
        """alpha (and with the cells' changes gamma, then alpha again; with month 3's ``persist`` rho, then alpha
        again) maximizing the profile likelihood; with LEVEL_DIRECTION alpha, then (alpha, delta, gamma) jointly
        (``joint_search``; from ``start``'s parameters without alpha's search first)."""
        def best(function, bounds) -> float:
            return float(minimize_scalar(function, bounds=bounds, method="bounded", options={"xatol": 0.02}).x)

        bounds = UP_LOGIT if self.level_slope is None else LEVEL_UP_LOGIT
        if self.level_slope is None or start is None:
            self.up_logit = best(lambda a: -self.profile(a, self.cell_slope)[0], bounds)
        if self.level_slope is not None:
            self.joint_search(with_cells, bounds, start)
        elif with_cells:
            self.cell_slope = best(lambda g: -self.profile(self.up_logit, g)[0], CELL_SLOPE)
            self.up_logit = best(lambda a: -self.profile(a, self.cell_slope)[0], bounds)
        if self.persist is not None and self.persist.constant is not None:
            self.stay = best(lambda r: -self.profile(self.up_logit, self.cell_slope, r)[0], STAY)
            self.up_logit = best(lambda a: -self.profile(a, self.cell_slope)[0], bounds)
        self.likelihood = Likelihood.of(self.components(self.up_logit, self.cell_slope), basis=True)
        self.weights = npmle_weights(self.likelihood, np.ones(len(self.movement)))

    def joint_search(self, with_cells: bool, bounds: tuple[float, float], fitted: WholeFit | None = None) -> None:
        """LEVEL_DIRECTION: (alpha, delta) and with the cells' changes gamma maximizing the profile likelihood
        (bounded Nelder-Mead from alpha's search, delta = gamma = 0, or from ``fitted``'s parameters with a quarter
        of the first steps; each profile's solver started at the weights of the point before)."""
        if fitted is None:
            start, step = np.array([self.up_logit, 0.0, 0.0]), LEVEL_STEP
        else:
            start, step = np.array([fitted.up_logit, fitted.level_slope or 0.0, fitted.cell_slope]), LEVEL_STEP / 4
        start = start[:3 if with_cells else 2]
        simplex = np.vstack([start, start + step * np.eye(len(start))])
        last: list[np.ndarray] = []

        def loss(p: np.ndarray) -> float:
            value, weights = self.profile(p[0], p[2] if with_cells else self.cell_slope, level=p[1],
                                          start=last[-1] if last else None)
            last[:] = [weights]
            return -value

        found = minimize(loss, start, method="Nelder-Mead", bounds=[bounds, LEVEL_SLOPE, CELL_SLOPE][:len(start)],
                         options={**LEVEL_TOLERANCE, "initial_simplex": simplex}).x
        self.up_logit, self.level_slope = float(found[0]), float(found[1])
        if with_cells:
            self.cell_slope = float(found[2])

    def up(self) -> np.ndarray:
        """Each row's q (the probability that a change is up; with LEVEL_DIRECTION rows x month 1, ``directions``)."""
        if self.parts is None:
            return expit(self.up_logit + self.cell_slope * self.movement)
        return directions(self.up_logit, self.cell_slope, self.level_slope, self.movement, self.parts[0].shape[1] - 1)

    def replicate(self, rng: np.random.Generator) -> np.ndarray:
        """w refitted on a Bayesian bootstrap of the rows (alpha and gamma held), from the fitted w."""
        assert self.likelihood is not None and self.weights is not None
        return npmle_weights(self.likelihood, rng.exponential(size=len(self.movement)), start=self.weights)


class WholeChanges:
    """The whole-change model of a state's smallest establishments (module docstring): which they are, their
    bands, the cells' implied changes, the fits and their draws."""

    def __init__(self, model: PosteriorModel) -> None:
        if PERSISTENCE and LEVEL_DIRECTION:
            raise ValueError("whole_changes.PERSISTENCE and LEVEL_DIRECTION are not built together")
        a, psi = model.answers, model.psi
        self.model = model
        first = a.months[:, 0]
        self.small = first < float(psi(np.array([WHOLE_SIZE]))[0])
        edges = psi(np.array([e for e in (2.0,) if e < WHOLE_SIZE]))
        band = np.searchsorted(edges, first)
        counts = np.bincount(band[self.small], minlength=len(edges) + 1)
        self.band = np.where(self.small, band if counts.min() >= MIN_WHOLE_BAND else 0, -1)
        top_answer = float(a.months[self.small].max(initial=float(psi.at_zero)))
        self.top = int(np.ceil(float(psi.inverse(np.array([top_answer + GRID_SDS * float(a.month_sd.max())]))[0])))
        floor = float(psi.at_zero) if np.isfinite(psi.at_zero) else float(first.min())
        offset = model.change_offset if model.change_offset is not None else np.zeros((len(first), 2))
        at = np.maximum(first, floor)
        self.movement = psi.inverse(at[:, None] + offset) - psi.inverse(at)[:, None]
        cut = float(psi(np.array([WHOLE_SIZE]))[0])
        self.level = LevelFit.of(first[self.small], float(a.month_sd[0]), psi, cut)
        level = self.level.log_prior(self.level.weights, self.top)
        sd = [float(s) for s in a.month_sd]
        self.fits: dict[tuple[int, int], WholeFit] = {}
        for b in range(int(self.band.max()) + 1):
            rows = self.band == b
            like = [np.exp(month_log_likelihood(a.months[rows, k], sd[k], psi, self.top)) for k in range(3)]
            u = np.exp(month_log_likelihood(a.months[rows, 0], sd[0], psi, self.top) + level[None, :])
            u /= u.max(axis=1, keepdims=True)
            for round in range(JOINT_ROUNDS):
                for k in ((2, 1) if PERSISTENCE and round > 0 else (1, 2)):
                    fit = None if round == 0 else self.fits[(b, 3 - k)]
                    if PERSISTENCE and fit is not None:
                        self.fits[(b, k)] = Persisting.fit(u, like, k, fit, self.movement[rows, k - 1])
                        continue
                    other = None if fit is None else given_first(like[3 - k], fit.weights, fit.up())
                    self.fits[(b, k)] = WholeFit.of(a.months[rows, 0], a.months[rows, k], (sd[0], sd[k]), level, psi,
                                                    self.movement[rows, k - 1], other, self.fits.get((b, k)))

    def weights(self, rng: np.random.Generator | None = None) -> dict:
        """Each fit's weights, month 1's ("level") and each change's ((band, k)); with ``rng`` a bootstrap
        replicate of each."""
        fits: dict = {"level": self.level, **self.fits}
        return {key: fit.weights if rng is None else fit.replicate(rng) for key, fit in fits.items()}

    def summary(self) -> dict:
        """The fitted whole-change priors in public numbers."""
        bands = int(self.band.max()) + 1
        return {"whole_changes": {
            "below_employees": WHOLE_SIZE, "establishments": int(self.small.sum()),
            "no_change_share": [[round(float(self.fits[(b, k)].weights[0]), 4) for k in (1, 2)] for b in range(bands)],
            "up_logit": [[round(self.fits[(b, k)].up_logit, 3) for k in (1, 2)] for b in range(bands)],
            "cell_slope": [[round(self.fits[(b, k)].cell_slope, 3) for k in (1, 2)] for b in range(bands)],
            **({"level_slope": [[round(float(self.fits[(b, k)].level_slope), 3) for k in (1, 2)] for b in range(bands)]}
               if LEVEL_DIRECTION else {}),
            **({"persistence": [round(self.fits[(b, 2)].stay, 4) for b in range(bands)]} if PERSISTENCE else {})}}

    def chain(self, rows: np.ndarray, rng: np.random.Generator, burn_in: int, count: int, thin: int,
              priors: Sequence[Priors] | None) -> Iterator[np.ndarray]:
        """``PosteriorModel.months_chain`` with the smallest establishments drawn here (``whole_chain``) and the
        others by the model's own chain."""
        model = self.model
        rows = np.asarray(rows)
        rows = np.flatnonzero(rows) if rows.dtype == bool else rows
        small = self.small[rows]
        others = (model.months_chain(rows[~small], rng, burn_in, count, thin, priors, whole=False)
                  if (~small).any() else None)
        coupling = WageCoupling(model, rows[small]) if model.priors.wage_table is not None and small.any() else None
        mine = whole_chain(self, rows[small], rng, burn_in, count, thin, priors, coupling)
        for _ in range(count):
            out = np.empty((len(rows), 3))
            out[small] = next(mine)
            if others is not None:
                out[~small] = next(others)
            yield out


def whole_chain(whole: WholeChanges, rows: np.ndarray, rng: np.random.Generator, burn_in: int, count: int,
                thin: int, priors: Sequence[Priors] | None, coupling: WageCoupling | None) -> Iterator[np.ndarray]:
    """``count`` draws of the whole months (rows x 3) of the smallest establishments ``rows``, after ``burn_in``
    sweeps and ``thin`` sweeps apart, draw j under ``priors[j]`` (the fitted without). Given the months' answers
    the posterior of (x_1, x_2, x_3) is drawn exactly each sweep (x_1 from p(x_1 | answers), whose likelihood
    sums each change over the grid: G(x_1) N(omega_1) prod_k sum_x P(x_k = x | x_1) N(omega_k; psi(x)), then
    each x_k given x_1); with the wage ``coupling`` that draw is an independence Metropolis-Hastings proposal
    accepted with the ratio of the wage's densities at the new and the current average employment."""
    model, top = whole.model, whole.top
    omega, sd = model.answers.months[rows], model.answers.month_sd
    log_lik = [month_log_likelihood(omega[:, k], float(sd[k]), model.psi, top) for k in range(3)]
    like = [np.exp(part - part.max(axis=1, keepdims=True)) for part in log_lik]
    x = np.stack([np.argmax(part, axis=1) for part in log_lik], axis=1)
    band = whole.band[rows]
    stay = np.array([whole.fits[(b, 2)].stay if getattr(whole.fits[(b, 2)], "persist", None) is not None else -1.0
                     for b in range(int(band.max(initial=0)) + 1)])[band]
    persist = bool(len(stay)) and bool((stay >= 0).all())
    sweeps = 0
    for j in range(count):
        prior = model.priors if priors is None else priors[j]
        if coupling is not None:
            coupling.priors = prior
        weights = prior.whole if prior.whole is not None else whole.weights()
        log_first = whole.level.log_prior(weights["level"], top)[None, :] + log_lik[0]
        tables, given = [], []  # per change: (w_0, q, A_up, A_down) of each row's band; T_k
        stays = np.zeros((len(rows), top + 1))  # PERSISTENCE: S_2 (``Persisting``)
        for k in (1, 2):
            given.append(np.empty((len(rows), top + 1)))
            parts = {}
            for b in np.unique(band):
                at, fit = band == b, whole.fits[(int(b), k)]
                w = weights[(int(b), k)]
                q = directions(fit.up_logit, fit.cell_slope, fit.level_slope, whole.movement[rows[at], k - 1], top)
                given[-1][at] = given_first(like[k][at], w, q)
                if persist and k == 1:
                    both = like[1][at] * like[2][at]
                    stays[at] = given_first(both, w, q) - w[0] * both
                parts[int(b)] = (w[0], q, *moves(w, top), at)
            tables.append(parts)
        if persist:
            w20 = np.zeros(len(rows))
            for w0, _, _, _, at in tables[0].values():
                w20[at] = w0
            rho = stay[:, None]
            total = rho * stays + ((1 - rho) * given[0] + rho * w20[:, None] * like[1]) * given[1]
            log_first = log_first + np.log(np.maximum(total, 1e-300))
        else:
            log_first = log_first + np.log(np.maximum(given[0], 1e-300)) + np.log(np.maximum(given[1], 1e-300))
        for _ in range(burn_in if sweeps == 0 else thin):
            state = None if coupling is None else CurrentDensity.of(coupling, x.mean(axis=1))
            first = pick_points(np.ascontiguousarray(log_first.T), rng)
            proposal = np.column_stack([first, first, first])
            for k in (1, 2):
                chance = np.empty((len(rows), top + 1))
                for w0, q, up, down, at in tables[k - 1].values():
                    q = q if q.shape[1] == 1 else q[np.arange(len(q)), first[at]][:, None]  # q at the drawn month 1
                    chance[at] = q * up.T[first[at]] + (1 - q) * down.T[first[at]]
                    index = np.flatnonzero(at)
                    chance[index, first[index]] += w0
                logit = np.log(np.maximum(chance, 1e-300)) + log_lik[k]
                if persist:
                    logit = persisting(logit, k, first, proposal[:, 1], stay, like[2], given[1], log_lik[2])
                proposal[:, k] = pick_points(np.ascontiguousarray(logit.T), rng)
            x = accepted(state, x, proposal, rng)
            if coupling is not None and state is not None:
                coupling.redraw(state.average, rng)
            sweeps += 1
        yield x.astype(float)


def persisting(logit: np.ndarray, k: int, first: np.ndarray, second: np.ndarray, stay: np.ndarray, like3: np.ndarray,
               given3: np.ndarray, log_lik3: np.ndarray) -> np.ndarray:
    """PERSISTENCE (``Persisting``): the log weights of change k's month given month 1 ``first`` (and month 2
    ``second``) from ``logit``, its weights were the changes independent: month 2's times rho N_3(x) + (1 - rho)
    C_3(x_1) where x != x_1 (C_3(x_1) where x = x_1); month 3's, where month 2 changed, times (1 - rho) plus rho
    N_3(x_2) at x = x_2."""
    rows = np.arange(len(first))
    rho = stay[:, None]
    if k == 1:
        factor = rho * like3 + (1 - rho) * given3[rows, first][:, None]
        factor[rows, first] = given3[rows, first]
        return logit + np.log(np.maximum(factor, 1e-300))
    changed = second != first
    out = logit + np.where(changed, np.log1p(-np.minimum(stay, 1 - 1e-12)), 0.0)[:, None]
    with np.errstate(divide="ignore"):
        keep = np.log(stay) + log_lik3[rows, second]
    out[rows[changed], second[changed]] = np.logaddexp(out[rows[changed], second[changed]], keep[changed])
    return out


def accepted(state: CurrentDensity | None, x: np.ndarray, proposal: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The proposal where the wage's Metropolis-Hastings step accepts it (its density ratio at the new and the
    current average employment; every proposal without a coupling)."""
    if state is None:
        return proposal
    average = proposal.mean(axis=1)
    density = state.coupling.log_density(average)
    accept = np.log(rng.random(len(x))) < np.nan_to_num(density - state.density, nan=0.0)
    state.accept(accept, average, density)
    return np.where(accept[:, None], proposal, x)
