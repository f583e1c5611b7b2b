"""Deconvolution priors and exact draws from their posteriors.

A release measures each establishment's value x through a Gaussian in the neighbour function's scale,
omega = psi(x) + N(0, sd^2), with sd public. The distribution of theta = psi(x) over establishments
is estimated from the omegas alone by a nonparametric maximum likelihood estimate (Kiefer and
Wolfowitz 1956) of a Gaussian mixture on a fixed grid: the marginal density of an answer is
sum_k w_k N(omega; t_k, h_k^2 + sd^2), with atoms (h_k = 0) where a point mass is real (no change,
zero employment) and a small bandwidth h_k elsewhere (a smooth density between the grid's points).
The weights w maximize a concave log-likelihood over the simplex (Koenker and Mizera 2014); they are
found by a primal interior-point method (Newton steps on the log-barrier problem), to within a
certified gap, on answers binned to a width far below sd. EM (Jiang and Zhang 2009) increases the same
likelihood but crawls along its flat directions: where an atom and mass just beside it are hard to tell
apart (no change against a change of one employee), 400 EM steps from uniform weights stopped far from
the optimum, always on the side of the uniform start (a bias of the prior, not noise).

With a Gaussian-mixture prior and a Gaussian likelihood the posterior is again a Gaussian mixture,
so draws are exact (no grid, no MCMC): pick a component with its posterior weight, then draw from its
Gaussian truncated below at the value's lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs
from scipy.special import log_ndtr, ndtr, ndtri

from gedp.postprocess.structured import one_blas_thread

#: A fit stops when its log-likelihood is provably within this many nats of the optimum (over all answers).
GAP_NATS = 0.01
#: Newton steps of one barrier weight at most, the barrier weight's first value (per component) and its fall.
NEWTON_STEPS = 100
FIRST_BARRIER = 1e-2
BARRIER_FALL = 30.0
#: Barrier weights of one fit at most: falling by BARRIER_FALL from FIRST_BARRIER / components to its
#: end GAP_NATS / answers / components, a fit of n answers takes log(n) / log(30) + 1 (12 for 1e15).
MAX_BARRIER_STEPS = 100
#: A warm start's weights are mixed with this share of uniform weights (components the start has not:
#: weight 0 is outside the barrier's domain). Small: the start's near-zero weights stay near zero,
#: where they are at the optimum (1e-2 had cost 40% more Newton steps on Rhode Island's replicates).
START_MIX = 1e-4
#: Bins per answer sd when answers are binned for a fit.
BINS_PER_SD = 10
#: Likelihood sds around an answer within which a draw's components are looked at.
WINDOW_SDS = 7.0
#: An atom's truncation z is ATOM_SCALE (its mean - the bound) + 9: at least 9 on or above the bound
#: (Phi = 1), hugely negative below it (Phi = 0).
ATOM_SCALE = 1e300
#: Rows of one block of a mixture draw (its points x rows arrays stay in the processor's cache).
DRAW_BLOCK = 4096
#: Singular values of a likelihood matrix kept in its basis (``Likelihood``), relative to the largest.
BASIS_TOLERANCE = 1e-10
#: A mixture's components whose weight is below this are dropped after a fit.
NEGLIGIBLE_WEIGHT = 1e-7


@dataclass(frozen=True)
class Mixture:
    """A prior: a Gaussian mixture (``sds`` 0 for atoms) with its weights (summing to 1)."""

    means: np.ndarray
    sds: np.ndarray
    weights: np.ndarray

    def mass_at(self, value: float) -> float:
        """The weight of the atom at ``value`` (0 without one)."""
        return float(self.weights[(self.sds == 0) & (self.means == value)].sum())

    def on(self, means: np.ndarray, sds: np.ndarray) -> np.ndarray:
        """The weights of the components (means, sds) in this mixture (0 for those it has not)."""
        index = {(float(m), float(s)): w for m, s, w in zip(self.means, self.sds, self.weights)}
        return np.array([index.get((float(m), float(s)), 0.0) for m, s in zip(means, sds)])

    def pruned(self) -> Mixture:
        """The mixture without its negligible components."""
        kept = self.weights > NEGLIGIBLE_WEIGHT
        return Mixture(self.means[kept], self.sds[kept], self.weights[kept] / self.weights[kept].sum())


def fit_mixture(observed: np.ndarray, sd: float, means: np.ndarray, sds: np.ndarray,
                rng: np.random.Generator | None = None, start: Mixture | None = None) -> Mixture:
    """The NPMLE of a Gaussian-mixture prior on fixed components from answers ``observed`` =
    theta + N(0, sd^2): the weights maximizing sum_i log sum_k w_k N(observed_i; means_k, sds_k^2 + sd^2).

    With ``rng``, a Bayesian bootstrap replicate of it (Rubin 1981): each answer weighted by an Exp(1)
    draw (a bin of c answers by a Gamma(c) draw), a draw of the prior from its posterior under a
    Dirichlet model of the answers' distribution. ``start``: a fit of the same components (the
    fit of all answers, for a replicate) to start from.

    Raises:
        ValueError: no finite answer, or sd not positive.
    """
    return MixtureFit.of(observed, sd, means, sds).solve(rng, start)


@dataclass(frozen=True)
class MixtureFit:
    """What a mixture prior's fit needs from its answers (binned) and components, kept so that its
    bootstrap replicates reuse it (``fit_mixture``)."""

    means: np.ndarray
    sds: np.ndarray
    counts: np.ndarray
    likelihood: Likelihood

    @classmethod
    def of(cls, observed: np.ndarray, sd: float, means: np.ndarray, sds: np.ndarray, basis: bool = False) -> MixtureFit:
        """The fit of answers ``observed`` (sd ``sd``) on components (``means``, ``sds``); with ``basis``,
        its likelihood's low-rank basis too (for a fit solved many times)."""
        observed = np.asarray(observed, dtype=float)
        observed = observed[np.isfinite(observed)]
        if observed.size == 0:
            raise ValueError("a prior needs at least one finite answer")
        if not sd > 0:
            raise ValueError(f"answer sd ({sd}) must be > 0")
        centers, counts = binned(observed, sd / BINS_PER_SD)
        means, sds = np.asarray(means, dtype=float), np.asarray(sds, dtype=float)
        spread = np.sqrt(sds**2 + sd * sd)
        likelihood = np.exp(-0.5 * ((centers[:, None] - means[None, :]) / spread) ** 2) / spread
        return cls(means, sds, counts, Likelihood.of(likelihood, basis=basis))

    def solve(self, rng: np.random.Generator | None = None, start: Mixture | None = None) -> Mixture:
        """The NPMLE (with ``rng``, a Bayesian bootstrap replicate of it, started from ``start``)."""
        counts = self.counts if rng is None else rng.gamma(self.counts)
        begin = None if start is None else start.on(self.means, self.sds)
        return Mixture(self.means, self.sds, npmle_weights(self.likelihood, counts, start=begin)).pruned()


def binned(values: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
    """Occupied bins of ``width`` (their centers, the mean of their values) and their counts; of
    points (rows x coordinates: bins of ``width`` in each coordinate) as of numbers."""
    if values.ndim == 2:
        index = np.floor((values - values.min(axis=0)) / width).astype(np.int64)
        _, inverse, counts = np.unique(index, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.ravel()
        sums = np.column_stack([np.bincount(inverse, weights=column) for column in values.T])
        return sums / counts[:, None], counts.astype(float)
    index = np.floor((values - values.min()) / width).astype(np.int64)
    occupied, inverse, counts = np.unique(index, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=values, minlength=occupied.size)
    return sums / counts, counts.astype(float)


def em_weights(likelihood: np.ndarray, counts: np.ndarray, iterations: int) -> np.ndarray:
    """EM for mixture weights with fixed components: ``likelihood`` (answers x components), each
    answer (row) counted ``counts`` times; rows of zero likelihood everywhere are left out."""
    keep = likelihood.max(axis=1) > 0
    likelihood, counts = likelihood[keep], counts[keep]
    likelihood = likelihood / likelihood.max(axis=1, keepdims=True)  # each row's scale does not matter
    weights = np.full(likelihood.shape[1], 1.0 / likelihood.shape[1])
    share = counts / counts.sum()
    for _ in range(iterations):
        weights = weights * (likelihood.T @ (share / (likelihood @ weights)))
    return weights / weights.sum()


@dataclass(frozen=True)
class Likelihood:
    """A likelihood matrix (answers x components) made ready for fits: the rows of zero likelihood
    everywhere left out (``kept``: which were kept), each row scaled to its largest value; with a
    ``basis``, also U (rows x r, orthonormal columns) and C (r x components) with L = U C to
    BASIS_TOLERANCE of its largest singular value, the Newton steps' Hessian computed through them
    (r is a third of the components or fewer on smooth likelihoods: a fit solved many times, as a
    bootstrap's replicates are, pays the decomposition once)."""

    matrix: np.ndarray
    kept: np.ndarray
    basis: np.ndarray | None = None
    coefficients: np.ndarray | None = None

    @classmethod
    def of(cls, likelihood: np.ndarray, basis: bool = False) -> Likelihood:
        kept = likelihood.max(axis=1) > 0
        matrix = likelihood[kept] / likelihood[kept].max(axis=1, keepdims=True)
        if not basis or min(matrix.shape) < 2:
            return cls(matrix, kept)
        with one_blas_thread:  # a small dense factorization: BLAS threads only wait for each other
            u, singular, vt = np.linalg.svd(matrix, full_matrices=False)
        rank = int((singular > singular[0] * BASIS_TOLERANCE).sum())
        return cls(matrix, kept, np.ascontiguousarray(u[:, :rank]), singular[:rank, None] * vt[:rank])

    def hessian(self, weights: np.ndarray, share: np.ndarray, fitted: np.ndarray) -> np.ndarray:
        """W L' diag(share / fitted^2) L W (one symmetric product, BLAS syrk, of rows x components or of
        rows x r through the basis)."""
        root = (np.sqrt(share) / fitted)[:, None]
        if self.basis is None:
            scaled = self.matrix * weights[None, :] * root
            return scaled.T @ scaled
        inner = self.basis * root
        along = self.coefficients * weights[None, :]
        return along.T @ ((inner.T @ inner) @ along)


def npmle_weights(likelihood: np.ndarray | Likelihood, counts: np.ndarray, gap_nats: float = GAP_NATS,
                  start: np.ndarray | None = None) -> np.ndarray:
    """Mixture weights w on the simplex maximizing sum_i counts_i log (likelihood_i . w), ``likelihood``
    answers x components (or made ready, ``Likelihood.of``); rows of zero likelihood everywhere are
    left out.

    A primal interior-point method: Newton steps (with the equality sum w = 1) on the objective less
    barrier * sum log w, the barrier divided by BARRIER_FALL once a Newton decrement is negligible,
    down to the value whose central-path point is within ``gap_nats`` of the optimum (components x
    barrier x answers, the barrier problem's duality gap). ``start``: weights near the optimum (a fit
    of the same components to similar answers), from which Newton's method goes to that value at once."""
    _check_fit_input(counts, gap_nats, start)
    if not isinstance(likelihood, Likelihood):
        likelihood = Likelihood.of(likelihood)
    counts = counts[likelihood.kept]
    share = counts / counts.sum()
    m = likelihood.matrix.shape[1]
    final = gap_nats / counts.sum() / m
    with one_blas_thread:  # small dense factorizations: BLAS threads only wait for each other
        return _central_path(likelihood, share, start, final, gap_nats / counts.sum())


def _check_fit_input(counts: np.ndarray, gap_nats: float, start: np.ndarray | None) -> None:
    """A fit's inputs finite: counts >= 0 of a positive sum, start weights finite and >= 0, a gap > 0
    (a NaN count made the barrier weight's end NaN, which no barrier weight reaches: the path never
    ended; a likelihood's NaN is no such loop: the barrier weight still falls to its end)."""
    from gedp.errors import InputError

    counts = np.asarray(counts, dtype=np.float64)
    if not (np.isfinite(counts).all() and (counts >= 0).all() and counts.sum() > 0):
        raise InputError("a deconvolution's counts must be finite numbers >= 0, not all 0 (NaN or infinite "
                         "answers?)")
    if not (math.isfinite(gap_nats) and gap_nats > 0):
        raise InputError(f"a deconvolution's gap must be a finite number > 0, not {gap_nats!r}")
    if start is not None and not (np.isfinite(start).all() and (start >= 0).all() and start.sum() > 0):
        raise InputError("a deconvolution's start weights must be finite numbers >= 0, not all 0")


def _central_path(likelihood: Likelihood, share: np.ndarray, start: np.ndarray | None, final: float,
                  enough: float) -> np.ndarray:
    """The barrier problem's optimum followed from its start down to the barrier weight ``final``, or
    until the weights certify a gap of ``enough`` (mean log-likelihood) by themselves; from a ``start``
    (the central point of a nearby problem), Newton's method goes to ``final`` at once (the
    intermediate barrier weights cost as many steps as they save). The barrier weight falls by
    BARRIER_FALL per step, so it reaches ``final`` (> 0, finite: ``_check_fit_input``) within
    log(first / final) / log(BARRIER_FALL) + 1 steps; MAX_BARRIER_STEPS more is a SolverError."""
    m = likelihood.matrix.shape[1]
    if start is None:
        weights, barrier = np.full(m, 1.0 / m), FIRST_BARRIER / m
    else:
        weights, barrier = (1.0 - START_MIX) * start / start.sum() + START_MIX / m, final
    for _ in range(MAX_BARRIER_STEPS):
        weights, certified = _barrier_optimum(likelihood, share, weights, barrier, enough)
        if certified or barrier <= final:
            return weights / weights.sum()
        barrier = max(barrier / BARRIER_FALL, final)
    from gedp.errors import SolverError

    raise SolverError(f"a deconvolution's barrier weight did not reach {final:.3g} in {MAX_BARRIER_STEPS} steps "
                      f"(it was {barrier:.3g})")


def _barrier_optimum(likelihood: Likelihood, share: np.ndarray, weights: np.ndarray, barrier: float,
                     enough: float) -> tuple[np.ndarray, bool]:
    """Newton's method with backtracking for min -share . log(L w) - barrier * sum log w, sum w = 1;
    stopped early (and True) once the weights certify that the mean log-likelihood is within ``enough``
    of its optimum: f* - f(w) <= max_k g_k - 1 for f concave on the simplex, g its gradient (sum_k
    w_k g_k = 1; Frank-Wolfe's duality gap), whatever the barrier weight."""
    matrix = likelihood.matrix
    for _ in range(NEWTON_STEPS):
        fitted = matrix @ weights
        score = matrix.T @ (share / fitted)
        if float(score.max()) - 1.0 <= enough:
            return weights, True
        gradient = -score - barrier / weights
        # The Newton step on {sum w = 1} in the scaled variable u = step / w (its Hessian W H W is
        # barrier * I plus a positive semidefinite part: well conditioned however small some w are):
        # W H W u = -W gradient - nu w, nu such that w . u = 0.
        hessian = likelihood.hessian(weights, share, fitted)
        np.einsum("ii->i", hessian)[...] += barrier  # the diagonal, a view of it
        factor, info = dpotrf(hessian, lower=0, clean=0)
        if info != 0:
            raise np.linalg.LinAlgError(f"a Newton step's Hessian is not positive definite (LAPACK info {info})")
        solved, _ = dpotrs(factor, np.array([weights * gradient, weights]).T)  # Fortran order: not copied
        along, across = solved[:, 0], solved[:, 1]
        step = weights * (across * ((weights @ along) / (weights @ across)) - along)
        decrement = float(-gradient @ step)
        if decrement < 1e-3 * barrier:
            break
        with np.errstate(divide="ignore", invalid="ignore"):  # the rows not falling are masked
            limit = float(np.where(step < 0, -weights / step, np.inf).min())
        t = min(1.0, 0.99 * limit) if limit < np.inf else 1.0
        along_step = (share, fitted, matrix @ step, weights, step, barrier)  # L (w + t step) = L w + t L step
        start = _objective(share, fitted, weights, barrier)
        while _objective_along(t, *along_step) > start - 0.25 * t * decrement and t > 1e-12:
            t /= 2
        weights = weights + t * step
    return weights, False


def _objective(share: np.ndarray, fitted: np.ndarray, weights: np.ndarray, barrier: float) -> float:
    """The barrier problem's objective at the weights (``fitted`` = L weights): ``_objective_along`` at t = 0
    (fitted + 0 L step is fitted, bit for bit)."""
    return float(-share @ np.log(fitted) - barrier * np.log(weights).sum())


def _objective_along(t: float, share: np.ndarray, fitted: np.ndarray, moved: np.ndarray, weights: np.ndarray,
                     step: np.ndarray, barrier: float) -> float:
    """The barrier problem's objective at weights + t step (``fitted`` = L weights, ``moved`` = L step)."""
    return float(-share @ np.log(fitted + t * moved) - barrier * np.log(weights + t * step).sum())


def draw_posterior(center: np.ndarray, sd: np.ndarray, prior: Mixture, lower: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Exact draws of theta from prior(theta) N(center; theta, sd^2) restricted to theta >= lower,
    one per row (``center``, ``sd``, ``lower`` of one length; sd > 0).

    The posterior is the mixture of the components' posteriors, component k (mean m_k, sd s_k, weight
    w_k) with weight w_k N(center; m_k, s_k^2 + sd^2) P(its posterior >= lower): a component is
    picked with that weight (inverse CDF), then its Gaussian posterior is drawn truncated at the bound.
    Each row looks at its components within WINDOW_SDS sds of its likelihood's peak within the bound
    (the center, or the bound when it is above the center: further components have less than
    exp(-WINDOW_SDS^2 / 2) = 2e-11 of the likelihood of one there; ``ComponentTable``); rows
    of one sd share the components' constants (the sd is one public number per month), and the
    truncation's factor is computed only for rows whose bound comes within 9 posterior sds of a
    component's posterior mean (elsewhere it is 1 in double precision). A row whose every component
    lies below its lower bound (possible only far in a tail) draws from its likelihood alone,
    truncated at the bound."""
    center, sd, lower = (np.asarray(a, dtype=float) for a in (center, sd, lower))
    u = rng.random(len(center))
    if len(center) == 0:
        return truncated_normal(center, sd, lower, rng)
    mean, spread = np.empty(len(center)), np.empty(len(center))
    for value in np.unique(sd):
        rows = np.flatnonzero(sd == value)
        table = ComponentTable.of(prior, float(value), np.maximum(center[rows], lower[rows]))
        for block in np.array_split(rows, -(-len(rows) // DRAW_BLOCK)):
            mean[block], spread[block] = table.pick(center[block], lower[block], u[block])
    return truncated_normal(mean, spread, lower, rng)


@dataclass(frozen=True)
class ComponentTable:
    """A prior's components sorted by mean with their posterior constants given one likelihood sd,
    and the window of components each row looks at (``draw_posterior``: ``width`` consecutive
    components holding every component within ``reach`` of the likelihood's peak within the row's bound)."""

    means: np.ndarray
    log_scale: np.ndarray  # log w_k - log(s_k^2 + sd^2) / 2
    precision: np.ndarray  # 1 / (2 (s_k^2 + sd^2))
    shrink: np.ndarray  # s_k^2 / (s_k^2 + sd^2): posterior mean m_k + shrink (center - m_k)
    post_sd: np.ndarray  # s_k sd / sqrt(s_k^2 + sd^2)
    offset: np.ndarray  # m_k (1 - shrink) / post_sd (an atom: ATOM_SCALE m_k, + 9 when ``bump`` is None)
    slope: np.ndarray  # shrink / post_sd (an atom: 0)
    inverse: np.ndarray  # 1 / post_sd (an atom: ATOM_SCALE)
    reach: float
    width: int
    sd: float
    bump: np.ndarray | None  # an atom's 9, added after the bound (None: every atom at 0, its 9 in the offset)

    @classmethod
    def of(cls, prior: Mixture, sd: float, centers: np.ndarray) -> ComponentTable:
        order = np.argsort(prior.means, kind="stable")
        means, sds, weights = prior.means[order], prior.sds[order], prior.weights[order]
        total = sds**2 + sd * sd
        with np.errstate(divide="ignore"):
            log_scale = np.log(weights) - 0.5 * np.log(total)
        reach = WINDOW_SDS * np.sqrt(sd * sd + float(sds.max()) ** 2)
        starts = np.searchsorted(means, centers - reach)
        width = int((np.searchsorted(means, centers + reach, side="right") - starts).max(initial=1))
        shrink, post_sd = sds**2 / total, sds * sd / np.sqrt(total)
        atom = post_sd == 0
        inverse = np.where(atom, ATOM_SCALE, 1.0 / np.where(atom, 1.0, post_sd))
        atom_means = np.where(atom, means, 0.0)  # ATOM_SCALE times another component's mean could overflow
        offset = np.where(atom, ATOM_SCALE * atom_means, means * (1.0 - shrink) * inverse)
        # an atom's z is ATOM_SCALE (m_k - lower) + 9; at m_k != 0 the 9 is lost beside ATOM_SCALE m_k
        # (an atom on the bound got z = 0, half its weight), so it is added after the bound is subtracted
        bump = np.where(atom, 9.0, 0.0)
        if not atom_means.any():
            offset, bump = offset + bump, None
        return cls(means, log_scale, 0.5 / total, shrink, post_sd, offset, np.where(atom, 0.0, shrink * inverse),
                   inverse, reach, min(width, len(means)), sd, bump)

    def pick(self, center: np.ndarray, lower: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's picked component's posterior (mean, sd) given uniforms ``u``: computed points x
        rows (each window position one vector operation over the rows)."""
        if self.width == len(self.means):  # every component: its constants broadcast over the rows
            start = np.zeros(len(center), dtype=np.int64)
            index = np.arange(self.width)[:, None]
        else:
            # around the likelihood's peak within the bound (the center, or the bound above it)
            peak = np.maximum(center, lower)
            start = np.minimum(np.searchsorted(self.means, peak - self.reach), len(self.means) - self.width)
            index = start[None, :] + np.arange(self.width)[:, None]
        log_weight = center[None, :] - self.means[index]  # the distance to each component, squared in place
        log_weight *= log_weight
        log_weight *= -self.precision[index]
        log_weight += self.log_scale[index]
        near = lower + 9.0 * float(self.post_sd.max()) > np.minimum(center, self.means[start])
        impossible = self._truncate(log_weight, index, center, lower, near) if near.any() else None
        best = log_weight.max(axis=0)
        feasible = np.isfinite(best)
        log_weight -= np.where(feasible, best, 0.0)
        np.maximum(log_weight, -700.0, out=log_weight)  # e^-700 is 0 beside 1; below it exp turns slow
        running = np.exp(log_weight, out=log_weight)
        if impossible is not None:  # components wholly below the bound: weight exactly 0
            running[impossible] = 0.0
        for j in range(1, len(running)):
            np.add(running[j - 1], running[j], out=running[j])
        picked = below_count(running, u * running[-1])
        chosen = start + np.minimum(picked, self.width - 1)
        mean = self.means[chosen] + self.shrink[chosen] * (center - self.means[chosen])
        return np.where(feasible, mean, center), np.where(feasible, self.post_sd[chosen], self.sd)

    def _truncate(self, log_weight: np.ndarray, index: np.ndarray, center: np.ndarray, lower: np.ndarray,
                  near: np.ndarray) -> np.ndarray | None:
        """Add to the columns of rows ``near`` (a mask) of ``log_weight`` each component's log P(posterior
        >= lower) = log Phi(z), z = (posterior mean - lower) / posterior sd = offset + slope center - inverse
        lower (an atom: z >= 9 on or above the bound, -inf below; log Phi computed only where z < 9: it is 0
        in double precision above); return where a component lies wholly below the bound (None: nowhere).
        z is computed for every row (a vector operation over them is cheaper than gathering the near ones),
        log Phi only for the near rows' components."""
        z = self.slope[index] * center
        z += self.offset[index]
        z -= self.inverse[index] * lower
        if self.bump is not None:
            z += self.bump[index]
        low = z < 9.0
        low &= near
        log_weight[low] += log_ndtr(z[low])
        impossible = ~(z > -np.inf)
        impossible &= near
        return impossible if impossible.any() else None


def truncated_normal(mean: np.ndarray, sd: np.ndarray, lower: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draws of N(mean, sd^2) restricted to >= lower (sd 0: the mean, which is then >= lower)."""
    u = rng.random(len(mean))
    with np.errstate(divide="ignore", invalid="ignore"):
        start = np.where(sd > 0, (lower - mean) / sd, -np.inf)
        # Z >= start as -ndtri(u * P(Z >= start)): exact far into the upper tail.
        z = -ndtri(np.maximum(u * ndtr(-start), np.finfo(float).tiny))
    return np.where(sd > 0, np.maximum(mean + sd * z, lower), mean)


def lattice_near(answers: np.ndarray, start: float, top: float, step: float, reach: float,
                 most: int) -> tuple[np.ndarray, float]:
    """The points start + k s (k >= 1, up to ``top``) within about ``reach`` of an answer, s = ``step`` 2^j
    for the smallest j that leaves at most ``most`` of them, and s: a grid whose size is bounded whatever
    the answers' range (points far from every answer have no weight in an NPMLE: their likelihood is
    negligible for every answer), each answer within s of a point. Computed on the answers' occupied
    cells (merged intervals of k), never on the whole lattice."""
    answers = np.asarray(answers, dtype=float)
    answers = answers[np.isfinite(answers)]
    while True:
        last = max(1.0, np.ceil((top - start) / step))
        r = float(np.ceil(reach / step))
        cell = np.unique(np.clip(np.rint((answers - start) / step), 1.0, last))
        if cell.size == 0:
            return np.empty(0), step
        low, high = np.maximum(cell - r, 1.0), np.minimum(cell + r, last)
        reached = np.maximum.accumulate(high)
        begins = np.flatnonzero(np.r_[True, low[1:] > reached[:-1] + 1])
        ends = reached[np.r_[begins[1:] - 1, len(cell) - 1]]
        lengths = (ends - low[begins] + 1).astype(np.int64)
        if lengths.sum() <= most:
            offsets = np.repeat(low[begins] - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
            return start + (offsets + np.arange(lengths.sum())) * step, step
        step *= 2.0


def pick_points(log_weight: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each column of ``log_weight`` (points x rows; overwritten), one point drawn with probability
    proportional to exp(log weight), by inverse CDF on the running sum of the weights."""
    log_weight -= log_weight.max(axis=0)
    np.maximum(log_weight, -700.0, out=log_weight)  # e^-700 is 0 beside 1; below it exp turns slow
    running = np.exp(log_weight, out=log_weight)
    for k in range(1, len(running)):
        np.add(running[k - 1], running[k], out=running[k])
    return np.minimum(below_count(running, rng.random(running.shape[1]) * running[-1]), len(running) - 1)


def below_count(running: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """Per column of ``running`` (points x rows), how many of its values are below the column's
    ``threshold``: the comparisons' bytes summed as bytes when fewer than 256 points (no cast of each
    to a 64-bit integer), else as integers."""
    below = running < threshold
    if len(running) < 256:
        return below.view(np.uint8).sum(axis=0, dtype=np.uint8).astype(np.int64)
    return below.sum(axis=0)


#: The smoothness penalties a ``SmoothFit`` chooses from (per unit of the second differences' squares).
SMOOTH_PENALTIES = 10.0 ** np.arange(-1.0, 4.01, 0.5)
#: Whether a bootstrap replicate of a ``SmoothFit`` draws its penalty (with probability proportional to
#: exp of its held-out log-likelihood) instead of keeping the chosen one (a measurement's knob).
SMOOTH_DRAW_PENALTY = False


@dataclass(frozen=True)
class SmoothFit:
    """A mixture prior on fixed components whose log weights are smooth (Efron's g-modeling, 2016, with
    a P-spline penalty): w = softmax(alpha), alpha maximizing sum_i c_i log (L_i . w) -
    penalty / 2 * |D alpha|^2, D the second differences of the components with a bandwidth (in their
    order; atoms are not penalized). The penalty is one of SMOOTH_PENALTIES chosen by cross-validation
    on the answers (``penalty_choice``), not a constant. Same interface as ``MixtureFit``."""

    means: np.ndarray
    sds: np.ndarray
    counts: np.ndarray
    likelihood: Likelihood
    penalty: float
    scores: np.ndarray | None = None  # held-out log-likelihood of each of SMOOTH_PENALTIES

    @classmethod
    def of(cls, observed: np.ndarray, sd: float, means: np.ndarray, sds: np.ndarray, basis: bool = False) -> SmoothFit:
        """The fit of answers ``observed`` (sd ``sd``) on components (``means``, ``sds``), its penalty
        chosen by cross-validation (``basis`` is accepted for ``MixtureFit``'s interface)."""
        from gedp.postprocess.penalty_choice import chosen_penalty, held_out_fold_scores

        fit = MixtureFit.of(observed, sd, means, sds)
        folds = held_out_fold_scores(fit.likelihood.matrix, fit.counts[fit.likelihood.kept],
                                     second_differences(fit.sds))
        return cls(fit.means, fit.sds, fit.counts, fit.likelihood, chosen_penalty(folds), folds.sum(axis=0))

    def solve(self, rng: np.random.Generator | None = None, start: Mixture | None = None) -> Mixture:
        """The penalized fit (with ``rng``, on a Bayesian bootstrap of the answers, the same penalty)."""
        counts = self.counts if rng is None else rng.gamma(self.counts)
        begin = None if start is None else np.log(np.maximum(start.on(self.means, self.sds), NEGLIGIBLE_WEIGHT))
        penalty = self.penalty
        if rng is not None and SMOOTH_DRAW_PENALTY and self.scores is not None:
            penalty = float(rng.choice(SMOOTH_PENALTIES, p=softmax(self.scores)))
        alpha = smooth_log_weights(self.likelihood.matrix, counts[self.likelihood.kept],
                                   second_differences(self.sds), penalty, begin)
        return Mixture(self.means, self.sds, softmax(alpha)).pruned()


def softmax(alpha: np.ndarray) -> np.ndarray:
    """exp(alpha) / sum exp(alpha)."""
    e = np.exp(alpha - alpha.max())
    return e / e.sum()


def second_differences(sds: np.ndarray) -> np.ndarray:
    """D (rows x components): the second differences of consecutive components with a bandwidth (sd > 0)."""
    smooth = np.flatnonzero(np.asarray(sds) > 0)
    d = np.zeros((max(smooth.size - 2, 0), len(sds)))
    for r in range(d.shape[0]):
        d[r, smooth[r:r + 3]] = (1.0, -2.0, 1.0)
    return d


def smooth_objective(alpha: np.ndarray, matrix: np.ndarray, counts: np.ndarray, penalty_matrix: np.ndarray
                     ) -> tuple[float, np.ndarray, np.ndarray]:
    """The penalized fit's objective to minimize, -sum_i c_i log (L_i . w) + alpha' P alpha / 2 +
    N mean(alpha)^2 / 2 (the last term fixes softmax's free shift, which changes no w), its gradient
    and Hessian in alpha (P = penalty D'D)."""
    w = softmax(alpha)
    fitted = matrix @ w
    total, k = counts.sum(), len(alpha)
    a = matrix.T @ (counts / fitted)
    b = matrix.T @ (matrix * (counts / fitted**2)[:, None])
    value = (-float(counts @ np.log(fitted)) + 0.5 * float(alpha @ penalty_matrix @ alpha)
             + 0.5 * total * alpha.mean() ** 2)
    gradient = -(w * a - total * w) + penalty_matrix @ alpha + total * alpha.mean() / k
    hessian = -(np.diag(w * (a - total)) + total * np.outer(w, w) - w[:, None] * b * w[None, :])
    return value, gradient, hessian + penalty_matrix + total / k**2


def smooth_log_weights(matrix: np.ndarray, counts: np.ndarray, differences: np.ndarray, penalty: float,
                       start: np.ndarray | None = None) -> np.ndarray:
    """The penalized fit's alpha (``SmoothFit``), by a trust-region Newton method from ``start`` (else 0)."""
    from scipy.optimize import minimize

    penalty_matrix = penalty * differences.T @ differences
    begin = np.zeros(matrix.shape[1]) if start is None else start - start.mean()
    with one_blas_thread:
        result = minimize(lambda a: smooth_objective(a, matrix, counts, penalty_matrix)[:2], begin, jac=True,
                          hess=lambda a: smooth_objective(a, matrix, counts, penalty_matrix)[2],
                          method="trust-exact", options={"gtol": 1e-6 * max(1.0, float(counts.sum()))})
    return np.asarray(result.x)
