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
#: Bins per answer sd when answers are binned for a fit.
BINS_PER_SD = 10
#: Likelihood sds around an answer within which a draw's components are looked at.
WINDOW_SDS = 7.0
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
    """Occupied bins of ``width`` (their centers, the mean of their values) and their counts."""
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
    if not isinstance(likelihood, Likelihood):
        likelihood = Likelihood.of(likelihood)
    counts = counts[likelihood.kept]
    share = counts / counts.sum()
    m = likelihood.matrix.shape[1]
    final = gap_nats / counts.sum() / m
    with one_blas_thread:  # small dense factorizations: BLAS threads only wait for each other
        return _central_path(likelihood, share, start, final)


def _central_path(likelihood: Likelihood, share: np.ndarray, start: np.ndarray | None, final: float) -> np.ndarray:
    """The barrier problem's optimum followed from its start down to the barrier weight ``final``; from
    a ``start`` (the central point of a nearby problem), Newton's method goes to ``final`` at once (the
    intermediate barrier weights cost as many steps as they save)."""
    m = likelihood.matrix.shape[1]
    if start is None:
        weights, barrier = np.full(m, 1.0 / m), FIRST_BARRIER / m
    else:
        weights, barrier = 0.99 * start / start.sum() + 0.01 / m, final
    while True:
        weights = _barrier_optimum(likelihood, share, weights, barrier)
        if barrier <= final:
            return weights / weights.sum()
        barrier = max(barrier / BARRIER_FALL, final)


def _barrier_optimum(likelihood: Likelihood, share: np.ndarray, weights: np.ndarray, barrier: float) -> np.ndarray:
    """Newton's method with backtracking for min -share . log(L w) - barrier * sum log w, sum w = 1."""
    matrix = likelihood.matrix

    def objective(w: np.ndarray) -> float:
        return float(-share @ np.log(matrix @ w) - barrier * np.log(w).sum())

    for _ in range(NEWTON_STEPS):
        fitted = matrix @ weights
        gradient = -matrix.T @ (share / fitted) - barrier / weights
        # The Newton step on {sum w = 1} in the scaled variable u = step / w (its Hessian W H W is
        # barrier * I plus a positive semidefinite part: well conditioned however small some w are):
        # W H W u = -W gradient - nu w, nu such that w . u = 0.
        hessian = likelihood.hessian(weights, share, fitted)
        hessian[np.diag_indices(len(weights))] += barrier
        factor, info = dpotrf(hessian, lower=0, clean=0)
        if info != 0:
            raise np.linalg.LinAlgError(f"a Newton step's Hessian is not positive definite (LAPACK info {info})")
        solved, _ = dpotrs(factor, np.column_stack([weights * gradient, weights]))
        along, across = solved[:, 0], solved[:, 1]
        step = weights * (across * ((weights @ along) / (weights @ across)) - along)
        decrement = float(-gradient @ step)
        if decrement < 1e-3 * barrier:
            break
        falling = step < 0
        t = min(1.0, 0.99 * float((-weights[falling] / step[falling]).min())) if falling.any() else 1.0
        start = objective(weights)
        while objective(weights + t * step) > start - 0.25 * t * decrement and t > 1e-12:
            t /= 2
        weights = weights + t * step
    return weights


def draw_posterior(center: np.ndarray, sd: np.ndarray, prior: Mixture, lower: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Exact draws of theta from prior(theta) N(center; theta, sd^2) restricted to theta >= lower,
    one per row (``center``, ``sd``, ``lower`` of one length; sd > 0).

    A row whose every component lies below its lower bound (possible only far in a tail) draws from
    its likelihood alone, truncated at the bound."""
    center, sd, lower = (np.asarray(a, dtype=float)[:, None] for a in (center, sd, lower))
    means, sds, weights = nearby_components(prior, center[:, 0], float(sd.max()) if sd.size else 0.0)
    prior_var = sds**2
    total = prior_var + sd * sd
    post_sd = np.sqrt(prior_var * sd * sd / total)
    post_mean = (means * sd * sd + center * prior_var) / total
    with np.errstate(divide="ignore", invalid="ignore"):
        log_weight = np.log(weights) - 0.5 * np.log(total) - 0.5 * (center - means) ** 2 / total
        above = (post_mean - lower) / post_sd  # atoms: +inf above the bound, -inf below, nan on it
    log_weight = log_weight + truncation_log_mass(np.where(np.isnan(above), np.inf, above))
    best = log_weight.max(axis=1, keepdims=True)
    feasible = np.isfinite(best[:, 0])
    cdf = np.cumsum(np.exp(log_weight - np.where(np.isfinite(best), best, 0.0)), axis=1)
    pick = (cdf < rng.random(len(cdf))[:, None] * cdf[:, -1:]).sum(axis=1)
    pick = np.minimum(pick, cdf.shape[1] - 1)
    rows = np.arange(len(cdf))
    mean, spread = post_mean[rows, pick], post_sd[rows, pick]
    mean = np.where(feasible, mean, center[:, 0])
    spread = np.where(feasible, spread, sd[:, 0])
    return truncated_normal(mean, spread, lower[:, 0], rng)


def truncation_log_mass(z: np.ndarray) -> np.ndarray:
    """log P(Z >= -z) = log Phi(z), computed only where it differs from 0 in double precision
    (z < 9: Phi(9) = 1 - 1e-19)."""
    out = np.zeros_like(z)
    low = z < 9.0
    out[low] = log_ndtr(z[low])
    return out


def nearby_components(prior: Mixture, center: np.ndarray, sd: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's components (rows x W: means, sds, weights) within WINDOW_SDS sds of its center, W
    the most any row has (a further component's likelihood is below exp(-WINDOW_SDS^2 / 2) = 2e-11 of
    a component at the center's); rows padded with weight-0 copies."""
    order = np.argsort(prior.means, kind="stable")
    means, sds, weights = prior.means[order], prior.sds[order], prior.weights[order]
    reach = WINDOW_SDS * np.sqrt(sd * sd + float(sds.max()) ** 2)
    start = np.searchsorted(means, center - reach)
    width = int((np.searchsorted(means, center + reach, side="right") - start).max(initial=1))
    if width >= len(means) or len(center) == 0:
        return means[None, :], sds[None, :], weights[None, :]
    index = np.minimum(start[:, None] + np.arange(max(width, 1))[None, :], len(means) - 1)
    padded = start[:, None] + np.arange(max(width, 1))[None, :] >= len(means)
    return means[index], sds[index], np.where(padded, 0.0, weights[index])


def truncated_normal(mean: np.ndarray, sd: np.ndarray, lower: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draws of N(mean, sd^2) restricted to >= lower (sd 0: the mean, which is then >= lower)."""
    u = rng.random(len(mean))
    with np.errstate(divide="ignore", invalid="ignore"):
        start = np.where(sd > 0, (lower - mean) / sd, -np.inf)
        # Z >= start as -ndtri(u * P(Z >= start)): exact far into the upper tail.
        z = -ndtri(np.maximum(u * ndtr(-start), np.finfo(float).tiny))
    return np.where(sd > 0, np.maximum(mean + sd * z, lower), mean)


def pick_points(log_weight: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each column of ``log_weight`` (points x rows; overwritten), one point drawn with probability
    proportional to exp(log weight), by inverse CDF on the running sum of the weights."""
    log_weight -= log_weight.max(axis=0)
    np.maximum(log_weight, -700.0, out=log_weight)  # e^-700 is 0 beside 1; below it exp turns slow
    running = np.exp(log_weight, out=log_weight)
    for k in range(1, len(running)):
        np.add(running[k - 1], running[k], out=running[k])
    return np.minimum((running < rng.random(running.shape[1]) * running[-1]).sum(axis=0), len(running) - 1)
