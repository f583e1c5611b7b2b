"""The whole changes' direction by month 1's level (``whole_changes.LEVEL_DIRECTION``: q(n) = expit(alpha + gamma m +
delta log n), q(0) = 1) against independent computations: ``directions`` against the closed form written with the
standard library; the month's likelihood given month 1 (``given_first``) against a loop over every change; a fit's
component likelihoods against an enumeration of (x_1, x_k) from the answers; the chain's draws against the
posterior of (x_1, x_2, x_3) enumerated by brute force (chi-square, p > 1e-4; delta = 0 refused); and on a simulated
band whose direction moves with the level, the fitted no-change share, alpha, delta and gamma against the truth
(within a stated false-failure rate; the model with one direction and a band without the level's effect refused:
the power)."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit
from test_whole_changes import PSI, SD, brute_given_first, drawn_cells, posterior, simulated_band

import gedp.postprocess.whole_changes as whole_changes
from gedp.postprocess.whole_changes import WholeFit, directions, given_first


def test_directions_is_the_level_s_logit_and_up_from_zero():
    movement, top = np.array([0.3, -1.0, 0.0]), 5
    q = directions(0.5, 1.2, -1.7, movement, top)
    for i, m in enumerate(movement):
        for n in range(top + 1):
            expected = 1.0 if n == 0 else 1 / (1 + math.exp(-(0.5 + 1.2 * m - 1.7 * math.log(n))))
            assert q[i, n] == pytest.approx(expected, rel=1e-12)
    np.testing.assert_array_equal(directions(0.5, 1.2, None, movement, top)[:, 0], expit(0.5 + 1.2 * movement))


def test_given_first_with_a_direction_per_month_one():
    rng = np.random.default_rng(0)
    like, weights, up = rng.random((7, 13)), rng.random(13), rng.random((7, 13))
    weights /= weights.sum()
    np.testing.assert_allclose(given_first(like, weights, up), brute_given_first(like, weights, up), rtol=1e-12)


def test_the_components_are_the_enumerated_likelihood():
    """Component 0 (no change) and s = 1..top of each row: sum_n H(n) N(omega_1; psi(n)) sum over the two
    directions q(n) N(omega_k; psi(clip(n + s))), (1 - q(n)) N(omega_k; psi(clip(n - s))), enumerated from the
    answers; equal to the fit's up to each row's constant."""
    rng = np.random.default_rng(3)
    top, rows = 9, 40
    log_h = np.log(0.7 ** np.arange(top + 1.0))
    omega = PSI(rng.integers(0, 5, (rows, 2)).astype(float)) + SD * rng.standard_normal((rows, 2))
    movement = rng.uniform(-1, 1, rows)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(whole_changes, "LEVEL_DIRECTION", True)
        patch.setattr(WholeFit, "search", lambda self, *args: None)
        fit = WholeFit.of(omega[:, 0], omega[:, 1], (SD, 1.1 * SD), log_h, PSI, movement)
    got = fit.components(0.4, 0.8, level=-1.3)
    density = [lambda x, k=k, s=s: math.exp(-0.5 * ((omega_i[k] - math.sqrt(x)) / s) ** 2)
               for k, s in ((0, SD), (1, 1.1 * SD))]
    for i in range(rows):
        omega_i = omega[i]
        expected = np.zeros(top + 1)
        for n in range(top + 1):
            q = 1.0 if n == 0 else 1 / (1 + math.exp(-(0.4 + 0.8 * movement[i] - 1.3 * math.log(n))))
            first = math.exp(log_h[n]) * density[0](n)
            expected[0] += first * density[1](n)
            for s in range(1, top + 1):
                expected[s] += first * (q * density[1](min(n + s, top)) + (1 - q) * density[1](max(n - s, 0)))
        np.testing.assert_allclose(got[i] / got[i, 0], expected / expected[0], rtol=1e-10)


def test_the_chain_draws_the_posterior_with_the_level_direction():
    top, rows = 14, 6000
    log_h = np.log(0.7 ** np.arange(top + 1) + 0.05)
    weights = [np.r_[0.5, 0.3, 0.15, 0.05, np.zeros(top - 3)], np.r_[0.7, 0.2, 0.1, np.zeros(top - 2)]]
    up, slopes = [0.9, 0.6], (-2.0, -1.0)
    omega = np.array([1.3, 1.9, 1.0])
    observed = drawn_cells(omega, weights, up, log_h, top, rows, level_slope=slopes)

    def p_value(delta):
        q = [directions(float(np.log(u / (1 - u))), 0.0, d, np.zeros(1), top)[0] for u, d in zip(up, delta)]
        expected = posterior(omega, SD, log_h, weights, q, top).ravel() * rows
        big = expected >= 5
        return stats.chisquare(np.r_[observed[big], observed[~big].sum()],
                               np.r_[expected[big], expected[~big].sum()]).pvalue

    assert p_value(slopes) > 1e-4
    assert p_value((0.0, 0.0)) < 1e-4  # power: one direction whatever the level refused


def level_fit(seed, level_slope=-2.0, level=True, no_change=0.5, up_logit=3.0, cell_slope=1.5, rows=8000, top=30):
    """WholeFit (LEVEL_DIRECTION ``level``) on a simulated band (``simulated_band``), up with probability
    expit(up_logit + cell_slope m + level_slope log n) (1 at n = 0)."""
    def up(first, m):
        return np.where(first == 0, 1.0, expit(up_logit + cell_slope * m + level_slope * np.log(np.maximum(first, 1))))
    omega, log_prior, m = simulated_band(seed, no_change, up, rows, top)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(whole_changes, "LEVEL_DIRECTION", level)
        return WholeFit.of(omega[:, 0], omega[:, 1], (SD, SD), log_prior, PSI, m)


# Over seeds 0-5 (8,000 rows; truth w_0 0.5, alpha 3, delta -2, gamma 1.5) the fit gave w_0 0.493 (sd 0.011), alpha
# 2.76 (0.53), delta -1.87 (0.39) and gamma 1.56 (0.22); the checks allow 6 sds around the truth (the largest offset
# seen 2.3 sds: a false failure in fewer than 1 run in 10,000 per figure, if normal). The power: the model with one
# direction fitted w_0 0.31-0.37 on those bands (13 or more sds low). On a band whose direction does not move with
# the level (delta = 0, seed 12) the level model fitted w_0 0.491 and delta 0.14: it finds no level effect there (a
# check with the same spreads; delta's 6 sds, 2.3, do not separate 0 from -2: the figure that refuses one
# direction is w_0).
SPREAD = {"no_change": 0.011, "up_logit": 0.525, "level_slope": 0.391, "cell_slope": 0.221}


def within(fit, no_change=0.5, up_logit=3.0, level_slope=-2.0, cell_slope=1.5):
    delta = np.inf if fit.level_slope is None else fit.level_slope - level_slope
    return {"no_change": abs(fit.weights[0] - no_change) < 6 * SPREAD["no_change"],
            "up_logit": abs(fit.up_logit - up_logit) < 6 * SPREAD["up_logit"],
            "level_slope": abs(delta) < 6 * SPREAD["level_slope"],
            "cell_slope": abs(fit.cell_slope - cell_slope) < 6 * SPREAD["cell_slope"]}


def test_the_fit_recovers_a_direction_that_moves_with_the_level():
    assert all(within(level_fit(11)).values())


def test_one_direction_is_refused_on_that_band():
    assert not within(level_fit(11, level=False))["no_change"]


def test_the_level_model_finds_no_level_effect_where_there_is_none():
    assert all(within(level_fit(12, level_slope=0.0), level_slope=0.0).values())
