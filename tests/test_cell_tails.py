"""The cells' heavy-tailed wage prior (``postprocess.cell_tails``, option ``wages.CELL_TAILS``): the
marginal likelihood against quadrature and the t density, simulated cell populations whose deviations
have a known tail (recovered; a normal one left as the normal fit), and the margins of the fit with
the option against a dense covariance."""

from __future__ import annotations

import numpy as np
import scipy.integrate
import scipy.stats

from gedp.postprocess import rate_tails
from gedp.postprocess.cell_tails import SCALE_BOUNDS, cell_tail_variances
from gedp.postprocess.rate_tails import _log_likelihoods, fit_tails


def _cells(rng: np.random.Generator, nu: float, n_cells: int = 1500, spread2: float = 0.3):
    """Cells like the wage fit's: normal prior variances vp over four orders of magnitude, deviations
    ~ t_nu(0, s^2 vp) (normal at nu = inf), observed with noise n = vp x a ratio of 0.1-3."""
    vp = np.exp(rng.uniform(np.log(1e6), np.log(1e10), n_cells))
    lam = np.ones(n_cells) if np.isinf(nu) else rng.gamma(nu / 2.0, 2.0 / nu, n_cells)
    u = rng.normal(0.0, np.sqrt(spread2 * vp / lam))
    noise = vp * rng.uniform(0.1, 3.0, n_cells)
    return u, u + rng.normal(0.0, np.sqrt(noise)), noise, vp


def test_marginal_likelihood_against_quadrature():
    """log E_lambda N(d; 0, n + s^2 c / lambda) against scipy's adaptive quadrature over lambda, for
    terms near and far from 0 (a far one's lambda lies in the mixture's far tail) and every nu of the
    grid; at n = 0 against the Student-t density in closed form. Cut into blocks of 2 terms the
    answer is the same to the last bits."""
    d = np.array([0.0, 0.3, 1.0, 4.0, 30.0])
    n = np.array([0.05, 0.0, 0.5, 0.1, 2.0])
    c = np.array([1.0, 2.0, 0.5, 1.5, 1.0])
    s2 = 0.3
    for nu in rate_tails.NU_GRID[:-1]:
        got = _log_likelihoods(d**2, n, c, s2, nu)
        for k in range(len(d)):
            def joint(lam, k=k):
                return (scipy.stats.gamma.pdf(lam, nu / 2.0, scale=2.0 / nu)
                        * scipy.stats.norm.pdf(d[k], 0.0, np.sqrt(n[k] + s2 * c[k] / lam)))
            pieces = [scipy.integrate.quad(joint, a, b, limit=400, epsabs=0)[0]
                      for a, b in ((0, 1e-6), (1e-6, 1e-2), (1e-2, 1), (1, 10), (10, np.inf))]
            assert abs(got[k] - np.log(sum(pieces))) < 1e-6, (nu, k)
        closed = scipy.stats.t.logpdf(d[1], nu, scale=np.sqrt(s2 * c[1]))
        assert abs(got[1] - closed) < 1e-6
    np.testing.assert_allclose(_log_likelihoods(d**2, n, c, s2, 3.0),
                               _blocked(d**2, n, c, s2, 3.0, 2), rtol=0, atol=0)


def _blocked(d2, n, c, s2, nu, block):
    old = rate_tails.BLOCK
    rate_tails.BLOCK = block
    try:
        return _log_likelihoods(d2, n, c, s2, nu)
    finally:
        rate_tails.BLOCK = old


def test_at_most_k_terms_is_every_kth_term():
    """``most``: s^2 and nu are those of every k-th term (here k = 3 of 1,000 terms at most 400);
    the multipliers are every term's at those s^2 and nu."""
    rng = np.random.default_rng(5)
    _, d, noise, vp = _cells(rng, 4.0, n_cells=1000)
    spread2, nu, multiplier = fit_tails(d, noise, vp, SCALE_BOUNDS, most=400)
    sub2, subnu, _ = fit_tails(d[::3], noise[::3], vp[::3], SCALE_BOUNDS)
    assert (spread2, nu) == (sub2, subnu)
    np.testing.assert_allclose(multiplier, rate_tails.variance_multiplier(d**2, noise, vp, spread2, nu), rtol=1e-12)


def test_simulated_heavy_tailed_cells_are_recovered():
    """t_3 cell deviations at s^2 = 0.3: nu is picked within 2.5-4 in at least 9 of 10 states and the
    median s^2 is within 20% of 0.3 (this draw: nu 2.5-4 in all 10, s^2 0.21-0.43, median 0.34; s^2
    follows the coarse grid's nu, 0.37-0.43 at nu = 4). Off the test, 2 of 100 states (seeds
    20000-20099, one each) picked nu outside 2.5-4: 2 or more misses of 10 has probability 0.016 at
    that rate (0.15 at its 95% upper bound, 0.07); their s^2 spread 0.22-0.42 (5-95%), median 0.30, so
    a median of 10 states lies 2.4 standard errors from the 20% bound (about 1.6% two-sided). Power:
    normal cells give nu >= 10 (``test_normal_cells_give_the_normal_fit``), which this test refuses."""
    rng = np.random.default_rng(21)
    picked, scales = [], []
    for _ in range(10):
        _, d, noise, vp = _cells(rng, 3.0)
        variance, spreads, nus = cell_tail_variances(np.zeros(len(d), dtype=np.int64), d, noise, vp,
                                                     np.zeros(len(d), dtype=bool), 1)
        picked.append(nus[0])
        scales.append(spreads[0])
    assert sum(2.5 <= nu <= 4.0 for nu in picked) >= 9
    assert abs(np.median(scales) / 0.3 - 1.0) < 0.2


def test_normal_cells_give_the_normal_fit():
    """Power: on normal deviations (s^2 = 1: the normal prior is right) a t prior is refused (nu = inf
    or >= 10 in at least 9 of 10 states; off the test 0 of 100 states, seeds 20000-20099, picked
    less: 2 or more of 10 below 0.035 at the rate's 95% upper bound, 0.03) and the cells' prior
    variances are vp within 10% (median ratio; this draw's states 0.89-1.06, off the test 0.87-1.12,
    5-95%: the median of 10 about 3.3 standard errors inside the bound)."""
    rng = np.random.default_rng(22)
    picked, ratios = [], []
    for _ in range(10):
        _, d, noise, vp = _cells(rng, np.inf, spread2=1.0)
        variance, _, nus = cell_tail_variances(np.zeros(len(d), dtype=np.int64), d, noise, vp,
                                               np.zeros(len(d), dtype=bool), 1)
        picked.append(nus[0])
        ratios.append(np.median(variance / vp))
    assert sum(nu >= 10.0 for nu in picked) >= 9
    assert abs(np.median(ratios) - 1.0) < 0.1


def test_states_apart_and_fixed_cells_kept():
    """Each state gets its own nu and s^2 (a t_3 state and a normal one, interleaved), and a fixed
    cell keeps its normal prior variance."""
    rng = np.random.default_rng(23)
    heavy, normal = _cells(rng, 3.0), _cells(rng, np.inf, spread2=1.0)
    state = np.tile([0, 1], len(heavy[0]))
    d, noise, vp = (np.ravel(np.column_stack([a, b])) for a, b in zip(heavy[1:], normal[1:]))
    fixed = np.zeros(len(d), dtype=bool)
    fixed[:7] = True
    variance, _, nus = cell_tail_variances(state, d, noise, vp, fixed, 2)
    assert nus[0] <= 4.0 and nus[1] >= 10.0
    np.testing.assert_array_equal(variance[fixed], vp[fixed])


def test_margins_are_the_dense_covariance_of_the_fit_at_the_new_variances(fitted_state, monkeypatch):
    """With CELL_TAILS the cells' prior variances change (the fit's cell variances and its links to
    the rates differ from the normal prior's), and the margins are the dense covariance of that fit
    (``test_wages._dense_variances``, from the fit's own variances and links), not the normal fit's."""
    from test_cell_margins import tab_codes
    from test_wages import _dense_variances as dense_wage_variances

    from gedp.postprocess import wage_margins, wages

    answers, protected, psi = fitted_state
    normal = wages.fit_wages(answers, protected, psi)
    monkeypatch.setattr(wages, "CELL_TAILS", True)
    fit = wages.fit_wages(answers, protected, psi)
    free = ~fit.fixed_cells
    assert np.max(np.abs(fit.cell_variance[free] / normal.cell_variance[free] - 1)) > 0.05
    for by in [("county",), ("naics3",), ()]:
        tab, n_tab = tab_codes(protected, by)
        margins = wage_margins.wage_variances(fit, tab, n_tab)
        np.testing.assert_allclose(margins, dense_wage_variances(fit, tab, n_tab), rtol=1e-7)
        assert np.max(np.abs(margins / wage_margins.wage_variances(normal, tab, n_tab) - 1)) > 1e-3
