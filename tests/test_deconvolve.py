"""Deconvolution priors and their posterior draws against independent computations: the NPMLE's
likelihood against a convex solver's optimum, the mixture posterior against quadrature, the Gibbs
sampler of the months against a brute-force posterior on a grid."""

import numpy as np
import pytest
from scipy import stats

from gedp.measure.neighbors import make_psi
from gedp.postprocess.deconvolve import (
    GAP_NATS,
    Mixture,
    binned,
    draw_posterior,
    em_weights,
    fit_mixture,
    npmle_weights,
)
from gedp.postprocess.implicates import PosteriorModel, Priors
from gedp.postprocess.prior_components import atom_standard_error, change_components, level_components

#: KS tests reject at p < 1e-4: a false failure in fewer than 1 run in 10,000 per test.
P_REJECT = 1e-4


def test_npmle_reaches_the_convex_optimum_and_the_true_cdf():
    cvxpy = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(11)
    n, sd = 6000, 0.5
    truth = np.where(rng.random(n) < 0.45, 0.0, rng.normal(1.5, 0.6, n))
    observed = truth + rng.normal(0, sd, n)
    means, sds = change_components(0.2, 5.0, sd)
    prior = fit_mixture(observed, sd, means, sds)
    # The optimum over the same components, by an interior-point solver on the binned answers.
    centers, counts = binned(observed, sd / 10)
    likelihood = stats.norm.pdf(centers[:, None], means, np.sqrt(sds**2 + sd**2))
    w = cvxpy.Variable(len(means), nonneg=True)
    problem = cvxpy.Problem(cvxpy.Maximize(counts @ cvxpy.log(likelihood @ w)), [cvxpy.sum(w) == 1])
    problem.solve(solver="CLARABEL")
    ours = float(counts @ np.log(likelihood @ _on(means, sds, prior)))
    # Within the certified gap (0.01 nat over 6,000 answers) plus the solver's own tolerance.
    assert problem.value - ours < GAP_NATS + 0.01
    # Power: EM's 400 steps from uniform weights (the former fit) stop further away than that.
    em = em_weights(likelihood, counts, 400)
    assert problem.value - float(counts @ np.log(likelihood @ em)) > GAP_NATS + 0.01
    # The atom alone is weakly identified at this noise (the likelihood is flat between an atom and
    # mass just beside it), and the NPMLE is discrete (a few atoms where the truth is smooth): it is
    # consistent in the Wasserstein distance W1 = integral |F_fitted - F_true|, not pointwise. W1 was
    # 0.077-0.113 over three seeds; the answers' own distribution (no deconvolution) is at 0.21.
    grid = np.linspace(-3, 6, 9001)
    fitted = (prior.weights * stats.norm.cdf(grid[:, None], prior.means, np.maximum(prior.sds, 1e-12))).sum(axis=1)
    true = np.searchsorted(np.sort(truth), grid, side="right") / n
    assert np.abs(fitted - true).sum() * 0.001 < 0.15
    naive = np.searchsorted(np.sort(observed), grid, side="right") / n
    assert np.abs(naive - true).sum() * 0.001 > 0.15


def test_npmle_weights_certify_their_gap_by_the_kkt_conditions():
    # For a concave log-likelihood f on the simplex, f* - f(w) <= n (max_k g_k - 1), g_k the k-th
    # partial derivative over n (Frank-Wolfe's duality gap): computed here from the weights alone.
    rng = np.random.default_rng(4)
    for n, atom in ((3000, 0.6), (20000, 0.2)):
        theta = np.where(rng.random(n) < atom, 0.0, rng.standard_t(2, n) * 0.3)
        observed = theta + rng.normal(0, 0.8, n)
        means, sds = change_components(0.1, 8.0, 0.8)
        centers, counts = binned(observed, 0.08)
        likelihood = stats.norm.pdf(centers[:, None], means, np.sqrt(sds**2 + 0.64))
        seen = likelihood.max(axis=1) > 0  # answers beyond every component's reach in double precision
        likelihood, counts = likelihood[seen], counts[seen]
        weights = npmle_weights(likelihood, counts)
        assert weights.min() >= 0 and weights.sum() == pytest.approx(1.0)
        gradient = likelihood.T @ (counts / (likelihood @ weights)) / counts.sum()
        assert counts.sum() * (gradient.max() - 1.0) < 2 * GAP_NATS
        # Started from a nearby fit (a bootstrap replicate's start), the same optimum.
        again = npmle_weights(likelihood, counts, start=np.roll(weights, 1) + weights)
        value = lambda w: float(counts @ np.log(likelihood @ w))  # noqa: E731
        assert abs(value(again) - value(weights)) < 2 * GAP_NATS


def test_bayesian_bootstrap_spreads_the_prior_as_much_as_resampling_the_state_does():
    # The spread of a smooth functional of the fitted prior (its CDF at 1.0 and its mean) over 40
    # bootstrap replicates of one sample, against its spread over 40 fits to independent samples. Each
    # sd is estimated from 40 values (log-sd of their ratio 0.16): the ratio outside [0.55, 1.8]
    # (3.7 sds) fails an exact bootstrap with probability < 0.1% per functional.
    rng = np.random.default_rng(21)
    n, sd = 3000, 0.6
    means, sds = change_components(0.2, 6.0, sd)

    def sample():
        return np.where(rng.random(n) < 0.5, 0.0, rng.normal(1.2, 0.8, n)) + rng.normal(0, sd, n)

    def functionals(prior):
        cdf = (prior.weights * stats.norm.cdf(1.0, prior.means, np.maximum(prior.sds, 1e-12))).sum()
        return cdf, (prior.weights * prior.means).sum()

    independent = np.array([functionals(fit_mixture(sample(), sd, means, sds)) for _ in range(40)])
    one = sample()
    fitted = fit_mixture(one, sd, means, sds)
    replicates = np.array([functionals(fit_mixture(one, sd, means, sds, rng=rng, start=fitted)) for _ in range(40)])
    ratio = replicates.std(axis=0, ddof=1) / independent.std(axis=0, ddof=1)
    assert ((ratio > 0.55) & (ratio < 1.8)).all(), ratio
    # Power: replicates with half the bootstrap's spread (weights Gamma(4c) / 4) are refused.
    centers, counts = binned(one, sd / 10)
    likelihood = stats.norm.pdf(centers[:, None], means, np.sqrt(sds**2 + sd**2))
    narrow = []
    for _ in range(40):
        weights = npmle_weights(likelihood, rng.gamma(4 * counts) / 4, start=fitted.on(means, sds))
        narrow.append(functionals(Mixture(means, sds, weights)))
    assert (np.array(narrow).std(axis=0, ddof=1) / independent.std(axis=0, ddof=1) < 0.55).any()


def _on(means, sds, prior):
    """The prior's weights on the components (means, sds) it was fitted on (0 for pruned ones)."""
    out = np.zeros(len(means))
    for m, s, w in zip(prior.means, prior.sds, prior.weights):
        out[np.flatnonzero((means == m) & (sds == s))[0]] = w
    return out


def test_em_weights_of_a_known_two_point_mixture():
    rng = np.random.default_rng(3)
    observed = np.where(rng.random(20000) < 0.3, -2.0, 2.0) + rng.normal(0, 1, 20000)
    likelihood = stats.norm.pdf(observed[:, None], [-2.0, 2.0], 1.0)
    weights = em_weights(likelihood, np.ones(len(observed)), 200)
    # Binomial sd of the share: sqrt(0.21 / 20000) = 0.0032; 0.015 is 4.6 sds.
    assert abs(weights[0] - 0.3) < 0.015


PRIOR = Mixture(np.array([0.0, 0.8, 2.0, 3.5]), np.array([0.0, 0.3, 0.5, 0.2]), np.array([0.3, 0.2, 0.3, 0.2]))


def quadrature_cdf(center, sd, lower, points):
    """The posterior CDF of theta >= lower at ``points``, by a fine grid (continuous part) plus the atom."""
    grid = np.linspace(lower, 8, 200_001)
    continuous = PRIOR.sds > 0
    density = (PRIOR.weights[continuous] * stats.norm.pdf(grid[:, None], PRIOR.means[continuous],
                                                          PRIOR.sds[continuous])).sum(axis=1)
    posterior = density * stats.norm.pdf(center, grid, sd)
    atom = sum(w * stats.norm.pdf(center, m, sd) for m, s, w in zip(PRIOR.means, PRIOR.sds, PRIOR.weights)
               if s == 0 and m >= lower)
    cells = np.concatenate([[0], np.cumsum((posterior[1:] + posterior[:-1]) / 2 * np.diff(grid))])
    total = cells[-1] + atom
    atom_at_start = 0.0 in PRIOR.means[~continuous] and lower <= 0.0
    return (np.interp(points, grid, cells) + (atom if atom_at_start else 0.0) * (np.asarray(points) >= 0)) / total


@pytest.mark.parametrize("center, sd, lower", [(0.4, 0.6, 0.0), (2.5, 0.4, 0.0), (1.0, 0.5, 0.9)])
def test_mixture_posterior_draws_follow_the_quadrature_posterior(center, sd, lower):
    rng = np.random.default_rng(5)
    n = 40_000
    draws = draw_posterior(np.full(n, center), np.full(n, sd), PRIOR, np.full(n, lower), rng)
    assert draws.min() >= lower
    points = np.quantile(draws, np.linspace(0.02, 0.98, 49))
    gap = np.abs((draws[:, None] <= points).mean(axis=0) - quadrature_cdf(center, sd, lower, points)).max()
    # Kolmogorov's bound: P(sqrt(n) max gap > 2.2) < 2e-4 at any points.
    assert gap * np.sqrt(n) < 2.2
    # Power: the same draws against the posterior of a likelihood 1.3x as wide are refused.
    wrong = np.abs((draws[:, None] <= points).mean(axis=0) - quadrature_cdf(center, sd * 1.3, lower, points)).max()
    assert wrong * np.sqrt(n) > 2.2


@pytest.mark.parametrize("bound", [1.0, 0.0])
def test_an_atom_on_the_bound_keeps_its_whole_weight_wherever_it_sits(bound):
    """An atom at a nonzero mean (psi(0) > 0: sqrt with a > 0, or log psi) lying exactly on the rows'
    bound keeps its weight: the closed-form posterior probability of the atom, 40,000 draws (the
    frequency within 4.5 binomial sds: false failure 7e-6); power: a halved atom is 70 sds away."""
    prior = Mixture(np.array([bound, bound + 2.0]), np.array([0.0, 1.0]), np.array([0.5, 0.5]))
    n, center, sd = 40_000, bound + 0.5, 1.0
    draws = draw_posterior(np.full(n, center), np.full(n, sd), prior, np.full(n, bound), np.random.default_rng(9))
    at_atom = 0.5 * stats.norm.pdf(center, bound, sd)
    post_mean, post_sd = bound + 2.0 + 0.5 * (center - bound - 2.0), np.sqrt(0.5)
    spread = 0.5 * stats.norm.pdf(center, bound + 2.0, np.sqrt(2.0)) * stats.norm.cdf((post_mean - bound) / post_sd)
    p = at_atom / (at_atom + spread)
    halved = 0.5 * at_atom / (0.5 * at_atom + spread)
    tolerance = 4.5 * np.sqrt(p * (1 - p) / n)
    assert abs(p - halved) > 10 * tolerance
    assert abs((draws == bound).mean() - p) < tolerance


def small_model(omega_sd: float) -> PosteriorModel:
    """A PosteriorModel with priors set by hand (few components), bypassing the fit."""
    model = PosteriorModel.__new__(PosteriorModel)
    model.psi = make_psi("sqrt", a=0.0)
    model.floor = 0.0
    level = Mixture(np.array([0.0, 1.5, 2.5]), np.array([0.0, 0.3, 0.3]), np.array([0.2, 0.5, 0.3]))
    change = Mixture(np.array([0.0, 0.4, -0.4]), np.array([0.0, 0.1, 0.1]), np.array([0.6, 0.2, 0.2]))
    model.priors = Priors(level, 100.0, np.empty(0), [(change, change)])
    return model


def brute_force_posterior(omega, sd, model, grid, quarter=False):
    """p(theta1, delta2, delta3 | omega) on a grid (delta_k = theta_k - theta_1), every month >= 0, as
    weights over the grid: the level prior on month 1's level (``quarter``: on the quarter's level, the
    mean of the three months: their sds are equal), the change priors on delta_2 and delta_3. Each
    factor is computed on the axes it depends on and broadcast (the same products point by point as on
    the whole meshgrid, bit for bit: the prior densities on 225 or 201 points, not 9 million)."""
    t1, d2, d3 = np.ix_(grid["t"], grid["d"], grid["d"])

    def density(prior, x, step):
        out = np.zeros_like(x)
        for m, s, w in zip(prior.means, prior.sds, prior.weights):
            out += w * (np.isclose(x, m) / step if s == 0 else stats.norm.pdf(x, m, s))
        return out

    level, change = model.priors.level, model.priors.changes[0][0]
    step_t, step_d = grid["t"][1] - grid["t"][0], grid["d"][1] - grid["d"][0]
    level_at = t1 + (d2 + d3) / 3 if quarter else t1
    weight = density(level, level_at, step_t) * density(change, d2, step_d) * density(change, d3, step_d)
    months = [t1, t1 + d2, t1 + d3]  # both changes from month 1
    for k in range(3):
        weight = weight * stats.norm.pdf(omega[k], months[k], sd) * (months[k] >= -1e-12)
    return *np.broadcast_arrays(t1, d2, d3), weight / weight.sum()


def test_gibbs_months_match_the_brute_force_posterior():
    from gedp.postprocess.implicates import StateAnswers

    sd = 0.5
    omega = np.array([1.6, 2.1, 1.9])
    model = small_model(sd)
    n = 30_000
    model.answers = StateAnswers(np.tile(omega, (n, 1)), np.full(3, sd), np.zeros(n), 1.0, np.zeros(n, dtype=int))
    rng = np.random.default_rng(9)
    import gedp.postprocess.implicates as implicates

    original = implicates.np.rint
    implicates.np.rint = lambda x: x  # the chain's months before they are rounded to whole employees
    try:
        months = next(model.months_chain(np.arange(n), rng, implicates.BURN_IN, 1))
    finally:
        implicates.np.rint = original
    theta = np.sqrt(months)
    grid = {"t": np.round(np.arange(0, 4.5, 0.02), 10), "d": np.round(np.arange(-2, 2.0001, 0.02), 10)}
    t1, d2, d3, weight = brute_force_posterior(omega, sd, model, grid)
    exact_no_change = weight[np.isclose(d2, 0)].sum()
    drawn_no_change = np.mean(np.isclose(theta[:, 1] - theta[:, 0], 0))
    # Binomial sd at n = 30,000 is <= 0.0029; 0.015 (5 sds) plus the grid's discretization.
    assert abs(drawn_no_change - exact_no_change) < 0.015
    exact_quarter = weight[np.isclose(d3, 0)].sum()
    assert abs(np.mean(np.isclose(theta[:, 2] - theta[:, 0], 0)) - exact_quarter) < 0.015
    exact_mean = (t1 * weight).sum()
    assert abs(theta[:, 0].mean() - exact_mean) < 5 * theta[:, 0].std() / np.sqrt(n) + 0.01
    # Power: a chain that never moves from its start (no burn-in) is told apart.
    frozen = np.full(n, max(omega.mean(), 0))
    assert abs(frozen.mean() - exact_mean) > 0.03 or abs(1.0 - exact_no_change) > 0.05


@pytest.mark.parametrize("quarter", [False, True])
def test_gibbs_months_draw_the_level_prior_they_are_given(quarter):
    """A sharp level prior (components of sd 0.05) and answers that move (2.0, 1.2, 2.6): the chain's
    shares without change (months 1 -> 2 and 1 -> 3) are the brute-force posterior's with the level
    prior on month 1's level, or with ``level_prior="quarter"`` on the quarter's (within 0.015: 5
    binomial sds at n = 30,000 plus the grid), and 0.046 and 0.076 away from the other model's: a chain
    of one model fails the other's posterior (power)."""
    import gedp.postprocess.implicates as implicates
    from gedp.postprocess.implicates import BURN_IN, StateAnswers

    sd, omega, n = 0.5, np.array([2.0, 1.2, 2.6]), 30_000
    model = small_model(sd)
    model.quarter = quarter
    model.priors.level = Mixture(np.array([0.0, 1.5, 2.5]), np.array([0.0, 0.05, 0.05]), np.array([0.2, 0.5, 0.3]))
    model.answers = StateAnswers(np.tile(omega, (n, 1)), np.full(3, sd), np.zeros(n), 1.0, np.zeros(n, dtype=int))
    original = implicates.np.rint
    implicates.np.rint = lambda x: x  # the chain's months before they are rounded to whole employees
    try:
        theta = np.sqrt(next(model.months_chain(np.arange(n), np.random.default_rng(12), BURN_IN, 1)))
    finally:
        implicates.np.rint = original
    drawn = [np.mean(np.isclose(theta[:, k] - theta[:, 0], 0)) for k in (1, 2)]
    grid = {"t": np.round(np.arange(0, 4.5, 0.02), 10), "d": np.round(np.arange(-2, 2.0001, 0.02), 10)}
    for level_at, agree in ((quarter, True), (not quarter, False)):
        _, d2, d3, weight = brute_force_posterior(omega, sd, model, grid, level_at)
        exact = [weight[np.isclose(d, 0)].sum() for d in (d2, d3)]
        assert all((abs(a - b) < 0.015) == agree for a, b in zip(drawn, exact)) if agree else max(
            abs(a - b) for a, b in zip(drawn, exact)) > 0.03


def test_level_components_start_with_the_zero_atom():
    means, sds = level_components(0.0, 3.0, 0.6, 0.0, np.array([0.0, 3.0]))
    assert means[0] == 0.0 and sds[0] == 0.0 and (np.diff(means) > 0).all() and means[-1] >= 3.0 - 0.2
    means, sds = change_components(0.15, 10.0, 0.8)
    assert (sds == 0).sum() == 1 and means[sds == 0][0] == 0.0
    assert np.abs(means[means != 0]).min() == pytest.approx(0.15)


def test_each_implicate_is_drawn_under_its_own_draw_of_the_priors():
    import gedp.postprocess.implicates as implicates
    from gedp.postprocess.implicates import StateAnswers

    sd, n = 0.5, 5000
    model = small_model(sd)
    omega = np.array([1.6, 1.7, 1.6])
    model.answers = StateAnswers(np.tile(omega, (n, 1)), np.full(3, sd), np.zeros(n), 1.0, np.zeros(n, dtype=int))
    level = model.priors.level
    still = Mixture(np.array([0.0]), np.array([0.0]), np.array([1.0]))  # nobody changes
    moving = Mixture(np.array([0.4, -0.4]), np.array([0.1, 0.1]), np.array([0.5, 0.5]))  # everybody does
    priors = [Priors(level, 100.0, np.empty(0), [(change, change)]) for change in (still, moving)]
    original = implicates.np.rint
    implicates.np.rint = lambda x: x
    try:
        first, second = model.months_chain(np.arange(n), np.random.default_rng(2), implicates.BURN_IN, 2, priors=priors)
    finally:
        implicates.np.rint = original
    assert np.allclose(first[:, 1], first[:, 0]) and np.allclose(first[:, 2], first[:, 0])
    assert np.isclose(np.sqrt(second[:, 1]) - np.sqrt(second[:, 0]), 0).mean() < 0.01


@pytest.mark.parametrize("sd", [0.8, 0.01, 1e-300])
def test_change_components_cover_no_change_one_employee_and_the_reach_whatever_the_noise(sd):
    """With noise far under one employee's change (a release at a large mu), the grid still has its atom at 0,
    +-one employee and steps of at most 15% out to the reach (it was empty, an IndexError, below sd = smallest / 4)."""
    smallest, reach = 1.0, 50.0
    means, widths = change_components(smallest, reach, sd)
    side = np.sort(means[means > 0])
    assert means[0] == 0.0 and widths[0] == 0.0
    assert np.array_equal(np.sort(-means[means < 0]), side)
    assert side[0] == smallest and side[-1] >= reach
    assert np.all(np.diff(side) <= np.maximum(sd / 4, 0.15 * side[:-1]) * (1 + 1e-12))
    assert np.all(np.isfinite(widths)) and np.all(widths[1:] > 0)


def grid_prior(rng, top=12.0, step=0.1):
    """A level-like prior: an atom at 0 and components every ``step`` up to ``top`` (bandwidth ``step``),
    Dirichlet weights: with a likelihood sd of 0.3, each row's window holds about a third of them."""
    means = np.concatenate([[0.0], np.arange(step, top + step / 2, step)])
    sds = np.concatenate([[0.0], np.full(len(means) - 1, step)])
    return Mixture(means, sds, rng.dirichlet(np.full(len(means), 0.5)))


def reference_draws(center, sd, prior, lower, rng):
    """draw_posterior written out over every component with scipy's densities, row by row: the
    component by inverse CDF on one uniform per row, then its posterior truncated at the bound."""
    from gedp.postprocess.deconvolve import truncated_normal

    u = rng.random(len(center))
    mean, spread = np.empty(len(center)), np.empty(len(center))
    for i, (c, s, low) in enumerate(zip(center, sd, lower)):
        total = prior.sds**2 + s * s
        post_mean = (prior.means * s * s + c * prior.sds**2) / total
        post_sd = prior.sds * s / np.sqrt(total)
        with np.errstate(divide="ignore"):
            above = np.where(post_sd > 0, stats.norm.logsf(low, post_mean, np.maximum(post_sd, 1e-300)),
                             np.where(prior.means >= low, 0.0, -np.inf))
            log_weight = np.log(prior.weights) + stats.norm.logpdf(c, prior.means, np.sqrt(total)) + above
        order = np.argsort(prior.means, kind="stable")
        weight = np.exp(log_weight[order] - log_weight.max())
        k = order[min(int((np.cumsum(weight) < u[i] * weight.sum()).sum()), len(order) - 1)]
        mean[i], spread[i] = (post_mean[k], post_sd[k]) if np.isfinite(log_weight.max()) else (c, s)
    return truncated_normal(mean, spread, lower, rng)


def test_mixture_draws_are_the_full_computations_draws_given_the_same_uniforms():
    # The draw computes each row's components within 7 sds of its center, rows of one sd at once, the
    # truncation only where the bound is near: given the same uniforms it must draw what the
    # computation over every component draws (rows of both sds, bounds near and far, centers past
    # every component, more rows than one block).
    rng = np.random.default_rng(17)
    n = 6000
    for prior in (grid_prior(rng), PRIOR):
        center = rng.uniform(-2.0, prior.means.max() + 3.0, n)
        sd = np.where(rng.random(n) < 0.5, 0.3, 0.45)
        lower = np.where(rng.random(n) < 0.4, -np.inf, rng.uniform(-1.0, prior.means.max() + 1.0, n))
        ours = draw_posterior(center, sd, prior, lower, np.random.default_rng(3))
        theirs = reference_draws(center, sd, prior, lower, np.random.default_rng(3))
        assert (ours >= lower).all()
        # A float's rounding may flip a pick whose uniform falls on a cumulative weight (p ~ 1e-13 a row).
        assert (~np.isclose(ours, theirs, rtol=1e-9, atol=1e-9)).sum() <= 2


def mixture_posterior_cdf(prior, center, sd, lower, points):
    """The posterior CDF at ``points`` in closed form: sum_k w_k N(center; m_k, s_k^2 + sd^2) P(lower <=
    posterior_k <= point) over the same sum with P(posterior_k >= lower), posterior_k the component's
    Gaussian posterior (an atom: a point mass at its mean)."""
    total = prior.sds**2 + sd * sd
    post_mean = (prior.means * sd * sd + center * prior.sds**2) / total
    post_sd = prior.sds * sd / np.sqrt(total)
    atom = post_sd == 0
    scale = np.where(atom, 1.0, post_sd)
    points = np.asarray(points)[:, None]
    mass = np.where(atom, prior.means >= lower, stats.norm.sf(lower, post_mean, scale))
    within = np.where(atom, (prior.means >= lower) & (prior.means <= points),
                      np.clip(stats.norm.cdf(points, post_mean, scale) - (1 - mass), 0, None))
    likelihood = prior.weights * stats.norm.pdf(center, prior.means, np.sqrt(total))
    return (likelihood * within).sum(axis=1) / (likelihood * mass).sum()


@pytest.mark.parametrize("center, lower", [(3.0, -np.inf), (0.3, 0.0), (6.05, 5.9)])
def test_windowed_mixture_draws_follow_the_closed_form_posterior_and_refuse_a_shifted_prior(center, lower):
    rng = np.random.default_rng(23)
    prior, sd, n = grid_prior(rng), 0.3, 40_000
    draws = draw_posterior(np.full(n, center), np.full(n, sd), prior, np.full(n, lower), rng)
    points = np.quantile(draws, np.linspace(0.02, 0.98, 49))
    # Kolmogorov's bound: P(sqrt(n) max gap > 2.2) < 2e-4 at any points.
    gap = np.abs((draws[:, None] <= points).mean(axis=0) - mixture_posterior_cdf(prior, center, sd, lower, points))
    assert gap.max() * np.sqrt(n) < 2.2
    # Power: the posterior under the prior shifted by a sixth of the likelihood's sd is refused.
    shifted = Mixture(prior.means + sd / 6, prior.sds, prior.weights)
    wrong = np.abs((draws[:, None] <= points).mean(axis=0) - mixture_posterior_cdf(shifted, center, sd, lower, points))
    assert wrong.max() * np.sqrt(n) > 2.2


def test_bootstrap_replicates_reach_the_optimum_within_the_certified_gap():
    # A replicate starts from the fitted prior and stops once its weights certify the gap (Frank-Wolfe's
    # bound from the gradient, computed here independently): its log-likelihood must be within GAP_NATS
    # of a solve from uniform weights of the same bootstrap counts.
    rng = np.random.default_rng(8)
    n, sd = 8000, 0.6
    observed = np.where(rng.random(n) < 0.5, 0.0, rng.normal(1.0, 0.7, n)) + rng.normal(0, sd, n)
    means, sds = change_components(0.2, 6.0, sd)
    fitted = fit_mixture(observed, sd, means, sds)
    centers, counts = binned(observed, sd / 10)
    likelihood = stats.norm.pdf(centers[:, None], means, np.sqrt(sds**2 + sd**2))
    value = lambda w, c: float(c @ np.log(likelihood @ w))  # noqa: E731
    for _ in range(5):
        drawn = rng.gamma(counts)
        warm = npmle_weights(likelihood, drawn, start=fitted.on(means, sds))
        cold = npmle_weights(likelihood, drawn)
        gradient = likelihood.T @ (drawn / (likelihood @ warm)) / drawn.sum()
        assert drawn.sum() * (gradient.max() - 1.0) <= GAP_NATS * (1 + 1e-9)
        assert abs(value(warm, drawn) - value(cold, drawn)) < GAP_NATS
        # Power: the start itself (no re-solve) is further from the replicate's optimum than that.
        assert value(cold, drawn) - value(fitted.on(means, sds) + 1e-300, drawn) > GAP_NATS


def atom_weight_mle(x: np.ndarray, a: float) -> np.ndarray:
    """Per row of answers ``x`` (noise sd 1), the maximum likelihood weight p of an atom at 0 against
    mass at +-a (p unconstrained), by Newton steps on the score of log(p phi(x) + (1 - p) psi(x)), up to
    30, until every row's step is below 1e-13 (quadratic convergence: 5 steps from 0.5 at 50,000
    answers, the next ones move p by about 1e-16 back and forth)."""
    phi = stats.norm.pdf(x)
    psi = (stats.norm.pdf(x - a) + stats.norm.pdf(x + a)) / 2
    p = np.full(len(x), 0.5)
    for _ in range(30):
        f = p[:, None] * phi + (1 - p[:, None]) * psi
        g = (phi - psi) / f
        step = g.sum(axis=1) / (g * g).sum(axis=1)
        p = p + step
        if np.abs(step).max() < 1e-13:
            break
    return p


def test_atom_standard_error_is_the_spread_of_the_atom_weights_estimate():
    """The formula against simulation: 400 samples of 50,000 answers from 0.5 atom(0) + 0.25 atom(+-a)
    + N(0, 1), a = 0.2, and the sd of the weight's maximum likelihood estimate. The formula is first
    order in a^2: by quadrature of the exact Fisher information, the real sd is 2.0% above it here. The
    sample sd of 400 estimates is within 3.5% (1 / sqrt(2 * 400)) of the real one, so a 15% band fails
    by chance about once in 10^4 (3.7 sds above, 4.9 below). Power: the formula without its factor
    sqrt(2) (information a^4 instead of a^4 / 2), 29% lower, fails it."""
    rng = np.random.default_rng(44)
    n, a, p = 50_000, 0.2, 0.5
    estimates = np.concatenate([atom_weight_mle(rng.choice([0.0, a, -a], p=[p, (1 - p) / 2, (1 - p) / 2], size=(50, n))
                                                + rng.normal(size=(50, n)), a) for _ in range(8)])
    expected = atom_standard_error(n, a, 1.0)
    assert abs(estimates.mean() - p) < 4 * expected / np.sqrt(400)
    assert abs(estimates.std(ddof=1) / expected - 1) < 0.15
    assert abs(estimates.std(ddof=1) / (expected / np.sqrt(2)) - 1) > 0.15
    assert atom_standard_error(n, a, 1.0) == pytest.approx(np.sqrt(2 / (n * a**4)))
    assert atom_standard_error(0, a, 1.0) == np.inf


def test_summary_reports_the_no_change_weights_standard_error_per_band():
    """Each band's standard error is the formula at its answers' count, its smallest change (one employee
    at twice its upper size) and its difference's sd; a band of many answers at small sizes is the best
    told, and it falls with the count (here: the same answers twice)."""
    rng = np.random.default_rng(5)
    psi = make_psi("sqrt", a=0.0)
    sizes = rng.integers(0, 60, size=3000).astype(float)
    omega = psi(sizes)[:, None] + rng.normal(scale=0.5, size=(3000, 3))
    model = PosteriorModel.__new__(PosteriorModel)
    model.psi = psi
    model.answers = type("A", (), {"months": omega, "month_sd": np.full(3, 0.5)})()
    errors = model.no_change_standard_errors()
    _, band, steps = model.change_bands()
    for b, step in enumerate(steps):
        count = int((band == b).sum())
        by_hand = np.sqrt(2 / (count * (step / np.hypot(0.5, 0.5)) ** 4))
        assert errors[b] == pytest.approx([by_hand, by_hand])
    model.answers.months = np.concatenate([omega, omega])
    assert all(e2 < e1 for e1, e2 in zip(np.ravel(errors), np.ravel(model.no_change_standard_errors())))


# --- inputs that never ended the barrier path (harden16) --------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize(("counts", "gap"), [([1.0, np.nan, 2.0, 3.0, 1.0], GAP_NATS),
                                             ([1.0, np.inf, 2.0, 3.0, 1.0], GAP_NATS),
                                             ([0.0, 0.0, 0.0, 0.0, 0.0], GAP_NATS),
                                             ([1.0, 1.0, 1.0, 1.0, 1.0], float("nan"))])
def test_counts_or_a_gap_that_are_not_finite_are_refused_not_looped(counts, gap):
    """A NaN count made the barrier weight's end NaN, which no barrier weight reaches: the path never
    ended (the code before this test hung on the first case). Now a one-line error."""
    from gedp.errors import InputError

    likelihood = np.random.default_rng(0).random((5, 3)) + 0.1
    with pytest.raises(InputError, match="deconvolution's (counts|gap) must be (a )?finite"):
        npmle_weights(likelihood, np.array(counts), gap_nats=gap)


@pytest.mark.timeout(30)
def test_a_barrier_path_that_does_not_reach_its_end_stops_at_its_cap(monkeypatch):
    """The cap holds whatever keeps the barrier weight from falling (a barrier weight that does not
    fall, here): MAX_BARRIER_STEPS steps, then a SolverError naming them."""
    from gedp.errors import SolverError
    from gedp.postprocess import deconvolve

    monkeypatch.setattr(deconvolve, "BARRIER_FALL", 1.0)
    likelihood = np.random.default_rng(0).random((50, 4)) + 0.1
    counts = np.random.default_rng(1).integers(1, 5, 50).astype(float)
    with pytest.raises(SolverError, match=f"in {deconvolve.MAX_BARRIER_STEPS} steps"):
        npmle_weights(likelihood, counts, gap_nats=1e-12)


def test_the_likelihood_basis_is_factorized_on_one_blas_thread(monkeypatch):
    """Likelihood.of's SVD (the basis of every wage prior, 75 for a state of 20,000) runs on one BLAS
    thread, as the fits' Newton steps do: on a busy 2-core machine two BLAS threads waiting for each
    other made a 3,000 x 115 SVD cost 0.3-1.9 s of CPU, the priors of a state of 20,000 33 s instead
    of 5. The basis is still the likelihood's: U C = L (U orthonormal). Fails before on any machine where BLAS
    may use 2 threads."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from gedp.postprocess.deconvolve import Likelihood

    def blas_threads():
        return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}

    svd, seen = np.linalg.svd, []

    def recorded(*args, **kwargs):
        seen.append(set(blas_threads().values()))
        return svd(*args, **kwargs)

    monkeypatch.setattr(np.linalg, "svd", recorded)
    grid = np.linspace(-3, 3, 60)
    likelihood = stats.norm.pdf(np.random.default_rng(2).normal(0, 1.5, 400)[:, None], grid, 0.5)
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        if max(before.values(), default=1) < 2:
            pytest.skip("BLAS runs on one thread here: nothing to limit")
        ready = Likelihood.of(likelihood, basis=True)
        assert blas_threads() == before  # restored after
    assert seen == [{1}]
    assert ready.basis is not None and ready.coefficients is not None
    np.testing.assert_allclose(ready.basis.T @ ready.basis, np.eye(ready.basis.shape[1]), atol=1e-12)
    np.testing.assert_allclose(ready.basis @ ready.coefficients, ready.matrix, atol=1e-9)


def test_below_count_is_the_count_of_values_below_each_columns_threshold():
    """Against a column-by-column count in Python, on both sides of the byte sum's limit (255 points
    all below a threshold: the largest count a byte holds; 300 points: the integer sum)."""
    from gedp.postprocess.deconvolve import below_count

    rng = np.random.default_rng(3)
    for points in (1, 2, 144, 255, 256, 300):
        running = np.cumsum(rng.random((points, 37)), axis=0)
        threshold = rng.random(37) * running[-1] * 1.2  # some columns above every value
        threshold[0] = np.inf  # every value below: the count is the number of points
        got = below_count(running, threshold)
        expected = [sum(1 for v in running[:, j] if v < threshold[j]) for j in range(37)]
        assert got.dtype == np.int64 and got.tolist() == expected
        assert got[0] == points


def test_the_line_searchs_start_is_the_objective_along_the_step_at_zero_bit_for_bit():
    """The Newton step's objective at the current weights (``_objective``) is ``_objective_along`` at
    t = 0, bit for bit (fitted + 0 L step is fitted): the same line search, the same fits."""
    from gedp.postprocess.deconvolve import _objective, _objective_along

    rng = np.random.default_rng(4)
    for _ in range(200):
        n, m = rng.integers(1, 60, size=2)
        matrix = rng.random((n, m)) ** 3
        weights = rng.dirichlet(np.full(m, 0.3)) + 1e-300
        step = rng.normal(size=m) * weights
        share = rng.dirichlet(np.ones(n))
        fitted, barrier = matrix @ weights + 1e-300, float(10.0 ** rng.uniform(-12, 0))
        assert _objective(share, fitted, weights, barrier) == _objective_along(
            0.0, share, fitted, matrix @ step, weights, step, barrier)
