"""Earlier employer-data mechanisms and noise infusion against their definitions (SPEC section 4).

Statistical checks use fixed seeds and reject at p < 1e-3 (false-failure rate 0.1% per check);
each is paired with a power check: the same test rejects a wrong noise scale (x0.7 or x1.3).
Mean checks compare the mean error with 4 standard errors (false-failure rate 6e-5).
"""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, stats

from gedp.evaluation.baselines.earlier import (
    check_log_laplace,
    check_smooth_gamma,
    check_smooth_laplace,
    infusion_distance_cdf,
    infusion_factors,
    is_valid,
    log_laplace,
    noise_infusion,
    quartic_cdf,
    sample_quartic,
    smooth_gamma,
    smooth_laplace,
    smooth_sensitivity,
    truncated_laplace,
)
from gedp.measure.queries import group_establishments

P = 1e-3


def one_cell_repeated(cell_values: list[float], copies: int):
    """``copies`` identical cells, each holding the establishments ``cell_values``."""
    values = np.tile(np.asarray(cell_values, dtype=float), copies)
    public = pd.DataFrame({"cell": np.repeat(np.arange(copies), len(cell_values))})
    return values, group_establishments(public, ("cell",))


def laplace_pvalue(noise, scale):
    return stats.kstest(noise, "laplace", args=(0, scale)).pvalue


def test_quartic_cdf_matches_numerical_integration():
    norm = math.pi / math.sqrt(2)
    for z in (-30.0, -2.5, -0.3, 0.0, 0.7, 1.0, 4.0, 100.0):
        left, _ = integrate.quad(lambda u: 1 / (1 + u**4), -np.inf, min(z, 0.0))
        right, _ = integrate.quad(lambda u: 1 / (1 + u**4), 0.0, max(z, 0.0))
        integral = left + right
        assert quartic_cdf(np.array([z]))[0] == pytest.approx(integral / norm, abs=1e-10)


def test_quartic_sampler_is_exact():
    draws = sample_quartic(40_000, np.random.default_rng(3))
    assert stats.kstest(draws, quartic_cdf).pvalue > P
    assert stats.kstest(draws / 0.7, quartic_cdf).pvalue < P  # power: a rescaled sample is caught
    assert stats.kstest(draws / 1.3, quartic_cdf).pvalue < P
    assert stats.kstest(stats.t(3).rvs(40_000, random_state=4) / math.sqrt(3), quartic_cdf).pvalue < P
    # variance 1 in closed form (integral of z^2 / (1 + z^4) is pi / sqrt 2)
    assert abs(np.mean(draws**2) - 1) < 4 * np.std(draws**2) / math.sqrt(draws.size)


def test_smooth_sensitivity_is_the_largest_contribution_times_alpha():
    public = pd.DataFrame({"cell": ["a", "a", "a", "b", "c"]})
    grouping = group_establishments(public, ("cell",))
    values = np.array([3.0, 250.0, 40.0, 2.0, 0.0])
    brute = [max(max(v for v, c in zip(values, public["cell"]) if c == cell) * 0.1, 1.0) for cell in "abc"]
    np.testing.assert_allclose(smooth_sensitivity(values, grouping, 0.1), brute)


def test_log_laplace_noise_and_bias_closed_form():
    eps, alpha = 2.0, 0.2  # lambda = 0.18 < 1/2: exp(eta) has finite variance, so the mean test is valid
    lam = 2 * math.log1p(alpha) / eps
    values, grouping = one_cell_repeated([30.0, 12.0, 0.0], 60_000)
    answer = log_laplace(values, grouping, attribute="m1emp", eps=eps, alpha=alpha, rng=np.random.default_rng(5))
    offset = 1 / alpha
    eta = np.log(answer.released + offset) - np.log(42 + offset)
    assert laplace_pvalue(eta, lam) > P
    assert laplace_pvalue(eta, 0.7 * lam) < P and laplace_pvalue(eta, 1.3 * lam) < P
    shifted = answer.released + offset
    expected = (42 + offset) / (1 - lam**2)
    se = shifted.std() / math.sqrt(shifted.size)
    assert abs(shifted.mean() - expected) < 4 * se
    assert abs(shifted.mean() - (42 + offset)) > 4 * se  # power: the bias is really there


def test_smooth_laplace_noise_scale_and_lodes_variant():
    eps, alpha, delta = 4.0, 0.1, 1e-3
    values, grouping = one_cell_repeated([100.0, 7.0, 3.0], 40_000)
    scale = max(alpha * 100, 1) / (eps / 2)
    answer = smooth_laplace(values, grouping, attribute="m1emp", eps=eps, alpha=alpha, delta=delta,
                            rng=np.random.default_rng(6))
    noise = answer.released - 110
    assert laplace_pvalue(noise, scale) > P
    assert laplace_pvalue(noise, 0.7 * scale) < P and laplace_pvalue(noise, 1.3 * scale) < P
    # LODES variant: the sum of Laplace(b1) and Laplace(b2) has CDF (b1^2 F1 - b2^2 F2) / (b1^2 - b2^2)
    worker = 0.5
    lodes = smooth_laplace(values, grouping, attribute="m1emp", eps=eps, alpha=alpha, delta=delta,
                           rng=np.random.default_rng(7), worker_eps=worker)
    b1, b2 = scale, 1 / worker

    def cdf(z, b2=b2):
        return (b1**2 * stats.laplace.cdf(z, scale=b1) - b2**2 * stats.laplace.cdf(z, scale=b2)) / (b1**2 - b2**2)

    assert stats.kstest(lodes.released - 110, cdf).pvalue > P
    assert stats.kstest(answer.released - 110, cdf).pvalue < P  # power: the extra term is detected
    assert lodes.mechanism == "smooth-laplace-lodes"


def test_smooth_gamma_noise_scale():
    eps, alpha = 2.0, 0.15
    eps1 = eps - 5 * math.log1p(alpha)
    values, grouping = one_cell_repeated([5.0, 0.0, 1.0], 40_000)  # x_v alpha < 1: S* = 1
    answer = smooth_gamma(values, grouping, attribute="m1emp", eps=eps, alpha=alpha, rng=np.random.default_rng(8))
    scale = 1 / (eps1 / 5)
    z = (answer.released - 6) / scale
    assert stats.kstest(z, quartic_cdf).pvalue > P
    assert stats.kstest(z * 0.7, quartic_cdf).pvalue < P and stats.kstest(z * 1.3, quartic_cdf).pvalue < P


def test_truncated_laplace_drops_large_establishments():
    values, grouping = one_cell_repeated([1.0, 19.0, 20.0, 400.0], 40_000)
    theta, eps = 20.0, 1.0
    answer = truncated_laplace(values, grouping, attribute="m1emp", eps=eps, theta=theta, rng=np.random.default_rng(9))
    noise = answer.released - 20  # only 1 and 19 are below theta
    assert laplace_pvalue(noise, theta / eps) > P
    assert laplace_pvalue(noise, 0.7 * theta / eps) < P and laplace_pvalue(noise, 1.3 * theta / eps) < P


@pytest.mark.parametrize(
    "check, args, condition",
    [
        (check_log_laplace, (0.25, 0.2), r"2 ln\(1 \+ alpha\) / eps < 1"),
        (check_smooth_laplace, (0.25, 0.05, 1e-3), r"alpha \+ 1 <= exp\(eps / \(2 ln\(1/delta\)\)\)"),
        (check_smooth_gamma, (0.25, 0.1), r"alpha \+ 1 < exp\(eps / 5\)"),
    ],
)
def test_invalid_pairs_are_refused_with_the_condition(check, args, condition):
    with pytest.raises(ValueError, match=condition):
        check(*args)
    assert not is_valid(check, *args)


def test_validity_conditions_at_their_boundaries():
    """Each condition just inside and just outside its boundary (relative 1e-9): a grid of SPEC's
    pairs never comes near a boundary, so it cannot catch a wrong constant or a flipped side.
    Boundaries solved for alpha by hand: Smooth Gamma needs eps1 = eps - 5 ln(1 + alpha) > 0,
    Log-Laplace a finite E[exp(eta)] (lambda = 2 ln(1 + alpha) / eps < 1), Smooth Laplace
    alpha + 1 <= exp(eps / (2 ln(1 / delta))). (< against <= cannot be told apart in floats.)"""
    inside, outside = 1 - 1e-9, 1 + 1e-9
    for eps in (0.25, 1.0, 4.0):
        edges = [(check_smooth_gamma, math.expm1(eps / 5), ()), (check_log_laplace, math.expm1(eps / 2), ())]
        edges += [
            (check_smooth_laplace, math.expm1(eps / (2 * math.log(1 / delta))), (delta,)) for delta in (1e-3, 1e-6)
        ]
        for check, edge, extra in edges:
            assert is_valid(check, eps, edge * inside, *extra), (check.__name__, eps, extra)
            assert not is_valid(check, eps, edge * outside, *extra), (check.__name__, eps, extra)
    # SPEC E5 grid: the pairs its tables keep, counted by hand from alpha < e^(eps/5) - 1 (0.051, 0.105,
    # 0.143, 0.221, 0.492, 1.226 for eps 0.25 ... 4)
    assert is_valid(check_smooth_gamma, 0.25, 0.05) and not is_valid(check_smooth_gamma, 0.25, 0.1)
    assert sum(is_valid(check_smooth_gamma, e, a) for e in (0.25, 0.5, 0.67, 1, 2, 4)
               for a in (0.01, 0.05, 0.1, 0.15, 0.2)) == 2 + 3 + 3 + 5 + 5 + 5


def test_infusion_factors_follow_the_ramp():
    s, t = 0.05, 0.15
    factors = infusion_factors(40_000, s=s, t=t, rng=np.random.default_rng(10))
    distance = np.abs(factors - 1)
    assert distance.min() >= s and distance.max() <= t
    assert stats.kstest(distance, lambda d: infusion_distance_cdf(d, s, t)).pvalue > P
    assert stats.kstest(distance, "uniform", args=(s, t - s)).pvalue < P  # power: not uniform
    down = (factors < 1).mean()
    assert abs(down - 0.5) < 4 * 0.5 / math.sqrt(factors.size)
    with pytest.raises(ValueError, match="0 <= s < t < 1"):
        infusion_factors(3, s=0.2, t=0.1, rng=np.random.default_rng(0))


def test_noise_infusion_cells_use_one_factor_per_establishment():
    public = pd.DataFrame({"county": ["1", "1", "2", "2", "3", "4"], "sector": ["a", "b", "a", "a", "b", "b"]})
    values = np.array([100.0, 50.0, 20.0, 0.0, 2.0, 0.0])
    factors = np.array([1.1, 0.9, 1.05, 0.95, 1.2, 0.8])
    rng = np.random.default_rng(11)
    by_county = noise_infusion(values, group_establishments(public, ("county",)), factors, attribute="m1emp", rng=rng)
    np.testing.assert_allclose(by_county.released[:2], [100 * 1.1 + 50 * 0.9, 20 * 1.05])
    assert by_county.released[2] in (1.0, 2.0)  # true 2 is in (0, 2.5): redrawn from {1, 2}
    assert by_county.released[3] == 0.0  # zeros stay zero
    by_sector = noise_infusion(values, group_establishments(public, ("sector",)), factors, attribute="m1emp", rng=rng)
    np.testing.assert_allclose(by_sector.released, [100 * 1.1 + 20 * 1.05, 50 * 0.9 + 2 * 1.2])
    # small cells: a uniform draw from {1, 2} (S = 2.5); 4,000 such cells, binomial z test at 4 SE
    n = 4_000
    small = noise_infusion(np.full(n, 2.0), group_establishments(pd.DataFrame({"c": np.arange(n)}), ("c",)),
                           np.ones(n), attribute="m1emp", rng=np.random.default_rng(12))
    assert set(small.released) == {1.0, 2.0}
    assert abs(np.mean(small.released == 1.0) - 0.5) < 4 * 0.5 / math.sqrt(n)
