"""The joint prior of the two month-to-month changes (``postprocess.joint_changes``): its NPMLE recovers
the joint shares of no change, one change and two changes from noisy answers (where the independent
change priors cannot), and its posterior draws are the posterior's."""

import numpy as np
import pytest

from gedp.postprocess.deconvolve import MixtureFit
from gedp.postprocess.joint_changes import ChangeLikelihood, JointFit, JointPrior, draw_changes, gaussian_log_density
from gedp.postprocess.prior_components import change_fit

SD = np.array([0.3, 0.3, 0.3])  # the months' answer sds
SMALLEST = 1.0  # one employee's change: every real change is at least this
#: the truth's shares of no change, one change, two changes (the patterns' weights in ``changes``)
PATTERNS = np.array([0.5, 0.3, 0.2])


def changes(rng: np.random.Generator, n: int) -> np.ndarray:
    """(a, b) = (theta_2 - theta_1, theta_3 - theta_2) of ``n`` establishments: no change (0.5), a change in
    month 2 only or month 3 only (0.15 each), a change and its revert (0.1), two changes (0.1); each
    change of +-U[1, 3]."""
    size = rng.choice([-1.0, 1.0], size=(n, 2)) * rng.uniform(1.0, 3.0, size=(n, 2))
    kind = rng.choice(5, size=n, p=[0.5, 0.15, 0.15, 0.1, 0.1])
    a = np.where(np.isin(kind, [1, 3, 4]), size[:, 0], 0.0)
    b = np.where(kind == 2, size[:, 1], np.where(kind == 3, -a, np.where(kind == 4, size[:, 1], 0.0)))
    return np.column_stack([a, b])


def answers(rng: np.random.Generator, n: int = 4000) -> np.ndarray:
    """The three months' answers (psi scale) of ``n`` establishments at level 0 with ``changes``."""
    ab = changes(rng, n)
    theta = np.cumsum(np.column_stack([np.zeros(n), ab]), axis=1)
    return theta + rng.normal(0.0, SD, size=(n, 3))


#: Over 40 seeds (offline), each share's estimate had sd 0.009 and a bias of at most 0.007: a tolerance of
#: 0.05 is 4.7 sds beyond the bias, a false failure in fewer than 1e-5 runs (three shares, normal tails).
TOLERANCE = 0.05


@pytest.mark.parametrize("seed", [11, 12])
def test_the_joint_npmle_recovers_the_change_patterns_and_the_independent_priors_do_not(seed):
    """From 4,000 establishments' noisy answers (difference sd 0.42, changes of 1-3), the joint prior's
    shares of {no change, one change, two changes} are the truth's within TOLERANCE. Power: the
    independent priors of the changes from month 1 (``change_fit``, as the chain uses them) imply
    shares p_2 p_3, p_2 (1 - p_3) and 1 - p_2 (no change in both, a change in month 3 only; a change in
    month 2 is a second change unless month 3 matches it exactly, which has probability 0): over 40
    seeds their no-change share was 0.41 (sd 0.01) and their two-change share 0.35 (sd 0.01), 4 and 15
    sds beyond the tolerance."""
    omega = answers(np.random.default_rng(seed))
    joint = JointFit.of(np.diff(omega, axis=1), SD, SMALLEST).solve()
    assert np.abs(joint.pattern_shares() - PATTERNS).max() < TOLERANCE
    d = omega[:, 1:] - omega[:, :1]
    p2, p3 = (MixtureFit.of(*change_fit(d[:, k], float(np.hypot(SD[0], SD[k + 1])), SMALLEST)).solve().mass_at(0.0)
              for k in (0, 1))
    independent = np.array([p2 * p3, p2 * (1 - p3), 1 - p2])
    assert np.abs(independent - PATTERNS).max() > TOLERANCE


def test_a_bootstrap_replicate_starts_from_the_fit_and_stays_near_it():
    """A replicate (Bayesian bootstrap counts, started from the fit) is another prior of the same
    components whose shares are within the sampling spread (0.05) of the fit's."""
    omega = answers(np.random.default_rng(3))
    fit = JointFit.of(np.diff(omega, axis=1), SD, SMALLEST)
    fitted = fit.solve()
    replicate = fit.solve(np.random.default_rng(4), fitted)
    assert not np.array_equal(replicate.weights, fitted.weights)
    assert np.abs(replicate.pattern_shares() - fitted.pattern_shares()).max() < TOLERANCE


def line(direction: np.ndarray, variance: float) -> np.ndarray:
    return variance * np.outer(direction, direction)


#: A small prior of (a, b): no change, a change in month 2 only (spread along a), a change and its
#: revert (spread along a = -b), two changes (spread in both).
PRIOR = JointPrior(np.array([[0.0, 0.0], [1.0, 0.0], [1.2, -1.2], [0.8, 0.9]]),
                   np.array([np.zeros((2, 2)), line(np.array([1.0, 0.0]), 0.04), line(np.array([1.0, -1.0]), 0.02),
                             np.diag([0.05, 0.03])]),
                   np.array([0.4, 0.25, 0.2, 0.15]))


def prior_sample(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws of (a, b) from PRIOR by its definition (a component, then its Gaussian)."""
    k = rng.choice(len(PRIOR.weights), size=n, p=PRIOR.weights)
    z = rng.standard_normal((n, 2))
    values, vectors = np.linalg.eigh(PRIOR.covariances)
    roots = vectors * np.sqrt(np.maximum(values, 0.0))[:, None, :]
    return PRIOR.means[k] + np.einsum("kij,kj->ki", roots[k], z), k


@pytest.mark.parametrize("level", ["month1", "quarter"])
def test_draws_are_the_posteriors_by_importance_sampling(level):
    """For one establishment's answers and level, 40,000 draws of the changes from month 1 against the
    posterior computed independently by self-normalized importance sampling (400,000 draws of the
    prior by its definition, weighted by the answers' likelihood at the months they give): the
    probability of no change, of month 3 equal to month 2 (a change in month 2 only) and of month 3
    equal to month 1 (a revert), and the changes' means, within 5 standard errors of both (a false
    failure in fewer than 1e-5 runs per figure). The same draws under the answers' sd taken 1.5x as
    large are refused (power)."""
    month_sd = np.array([0.25, 0.3, 0.35])
    weights = np.array([1.0, 0.0, 0.0]) if level == "month1" else (1 / month_sd**2) / (1 / month_sd**2).sum()
    months = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]) - weights[1:][None, :]
    omega = np.array([2.0, 2.7, 2.4])
    theta_level = 2.05 if level == "month1" else 2.4  # month 1's level, or the quarter's
    residual = (omega - theta_level)[None, :]
    rng = np.random.default_rng(5)

    def figures(delta: np.ndarray) -> np.ndarray:
        moved = np.abs(delta[:, 0]) > 1e-9
        same = np.abs(delta[:, 1] - delta[:, 0]) < 1e-9
        return np.column_stack([np.all(np.abs(delta) < 1e-9, axis=1), same & moved,
                                (np.abs(delta[:, 1]) < 1e-9) & moved, delta[:, 0], delta[:, 1]])

    ab, _ = prior_sample(rng, 400_000)
    delta = np.column_stack([ab[:, 0], ab[:, 0] + ab[:, 1]])
    log_w = -0.5 * ((((residual - delta @ months.T)) / month_sd) ** 2).sum(axis=1)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    f = figures(delta)
    expected = w @ f
    expected_se = np.sqrt(w**2 @ (f - expected) ** 2)  # the importance estimate's standard error
    assert (expected[:3] > 0.05).all()  # each pattern has posterior mass
    draws = figures(draw_changes(PRIOR, ChangeLikelihood.of(months, month_sd), np.repeat(residual, 40_000, axis=0),
                                 rng))
    se = np.sqrt(w @ (f - expected) ** 2 / len(draws) + expected_se**2)  # the posterior's variance / draws
    assert (np.abs(draws.mean(axis=0) - expected) < 5 * se).all()
    wide = figures(draw_changes(PRIOR, ChangeLikelihood.of(months, 1.5 * month_sd),
                                np.repeat(residual, 40_000, axis=0), rng))
    assert (np.abs(wide.mean(axis=0) - expected) > 5 * se).any()


def test_the_marginal_density_is_a_gaussians():
    """``gaussian_log_density`` against scipy's multivariate normal."""
    from scipy.stats import multivariate_normal

    x = np.array([[0.3, -0.2], [1.0, 2.0]])
    means = np.array([[0.0, 0.0], [1.0, -1.0]])
    cov = np.array([[[1.0, 0.3], [0.3, 2.0]], [[0.5, -0.1], [-0.1, 0.4]]])
    got = gaussian_log_density(x, means, cov)
    want = np.array([[multivariate_normal(means[k], cov[k]).logpdf(x[i]) for k in range(2)] for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_the_product_grid_stops_growing_beyond_its_reach():
    """One answer 10^6 sds out (a crafted but consistent release) made the product grid 5,000
    components (a fit of 164 s, 1.2 GB): its points beyond 4 sds are capped at MAX_GRID_FAR a side,
    while the axes still reach the answer."""
    from gedp.postprocess.joint_changes import MAX_GRID_FAR, joint_components

    means, _ = joint_components(0.5, 1.0, 1e6)
    off_axes = (means != 0).all(axis=1) & (means[:, 0] != -means[:, 1])
    near = len(np.arange(0.5, 4.0, 1.0))
    assert off_axes.sum() <= (2 * (near + MAX_GRID_FAR)) ** 2
    assert np.abs(means).max() >= 1e6  # the axes reach the farthest answer
    assert len(joint_components(0.5, 1.0, 30.0)[0]) < len(means)  # an honest reach is not capped
