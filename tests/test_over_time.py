"""Noise designs across quarters against brute force, closed forms and simulation.

The simulation tests draw with fixed seeds; each compares a sample variance with its chi-square
distribution at two-sided level 1e-4 per contrast (false-failure rate below 1e-3 per test over its
contrasts) and is paired with a power check: the same test rejects the variance x0.7 and x1.3.
"""

import itertools

import numpy as np
import pytest
from scipy import stats

from gedp.errors import InputError
from gedp.measure import over_time as ot

ALPHA = 1e-4


def test_corners_are_every_sign_vector_up_to_sign():
    corners = ot.sign_corners(4)
    every = {tuple(s) for s in itertools.product((1.0, -1.0), repeat=4)}
    reached = {tuple(c) for c in corners} | {tuple(-c) for c in corners}
    assert corners.shape == (8, 4) and reached == every


def test_box_sensitivity_is_the_maximum_over_a_fine_grid_of_the_box():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(4, 3))
    axis = np.linspace(-1, 1, 41)
    grid = np.array(list(itertools.product(axis, repeat=3)))
    brute = np.sqrt(((grid @ rows.T) ** 2).sum(axis=1).max())
    assert ot.box_sensitivity(rows) == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize("quarters", [4, 5])
def test_cost_of_the_closed_form_designs(quarters):
    a, b = 0.7, 0.4
    assert ot.box_sensitivity(np.eye(quarters)) ** 2 == pytest.approx(quarters)
    one_change = ot.change_design(quarters, level=a, year=b)
    n_year = quarters - ot.YEAR
    assert ot.box_sensitivity(one_change.rows) ** 2 == pytest.approx(quarters * a * a + 4 * n_year * b * b)
    rho = 0.8
    shared = ot.shared_component_design(quarters, rho).rows
    smallest_sum = quarters % 2  # the corner whose coordinates add up to the least in absolute value
    expected = (quarters - rho * smallest_sum ** 2 / (1 + (quarters - 1) * rho)) / (1 - rho)
    assert ot.box_sensitivity(shared) ** 2 == pytest.approx(expected)


def test_level_and_year_change_rows_over_three_years_cost_every_change_row_in_full():
    quarters, a, b = 12, 0.8, 0.3
    rows = ot.change_design(quarters, level=a, year=b).rows
    assert ot.box_sensitivity(rows) ** 2 == pytest.approx(quarters * a * a + 4 * (quarters - 4) * b * b)


def test_continuing_series_of_level_and_year_change_rows_matches_the_stationary_closed_form():
    # Far from the ends of a long series, var(y_t - y_t-4) = (1 - a / sqrt(a^2 + 4 b^2)) / b^2 (Fourier)
    quarters, a, b = 160, 0.8, 0.3
    covariance = ot.estimate_covariance(ot.change_design(quarters, level=a, year=b), 1.0)
    middle = quarters // 2
    variance = covariance[middle, middle] + covariance[middle + 4, middle + 4] - 2 * covariance[middle, middle + 4]
    assert variance == pytest.approx((1 - a / np.sqrt(a * a + 4 * b * b)) / b ** 2, rel=1e-9)


def test_an_establishment_present_in_some_quarters_spends_on_those_alone():
    independent = ot.independent_design(5)
    present = np.array([True, False, True, True, False])
    assert ot.presence_mu(independent, present, 0.5, 0.25) == pytest.approx(np.sqrt(3) * 0.5 / 0.25)
    design = ot.change_design(5, level=0.8, quarter=0.3, year=0.6)
    # brute force: moves of +-1 in the present quarters, 0 elsewhere
    moves = [np.where(present, np.array(signs, dtype=float), 0.0)
             for signs in itertools.product((1, -1), repeat=5)]
    brute = max(np.linalg.norm(design.rows @ move) for move in moves)
    assert ot.presence_mu(design, present, 1.0, 1.0) == pytest.approx(brute)
    with pytest.raises(InputError, match=r"present \(shape \(5,\)\) must mark at least one"):
        ot.presence_mu(design, np.zeros(5, dtype=bool), 1.0, 1.0)


def test_independent_quarters_at_an_annual_budget():
    design = ot.independent_design(4)
    sd = ot.design_sd(design, 0.5, 2.3065)
    assert sd == pytest.approx(0.5 / (2.3065 / 2))
    assert ot.design_mu(design, 0.5, sd) == pytest.approx(2.3065)


def test_change_design_variances_match_the_closed_forms():
    a, b, sd = 0.9, 0.6, 1.3
    design = ot.change_design(5, level=a, year=b)
    levels = ot.contrast_variances(design, sd, "level") / sd ** 2
    ends = (a * a + b * b) / (a * a * (a * a + 2 * b * b))
    np.testing.assert_allclose(levels, [ends, 1 / a ** 2, 1 / a ** 2, 1 / a ** 2, ends], rtol=1e-12)
    year = ot.contrast_variances(design, sd, "year") / sd ** 2
    np.testing.assert_allclose(year, [2 / (a * a + 2 * b * b)], rtol=1e-12)


def test_shared_component_gives_no_change_for_the_box_at_equal_mu():
    quarters, rho, mu, gamma = 4, 0.7, 2.0, 0.5
    shared = ot.shared_component_design(quarters, rho)
    sd = ot.design_sd(shared, gamma, mu)
    covariance = ot.estimate_covariance(shared, sd)
    np.testing.assert_allclose(covariance, sd ** 2 * (rho + (1 - rho) * np.eye(quarters)), atol=1e-12)
    independent = ot.independent_design(quarters)
    independent_sd = ot.design_sd(independent, gamma, mu)
    np.testing.assert_allclose(ot.contrast_variances(shared, sd, "quarter"),
                               ot.contrast_variances(independent, independent_sd, "quarter"), rtol=1e-12)
    assert ot.contrast_variances(shared, sd, "level")[0] > 3 * independent_sd ** 2


@pytest.mark.parametrize("name", ["independent", "change", "shared", "tree", "optimal"])
def test_no_design_beats_the_one_row_bound(name):
    # var(c'y) >= gamma^2 ||c||_1^2 / mu^2 (Cauchy-Schwarz at the corner sign(c))
    quarters, gamma, mu = 5, 0.5, 2.0
    design = {"independent": ot.independent_design(quarters),
              "change": ot.change_design(quarters, level=1, quarter=0.5, year=2),
              "shared": ot.shared_component_design(quarters, 0.5),
              "tree": ot.binary_tree_design(quarters),
              "optimal": ot.optimal_design(quarters, {"level": 1, "year": 3})}[name]
    sd = ot.design_sd(design, gamma, mu)
    for kind, l1 in (("level", 1), ("quarter", 2), ("year", 2)):
        assert (ot.contrast_variances(design, sd, kind) >= gamma ** 2 * l1 ** 2 / mu ** 2 * (1 - 1e-9)).all()


def test_binary_tree_rows_are_dyadic_interval_sums():
    rows = ot.binary_tree_design(4).rows
    increments = np.array([[1, 0, 0, 0], [-1, 1, 0, 0], [0, -1, 1, 0], [0, 0, -1, 1]], dtype=float)
    intervals = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 2), (2, 4), (0, 4)]
    expected = np.array([increments[i:j].sum(axis=0) for i, j in intervals])
    np.testing.assert_array_equal(rows, expected)


def _variance_rejects(errors: np.ndarray, variance: np.ndarray) -> bool:
    n = errors.shape[0]
    statistic = (errors ** 2).sum(axis=0) / variance
    low, high = stats.chi2.ppf([ALPHA / 2, 1 - ALPHA / 2], n)
    return bool(((statistic < low) | (statistic > high)).any())


def test_gls_estimates_are_unbiased_with_the_stated_covariance():
    rng = np.random.default_rng(7)
    design = ot.optimal_design(5, {"level": 1, "quarter": 1, "year": 2})
    sd = ot.design_sd(design, 0.5, 2.5)
    truth = rng.uniform(0, 30, size=(20_000, 5))
    estimates = ot.gls_estimates(design, ot.release_answers(design, truth, sd, rng=rng))
    for kind in ot.CONTRAST_KINDS:
        rows = ot.contrasts(5, kind)
        errors = (estimates - truth) @ rows.T
        variance = ot.contrast_variances(design, sd, kind)
        z = errors.mean(axis=0) / np.sqrt(variance / len(errors))
        assert (np.abs(z) < stats.norm.isf(ALPHA / 2)).all()
        assert not _variance_rejects(errors, variance)
        assert _variance_rejects(errors, 0.7 * variance) and _variance_rejects(errors, 1.3 * variance)


def test_optimal_design_for_levels_alone_is_independent_quarters():
    design = ot.optimal_design(4, {"level": 1})
    assert ot.box_sensitivity(design.rows) == pytest.approx(1.0, rel=1e-9)
    np.testing.assert_allclose(design.rows.T @ design.rows, np.eye(4) / 4, atol=1e-5)


@pytest.mark.parametrize("weight", [0.5, 3.0])
def test_over_two_full_years_independent_quarters_are_optimal_for_levels_and_year_changes(weight):
    # Lower bound with corners alternating by year (weight w/(1+w)) and uniform: 64 (1 + w) = independent.
    quarters = 8
    design = ot.optimal_design(quarters, {"level": 1, "year": weight})
    sd = ot.design_sd(design, 1.0, 1.0)
    objective = (ot.contrast_variances(design, sd, "level").mean()
                 + weight * ot.contrast_variances(design, sd, "year").mean())
    assert objective == pytest.approx(quarters * (1 + 2 * weight), rel=1e-4)


def test_optimal_design_trades_levels_for_the_year_change_over_five_quarters():
    independent = ot.independent_design(5)
    optimal = ot.optimal_design(5, {"level": 1, "year": 3})
    year = [ot.contrast_variances(d, ot.design_sd(d, 1.0, 1.0), "year")[0] for d in (independent, optimal)]
    level = [ot.contrast_variances(d, ot.design_sd(d, 1.0, 1.0), "level").mean() for d in (independent, optimal)]
    assert year[1] < 0.6 * year[0] and level[1] > 1.3 * level[0]


def test_refusals_name_the_value_and_the_rule():
    with pytest.raises(InputError, match=r"quarters \(17\) must be a whole number from 1 to 16"):
        ot.sign_corners(17)
    with pytest.raises(InputError, match=r"contrast kind \('month'\) must be one of level, quarter, year"):
        ot.contrasts(5, "month")
    with pytest.raises(InputError, match=r"must determine all 5 quarters' levels"):
        ot.estimate_covariance(ot.change_design(5, level=0, year=1), 1.0)
    with pytest.raises(InputError, match=r"rho \(1\) must be in \[0, 1\)"):
        ot.shared_component_design(4, 1)
    with pytest.raises(InputError, match=r"weights .* at least one weight > 0"):
        ot.optimal_design(4, {"levels": 1})


def _sample_variance_z(errors: np.ndarray, variance: np.ndarray) -> np.ndarray:
    # z of the sample variance against ``variance``, its standard error from the fourth moment
    centred = errors - errors.mean(axis=0)
    squares = centred ** 2
    return (squares.mean(axis=0) - variance) / (squares.std(axis=0) / np.sqrt(len(errors)))


def test_sqrt_change_variance_matches_simulation_and_its_estimate_is_unbiased():
    # z tests at two-sided 1e-4 on 5 contrasts (false-failure rate < 1e-3), power at x0.7 and x1.3
    rng = np.random.default_rng(21)
    design = ot.optimal_design(5, {"level": 1, "year": 3})
    sd = ot.design_sd(design, 0.5, 1.0)
    covariance = ot.estimate_covariance(design, sd)
    psi_truth = np.sqrt([25.0, 30.0, 12.0, 40.0, 36.0])
    rows = np.vstack([ot.contrasts(5, "year"), ot.contrasts(5, "quarter")])
    n = 200_000
    estimates = ot.gls_estimates(design, ot.release_answers(design, np.tile(psi_truth, (n, 1)), sd, rng=rng))
    errors = ot.sqrt_levels(estimates, covariance) @ rows.T - rows @ psi_truth ** 2
    # Isserlis: Cov(y_s^2, y_t^2) = 2 C_st^2 + 4 m_s m_t C_st for y ~ N(m, C)
    pairs = 2 * covariance ** 2 + 4 * np.outer(psi_truth, psi_truth) * covariance
    exact = np.array([row @ pairs @ row for row in rows])
    limit = stats.norm.isf(ALPHA / 2)
    assert (np.abs(_sample_variance_z(errors, exact)) < limit).all()
    assert (np.abs(_sample_variance_z(errors, 0.7 * exact)) > limit).all()
    assert (np.abs(_sample_variance_z(errors, 1.3 * exact)) > limit).all()
    released = ot.sqrt_contrast_variances(estimates, covariance, rows)
    z = (released.mean(axis=0) - exact) / (released.std(axis=0) / np.sqrt(n))
    assert (np.abs(z) < limit).all()


def _trace_sqrt_squared(matrix: np.ndarray) -> float:
    return float(np.sqrt(np.clip(np.linalg.eigvalsh(matrix), 0, None)).sum() ** 2)


@pytest.mark.parametrize("weight", [0.5, 3.0])
def test_two_year_lower_bound_from_a_corner_mixture_is_attained_by_independent_quarters(weight):
    # For corners drawn from pi, max_s s'Ms >= tr(M Sigma_pi); min tr(G M^-1) under tr(M Sigma) <= 1 is
    # (tr (Sigma^1/2 G Sigma^1/2)^1/2)^2. Mixing uniform corners with corners alternating by year
    # (s_t+4 = -s_t) at lambda = w / (1 + w) gives 64 (1 + w), the value of independent quarters.
    year = ot.contrasts(8, "year")
    gram = np.eye(8) + weight * year.T @ year
    alternating = np.block([[np.eye(4), -np.eye(4)], [-np.eye(4), np.eye(4)]])
    lam = weight / (1 + weight)
    mixture = (1 - lam) * np.eye(8) + lam * alternating
    values, vectors = np.linalg.eigh(mixture)
    root = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
    bound = _trace_sqrt_squared(root @ gram @ root)
    independent = np.trace(gram @ np.linalg.inv(np.eye(8) / 8))
    assert bound == pytest.approx(64 * (1 + weight)) and independent == pytest.approx(bound)
    rng = np.random.default_rng(4)
    for _ in range(20):  # any design scaled to box sensitivity 1 does no better
        rows = rng.normal(size=(10, 8))
        rows /= ot.box_sensitivity(rows)
        assert np.trace(gram @ np.linalg.inv(rows.T @ rows)) >= bound * (1 - 1e-12)


def test_released_noise_has_the_sd_the_cost_is_charged_for():
    # KS at 1e-4 (false-failure rate 1e-4); power: the same test rejects sd x0.7 and x1.3
    rng = np.random.default_rng(9)
    design = ot.change_design(5, level=1.0, year=0.5)
    sd = ot.design_sd(design, 0.5, 2.0)
    assert ot.design_mu(design, 0.5, sd) == pytest.approx(2.0)
    truth = rng.uniform(0, 10, size=(20_000, 5))
    noise = (ot.release_answers(design, truth, sd, rng=rng) - truth @ design.rows.T).ravel()
    assert stats.kstest(noise / sd, "norm").pvalue > ALPHA
    assert stats.kstest(noise / (0.7 * sd), "norm").pvalue < ALPHA
    assert stats.kstest(noise / (1.3 * sd), "norm").pvalue < ALPHA


def _objective(design: ot.Design, weights: dict) -> float:
    sd = ot.design_sd(design, 1.0, 1.0)
    return sum(weight * ot.contrast_variances(design, sd, kind).mean() for kind, weight in weights.items())


def test_optimal_design_beats_every_change_design_and_every_nearby_precision():
    weights = {"level": 1.0, "quarter": 0.5, "year": 3.0}
    optimal = ot.optimal_design(5, weights)
    best = _objective(optimal, weights)
    grid = [ot.change_design(5, level=1.0, quarter=q, year=y)
            for q in np.linspace(0, 1, 6) for y in np.linspace(0, 2, 11)]
    assert best <= min(_objective(design, weights) for design in grid) * (1 + 1e-6)
    rng = np.random.default_rng(12)
    precision = optimal.rows.T @ optimal.rows
    for _ in range(50):  # feasible perturbations (rescaled to sensitivity 1) never do better
        step = rng.normal(scale=0.02, size=(5, 5))
        values, vectors = np.linalg.eigh(precision + (step + step.T) / 2)
        rows = (vectors * np.sqrt(np.clip(values, 1e-9, None))) @ vectors.T
        assert _objective(ot.Design("perturbed", rows), weights) >= best * (1 - 1e-5)


def test_average_over_corners_bounds_every_design_and_the_year_change_gain_over_long_series():
    # max over corners >= mean over corners = tr(W'W); so sum of year-change variances >= (tr G^1/2)^2 / mu^2,
    # G = sum of c c'. Relative to independent quarters the bound tends to (mean of 2|sin(t/2)|)^2 / 2 = 8/pi^2.
    rng = np.random.default_rng(6)
    for _ in range(20):
        rows = rng.normal(size=(7, 6))
        assert ot.box_sensitivity(rows) ** 2 >= np.trace(rows.T @ rows) * (1 - 1e-12)

    def bound_ratio(quarters: int) -> float:
        year = ot.contrasts(quarters, "year")
        gram = year.T @ year
        return _trace_sqrt_squared(gram) / (quarters * np.trace(gram))

    assert bound_ratio(640) == pytest.approx(8 / np.pi ** 2, abs=0.005)
    assert bound_ratio(12) > 0.75 ** 2  # a quarter less error is out of reach from 12 quarters on
    for _ in range(20):
        rows = rng.normal(size=(14, 12))
        design = ot.Design("random", rows)
        sd = ot.design_sd(design, 1.0, 1.0)
        independent = ot.independent_design(12)
        ratio = (ot.contrast_variances(design, sd, "year").sum()
                 / ot.contrast_variances(independent, ot.design_sd(independent, 1.0, 1.0), "year").sum())
        assert ratio >= bound_ratio(12) * (1 - 1e-12)
