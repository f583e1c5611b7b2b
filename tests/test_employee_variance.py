"""The per-employee variance b estimated from a release (``postprocess.employee_variance``), against
simulated cells with a known b: its bias and standard error, a power check, the fallback where b is
not identified, hostile inputs; and the fit and the margins using the same b."""

from __future__ import annotations

import numpy as np
import pytest

from gedp.postprocess.employee_variance import BOUNDS, spread_and_employee_variance

SPREAD_BOUNDS = (0.1, 1.0)
FALLBACK = 3.8


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


def estimates(b_true: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per simulated state (100, all identified): the estimate of b and its standard error, on cells made
    with ``b_true``."""
    _, b, error = spread_and_employee_variance(*simulated(np.random.default_rng(seed), b_true))
    assert np.isfinite(error).all()
    return b, error


def consistent(b: np.ndarray, error: np.ndarray, claimed: float) -> bool:
    """The states' estimates agree with the ``claimed`` b: their mean within 5% of it (the mean's own
    standard error is about 1.2% at b = 2.5) and their spread between states within 0.8-1.25 of the
    stated standard error (the standard error calibrated)."""
    return bool(abs(b.mean() / claimed - 1) <= 0.05 and 0.8 <= b.std() / error.mean() <= 1.25)


@pytest.mark.parametrize("b", [2.5, 6.0])
def test_estimate_finds_a_known_b(b):
    """100 simulated states of 3,000 cells (gamma wages; noise about the size of b's part in the small
    cells): the estimates agree with the b they were made with, and their standard errors are
    calibrated. Offline, 100 seeds at each b: no false failure (the estimates' mean -3.2% to +4.2% off
    b, their spread between states 0.84-1.23 of the stated standard error). Power: the same estimates
    refuse b off by a factor of 2 either way (100 of 100 seeds offline)."""
    found, error = estimates(b, seed=int(b * 10))
    assert consistent(found, error, b)
    assert not consistent(found, error, 2 * b)
    assert not consistent(found, error, b / 2)


def test_leaving_the_cell_spread_out_would_be_refused():
    """Power against a wrong implementation: b's moment without the cell spread (s held at 0) puts the
    cells' s^2 (E r)^2 into b, and the check refuses it (100 of 100 seeds offline)."""
    inputs = list(simulated(np.random.default_rng(7), 2.5))
    inputs[7] = (0.0, 0.0)
    _, b, error = spread_and_employee_variance(*inputs)
    assert not consistent(b, error, 2.5)


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
