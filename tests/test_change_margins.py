"""Margins of changes with the levels' variance slopes: the change's slope against the regression of
the stated variance on the change's error (simulation), the margin against its score interval."""

import numpy as np
import pytest
from scipy.optimize import brentq

from gedp.measure.design import ChangeCells
from gedp.postprocess.changes import change_columns

Z = 1.959963984540054
#: (V1, V2, C, g1, g2): variances, covariance and slopes of a cell's two levels.
CASES = [(4.0, 5.0, 0.0, 0.7, 0.8), (9.0, 2.0, 0.0, 1.2, 0.1), (6.0, 6.0, 2.0, 0.5, 0.9), (3.0, 8.0, 1.0, 0.0, 1.5)]


def change_margin(v1, v2, c, g1, g2):
    """The change's margin from change_columns, given the levels' margins and slopes."""
    margins = tuple(np.array([Z * np.sqrt(v + (Z * g / 2) ** 2)]) for v, g in ((v1, g1), (v2, g2)))

    def covariance(cells: ChangeCells) -> np.ndarray:
        return np.full(len(cells.first_variance), c)

    columns = change_columns("m1emp", np.array([10.0]), np.array([12.0]), margins, Z, covariance, 4,
                             (np.array([g1]), np.array([g2])))
    return columns["m1emp_chg_moe"][0]


def implied_slope(v1, v2, c, g1, g2):
    """|g| of the change from its margin z sqrt(V + (z g / 2)^2), V = V1 + V2 - 2C."""
    return 2 / Z * np.sqrt(max((change_margin(v1, v2, c, g1, g2) / Z) ** 2 - (v1 + v2 - 2 * c), 0.0))


@pytest.mark.parametrize("case", CASES)
def test_change_slope_is_the_regression_of_the_stated_variance_on_its_error(case):
    """Errors (e1, e2) drawn with the levels' covariance; the stated variance moves as g1 e1 + g2 e2;
    its least-squares slope on e2 - e1 matches the margin's slope within 4 standard errors (false
    failure 6.3e-5 per case), and the sum of the two slopes (the widening without them) is rejected
    wherever it differs from the right one by more than 0.05 (power)."""
    v1, v2, c, g1, g2 = case
    rng = np.random.default_rng(41)
    errors = rng.multivariate_normal([0.0, 0.0], [[v1, c], [c, v2]], size=200_000)
    stated, change = errors @ np.array([g1, g2]), errors[:, 1] - errors[:, 0]
    slope = np.cov(stated, change)[0, 1] / change.var(ddof=1)
    residual = stated - slope * change
    se = residual.std(ddof=2) / (change.std(ddof=1) * np.sqrt(len(change)))
    assert abs(abs(slope) - implied_slope(*case)) < 4 * se, (slope, implied_slope(*case), se)
    if abs(abs(slope) - np.hypot(g1, g2)) > 0.05:
        assert abs(abs(slope) - np.hypot(g1, g2)) > 4 * se


@pytest.mark.parametrize("case", CASES)
def test_change_margin_is_half_its_score_intervals_length(case):
    """{d : d^2 <= z^2 (V + g d)}, V = V1 + V2 - 2C, g the regression slope, found by root finding."""
    v1, v2, c, g1, g2 = case
    variance = v1 + v2 - 2 * c
    g = (g2 * (v2 - c) - g1 * (v1 - c)) / variance
    gap = lambda d: d * d - Z * Z * (variance + g * d)  # noqa: E731
    low, high = brentq(gap, -1e6, 0.0), brentq(gap, 0.0, 1e6)
    assert change_margin(*case) == pytest.approx((high - low) / 2, rel=1e-10)


def test_without_slopes_the_levels_squared_margins_add():
    margins = (np.array([3.0, 2.0]), np.array([4.0, 0.0]))
    columns = change_columns("wage", np.array([1.0, 2.0]), np.array([3.0, 0.0]), margins, Z, None, 1)
    np.testing.assert_allclose(columns["wage_chg_moe"], [5.0, 2.0], rtol=1e-12)
