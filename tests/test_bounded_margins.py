"""Margins of values held near the bound x >= 0: the truncated normal's mean squared error against
scipy's moments and against simulation, its calibration under a flat prior, and its place in the
cells' variances (a cell held at the bound keeps a positive margin)."""

import numpy as np
import pytest
from scipy import stats
from test_postprocess import nested_instance

from gedp.measure.queries import group_establishments
from gedp.postprocess.structured import cell_to_group_matrix, solve_structured_wls
from gedp.postprocess.variances import bounded_error_factor, tabulation_variances, unconstrained_values
from gedp.postprocess.wls import LinearSystem, structured_parts

#: Every simulated mean is checked at 4 standard errors: a false failure has probability 6.3e-5 per
#: check (normal means of 20,000-40,000 light-tailed draws), under 1e-3 for each test's checks.
SES = 4.0
POINTS = np.array([-3.0, -1.5, -0.5, 0.0, 0.4, 1.0, 2.0, 3.5])


def truncated_squared_error(k: float) -> float:
    """E (X - max(k, 0))^2 for X ~ N(k, 1) truncated to X >= 0, from scipy's mean and variance."""
    law = stats.truncnorm(-k, np.inf, loc=k, scale=1.0)
    return float(law.var() + (law.mean() - max(k, 0.0)) ** 2)


def test_factor_equals_scipys_truncated_normal_moments():
    points = np.concatenate([np.linspace(-30, 30, 121), POINTS])
    expected = [truncated_squared_error(k) for k in points]
    np.testing.assert_allclose(bounded_error_factor(points), expected, rtol=1e-7)
    assert bounded_error_factor(np.array([0.0]))[0] == 1.0


def test_factor_is_positive_and_bounded_beyond_its_range():
    """Far below the bound it stays at its value at -30 (never narrower); far above it is 1."""
    below, at_limit, above = bounded_error_factor(np.array([-1e6, -30.0, 1e6]))
    assert below == at_limit > 0
    assert above == 1.0
    assert np.all(bounded_error_factor(np.linspace(-50, 50, 1001)) > 0)


def test_factor_against_simulation_with_power():
    """Draws of the truncated normal (inverse cdf): their mean squared error about max(k, 0) is the
    factor within 4 standard errors, and factors 10% off are rejected at every point (power)."""
    rng = np.random.default_rng(11)
    for k in POINTS:
        draws = stats.truncnorm(-k, np.inf, loc=k, scale=1.0).rvs(40_000, random_state=rng)
        squared = (draws - max(k, 0.0)) ** 2
        se = squared.std(ddof=1) / np.sqrt(len(squared))
        factor = bounded_error_factor(np.array([k]))[0]
        assert abs(squared.mean() - factor) < SES * se, (k, squared.mean(), factor, se)
        for wrong in (0.9 * factor, 1.1 * factor):
            assert abs(squared.mean() - wrong) > SES * se, (k, wrong)


def test_factor_is_calibrated_under_a_flat_prior():
    """True values spread evenly over [0, 40] sd (flat near the bound), answers u = x + N(0, 1), protected
    values max(u, 0): in bands of u, the protected values' mean squared error is the mean factor
    within 4 standard errors, and the unshrunk variance 1 is rejected below the bound and just above it."""
    rng = np.random.default_rng(12)
    truth = rng.uniform(0.0, 40.0, 2_000_000)
    answers = truth + rng.normal(size=truth.size)
    squared = (np.maximum(answers, 0.0) - truth) ** 2
    for low, high, shrunk in ((-np.inf, -1.0, True), (-1.0, 0.0, True), (0.0, 1.5, True), (1.5, 3.0, False)):
        band = (answers >= low) & (answers < high)
        mean, se = squared[band].mean(), squared[band].std(ddof=1) / np.sqrt(band.sum())
        assert abs(mean - bounded_error_factor(answers[band]).mean()) < SES * se, (low, high)
        if shrunk:
            assert abs(mean - 1.0) > SES * se, (low, high)


def test_identity_answers_alone_give_each_establishment_its_factor():
    """Without group answers u_j = a_j: an establishment's variance is v_j f(a_j / sqrt(v_j)), a
    cell's the sum over its establishments; without the protected values, the plain v_j."""
    system, cells, public = nested_instance(21, n=150)
    identity_only = LinearSystem(system.matrix[:150], system.b[:150], system.v[:150])
    values = np.maximum(identity_only.b, 0.0)
    single = group_establishments(public, ("estab_id",))
    alone = tabulation_variances(identity_only, np.arange(150), cells, single.codes, single.n_groups, values=values)
    a, v = identity_only.b[single.codes.argsort()], identity_only.v[single.codes.argsort()]
    np.testing.assert_allclose(alone.variance, v * bounded_error_factor(a / np.sqrt(v)), rtol=1e-12)
    grouping = group_establishments(public, ("county", "naics"))
    summed = tabulation_variances(identity_only, np.arange(150), cells, grouping.codes, grouping.n_groups,
                                  values=values).variance
    expected = np.bincount(grouping.codes, identity_only.v * bounded_error_factor(identity_only.b / np.sqrt(
        identity_only.v)))
    np.testing.assert_allclose(summed, expected, rtol=1e-12)
    plain = tabulation_variances(identity_only, np.arange(150), cells, single.codes, single.n_groups).variance
    np.testing.assert_allclose(plain, v, rtol=1e-12)


@pytest.mark.parametrize("seed", [31, 32])
def test_cells_held_at_the_bound_keep_a_positive_margin(seed):
    """Nested answers with many true zeros, solved with the bound: the unconstrained values of the
    establishments held at 0 are <= 0 (KKT), of the free ones their values; every cell's variance is
    positive (those held at 0 in all their establishments too) and at most its unshrunk variance."""
    system, cells, public = nested_instance(seed, n=300, zero_share=0.7)
    identity = np.arange(300)
    a, v, groups, b, w = structured_parts(system, identity)
    values = solve_structured_wls(a, v, cells, groups, b, w)[0]
    held = values <= 0
    assert held.sum() > 30
    unconstrained = unconstrained_values(system, identity, cells, values, cell_to_group_matrix(
        groups, cells, int(cells.max()) + 1), b, w)
    assert np.all(unconstrained[held] <= 1e-9 * np.abs(a).max())
    np.testing.assert_allclose(unconstrained[~held], values[~held], rtol=1e-8, atol=1e-8 * np.abs(a).max())
    grouping = group_establishments(public, ("county", "naics"))
    shrunk = tabulation_variances(system, identity, cells, grouping.codes, grouping.n_groups, values=values).variance
    unshrunk = tabulation_variances(system, identity, cells, grouping.codes, grouping.n_groups).variance
    at_bound = grouping.sum(values) <= 0
    assert at_bound.sum() >= 1
    assert np.all(shrunk > 0)
    assert np.all(shrunk <= unshrunk * (1 + 1e-12))
    assert np.all(shrunk[at_bound] < unshrunk[at_bound])
