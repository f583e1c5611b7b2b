"""A joint prior of an establishment's two month-to-month changes, and exact draws from its posterior.

The independent change priors (``postprocess.implicates``) draw the change from month 1 to 2 and the
change from month 1 to 3 each from its own prior, so an establishment that changed in month 2 is as
likely to change again in month 3 as one that did not. Real headcounts change once, or change and
revert, or not at all. This prior is on the pair (a, b) = (theta_2 - theta_1, theta_3 - theta_2), a
two-dimensional Gaussian mixture on fixed components (an NPMLE, ``deconvolve.npmle_weights``) with

* an atom at (0, 0): no change;
* components on each axis, (a, 0) and (0, b), an atom in the coordinate that is 0: one change, in
  month 2 or in month 3;
* components on the diagonal (a, -a), spread along it only: a change and its revert (m3 = m1);
* a coarser product grid off the axes: two changes.

The 1-D steps are the independent priors': no mass between 0 and one employee's change (``smallest``),
then every sd / 2 up to 4 sds (sd of one answers' difference) and 25% apart beyond (the product grid:
every sd up to 4 sds, then 50% apart), each component's bandwidth half its step. Nothing is fitted to
a synthetic state: the grid is spaced on the answers' public sd.

The answers' differences x = (omega_2 - omega_1, omega_3 - omega_2) are (a, b) plus Gaussian noise of
covariance N = [[s1^2 + s2^2, -s2^2], [-s2^2, s2^2 + s3^2]] (the months' sds s_k), so the likelihood
of a component (mean m, covariance C) is N(x; m, C + N). Given the level, the changes' likelihood is a
Gaussian too (``ChangeLikelihood``), and the posterior a Gaussian mixture: drawn exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gedp.postprocess.deconvolve import Likelihood, binned, npmle_weights, pick_points

#: (a, b) to the changes from month 1, (theta_2 - theta_1, theta_3 - theta_1) = T (a, b).
TO_DELTA = np.array([[1.0, 0.0], [1.0, 1.0]])
#: 2-D answers are binned to this fraction of the differences' sd in each coordinate.
BINS_PER_SD = 5
#: Rows a block of a draw (rows x components of weights).
DRAW_BLOCK = 2048
#: The product grid's points beyond 4 sds, each side (1.5^10: to 230 sds): its components grow with the
#: square of the points, and one answer of 10^6 sds had made them 5,000 (a fit of 164 s, 1.2 GB).
MAX_GRID_FAR = 10
#: Components whose weight is below this are dropped after a fit.
NEGLIGIBLE_WEIGHT = 1e-7


@dataclass(frozen=True)
class JointPrior:
    """A 2-D Gaussian mixture of (a, b): means (k, 2), covariances (k, 2, 2) (singular for atoms and
    components on a line), weights (k,)."""

    means: np.ndarray
    covariances: np.ndarray
    weights: np.ndarray

    def pattern_shares(self) -> np.ndarray:
        """The prior's shares of no change (a = b = 0), one change (exactly one of a, b is 0 as an atom
        coordinate) and two changes (the rest)."""
        zero = (self.means == 0) & (np.diagonal(self.covariances, axis1=1, axis2=2) == 0)
        changes = 2 - zero.sum(axis=1)
        return np.array([self.weights[changes == k].sum() for k in range(3)])

    def pruned(self) -> JointPrior:
        kept = self.weights > NEGLIGIBLE_WEIGHT
        return JointPrior(self.means[kept], self.covariances[kept], self.weights[kept] / self.weights[kept].sum())


def side(smallest: float, sd: float, reach: float, step: float, far: float, most: int | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """One sign's 1-D points from ``smallest`` every ``step`` up to 4 sd, then ``far`` apart up to
    ``reach`` (at most ``most`` of them), and each one's bandwidth (half its step)."""
    near = np.arange(smallest, 4 * sd, step) if 4 * sd > smallest else np.array([smallest])
    count = max(1, int(np.ceil(np.log(max(reach, near[-1] * far) / near[-1]) / np.log(far))))
    count = count if most is None else min(count, most)
    points = np.concatenate([near, near[-1] * far ** np.arange(1, count + 1)])
    return points, np.diff(points, prepend=points[0] - (points[1] - points[0] if len(points) > 1 else step)) / 2


def joint_components(smallest: float, sd: float, reach: float) -> tuple[np.ndarray, np.ndarray]:
    """The prior's components (means (k, 2), covariances (k, 2, 2)): the atom, the axes, the revert
    diagonal and the coarse product grid (module docstring)."""
    fine, fine_h = side(smallest, sd, reach, sd / 2, 1.25)
    fine, fine_h = np.concatenate([fine, -fine]), np.concatenate([fine_h, fine_h])
    coarse, coarse_h = side(smallest, sd, reach, sd, 1.5, MAX_GRID_FAR)
    coarse, coarse_h = np.concatenate([coarse, -coarse]), np.concatenate([coarse_h, coarse_h])
    zeros = np.zeros_like(fine)
    means = [np.zeros((1, 2)), np.column_stack([fine, zeros]), np.column_stack([zeros, fine]),
             np.column_stack([fine, -fine])]
    covariances = [np.zeros((1, 2, 2))]
    var = fine_h**2
    covariances.append(np.einsum("k,ij->kij", var, np.array([[1.0, 0.0], [0.0, 0.0]])))
    covariances.append(np.einsum("k,ij->kij", var, np.array([[0.0, 0.0], [0.0, 1.0]])))
    covariances.append(np.einsum("k,ij->kij", var, np.array([[1.0, -1.0], [-1.0, 1.0]])))
    a, b = np.meshgrid(coarse, coarse, indexing="ij")
    ha, hb = np.meshgrid(coarse_h, coarse_h, indexing="ij")
    means.append(np.column_stack([a.ravel(), b.ravel()]))
    grid = np.zeros((a.size, 2, 2))
    grid[:, 0, 0], grid[:, 1, 1] = ha.ravel() ** 2, hb.ravel() ** 2
    covariances.append(grid)
    return np.concatenate(means), np.concatenate(covariances)


def difference_noise(month_sd: np.ndarray) -> np.ndarray:
    """The covariance of the answers' differences (omega_2 - omega_1, omega_3 - omega_2)."""
    s = np.asarray(month_sd, dtype=float) ** 2
    return np.array([[s[0] + s[1], -s[1]], [-s[1], s[1] + s[2]]])


def gaussian_log_density(x: np.ndarray, means: np.ndarray, covariances: np.ndarray) -> np.ndarray:
    """log N(x_i; m_k, S_k), rows x components (S_k 2 x 2, positive definite)."""
    det = covariances[:, 0, 0] * covariances[:, 1, 1] - covariances[:, 0, 1] * covariances[:, 1, 0]
    p00, p11, p01 = covariances[:, 1, 1] / det, covariances[:, 0, 0] / det, -covariances[:, 0, 1] / det
    d0 = x[:, 0, None] - means[None, :, 0]
    d1 = x[:, 1, None] - means[None, :, 1]
    return -0.5 * (p00 * d0**2 + 2 * p01 * d0 * d1 + p11 * d1**2) - np.log(2 * np.pi) - 0.5 * np.log(det)


@dataclass(frozen=True)
class JointFit:
    """A joint prior's fit (binned answers, the likelihood made ready), kept for its bootstrap replicates."""

    means: np.ndarray
    covariances: np.ndarray
    counts: np.ndarray
    likelihood: Likelihood

    @classmethod
    def of(cls, x: np.ndarray, month_sd: np.ndarray, smallest: float, basis: bool = False) -> JointFit:
        """The fit of the answers' differences ``x`` (rows x 2: omega_2 - omega_1, omega_3 - omega_2)."""
        x = np.asarray(x, dtype=float)
        x = x[np.isfinite(x).all(axis=1)]
        if len(x) == 0:
            raise ValueError("a prior needs at least one finite answer")
        noise = difference_noise(month_sd)
        sd = float(np.sqrt(noise[0, 0]))
        reach = max(float(np.abs(x).max()), 4 * sd) + sd
        means, covariances = joint_components(smallest, sd, reach)
        centers, counts = binned(x, sd / BINS_PER_SD)
        log_lik = gaussian_log_density(centers, means, covariances + noise)
        likelihood = np.exp(log_lik - log_lik.max(axis=1, keepdims=True))
        return cls(means, covariances, counts, Likelihood.of(likelihood, basis=basis))

    def solve(self, rng: np.random.Generator | None = None, start: JointPrior | None = None) -> JointPrior:
        """The NPMLE (with ``rng``, a Bayesian bootstrap replicate, started from ``start``, a prior of the
        same fit)."""
        counts = self.counts if rng is None else rng.gamma(self.counts)
        begin = None
        if start is not None:
            index = {(*m, *c.ravel()): w for m, c, w in zip(map(tuple, start.means), start.covariances, start.weights)}
            begin = np.array([index.get((*m, *c.ravel()), 0.0) for m, c in zip(map(tuple, self.means),
                                                                                self.covariances)])
        return JointPrior(self.means, self.covariances, npmle_weights(self.likelihood, counts, start=begin)).pruned()


@dataclass(frozen=True)
class ChangeLikelihood:
    """The changes' likelihood given the level: the months theta = level + M delta (delta the changes from
    month 1), answers omega = theta + N(0, diag(sd^2)), so delta's likelihood is Gaussian with precision
    P = M' S^-1 M and center P^-1 M' S^-1 (omega - level)."""

    months: np.ndarray  # M, 3 x 2
    precision: np.ndarray  # P, 2 x 2
    gain: np.ndarray  # P^-1 M' S^-1, 2 x 3

    @classmethod
    def of(cls, months: np.ndarray, month_sd: np.ndarray) -> ChangeLikelihood:
        weighted = months.T / np.asarray(month_sd, dtype=float) ** 2
        precision = weighted @ months
        return cls(months, precision, np.linalg.solve(precision, weighted))


def draw_changes(prior: JointPrior, likelihood: ChangeLikelihood, residual: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """Exact draws of the changes from month 1 (rows x 2) from prior(delta) N(center; delta, P^-1), the
    center the likelihood's for each row's answers less its level (``residual``, rows x 3), without
    bounds (the chain refuses a draw out of them). Component k (in delta: mean mu = T m, covariance
    C = T C_ab T') is picked with weight w_k N(center; mu, C + P^-1), then its posterior mean
    mu + C Q^-1 (center - mu) and covariance C - C Q^-1 C (Q = C + P^-1) drawn."""
    center = residual @ likelihood.gain.T
    mu = prior.means @ TO_DELTA.T
    cov = TO_DELTA @ prior.covariances @ TO_DELTA.T
    q = cov + np.linalg.inv(likelihood.precision)
    gain = cov @ np.linalg.inv(q)
    post = cov - gain @ cov
    post = (post + np.transpose(post, (0, 2, 1))) / 2
    values, vectors = np.linalg.eigh(post)
    root = vectors * np.sqrt(np.maximum(values, 0.0))[:, None, :]  # root root' = post
    log_w = np.log(prior.weights)
    picked = np.empty(len(center), dtype=np.int64)
    for start in range(0, len(center), DRAW_BLOCK):
        block = slice(start, start + DRAW_BLOCK)
        weights = (gaussian_log_density(center[block], mu, q) + log_w).T
        picked[block] = pick_points(np.ascontiguousarray(weights), rng)
    z = rng.standard_normal((len(center), 2))
    shift = center - mu[picked]
    mean = mu[picked] + np.einsum("rij,rj->ri", gain[picked], shift)
    return mean + np.einsum("rij,rj->ri", root[picked], z)
