"""The sibling rates' heavier-tailed prior (``postprocess.rate_tails``, option ``wages.RATE_TAILS``):
the quadrature against closed forms and brute-force integration, and simulated states whose sibling
rates have a known tail (recovered, outliers shrunk less, normal rates left as the normal fit)."""

from __future__ import annotations

import numpy as np
import scipy.integrate
import scipy.linalg
import scipy.special
import scipy.stats

from gedp.postprocess import rate_tails
from gedp.postprocess.rate_tails import NU_GRID, effective_deviations, fit_tails, variance_multiplier
from gedp.postprocess.wage_rates import difference_variances

BOUNDS = (0.01, 4.0)


def _state(rng: np.random.Generator, nu: float, n_terms: int = 600, spread2: float = 0.04, noise_share: float = 0.3):
    """Deviations u ~ t_nu(0, s^2 c) (normal at nu = inf), observed with noise n = noise_share s^2 c."""
    scale = rng.uniform(0.5, 2.0, n_terms)
    lam = np.ones(n_terms) if np.isinf(nu) else rng.gamma(nu / 2.0, 2.0 / nu, n_terms)
    u = rng.normal(0.0, np.sqrt(spread2 * scale / lam))
    noise = noise_share * spread2 * scale
    return u, u + rng.normal(0.0, np.sqrt(noise)), noise, scale


def test_multiplier_is_the_t_posterior_in_closed_form_without_noise():
    """At n = 0, lambda | u is Gamma((nu + 1) / 2, rate (nu + u^2 / (s^2 c)) / 2): E[1 / lambda | u] =
    (nu + u^2 / (s^2 c)) / (nu - 1)."""
    u = np.array([0.0, 0.1, 0.3, 1.0, 3.0])
    scale = np.array([1.0, 0.5, 2.0, 1.0, 1.5])
    for nu in (2.5, 4.0, 10.0):
        got = variance_multiplier(u**2, np.zeros(5), scale, 0.04, nu)
        np.testing.assert_allclose(got, (nu + u**2 / (0.04 * scale)) / (nu - 1.0), rtol=1e-5)


def test_multiplier_against_brute_force_integration_with_noise():
    d, n, c, s2, nu = 0.5, 0.02, 1.2, 0.03, 3.0

    def joint(lam, power):
        return (lam**power * scipy.stats.gamma.pdf(lam, nu / 2.0, scale=2.0 / nu)
                * scipy.stats.norm.pdf(d, 0.0, np.sqrt(n + s2 * c / lam)))

    numerator = scipy.integrate.quad(joint, 0, np.inf, args=(-1,), limit=200)[0]
    denominator = scipy.integrate.quad(joint, 0, np.inf, args=(0,), limit=200)[0]
    got = variance_multiplier(np.array([d**2]), np.array([n]), np.array([c]), s2, nu)[0]
    assert abs(got - numerator / denominator) < 1e-4 * numerator / denominator


def test_effective_deviations_undo_a_normal_prior():
    rng = np.random.default_rng(3)
    d, n, tau2 = rng.normal(size=50), rng.uniform(0.1, 2.0, 50), rng.uniform(0.1, 2.0, 50)
    mean, variance = d * tau2 / (tau2 + n), tau2 * n / (tau2 + n)
    got_d, got_n = effective_deviations(mean, variance, tau2)
    np.testing.assert_allclose(got_d, d, rtol=1e-9)
    np.testing.assert_allclose(got_n, n, rtol=1e-9)
    none_d, none_n = effective_deviations(np.array([0.3]), np.array([2.0]), np.array([2.0]))  # no information
    assert none_d[0] == 0.0 and np.isinf(none_n[0])


def test_difference_variances_against_the_dense_inverse():
    rng = np.random.default_rng(4)
    half = rng.normal(size=(9, 9))
    m = half @ half.T + 9 * np.eye(9)
    index = np.arange(9)
    children, parents = np.array([0, 1, 2, 5]), np.array([7, 7, 8, 8])
    inverse = np.linalg.inv(m)
    expected = inverse[children, children] + inverse[parents, parents] - 2 * inverse[children, parents]
    for lower in (True, False):
        blocks = ((index, scipy.linalg.cho_factor(m, lower=lower)),)
        np.testing.assert_allclose(difference_variances(blocks, children, parents), expected, rtol=1e-10)


def test_simulated_heavy_tail_is_recovered():
    """nu = 3: the fit picks nu <= 6 in at least 26 of 30 states, and its s^2 is the truth's within
    15% (median). Off the test, 0 of 100 states (seeds 10000-10099) picked nu > 6: a per-state rate
    below 0.03 (95% upper bound), so 5 or more of 30 has probability below 0.002."""
    rng = np.random.default_rng(11)
    picked, scales = [], []
    for _ in range(30):
        _, d, noise, scale = _state(rng, 3.0)
        spread2, nu, _ = fit_tails(d, noise, scale, BOUNDS)
        picked.append(nu)
        scales.append(spread2)
    assert sum(nu <= 6.0 for nu in picked) >= 26
    assert abs(np.median(scales) / 0.04 - 1.0) < 0.15


def test_outliers_are_shrunk_less_than_under_the_normal_prior():
    """Power: on t_3 rates, the outliers' (|u| > 3 s sqrt(c)) estimates with the fitted t prior's
    variances lie nearer the exact posterior mean under the true prior (brute force over a grid of u)
    and nearer the truth than those of the normal fit (nu = inf, its marginal-likelihood s^2)."""
    rng = np.random.default_rng(12)
    u, d, noise, scale = _state(rng, 3.0, n_terms=3000)
    spread2, nu, multiplier = fit_tails(d, noise, scale, BOUNDS)
    heavy = d * spread2 * scale * multiplier / (spread2 * scale * multiplier + noise)
    normal_spread2, _, _ = fit_tails(d, noise, scale, BOUNDS, nus=(np.inf,))
    normal = d * normal_spread2 * scale / (normal_spread2 * scale + noise)
    far = np.abs(u) > 3 * np.sqrt(0.04 * scale)
    assert far.sum() > 50
    grid = np.linspace(-5, 5, 20001)
    exact = np.array([np.sum(grid * w) / np.sum(w) for w in (
        scipy.stats.t.pdf(grid / np.sqrt(0.04 * c), 3.0) * scipy.stats.norm.pdf(x, grid, np.sqrt(n))
        for x, n, c in zip(d[far], noise[far], scale[far]))])
    assert np.mean(np.abs(heavy[far] - exact)) < 0.5 * np.mean(np.abs(normal[far] - exact))
    assert np.mean(np.abs(heavy[far] - u[far])) < np.mean(np.abs(normal[far] - u[far]))


def test_normal_rates_give_the_normal_fit():
    """On normal rates the fit keeps nu = inf or a large nu (>= 10) in at least 26 of 30 states
    (off the test 0 of 100 states, seeds 10000-10099, picked a smaller nu: a per-state rate below 0.03,
    so 5 or more of 30 has probability below 0.002), and the variances it gives are the normal
    fit's within noise (median multiplier within 10% of 1, s^2 within 15% of the truth)."""
    rng = np.random.default_rng(13)
    picked, medians, scales = [], [], []
    for _ in range(30):
        _, d, noise, scale = _state(rng, np.inf)
        spread2, nu, multiplier = fit_tails(d, noise, scale, BOUNDS)
        picked.append(nu)
        medians.append(np.median(spread2 * multiplier) / 0.04)
        scales.append(spread2 * (nu / (nu - 2.0) if np.isfinite(nu) else 1.0))
    assert sum(nu >= 10.0 for nu in picked) >= 26
    assert abs(np.median(medians) - 1.0) < 0.10
    assert abs(np.median(scales) / 0.04 - 1.0) < 0.15
    assert np.inf in NU_GRID


def test_margins_use_the_final_weights_in_both_paths(fitted_state, baseline_wage_fit, monkeypatch):
    """With RATE_TAILS the wage fit's rate priors change (the Hessian over the rates differs from the
    normal prior's), and the margins from per-cell pieces are the per-establishment ones to the last
    bits and the dense covariance of that fit."""
    from test_cell_margins import cell_tab, tab_codes
    from test_wages import _dense_variances as dense_wage_variances

    from gedp.postprocess import wage_margins, wages
    from gedp.postprocess.cellmargins import WageCells, finest_cells, pieces_of
    from gedp.postprocess.models import WageVariances

    answers, protected, psi = fitted_state  # the baseline release of the small state, seed 5
    normal = baseline_wage_fit
    monkeypatch.setattr(wages, "RATE_TAILS", True)
    fit = wages.fit_wages(answers, protected, psi)
    assert abs(fit.rates.precision - normal.rates.precision).max() > 1e-6 * abs(normal.rates.precision).max()
    finest = finest_cells(protected)
    exact = WageVariances(fit, wage_margins.wage_factorizations(fit))
    pieces = pieces_of(exact, finest.codes, finest.n_groups)
    assert isinstance(pieces, WageCells)
    for by in [("county",), ("naics3",), ()]:
        tab, n_tab = tab_codes(protected, by)
        variance, _ = pieces.variances(cell_tab(finest.codes, tab), n_tab)
        np.testing.assert_allclose(variance, dense_wage_variances(fit, tab, n_tab), rtol=1e-7)
        np.testing.assert_allclose(variance, exact(tab, n_tab).variance, rtol=1e-12)


def _full_grid(d2, noise, scale, spread2, nu, shape):
    """The expectation on every node of the grid, plainly (the quadrature before CUT, caching and
    buffers): the reference the fast one keeps within 1e-10 relative."""
    log_lam = np.linspace(*rate_tails.LOG_RANGE, rate_tails.NODES)
    log_weight = (scipy.stats.gamma.logpdf(np.exp(log_lam), shape, scale=2.0 / nu) + log_lam
                  + np.log(log_lam[1] - log_lam[0]))
    variance = noise[:, None] + spread2 * scale[:, None] / np.exp(log_lam)[None, :]
    return scipy.special.logsumexp(log_weight - 0.5 * (np.log(2 * np.pi * variance) + d2[:, None] / variance), axis=1)


def _cases():
    """The tests' terms: t_3 and normal rates (``_state``), cells over four orders of magnitude, and
    terms at 0 without noise (where the dropped nodes weigh most) and far outliers."""
    rng = np.random.default_rng(31)
    yield _state(rng, 3.0)[1:], 0.04
    yield _state(rng, np.inf)[1:], 0.04
    vp = np.exp(rng.uniform(np.log(1e6), np.log(1e10), 500))
    yield (rng.standard_t(3.0, 500) * np.sqrt(0.3 * vp), vp * rng.uniform(0.1, 3.0, 500), vp), 0.3
    yield (np.array([0.0, 0.0, 0.3, 30.0, 1e3]), np.array([0.0, 1e-9, 0.0, 2.0, 0.0]), np.ones(5)), 0.3


def test_quadrature_is_the_full_grid_within_1e_10():
    """The expectation (log-likelihoods at shapes nu / 2 and nu / 2 - 1, so the multipliers too) is the
    full grid's within 1e-10 relative at every nu of the grid and s^2 from 0.01 to 10 times the
    truth. Power: at CUT = 5 the comparison fails."""
    for (d, noise, scale), spread2 in _cases():
        for nu in NU_GRID[:-1]:
            for shape in (nu / 2.0, nu / 2.0 - 1.0):
                for factor in (0.01, 1.0, 10.0):
                    got = rate_tails._log_likelihoods(d**2, noise, scale, factor * spread2, nu, shape)
                    expected = _full_grid(d**2, noise, scale, factor * spread2, nu, shape)
                    np.testing.assert_allclose(np.exp(got - expected), 1.0, rtol=0, atol=1e-10)
    d = np.zeros(3)
    loose = rate_tails.CUT
    try:
        rate_tails.CUT = 5.0
        rate_tails._mixture.cache_clear()
        got = rate_tails._log_likelihoods(d, d, np.ones(3), 0.3, 20.0)
    finally:
        rate_tails.CUT = loose
        rate_tails._mixture.cache_clear()
    assert np.max(np.abs(np.exp(got - _full_grid(d, d, np.ones(3), 0.3, 20.0, 10.0)) - 1.0)) > 1e-10
