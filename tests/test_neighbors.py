"""Neighbor functions and uncertainty intervals against closed forms and quadrature."""

import math

import numpy as np
import pytest
from scipy import integrate

from gedp.measure.neighbors import LinearPsi, LogPsi, SqrtLinearPsi, SqrtPsi, interval_table, make_psi
from gedp.synth.schema import InputError

VALUES = np.array([0.0, 0.1, 3.0, 36.0, 360.0, 36_000.0])


def test_sqrt_interval_closed_form():
    gamma = 0.5
    lower, upper = SqrtPsi().interval(VALUES, gamma)
    root = np.sqrt(VALUES)
    np.testing.assert_allclose(upper, (root + gamma) ** 2)
    np.testing.assert_allclose(lower, np.where(root > gamma, (root - gamma) ** 2, 0.0))


def test_sqrt_interval_with_offset():
    gamma, a = 0.5, 2.0
    lower, upper = SqrtPsi(a=a).interval(VALUES, gamma)
    root = np.sqrt(VALUES + a)
    np.testing.assert_allclose(upper, (root + gamma) ** 2 - a)
    np.testing.assert_allclose(lower, np.maximum((root - gamma) ** 2, a) - a, atol=1e-12)


def test_interval_table_quotes_the_policy_example():
    """x = 36 with gamma 0.5: I = [30.25, 42.25], i.e. -16.0% / +17.4%."""
    row = interval_table(SqrtPsi(), 0.5, np.array([36.0]))[0]
    assert (row["lower"], row["upper"]) == pytest.approx((30.25, 42.25))
    assert row["below_pct"] == pytest.approx(100 * 5.75 / 36)
    assert row["above_pct"] == pytest.approx(100 * 6.25 / 36)


def test_log_interval_closed_form():
    gamma = 0.1
    x = VALUES[VALUES > 0]
    lower, upper = LogPsi().interval(x, gamma)
    np.testing.assert_allclose(lower, x * math.exp(-gamma))
    np.testing.assert_allclose(upper, x * math.exp(gamma))


def test_log_interval_with_offset_is_clamped_at_zero():
    gamma, a = 1.0, 1.0
    lower, upper = LogPsi(a=a).interval(VALUES, gamma)
    np.testing.assert_allclose(upper, (VALUES + a) * math.e - a)
    np.testing.assert_allclose(lower, np.maximum((VALUES + a) / math.e, a) - a)


def test_linear_interval_is_additive():
    lower, upper = LinearPsi(d=4.0).interval(VALUES, 0.5)
    np.testing.assert_allclose(upper, VALUES + 2.0)
    np.testing.assert_allclose(lower, np.maximum(VALUES - 2.0, 0.0))


def test_sqrt_linear_equals_integral_of_minimum_derivative():
    """psi*(x) = integral_0^x min(1 / (2 gamma sqrt t), 1 / d) dt (SPEC section 3)."""
    gamma, d = 0.5, 3.0
    combined = SqrtLinearPsi(gamma_sqrt=gamma, d=d)
    for x in (0.5, combined.knot, 20.0, 500.0):
        expected, _ = integrate.quad(lambda t: min(1 / (2 * gamma * math.sqrt(t)) if t > 0 else math.inf, 1 / d),
                                     0, x, points=[combined.knot], limit=200)
        assert combined(np.array([x]))[0] == pytest.approx(expected, rel=1e-8)
    grid = np.linspace(0, 1000, 2001)
    np.testing.assert_allclose(combined.inverse(combined(grid)), grid, atol=1e-9)


def test_inverse_clamps_below_psi_of_zero():
    np.testing.assert_array_equal(SqrtPsi().inverse(np.array([-3.0, -0.1])), [0.0, 0.0])
    np.testing.assert_array_equal(LinearPsi().inverse(np.array([-1.0])), [0.0])


def test_log_with_zero_offset_refuses_zero_values():
    with pytest.raises(InputError, match="needs every value > 0, but a total of query total on wage is 0"):
        LogPsi(a=0).check_domain(np.array([0.0, 5.0, 0.0]), "query total on wage")
    LogPsi(a=1).check_domain(np.array([0.0]), "query total on wage")  # a > 0 accepts zeros


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: SqrtPsi(a=-1), r"a \(-1\) must be a finite number >= 0"),
        (lambda: SqrtPsi().interval(VALUES, -1.0), r"gamma \(-1.0\) must be a finite number >= 0"),
        (lambda: LinearPsi(d=0), r"d \(0\) must be a finite number > 0"),
        (lambda: make_psi("cube"), "psi 'cube' is unknown"),
        (lambda: make_psi("sqrt", b=1), "psi 'sqrt' takes parameters"),
    ],
)
def test_invalid_parameters_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_shipped_psi_satisfy_the_neighbor_function_conditions():
    """Strictly increasing, concave, and psi(exp(x)) convex (SPEC section 3), on a grid."""
    x = np.linspace(0.01, 200, 4001)
    for psi in (SqrtPsi(), SqrtPsi(a=1), LogPsi(a=1), LinearPsi(2.0), SqrtLinearPsi(0.5, 3.0)):
        values = psi(x)
        assert np.all(np.diff(values) > 0), psi
        assert np.all(np.diff(values, 2) <= 1e-12), psi
        t = np.linspace(-3, 5, 4001)
        assert np.all(np.diff(psi(np.exp(t)), 2) >= -1e-9), psi
