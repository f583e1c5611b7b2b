"""psi-mechanism and pnc against their definitions, by simulation and brute force.

Statistical tests use fixed seeds. Each KS or z test rejects at p < 1e-3 (false-failure rate 0.1%
per check under the null) and is paired with a power check: the same test rejects the wrong noise
sd (x0.7, x1.3), the wrong bias correction, or the wrong tau.
"""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gedp.measure.grid import VALUE_GRID, psi_grid
from gedp.measure.mechanisms import (
    exact_group_sums,
    pnc_mechanism,
    pnc_mu,
    pnc_sensitivity,
    pnc_tau,
    pnc_upper_bounds,
    psi_confidence_interval,
    psi_mechanism,
    psi_mechanism_mu,
)
from gedp.measure.neighbors import LinearPsi, LogPsi, SqrtPsi
from gedp.measure.queries import IDENTITY, Grouping, group_establishments

ALPHA = 1e-3


def identity_grouping(n: int) -> Grouping:
    import pandas as pd

    return group_establishments(pd.DataFrame({"estab_id": [f"E{i}" for i in range(n)]}), IDENTITY)


def ks_pvalue(noise: np.ndarray, sd: float) -> float:
    return stats.kstest(noise / sd, "norm").pvalue


def gdp_mu_of_gaussian(sensitivity: float, sd: float) -> float:
    """mu from the definition (SPEC section 3): the largest gap Phi^-1(P(M(D2) in S)) -
    Phi^-1(P(M(D1) in S)) over half-lines S = (t, inf), the Neyman-Pearson worst case for a
    Gaussian shift, for M(D1) ~ N(0, sd^2) and M(D2) ~ N(sensitivity, sd^2); evaluated by scipy."""
    t = sensitivity / 2 + sd * np.linspace(-2, 2, 41)  # away from the tails, where float sf loses digits
    gaps = stats.norm.ppf(stats.norm.sf(t, loc=sensitivity, scale=sd)) - stats.norm.ppf(stats.norm.sf(t, scale=sd))
    return float(gaps.max())


@pytest.mark.parametrize("sensitivity, sd", [(0.5, 0.714), (1.0, 0.25), (3.0, 10.0)])
def test_privacy_cost_function_follows_the_definition(sensitivity, sd):
    assert psi_mechanism_mu(sensitivity, sd) == pytest.approx(gdp_mu_of_gaussian(sensitivity, sd), rel=1e-9)


@pytest.mark.parametrize("psi, gamma, mu", [(SqrtPsi(), 0.5, 0.7), (LogPsi(a=1), 0.1, 1.0), (LinearPsi(3.0), 1.0, 0.4)])
def test_psi_mechanism_noise_matches_its_privacy_cost(psi, gamma, mu):
    n = 20_000
    values = np.random.default_rng(1).gamma(0.5, 200, size=n)
    answer = psi_mechanism(values, identity_grouping(n), attribute="m1emp", psi=psi, gamma=gamma, mu=mu,
                           rng=np.random.default_rng(2))
    noise = answer.released - psi(values)
    sensitivity = gamma + psi_grid(gamma)  # psi(x) moves by gamma; rounding psi(x) to the grid adds a step
    # The charge is never above the plan (a plan's mu is a promise).
    assert answer.mu <= mu * (1 + 1e-12)
    # The charge against the noise actually drawn: the mu that the definition of mu-GDP gives for
    # the sample sd (z test on the sd, 4 standard errors of a normal sample's sd: false-failure
    # rate 6e-5), not the code's own gamma / (gamma / mu).
    sample_sd = noise.std(ddof=1)
    drawn_mu = gdp_mu_of_gaussian(sensitivity, sample_sd)
    assert abs(answer.mu - drawn_mu) < 4 * drawn_mu / np.sqrt(2 * (n - 1))
    for wrong in (0.7, 1.3):  # power: a charge off by 30% is caught
        assert abs(wrong * answer.mu - drawn_mu) > 4 * drawn_mu / np.sqrt(2 * (n - 1))
    sd = sensitivity / answer.mu
    assert ks_pvalue(noise, sd) > ALPHA
    assert ks_pvalue(noise, 0.7 * sd) < ALPHA  # power: a wrong sd is caught
    assert ks_pvalue(noise, 1.3 * sd) < ALPHA


def test_psi_mechanism_on_groups_noises_the_group_sum():
    import pandas as pd

    public = pd.DataFrame({"county": np.repeat(["001", "002", "003"], [3, 1, 2])})
    grouping = group_establishments(public, ("county",))
    values = np.array([1.0, 2, 3, 10, 4, 5])
    answer = psi_mechanism(values, grouping, attribute="wage", psi=SqrtPsi(), gamma=0.5, mu=1e9,
                           rng=np.random.default_rng(0))
    # Within one grid step of psi(group sum): the draw is rounded to the grid, and so is psi.
    np.testing.assert_allclose(answer.released, np.sqrt([6.0, 10.0, 9.0]), rtol=0, atol=psi_grid(0.5))
    assert np.all(np.mod(answer.released, psi_grid(0.5)) == 0)
    assert list(answer.keys["county"]) == ["001", "002", "003"]


def _repeated_answers(psi, x, sd, n, seed):
    """n independent psi-mechanism answers of the same total x (identity query of n copies)."""
    return psi_mechanism(np.full(n, float(x)), identity_grouping(n), attribute="m1emp", psi=psi,
                         gamma=sd, mu=1.0, rng=np.random.default_rng(seed))


@pytest.mark.parametrize("psi, sd", [(SqrtPsi(), 0.714), (SqrtPsi(a=2), 0.714), (LogPsi(a=1), 0.1), (LogPsi(), 0.3)])
@pytest.mark.parametrize("x", [0.5, 10.0, 1000.0])
def test_estimates_are_unbiased_and_variances_exact(psi, sd, x):
    n = 200_000
    answer = _repeated_answers(psi, x, sd, n, seed=int(x * 10) + 3)
    error = answer.estimate - x
    standard_error = error.std(ddof=1) / np.sqrt(n)
    assert abs(error.mean()) < 4 * standard_error
    # power: the estimate without the bias correction is rejected
    naive = psi.inverse(answer.released) - x
    assert abs(naive.mean()) > 4 * naive.std(ddof=1) / np.sqrt(n)

    # the variance formula against the sample variance, with the sample's own standard error
    true_variance = psi.estimate_variance(x, answer.sd[0])
    centered = answer.estimate - answer.estimate.mean()
    variance_se = np.sqrt((np.mean(centered**4) - np.var(centered) ** 2) / n)
    assert abs(np.var(centered) - true_variance) < 4 * variance_se
    for wrong in (0.7, 1.3):
        assert abs(np.var(centered) - wrong * true_variance) > 4 * variance_se


def test_sqrt_releasable_variance_is_unbiased_for_large_totals_and_positive_always():
    sd, x, n = 0.714, 1000.0, 200_000
    answer = _repeated_answers(SqrtPsi(), x, sd, n, seed=5)
    v = SqrtPsi().estimate_variance(x, answer.sd[0])  # the sd of the (rounded) noise drawn
    assert abs(answer.variance.mean() - v) < 4 * answer.variance.std(ddof=1) / np.sqrt(n)
    small = _repeated_answers(SqrtPsi(), 0.0, sd, 10_000, seed=6)
    assert np.all(small.variance >= 2 * sd**4 - 1e-12)


def test_psi_confidence_interval_covers_95_percent():
    n, sd, x = 40_000, 0.714, 36.0
    answer = _repeated_answers(SqrtPsi(), x, sd, n, seed=8)
    lower, upper = psi_confidence_interval(answer, SqrtPsi())
    covered = np.mean((lower <= x) & (x <= upper))
    assert abs(covered - 0.95) < 4 * np.sqrt(0.95 * 0.05 / n)
    # power: intervals built from a wrong noise variance (x0.7, x1.3) miss 0.95 by far more than 4 SE
    for wrong in (0.7, 1.3):
        narrow = dataclasses.replace(answer, sd=answer.sd * np.sqrt(wrong))
        lower, upper = psi_confidence_interval(narrow, SqrtPsi())
        assert abs(np.mean((lower <= x) & (x <= upper)) - 0.95) > 4 * np.sqrt(0.95 * 0.05 / n), wrong


def test_tau_makes_all_bounds_hold_with_probability_one_minus_zeta():
    for zeta, m in [(0.01, 1), (0.01, 100_000), (0.2, 37)]:
        tau = pnc_tau(zeta, m)
        assert stats.norm.cdf(tau) ** m == pytest.approx(1 - zeta, rel=1e-9)


@pytest.mark.parametrize("psi, gamma, mu", [(SqrtPsi(), 0.5, 0.7), (LogPsi(a=1), 0.1, 0.5)])
def test_pnc_upper_bounds_cover_all_values_in_1_minus_zeta_of_runs(psi, gamma, mu):
    """Coverage of all kc * n bounds per run is >= 1 - zeta (one-sided z test at 1e-3)."""
    zeta, runs, n, kc = 0.1, 4_000, 50, 2
    values = np.random.default_rng(11).gamma(0.7, 30, size=n * kc)
    all_values = np.tile(values, runs)
    identity = psi_mechanism(all_values, identity_grouping(len(all_values)), attribute="m1emp", psi=psi,
                             gamma=gamma, mu=mu, rng=np.random.default_rng(12))

    def coverage(tau):
        upper = pnc_upper_bounds(identity, psi, tau=tau)
        return np.mean(np.all((upper >= all_values).reshape(runs, n * kc), axis=1))

    threshold = stats.norm.ppf(ALPHA) * np.sqrt(zeta * (1 - zeta) / runs)
    assert coverage(pnc_tau(zeta, kc * n)) - (1 - zeta) > threshold
    # power: a tau that forgets the kc attributes covers only (1 - zeta)^kc of the runs
    assert coverage(pnc_tau(zeta, n)) - (1 - zeta) < threshold


@pytest.mark.parametrize(
    "psi, gamma", [(SqrtPsi(), 0.5), (SqrtPsi(a=1), 0.5), (LogPsi(a=1), 0.1), (LinearPsi(5.0), 1.0)]
)
@pytest.mark.parametrize("clip", [0.1, 1.0, 7.5, 100.0, 5000.0])
def test_pnc_sensitivity_equals_brute_force_maximum(psi, gamma, clip):
    """max over psi-close x, x' on a grid of |min(x, u*) - min(x', u*)| equals Delta(u*)."""
    grid = np.linspace(0.0, 3.0 * clip + 10.0, 3001)
    grid = np.union1d(grid, [clip])
    close = np.abs(psi(grid)[:, None] - psi(grid)[None, :]) <= gamma + 1e-12
    clipped = np.minimum(grid, clip)
    brute = np.max(np.where(close, np.abs(clipped[:, None] - clipped[None, :]), 0.0))
    delta = pnc_sensitivity(np.array([clip]), psi, gamma)[0]
    step = grid[1] - grid[0]
    assert brute <= delta + 1e-9
    assert brute >= delta - 2 * step


def test_pnc_noise_matches_its_privacy_cost_and_clips_at_the_group_maximum():
    import pandas as pd

    rng = np.random.default_rng(21)
    n_groups, per_group = 2_000, 5
    public = pd.DataFrame({"county": np.repeat([f"{g:05d}" for g in range(n_groups)], per_group)})
    grouping = group_establishments(public, ("county",))
    values = rng.gamma(0.8, 20, size=n_groups * per_group)
    upper = values * rng.uniform(0.8, 3.0, size=values.size)  # some values exceed their group's clip
    psi, gamma, mu = SqrtPsi(), 0.5, 0.6
    answer = pnc_mechanism(values, grouping, upper, attribute="m1emp", psi=psi, gamma=gamma, mu=mu,
                           rng=np.random.default_rng(22))

    clip = pd.Series(upper).groupby(grouping.codes).max().to_numpy()
    clipped_sum = pd.Series(np.minimum(values, clip[grouping.codes])).groupby(grouping.codes).sum().to_numpy()
    delta = clip - np.maximum(np.sqrt(clip) - gamma, 0.0) ** 2
    # Released sensitivity: Delta_g plus one grid step (the clipped values are rounded to the grid).
    sd = (delta + VALUE_GRID) / mu
    np.testing.assert_allclose(answer.sd, np.sqrt(sd**2 + VALUE_GRID**2 / 12), rtol=1e-9)
    np.testing.assert_allclose(answer.variance, answer.sd**2)
    assert answer.mu == pytest.approx(mu, rel=1e-9) and answer.mu <= mu * (1 + 1e-12)
    assert pnc_mu(delta + VALUE_GRID, answer.sd) <= mu
    assert np.all(np.mod(answer.released, VALUE_GRID) == 0)
    standardized = (answer.released - clipped_sum) / answer.sd
    assert stats.kstest(standardized, "norm").pvalue > ALPHA
    assert stats.kstest(standardized / 0.7, "norm").pvalue < ALPHA
    assert stats.kstest(standardized / 1.3, "norm").pvalue < ALPHA
    assert answer.variance_kind == "exact" and answer.mechanism == "pnc"


def test_pnc_group_with_zero_clip_is_released_exactly_as_zero():
    import pandas as pd

    grouping = group_establishments(pd.DataFrame({"county": ["001", "001", "002"]}), ("county",))
    answer = pnc_mechanism(np.array([0.0, 0.0, 4.0]), grouping, np.array([0.0, 0.0, 9.0]), attribute="m1emp",
                           psi=SqrtPsi(), gamma=0.5, mu=1.0, rng=np.random.default_rng(0))
    assert answer.released[0] == 0.0 and answer.variance[0] == 0.0
    assert answer.variance[1] > 0


@pytest.mark.parametrize("call, message", [
    (lambda: pnc_tau(0.0, 10), r"zeta \(0.0\) must be in \(0, 1\)"),
    (lambda: pnc_tau(0.1, 0), r"n_bounds \(0\) must be >= 1"),
    (lambda: psi_mechanism(np.ones(2), identity_grouping(2), attribute="m1emp", psi=SqrtPsi(), gamma=0.5, mu=0.0,
                           rng=np.random.default_rng(0)), r"mu \(0.0\) must be a finite number > 0"),
])
def test_invalid_mechanism_parameters_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("whole", [True, False])
def test_group_sums_are_correctly_rounded(whole):
    """Both paths (whole numbers by bincount, others by fsum) against exact rational arithmetic."""
    from fractions import Fraction

    rng = np.random.default_rng(4)
    values = rng.lognormal(8, 3, 5_000)
    values = np.rint(values) if whole else values * (1 + 1e-9 * rng.standard_normal(5_000))
    codes = rng.integers(0, 40, 5_000)
    grouping = Grouping(("state", "county"), codes, pd.DataFrame(index=range(40)))
    exact = [float(sum((Fraction(v) for v in values[codes == g]), Fraction(0))) for g in range(40)]
    np.testing.assert_array_equal(exact_group_sums(values, grouping), exact)


@pytest.mark.parametrize("by", [("text",), ("text", "small"), ("small", "text", "digits"), ("category", "text"),
                                ("loose", "real"), ("gaps", "small"), ("real",)])
def test_groupings_are_pandas_groups_in_sorted_key_order(by):
    """Groupings (each key column factorized once, groups ranked by a mixed-radix key) give the codes
    and keys of pandas' sorted groupby, dtypes included, whatever the columns' types; columns with
    missing values or of object type go through pandas itself, rows with a missing key in no group (code
    -1; a NaN code had been cast to -2^63 with a RuntimeWarning)."""
    from gedp.measure.queries import Groupings

    rng = np.random.default_rng(5)
    n = 3_000
    text = rng.choice(["x", "b", "aa", "é", "Z", "10", "9"], n)
    frame = pd.DataFrame({
        "text": pd.array(text, dtype="str"), "small": rng.integers(-3, 4, n), "real": rng.choice([0.5, -1.0, 3.0], n),
        "digits": pd.array(rng.choice(["044", "44", "4"], n), dtype="str"),
        "category": pd.Categorical(rng.choice(["q", "p", "r"], n), categories=["r", "q", "p", "s"]),
        "loose": pd.Series(text, dtype=object),
        "gaps": pd.array(np.where(rng.random(n) < 0.1, None, text), dtype="str"),
    })
    groupings = Groupings(frame)
    grouping = groupings(by)
    grouped = frame.groupby(list(by), sort=True, observed=True)
    expected = grouped.ngroup().to_numpy()
    kept = ~np.isnan(expected)
    assert np.array_equal(grouping.codes[kept], expected[kept])
    assert (grouping.codes[~kept] == -1).all()  # rows pandas drops (a missing key): in no group
    keys = grouped.size().index.to_frame(index=False)[list(by)]
    assert grouping.keys.equals(keys) and list(grouping.keys.dtypes) == list(keys.dtypes)
    assert groupings(list(by)) is grouping  # built once
    if kept.all():  # rows of groups that every establishment is in
        rows = groupings.rows([by, ()])
        assert rows.shape == (grouping.n_groups + 1, n)
        assert np.array_equal(rows[: grouping.n_groups].argmax(axis=0).A1, expected)
        assert np.array_equal(rows.sum(axis=0).A1, np.full(n, 2.0))
