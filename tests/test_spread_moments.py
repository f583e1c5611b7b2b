"""The weighted moment estimate of a relative spread squared (``postprocess.spread_moments``) against
an independent root finder and by simulation."""

from __future__ import annotations

import numpy as np
import scipy.optimize

from gedp.postprocess.spread_moments import idle_wage_variance, weighted_squared_spread

START = 0.01


def _terms(rng: np.random.Generator, n: int, spread2: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n terms as the wage fit has them: scales (squared rates) and noise variances over orders of
    magnitude (a few noisy terms much noisier than the rest), deviations normal with variance
    noise + spread2 x scale; returns excess (squared deviation less noise), scale and noise."""
    scale = rng.lognormal(0.0, 0.5, n) ** 2
    noise = scale * rng.lognormal(-3.0, 2.5, n)
    deviation = rng.normal(0.0, np.sqrt(noise + spread2 * scale))
    return deviation**2 - noise, scale, noise


def test_the_estimate_solves_the_estimating_equation():
    """Against scipy's root finder on sum c (e - s^2 c) / (n + s^2 c)^2 = 0, per state."""
    rng = np.random.default_rng(3)
    parts = [_terms(rng, 400, s2) for s2 in (0.04, 0.3)]
    codes = np.repeat([0, 1], 400)
    excess, scale, noise = (np.concatenate(columns) for columns in zip(*parts))
    spread2, _ = weighted_squared_spread(codes, excess, scale, noise, 2, START)
    for state in (0, 1):
        e, c, n = excess[codes == state], scale[codes == state], noise[codes == state]

        def equation(s2, e=e, c=c, n=n):
            return np.sum(c * (e - s2 * c) / (n + s2 * c) ** 2)

        root = scipy.optimize.brentq(equation, START, 10.0)
        assert abs(spread2[state] - root) <= 1e-3 * root


def test_a_state_without_scale_gets_zero():
    spread2, error = weighted_squared_spread(np.array([0, 0]), np.array([1.0, 2.0]), np.zeros(2), np.ones(2), 2,
                                             START)
    assert np.all(spread2 == 0.0) and np.all(error == 0.0)


def test_estimate_is_unbiased_and_its_error_is_honest():
    """200 simulated states of 300 terms at s^2 = 0.04 (noisy terms dominating the plain estimate):
    the mean estimate lies within 4 standard errors of the mean of 0.04 (false failure about 6e-5 for
    a normal mean), the sandwich errors' root mean square within 20% of the estimates' sd (its sampling
    error over 200 states is about 5%: a false failure far below 1e-4), and the z-scores cover at 95% +-
    5 points. Power: the plain moment estimate sum (d - n) / sum c of the same states has at least 3
    times the sd (the check fails if the weighing does nothing)."""
    rng = np.random.default_rng(11)
    truth, n_states = 0.04, 200
    estimates, errors, plain = [], [], []
    for _ in range(n_states):
        excess, scale, noise = _terms(rng, 300, truth)
        value, error = weighted_squared_spread(np.zeros(300, dtype=np.int64), excess, scale, noise, 1, START)
        estimates.append(value[0]), errors.append(error[0]), plain.append(excess.sum() / scale.sum())
    estimates, errors = np.array(estimates), np.array(errors)
    assert abs(estimates.mean() - truth) <= 4 * estimates.std() / np.sqrt(n_states)
    assert 0.8 <= np.sqrt(np.mean(errors**2)) / estimates.std() <= 1.2
    assert 0.90 <= np.mean(np.abs(estimates - truth) <= 1.96 * errors) <= 1.0
    assert np.std(plain) >= 3 * estimates.std()


def test_idle_wage_variance_is_unbiased_per_state_and_zero_elsewhere():
    """Two states' idle establishments (wages their prior plus a deviation of sd 15k and 40k, identity
    noise of sd 5k-60k, the weights' noise variance off by up to a factor 3), 200 simulations: each
    state's mean estimate within 4 standard errors of its truth (false failure about 1e-4 for the two),
    the employed establishments at 0; power: the two states' estimates are told apart (their means
    differ by more than 10 of those standard errors)."""
    rng = np.random.default_rng(5)
    n, truths = 600, np.array([15e3**2, 40e3**2])
    state = np.repeat([0, 1], n // 2)
    idle = rng.random(n) < 0.6
    estimates = []
    for _ in range(200):
        prior = rng.uniform(0, 20e3, n)
        noise = rng.uniform(5e3, 60e3, n) ** 2
        answer = prior + rng.normal(0.0, np.sqrt(truths[state])) * idle + rng.normal(0.0, np.sqrt(noise))
        out = idle_wage_variance(answer, prior, noise, noise * rng.uniform(1 / 3, 3, n), idle, state, 2)
        assert np.all(out[~idle] == 0.0)
        estimates.append([out[idle & (state == 0)][0], out[idle & (state == 1)][0]])
    estimates = np.array(estimates)
    error = estimates.std(axis=0) / np.sqrt(len(estimates))
    assert np.all(np.abs(estimates.mean(axis=0) - truths) <= 4 * error)
    assert estimates[:, 1].mean() - estimates[:, 0].mean() > 10 * error.max()
