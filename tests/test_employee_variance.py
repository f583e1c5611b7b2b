"""The per-employee variance b estimated from a release (``postprocess.employee_variance``), against
simulated cells with a known b: its bias and standard error, a power check, the fallback where b is
not identified, hostile inputs; and the fit and the margins using the same b."""

from __future__ import annotations

import numpy as np
import pytest

from gedp.postprocess.employee_variance import BOUNDS, spread_and_employee_variance

SPREAD_BOUNDS = (0.1, 1.0)
FALLBACK = 3.8
Z = 3.29  # two-sided 0.1%


def simulated(rng: np.random.Generator, b: float, n_states: int = 100, n_cells: int = 3000, spread2: float = 0.05,
              noise_per_dollar: float = 3e4) -> tuple:
    """The estimator's inputs for ``n_states`` states of ``n_cells`` cells each: a cell of E employees
    at a rate r pays a gamma-distributed wage of mean E r and variance s^2 (E r)^2 + b r^2 E (skewed,
    never negative, as wages are); its summed answers add noise of variance k x its wages (a sqrt
    mechanism's noise grows with the wage), so k x the answers is unbiased for that variance and k x
    the prior is what the fit weighs at."""
    codes = np.repeat(np.arange(n_states), n_cells)
    n = len(codes)
    employment = np.ceil(rng.lognormal(1.5, 1.3, n))
    rate = rng.uniform(5e3, 2e4, n)
    prior = employment * rate
    variance = spread2 * prior**2 + b * rate**2 * employment
    wages = rng.gamma(prior**2 / variance, variance / prior)
    noise = noise_per_dollar * wages
    answers = wages + np.sqrt(noise) * rng.standard_normal(n)
    squared = (answers - prior) ** 2
    return (codes, squared - noise_per_dollar * prior, squared - noise_per_dollar * answers, prior,
            rate**2 * employment, noise_per_dollar * prior, n_states, SPREAD_BOUNDS, FALLBACK)


def z_scores(b_true: float, b_claimed: float, seed: int) -> np.ndarray:
    """Per simulated state where b is identified (at least 95 of 100): (estimate - ``b_claimed``) / its
    standard error, on cells made with ``b_true``."""
    _, b, error = spread_and_employee_variance(*simulated(np.random.default_rng(seed), b_true))
    identified = np.isfinite(error)
    assert identified.sum() >= 95
    return (b - b_claimed)[identified] / error[identified]


def consistent(z: np.ndarray) -> bool:
    """The states' z-scores agree with the claimed b: their mean within Z of its standard error (false
    failure 0.1% where z is standard normal across states) and their sd within 0.75-1.33 (the
    standard error calibrated)."""
    return bool(abs(z.mean()) <= Z * z.std() / np.sqrt(len(z)) and 0.75 <= z.std() <= 1.33)


@pytest.mark.parametrize("b", [2.5, 6.0])
def test_estimate_finds_a_known_b(b):
    """100 simulated states of 3,000 cells (gamma wages; noise about the size of b's part in the small
    cells): the estimates agree with the b they were made with, and their standard errors are
    calibrated. False failures: 0 of 100 seeds at either b offline (z's mean -0.36 to 0.22 where the
    check allows about +-0.33 x its sd, z's sd 0.87-1.29; at b = 1.5, 1 of 100, and 39 of 10,000 states
    not identified). Power: the same estimates refuse b off by a factor of 2 either way."""
    seed = int(b * 10)
    assert consistent(z_scores(b, b, seed))
    assert not consistent(z_scores(b, 2 * b, seed))
    assert not consistent(z_scores(b, b / 2, seed))


def test_leaving_the_cell_spread_out_would_be_refused():
    """Power against a wrong implementation: b's moment without the cell spread (s held at 0) puts the
    cells' s^2 (E r)^2 into b, and the check refuses it."""
    inputs = list(simulated(np.random.default_rng(7), 2.5))
    inputs[7] = (0.0, 0.0)
    _, b, error = spread_and_employee_variance(*inputs)
    assert not consistent((b - 2.5) / error)


def test_not_identified_keeps_the_fallback():
    """Answers so noisy (the noise 100 times b's part in a small cell) that b's standard error exceeds
    half the estimate: the state keeps the fallback, with an infinite standard error; with a tenth of
    that noise the same cells identify b."""
    _, b, error = spread_and_employee_variance(*simulated(np.random.default_rng(3), 2.5, n_states=5, n_cells=300,
                                                          noise_per_dollar=2.5e6))
    assert (b == FALLBACK).all() and np.isinf(error).all()
    _, b, error = spread_and_employee_variance(*simulated(np.random.default_rng(3), 2.5, n_states=5, n_cells=300,
                                                          noise_per_dollar=2.5e3))
    assert np.isfinite(error).all() and (b != FALLBACK).all()


@pytest.mark.parametrize("scale", [1e150, -1e150, 1e-300])
def test_hostile_answers_keep_b_finite_and_in_range(scale):
    """Edited answers (a few cells' summed answers moved by huge or tiny amounts: the release's reader
    refuses non-finite ones) leave b finite and within BOUNDS, or at the fallback."""
    inputs = list(simulated(np.random.default_rng(5), 2.5, n_states=3, n_cells=500))
    for k in (1, 2):
        inputs[k] = inputs[k].copy()
        inputs[k][::50] = scale
    _, b, _ = spread_and_employee_variance(*inputs)
    assert np.isfinite(b).all()
    assert ((b >= BOUNDS[0]) & (b <= BOUNDS[1]) | (b == FALLBACK)).all()


@pytest.mark.parametrize("config", ["baseline", "recommended"])
def test_the_margins_refit_gets_the_releases_b(small_state, monkeypatch, config):
    """With EMPLOYEE_VARIANCE_ESTIMATED, the wage fit the margins recompute from a release's files
    (``wages.fit_wages``, ``wage_margins.wage_variances``) gives back the released wages, so it estimates
    the b the release was protected with (b changes the wages: the check has power, below). The small
    state (1,500 establishments) does not identify b, so any estimate is taken here. Power: a refit at
    another b (the fallback, the knob off) gives other wages and other margins."""
    import gedp
    from gedp.postprocess import employee_variance, wage_margins, wages
    from gedp.release.reader import read_release

    monkeypatch.setattr(wages, "EMPLOYEE_VARIANCE_ESTIMATED", True)
    monkeypatch.setattr(employee_variance, "IDENTIFIED", np.inf)  # 1,500 establishments: not identified else
    release = gedp.protect(small_state, config, seed=5, not_for_publication=True)
    protected, answers = read_release(release.folder)
    psi = gedp.load(config).plan.psi
    fit = wages.fit_wages(answers, protected, psi)
    assert np.isfinite(fit.employee_variance_se).all() and (fit.employee_variance != wages.EMPLOYEE_VARIANCE).all()
    np.testing.assert_allclose(fit.values, protected["wage"], rtol=1e-9, atol=1e-6)
    monkeypatch.setattr(wages, "EMPLOYEE_VARIANCE_ESTIMATED", False)
    other = wages.fit_wages(answers, protected, psi)
    assert (other.employee_variance == wages.EMPLOYEE_VARIANCE).all()
    assert not np.allclose(other.values, protected["wage"], rtol=1e-6, atol=1e-3)
    n = len(fit.totals)
    assert not np.allclose(wage_margins.wage_variances(fit, fit.cell_codes, n),
                           wage_margins.wage_variances(other, other.cell_codes, n), rtol=1e-3)
