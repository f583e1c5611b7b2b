"""The combined psi (SPEC section 3): closed form against the numeric builder and the integral, the
neighbor-function rules on a grid (with power), the psi-mechanism estimate by simulation, and the
pnc sensitivity by brute force over neighbors.

Statistical checks use fixed seeds and reject at |z| > 4 (two-sided false-failure rate 6.3e-5 per
check, below 1e-3 for the file); each is paired with a power check that a wrong estimate or
variance is rejected by the same test.
"""

import math

import mpmath
import numpy as np
import pandas as pd
import pytest
from scipy import integrate

from gedp.measure.combined import combine, compose_publishers, neighbor_function_violations
from gedp.measure.mechanisms import pnc_sensitivity, psi_mechanism
from gedp.measure.neighbors import LinearPsi, LogPsi, SqrtLinearPsi, SqrtPsi
from gedp.measure.queries import IDENTITY, group_establishments
from gedp.measure.workflows import MeasurementPlan, QueryPlan
from gedp.synth.schema import MAX_VALUE

Z_REJECT = 4.0
SHIPPED = {"sqrt": SqrtPsi(), "sqrt a=1": SqrtPsi(a=1.0), "log a=1": LogPsi(a=1.0), "linear d=3": LinearPsi(d=3.0)}
GRID = np.geomspace(1e-4, 1e7, 6001)
SETTINGS = [(0.5, 1.0), (0.25, 1.0), (0.1, 3.0), (2.0, 0.5)]  # (gamma_sqrt, d)


@pytest.mark.parametrize("gamma_sqrt, d", SETTINGS)
def test_closed_form_matches_the_numeric_builder(gamma_sqrt, d):
    closed, numeric = SqrtLinearPsi(gamma_sqrt, d), combine(SqrtPsi(), gamma_sqrt, LinearPsi(d), 1.0)
    assert numeric.switch == pytest.approx(d**2 / (4 * gamma_sqrt**2), rel=1e-12)
    x = np.concatenate([[0.0, closed.knot], GRID])
    np.testing.assert_allclose(closed(x), numeric(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(closed.derivative(x[1:]), numeric.derivative(x[1:]), rtol=1e-12)
    y = closed(x)
    np.testing.assert_allclose(numeric.inverse(y), x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(closed.inverse(y), x, rtol=1e-12, atol=1e-12)
    omega = np.linspace(-3, 50, 101)
    np.testing.assert_allclose(closed.unbiased_estimate(omega, 1.3), numeric.unbiased_estimate(omega, 1.3), rtol=1e-12,
                               atol=1e-9)
    np.testing.assert_allclose(closed.estimate_variance(x, 1.3), numeric.estimate_variance(x, 1.3), rtol=1e-10)
    for gamma in (0.3, 1.0, 4.0):
        np.testing.assert_allclose(closed.interval(x, gamma), numeric.interval(x, gamma), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("gamma_sqrt, d", SETTINGS)
def test_closed_form_is_the_integral_of_the_smaller_scaled_derivative(gamma_sqrt, d):
    """psi*(x) = int_0^x min(1 / (2 gamma sqrt t), 1 / d) dt: the sqrt part is sqrt(x), with no offset."""
    combined = SqrtLinearPsi(gamma_sqrt, d)
    for x in (0.3 * combined.knot, combined.knot, 3 * combined.knot, 1e4 * combined.knot):
        expected, _ = integrate.quad(lambda t: min(1 / (2 * gamma_sqrt * math.sqrt(t)), 1 / d), 0, x,
                                     points=[combined.knot] if x > combined.knot else None, limit=200)
        assert combined(np.array([x]))[0] == pytest.approx(expected, rel=1e-9)


def test_an_offset_in_the_sqrt_part_only_moves_the_knot():
    """With sqrt(x + a) the numeric psi* switches at knot - a: the offset only shifts where sqrt takes over."""
    numeric = combine(SqrtPsi(a=0.2), 0.5, LinearPsi(1.0), 1.0)
    assert numeric.switch == pytest.approx(SqrtLinearPsi(0.5, 1.0).knot - 0.2, rel=1e-12)


PAIRS = [(a, b) for a in SHIPPED for b in SHIPPED if a < b]


@pytest.mark.parametrize("first, second", PAIRS)
@pytest.mark.parametrize("build", [combine, compose_publishers])
def test_combined_psi_satisfy_the_four_rules(first, second, build):
    psi = build(SHIPPED[first], 0.5, SHIPPED[second], 2.0)
    assert neighbor_function_violations(psi, GRID) == []
    assert psi(np.zeros(1))[0] == 0.0
    y = psi(GRID)  # the bisection inverse: psi*(psi*^-1(y)) = y up to psi*'s own rounding near 0
    np.testing.assert_allclose(psi(psi.inverse(y)), y, rtol=1e-12, atol=1e-14)
    # the derivative rule: min for combining, max for composing (checked by finite differences)
    pick = np.minimum if build is combine else np.maximum
    slope = (psi(GRID * (1 + 1e-4)) - psi(GRID * (1 - 1e-4))) / (2e-4 * GRID)
    expected = pick(SHIPPED[first].derivative(GRID) / 0.5, SHIPPED[second].derivative(GRID) / 2.0)
    np.testing.assert_allclose(slope, expected, rtol=1e-5)


class _Formula:
    """A candidate psi given by a formula (for the rule checker's power)."""

    def __init__(self, formula):
        self.formula = formula

    def __call__(self, x):
        return self.formula(np.asarray(x, dtype=float))


@pytest.mark.parametrize("formula, broken", [
    (lambda x: x**2, ["concave"]),
    (lambda x: 1 - np.exp(-x), ["exp-convex"]),  # increasing and concave, but psi(e^t) is not convex
    (lambda x: -np.sqrt(x), ["increasing", "concave", "exp-convex"]),  # decreasing and convex
    # sqrt-linear with the wrong constant -d / (2 gamma^2): a jump at the knot
    (lambda x: np.where(x <= 1.0, x, 2 * np.sqrt(x) - 2), ["increasing", "continuous", "concave", "exp-convex"]),
])
def test_the_rule_checker_finds_a_violation_when_there_is_one(formula, broken):
    assert neighbor_function_violations(_Formula(formula), np.geomspace(1e-3, 30, 2001)) == broken


def test_a_numeric_psi_is_refused_for_releases():
    with pytest.raises(ValueError, match="psi combined cannot be used in a release"):
        MeasurementPlan(psi=combine(SqrtPsi(), 0.5, LinearPsi(), 1.0), gammas={"m1emp": 1.0},
                        queries=(QueryPlan(IDENTITY, {"m1emp": 1.0}),))


def test_combining_parameters_are_checked():
    with pytest.raises(ValueError, match="rule 'mean' is unknown"):
        combine(SqrtPsi(), 0.5, LinearPsi(), 1.0).__class__(SqrtPsi(), 0.5, LinearPsi(), 1.0, "mean")
    with pytest.raises(ValueError, match="gammas of a combined psi must be > 0"):
        combine(SqrtPsi(), 0.0, LinearPsi(), 1.0)
    with pytest.raises(ValueError, match="not finite at 0"):
        compose_publishers(LogPsi(a=0.0), 1.0, LinearPsi(), 1.0)


# --- the psi-mechanism's estimate ----------------------------------------------------------------
PSI = SqrtLinearPsi(gamma_sqrt=0.25, d=1.0)  # knot 4: the linear piece holds 0..4 employees
MU, N_DRAWS = 0.7, 1_000_000


def released_answer(x: float, seed: int):
    """N_DRAWS identity answers of the psi-mechanism (gamma 1, mu 0.7) for the total x."""
    grouping = group_establishments(pd.DataFrame({"estab_id": np.arange(N_DRAWS)}), IDENTITY)
    return psi_mechanism(np.full(N_DRAWS, x), grouping, attribute="m1emp", psi=PSI, gamma=1.0, mu=MU,
                         rng=np.random.default_rng(seed))


def z_of_mean(values: np.ndarray, target: float) -> float:
    return (values.mean() - target) / (values.std() / math.sqrt(len(values)))


def z_of_variance(values: np.ndarray, target: float) -> float:
    """z of the sample variance against ``target`` (its standard error from the squared deviations)."""
    squares = (values - values.mean()) ** 2
    return (squares.mean() - target) / (squares.std() / math.sqrt(len(values)))


@pytest.fixture(scope="module")
def answers():
    """Simulated answers below the knot (0, 2), at it (4) and above (9, 400)."""
    return {x: released_answer(x, seed) for seed, x in enumerate((0.0, 2.0, 4.0, 9.0, 400.0))}


@pytest.mark.parametrize("x", [4.0, 9.0, 400.0])
def test_estimate_is_unbiased_from_the_knot_on(answers, x):
    answer = answers[x]
    assert abs(z_of_mean(answer.estimate, x)) < Z_REJECT
    # power: the plug-in psi*^-1(omega), biased by gamma^2 s^2 on the sqrt piece, is rejected
    assert abs(z_of_mean(PSI.inverse(answer.released), x)) > Z_REJECT


@pytest.mark.parametrize("x", [0.0, 2.0])
def test_estimate_below_the_knot_has_the_stated_bias(answers, x):
    """No estimate is unbiased on both pieces; below the knot the bias is (knot - x)^2 / (4 knot)."""
    estimate = answers[x].estimate
    bias = (PSI.knot - x) ** 2 / (4 * PSI.knot)
    assert float(PSI.estimate_bias(np.array([x]))[0]) == pytest.approx(bias, rel=1e-12)
    assert abs(z_of_mean(estimate, x + bias)) < Z_REJECT
    assert abs(z_of_mean(estimate, x)) > Z_REJECT  # power: the bias is there and the test sees it


@pytest.mark.parametrize("x", [0.0, 2.0, 4.0, 9.0, 400.0])
def test_variance_formula_matches_simulation(answers, x):
    answer = answers[x]
    true_variance = float(PSI.estimate_variance(np.array([x]), answer.sd[0])[0])
    assert abs(z_of_variance(answer.estimate, true_variance)) < Z_REJECT
    for wrong in (0.7, 1.3):  # power
        assert abs(z_of_variance(answer.estimate, wrong * true_variance)) > Z_REJECT


def test_releasable_variance_is_positive_and_unbiased_where_the_estimate_stays_positive(answers):
    """v~ = the formula at max(x~, 0) > 0; it is linear in x~, so E[v~] = v wherever x~ never drops below 0."""
    assert answers[0.0].variance.min() > 0
    answer = answers[400.0]
    assert answer.estimate.min() > 0
    true_variance = float(PSI.estimate_variance(np.array([400.0]), answer.sd[0])[0])
    assert abs(z_of_mean(answer.variance, true_variance)) < Z_REJECT


@pytest.mark.parametrize("name", list(SHIPPED))
def test_estimand_is_the_mean_of_each_shipped_estimate(name):
    """E[x~] for omega ~ N(y, s^2) is estimand(y), also for y below psi(0) (the far piece's continuation)."""
    psi, sd = SHIPPED[name], 0.3
    noise = np.random.default_rng(11).standard_normal(400_000) * sd
    for y in (-0.5, 0.2, 3.0):
        estimates = psi.unbiased_estimate(y + noise, sd)
        assert abs(z_of_mean(estimates, float(psi.estimand(np.array([y]))[0]))) < Z_REJECT
        assert abs(z_of_mean(estimates, float(psi.estimand(np.array([y + 0.02]))[0]))) > Z_REJECT  # power


def test_numeric_builder_estimate_with_a_log_far_piece():
    """linear (d 1) combined with log(x + 1) (gamma 0.1): log takes over at x = 9; its estimate there."""
    psi = combine(LinearPsi(1.0), 1.0, LogPsi(a=1.0), 0.1)
    assert psi.switch == pytest.approx(9.0, rel=1e-12) and psi.far == LogPsi(a=1.0)
    sd = 0.8
    noise = np.random.default_rng(12).standard_normal(400_000) * sd
    for x in (9.0, 30.0):
        estimates = psi.unbiased_estimate(psi(np.array([x]))[0] + noise, sd)
        assert abs(z_of_mean(estimates, x)) < Z_REJECT
        assert abs(z_of_variance(estimates, float(psi.estimate_variance(np.array([x]), sd)[0]))) < Z_REJECT
    x = 4.0
    estimates = psi.unbiased_estimate(psi(np.array([x]))[0] + noise, sd)
    assert abs(z_of_mean(estimates, x + float(psi.estimate_bias(np.array([x]))[0]))) < Z_REJECT
    assert float(psi.estimate_bias(np.array([x]))[0]) > 0.1


# --- pnc's Delta_g --------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma_sqrt, d", SETTINGS[:3])
@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.5])
def test_clip_sensitivity_matches_brute_force_over_neighbors(gamma_sqrt, d, gamma):
    """Delta_g(u) = max over psi-close x, x' of |min(x, u) - min(x', u)|, on a grid of values."""
    psi = SqrtLinearPsi(gamma_sqrt, d)
    top = 4 * psi.inverse(np.array([psi(np.array([psi.knot]))[0] + 3 * gamma]))[0]
    values = np.linspace(0.0, top, 2501)
    step = values[1]
    close = np.abs(psi(values)[:, None] - psi(values)[None, :]) <= gamma
    clips = np.concatenate([[0.3 * psi.knot, psi.knot], np.linspace(0.05, 0.6, 12) * top])
    for u in clips:
        clipped = np.minimum(values, u)
        brute = np.max(np.where(close, np.abs(clipped[:, None] - clipped[None, :]), 0.0))
        delta = float(pnc_sensitivity(np.array([u]), psi, gamma)[0])
        assert brute <= delta + 1e-9 and delta - brute <= step * (1 + d), (u, brute, delta)


def test_clip_sensitivity_does_not_cancel_at_tiny_gamma():
    """Against 50-digit arithmetic on both pieces, where u - psi*^-1(psi*(u) - gamma) loses digits."""
    mpmath.mp.dps = 50
    psi = SqrtLinearPsi(0.5, 1.0)
    for gamma in (1e-9, 1e-3, 1.0, 3.0):
        for u in (0.5, 1.0, 1.0 + 1e-6, 2.0, 37.0, 1e6, 1e12):
            g, d = mpmath.mpf(psi.gamma_sqrt), mpmath.mpf(psi.d)
            m_k = d / (4 * g * g)

            def value(x):
                return x / d if x <= d * m_k else mpmath.sqrt(x) / g - m_k

            lower = value(mpmath.mpf(u)) - gamma
            inverse = 0 if lower <= 0 else (lower * d if lower <= m_k else (g * (lower + m_k)) ** 2)
            exact = mpmath.mpf(u) - inverse
            got = float(psi.clip_sensitivity(np.array([u]), gamma)[0])
            assert abs(got - float(exact)) <= 1e-12 * float(exact), (gamma, u)


def test_float_error_bound_holds_against_high_precision():
    mpmath.mp.dps = 50
    psi = SqrtLinearPsi(0.3, 2.0)
    totals = np.concatenate([np.random.default_rng(1).uniform(0, 3 * psi.knot, 200), np.geomspace(1e-3, 1e15, 200)])
    for total in totals:
        g, d = mpmath.mpf(psi.gamma_sqrt), mpmath.mpf(psi.d)
        x = mpmath.mpf(float(total))
        exact = x / d if x <= d**2 / (4 * g * g) else mpmath.sqrt(x) / g - d / (4 * g * g)
        error = abs(mpmath.mpf(float(psi(np.array([total]))[0])) - exact)
        assert error <= psi.float_error(np.array([total]))[0], total


def test_float_error_widens_the_sensitivity_negligibly():
    """The bound enters every sensitivity (twice): at a million records of MAX_VALUE it stays below 1e-5,
    as sqrt's does (a bound of S / d on the linear piece for all S would be about 1e4)."""
    upper = np.array([1e6 * MAX_VALUE])
    assert SqrtLinearPsi(0.5, 1.0).float_error(upper)[0] < 1e-5
    assert SqrtLinearPsi(0.5, 1.0).float_error(upper)[0] < 10 * SqrtPsi().float_error(upper)[0] / 0.5



@pytest.mark.parametrize("gamma_sqrt, d", SETTINGS)
def test_one_person_and_the_sqrt_distance_are_always_inside_the_interval(gamma_sqrt, d):
    """What the combination protects: x +- d (one person) and sqrt's interval with gamma_sqrt are both
    within I*(x) for gamma 1, at every size."""
    psi, x = SqrtLinearPsi(gamma_sqrt, d), np.concatenate([[0.0], GRID])
    lower, upper = psi.interval(x, 1.0)
    sqrt_lower, sqrt_upper = SqrtPsi().interval(x, gamma_sqrt)
    linear_lower, linear_upper = LinearPsi(d).interval(x, 1.0)
    slack = 1e-9 * (1 + x)
    assert np.all(upper >= np.maximum(sqrt_upper, linear_upper) - slack)
    assert np.all(lower <= np.minimum(sqrt_lower, linear_lower) + slack)


def test_neither_part_alone_protects_both():
    """The power of the check above at the shipped setting: sqrt (gamma 0.5) alone misses the person
    at 0 (I(0) = [0, 0.25]), linear (d 1) alone misses sqrt's interval at 36 ([30.25, 42.25])."""
    x = np.array([0.0, 36.0])
    sqrt_upper, linear_upper = SqrtPsi().interval(x, 0.5)[1], LinearPsi(1.0).interval(x, 1.0)[1]
    assert sqrt_upper[0] < linear_upper[0] and linear_upper[1] < sqrt_upper[1]
