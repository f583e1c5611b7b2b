"""The smallest establishments' whole-employee changes (``postprocess.whole_changes``) against independent
computations: the month's likelihood given month 1 (``given_first``) against a loop over every change j with
the grid's ends; the chain's draws against the posterior of (x_1, x_2, x_3) enumerated by brute force
(chi-square, p > 1e-4; the posterior of answers 1.3x as noisy refused); and in a simulated state whose
small establishments keep their headcount with a known probability and change up with a known logit of their
cell's movement, the fitted no-change share, logit and slope against the truth (within a stated false-failure
rate; a state with another no-change share and one whose changes ignore their cell refused: the power). With
PERSISTENCE (month 2's change kept in month 3 with probability rho) the chain against the posterior enumerated by
brute force (rho = 0 refused) and rho recovered on a simulated band (independence refused); with SMOOTH_LEVEL
month 1's prior recovered on a simulated band (a prior of another ratio refused)."""

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit

import gedp.postprocess.whole_changes as whole_changes
from gedp.measure.neighbors import make_psi
from gedp.postprocess.whole_changes import (
    LevelFit,
    Persisting,
    WholeFit,
    given_first,
    month_log_likelihood,
    whole_chain,
)

PSI = make_psi("sqrt")
SD = 0.56  # a month's answer sd in sqrt(employment) (the shipped plan's)


def brute_given_first(like, weights, up):
    """sum_j P(j) like[clip(n + j)] by a loop over n and j (``up``: each row's q, or rows x n)."""
    rows, size = like.shape
    top = size - 1
    out = np.zeros((rows, size))
    for n in range(size):
        q = up[:, n] if np.ndim(up) == 2 else up
        for j in range(-top, top + 1):
            p = weights[0] if j == 0 else weights[abs(j)] * (q if j > 0 else 1 - q)
            out[:, n] += p * like[:, min(max(n + j, 0), top)]
    return out


def test_given_first_sums_every_change_with_the_grid_ends():
    rng = np.random.default_rng(0)
    like, weights, up = rng.random((7, 13)), rng.random(13), rng.random(7)
    weights /= weights.sum()
    np.testing.assert_allclose(given_first(like, weights, up), brute_given_first(like, weights, up), rtol=1e-12)


class FixedLevel:
    """A month-1 prior given as log H on the grid (``LevelFit``'s interface)."""

    def __init__(self, log_h):
        self.log_h, self.weights = log_h, None

    def log_prior(self, weights, top):
        return self.log_h[:top + 1]


def posterior(omega, sd, log_h, weights, up, top):
    """p(x_1, x_2, x_3 | omega) on the grid, by enumeration (one row; ``up[k]``: q, or q at each month 1)."""
    lik = [np.exp(month_log_likelihood(np.array([omega[k]]), sd, PSI, top))[0] for k in range(3)]
    q = [np.broadcast_to(up[k], (top + 1, top + 1)) if np.ndim(up[k]) == 1 else np.array(up[k]) for k in range(2)]
    change = [brute_given_first(np.eye(top + 1), weights[k], q[k]).T for k in range(2)]  # [n, x]
    first = np.exp(log_h) * lik[0]
    joint = first[:, None, None] * (change[0] * lik[1])[:, :, None] * (change[1] * lik[2])[:, None, :]
    return joint / joint.sum()


def drawn_cells(omega, weights, up, log_h, top, rows, **fit_fields):
    """Counts of the (month 1, 2, 3) cells drawn by one sweep of ``whole_chain`` for ``rows`` copies of one
    establishment answering ``omega``: month 1's prior exp(log_h), the changes' ``weights`` and up
    probabilities ``up`` (``fit_fields`` added to each change's fit)."""
    answers = SimpleNamespace(months=np.tile(omega, (rows, 1)), month_sd=np.full(3, SD))
    model = SimpleNamespace(answers=answers, psi=PSI, priors=SimpleNamespace(whole=None))
    fields = {k: {"up_logit": float(np.log(up[k - 1] / (1 - up[k - 1]))), "cell_slope": 0.0, "level_slope": None,
                  **{name: value[k - 1] for name, value in fit_fields.items()}} for k in (1, 2)}
    fits = {(0, k): SimpleNamespace(**fields[k]) for k in (1, 2)}
    whole = SimpleNamespace(model=model, top=top, band=np.zeros(rows, int), fits=fits, movement=np.zeros((rows, 2)),
                            level=FixedLevel(log_h), weights=lambda: {"level": None, (0, 1): weights[0],
                                                                       (0, 2): weights[1]})
    drawn = next(whole_chain(whole, np.arange(rows), np.random.default_rng(1), 1, 1, 1, None, None)).astype(int)
    return np.bincount(np.ravel_multi_index(drawn.T, (top + 1,) * 3), minlength=(top + 1) ** 3)


def test_the_chain_draws_the_posterior_of_the_whole_months():
    top, rows = 14, 6000
    log_h = np.log(0.7 ** np.arange(top + 1) + 0.05)
    weights = [np.r_[0.5, 0.3, 0.15, 0.05, np.zeros(top - 3)], np.r_[0.7, 0.2, 0.1, np.zeros(top - 2)]]
    up = [0.7, 0.35]
    omega = np.array([1.3, 1.9, 1.0])
    observed = drawn_cells(omega, weights, up, log_h, top, rows)

    def p_value(sd):
        expected = posterior(omega, sd, log_h, weights, up, top).ravel() * rows
        big = expected >= 5
        o = np.r_[observed[big], observed[~big].sum()]
        e = np.r_[expected[big], expected[~big].sum()]
        return stats.chisquare(o, e).pvalue

    assert p_value(SD) > 1e-4
    assert p_value(1.3 * SD) < 1e-4  # power


def band_priors(top):
    """The simulated bands' month-1 prior on 0..top (0.75^n, with 0.5 more at 0) and change sizes 1..top
    (P proportional to 2^-s)."""
    prior = 0.75 ** np.arange(top + 1)
    prior[0] += 0.5
    sizes = 0.5 ** np.arange(1, top + 1)
    return prior / prior.sum(), sizes / sizes.sum()


def simulated_band(seed, no_change, up, rows=8000, top=30):
    """A simulated band: month 1 from ``band_priors``, each change 0 with probability ``no_change``, else of
    size s (P proportional to 2^-s), up with probability ``up(first, m)``, m the cell's implied change (uniform
    on [-1.5, 1.5] employees); sqrt answers with sd SD. The answers of months 1 and k, month 1's log prior, m."""
    rng = np.random.default_rng(seed)
    prior, sizes = band_priors(top)
    m = rng.uniform(-1.5, 1.5, rows)
    first = rng.choice(top + 1, rows, p=prior)
    size = rng.choice(np.arange(1, top + 1), rows, p=sizes)
    stays = rng.random(rows) < no_change
    j = np.where(stays, 0, np.where(rng.random(rows) < up(first, m), size, -size))
    later = np.clip(first + j, 0, top)
    omega = PSI(np.column_stack([first, later]).astype(float)) + SD * rng.standard_normal((rows, 2))
    return omega, np.log(prior), m


def simulated_fit(seed, no_change=0.6, up_logit=0.3, cell_slope=1.5, rows=8000, top=30):
    """WholeFit on a simulated band (``simulated_band``), up with probability expit(up_logit + cell_slope m)."""
    omega, log_prior, m = simulated_band(seed, no_change, lambda first, m: expit(up_logit + cell_slope * m), rows,
                                         top)
    return WholeFit.of(omega[:, 0], omega[:, 1], (SD, SD), log_prior, PSI, m)


# Over seeds 0-5 (8,000 rows) the fitted no-change share was 0.58 (sd 0.030) for 0.6, the logit 0.16 (sd 0.061)
# for 0.3 and the slope 1.42 (sd 0.226) for 1.5; the checks allow 6 of those sds around the truth (with the offsets
# seen, the nearest bound is 3.8 sds away: a false failure in fewer than 1 run in 10,000 per figure, if normal).
SPREAD = (0.030, 0.061, 0.226)


def within(fit, no_change=0.6, up_logit=0.3, cell_slope=1.5):
    return (abs(fit.weights[0] - no_change) < 6 * SPREAD[0], abs(fit.up_logit - up_logit) < 6 * SPREAD[1],
            abs(fit.cell_slope - cell_slope) < 6 * SPREAD[2])


def test_the_fit_recovers_the_no_change_share_and_the_cells_direction():
    assert all(within(simulated_fit(11)))


@pytest.mark.parametrize("wrong, figure", [({"no_change": 0.3}, 0), ({"cell_slope": -1.0}, 2)])
def test_a_state_with_other_changes_is_refused(wrong, figure):
    assert not within(simulated_fit(12, **wrong))[figure]


def persisting_posterior(omega, sd, log_h, weights, up, top, stay):
    """p(x_1, x_2, x_3 | omega) by enumeration when month 2's change persists to month 3 with probability ``stay``
    (else month 3's change from month 1 is drawn from its prior)."""
    lik = [np.exp(month_log_likelihood(np.array([omega[k]]), sd, PSI, top))[0] for k in range(3)]
    change = [brute_given_first(np.eye(top + 1), weights[k], np.array(up[k])).T for k in range(2)]  # [n, x]
    joint = np.zeros((top + 1,) * 3)
    for n in range(top + 1):
        for x2 in range(top + 1):
            third = change[1][n] if x2 == n else (1 - stay) * change[1][n] + stay * (np.arange(top + 1) == x2)
            joint[n, x2] = np.exp(log_h[n]) * lik[0][n] * change[0][n, x2] * lik[1][x2] * third * lik[2]
    return joint / joint.sum()


def test_the_chain_draws_the_posterior_with_persistence():
    top, rows, stay = 14, 6000, 0.6
    log_h = np.log(0.7 ** np.arange(top + 1) + 0.05)
    weights = [np.r_[0.5, 0.3, 0.15, 0.05, np.zeros(top - 3)], np.r_[0.6, 0.25, 0.15, np.zeros(top - 2)]]
    up = [0.7, 0.35]
    omega = np.array([1.3, 1.9, 1.8])
    observed = drawn_cells(omega, weights, up, log_h, top, rows, persist=(True, True), stay=(0.0, stay))

    def p_value(rho):
        expected = persisting_posterior(omega, SD, log_h, weights, up, top, rho).ravel() * rows
        big = expected >= 5
        return stats.chisquare(np.r_[observed[big], observed[~big].sum()],
                               np.r_[expected[big], expected[~big].sum()]).pvalue

    assert p_value(stay) > 1e-4
    assert p_value(0.0) < 1e-4  # power: the changes drawn independent given month 1 refused


def persisting_fit(seed, stay, rows=8000, top=30):
    """The persistence rho fitted (``Persisting.fit`` after independent fits of both changes, as ``WholeChanges``)
    on a simulated band: month 1 from a known prior, month 2's change 0 with probability 0.6, else of size s
    (P proportional to 2^-s), up with probability expit(0.3); month 3: where month 2 changed, the same month with
    probability ``stay``, else month 1 plus a change from the same prior with no change 0.7; sqrt answers."""
    rng = np.random.default_rng(seed)
    prior, sizes = band_priors(top)

    def change(no_change):
        size = rng.choice(np.arange(1, top + 1), rows, p=sizes)
        return np.where(rng.random(rows) < no_change, 0, np.where(rng.random(rows) < expit(0.3), size, -size))

    first = rng.choice(top + 1, rows, p=prior)
    second = np.clip(first + change(0.6), 0, top)
    third = np.where((second != first) & (rng.random(rows) < stay), second, np.clip(first + change(0.7), 0, top))
    omega = PSI(np.column_stack([first, second, third]).astype(float)) + SD * rng.standard_normal((rows, 3))
    like = [np.exp(month_log_likelihood(omega[:, k], SD, PSI, top)) for k in range(3)]
    u = np.exp(month_log_likelihood(omega[:, 0], SD, PSI, top) + np.log(prior)[None, :])
    m = np.zeros(rows)
    fit = WholeFit.of(omega[:, 0], omega[:, 1], (SD, SD), np.log(prior), PSI, m)
    return Persisting.fit(u / u.max(axis=1, keepdims=True), like, 2, fit, m).stay


# Over seeds 0-5 (8,000 rows, rho = 0.5) the fitted rho was 0.488 (sd 0.026); the check allows 6 sds around the truth
# (a false failure in fewer than 1 run in 10,000 if normal); a band whose changes are independent (rho = 0; seeds
# 100-105 fitted 0.013, the search's lowest point) is refused (its fit more than 6 sds below 0.5: the power).
SPREAD_RHO = 0.026
def test_the_fit_recovers_the_persistence():
    assert abs(persisting_fit(11, 0.5) - 0.5) < 6 * SPREAD_RHO


def test_independent_changes_are_refused():
    assert persisting_fit(12, 0.0) < 0.5 - 6 * SPREAD_RHO


def smooth_level_distance(seed, ratio=0.7, against=0.7, rows=20000, top=9):
    """Total variation between month 1's smooth prior (SMOOTH_LEVEL) fitted on a simulated band (month 1 with
    P(n) proportional to ``ratio`` ** n, sqrt answers, those below psi(5) kept) and P(n) proportional to
    ``against`` ** n, over n = 0..top."""
    rng = np.random.default_rng(seed)
    truth = ratio ** np.arange(60.0)
    first = rng.choice(60, 3 * rows, p=truth / truth.sum())
    omega = PSI(first.astype(float)) + SD * rng.standard_normal(len(first))
    cut = float(PSI(np.array([5.0]))[0])
    omega = omega[omega < cut][:rows]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(whole_changes, "SMOOTH_LEVEL", True)
        fit = LevelFit.of(omega, SD, PSI, cut)
    h = np.exp(fit.log_prior(fit.weights, top))
    reference = against ** np.arange(top + 1.0)
    return 0.5 * np.abs(h / h.sum() - reference / reference.sum()).sum()


# Over seeds 0-5 the smooth fit's distance to the truth was 0.011, 0.118, 0.012, 0.121, 0.023 and 0.016 with the penalty
# of the largest held-out sum (two of six cross-validations chose a small penalty: not normal, so no sd-based rate is
# claimed: 0 of 6 beyond 0.121; the one-standard-error rule, below: 0.031, 0.040, 0.019, 0.019, 0.038, 0.024) and to a
# prior of ratio 0.5 0.181-0.236 (the power); the check's bound is 0.15, between the two.
TV_BOUND = 0.15


def test_the_smooth_level_prior_recovers_month_one():
    assert smooth_level_distance(11) < TV_BOUND
    assert smooth_level_distance(11, against=0.5) > TV_BOUND


# The penalty's rule (``penalty_choice.SMOOTH_RULE``), on the bands above of seeds 0-11
# (benchmarks/smooth_penalty_rules.py): the largest held-out sum chose 10^-1 on seeds 1, 3 (and 10^0 on 11), its
# distance to the truth 0.118, 0.121 (0.103) for a mean of 0.043 and an sd of 0.044; the one-standard-error rule
# chose 10^2-10^3 on every seed, distances 0.008-0.040, mean 0.025, sd 0.010. The bound is that mean plus 4.5 of
# those sds (a false failure in under 1 run in 100,000 per seed if normal; 0 of 12 seeds beyond 0.040); the power:
# the largest sum's choice on these seeds (0.118, 0.121) and a prior of ratio 0.5 (0.18-0.24) are refused.
RULE_BOUND = 0.07


def test_the_one_standard_error_rule_keeps_month_one_smooth_where_the_best_score_did_not():
    assert smooth_level_distance(1) < RULE_BOUND and smooth_level_distance(3) < RULE_BOUND
    assert smooth_level_distance(1, against=0.5) > RULE_BOUND
