"""Efficiency bounds of the change statistics (evaluation.information_bounds) against independent
computations: Monte Carlo information, the multinomial's closed form, the spread of maximum
likelihood estimates, loops, finite differences and microdata_stats."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from gedp.evaluation import information_bounds as ib
from gedp.evaluation.microdata_stats import growth_rates, job_flow_rates, no_change_share

S = 0.564


def monte_carlo_information(means, sds, law, n, rng):
    """The mean of the scores' outer products over n observations drawn from the mixture, and each
    entry's standard error."""
    means, law = [np.asarray(m, float) for m in means], np.asarray(law, float)
    pick = rng.choice(len(law), size=n, p=law)
    log_f = np.zeros((n, len(law)))
    for mean, sd in zip(means, sds):
        x = mean[pick] + sd * rng.standard_normal(n)
        log_f += -0.5 * ((x[:, None] - mean[None, :]) / sd) ** 2
    f = np.exp(log_f - log_f.max(axis=1, keepdims=True))
    score = f / (f @ law)[:, None]
    products = score[:, :, None] * score[:, None, :]
    return products.mean(axis=0), products.std(axis=0) / np.sqrt(n)


@pytest.mark.parametrize("case", ["identity and measurement", "three identity answers"])
def test_information_is_the_monte_carlo_mean_of_the_scores_products(case):
    """Gauss-Hermite against 200,000 simulated observations: every entry within 5 standard errors
    (false failure < 1e-5 per entry); with the answers' sd halved some entry is far off (power)."""
    rng = np.random.default_rng(3)
    if case == "identity and measurement":
        support, law = np.array([3.0, 4.0, 5.0]), np.array([0.2, 0.5, 0.3])
        means, sds = [np.sqrt(support), support], [S, 1 / np.sqrt(0.3)]
        exact = ib.pair_information(support, law, S, 0.3)
    else:
        pairs = np.array([[1, 1], [1, 2], [2, 1], [2, 2], [3, 2]])
        law = np.array([0.3, 0.1, 0.15, 0.3, 0.15])
        means, sds = [np.sqrt(pairs[:, 0]), np.sqrt(pairs[:, 1]), np.sqrt(pairs[:, 1] + 1)], [S, S, S]
        exact = ib.information(means, sds, law)
    simulated, se = monte_carlo_information(means, sds, law, 200_000, rng)
    assert np.all(np.abs(exact - simulated) < 5 * se)
    wrong = ib.information(means, [sd / 2 for sd in sds], law)
    assert np.max(np.abs(wrong - simulated) / se) > 5


def test_a_precise_measurement_gives_the_multinomial_variance():
    """tau large: each observation tells x, so the tangent variance of p_a is p_a (1 - p_a)."""
    law = np.array([0.1, 0.6, 0.3])
    g = ib.tangent_inverse(ib.pair_information(np.array([0, 1, 2]), law, S, 1e4))
    for a in range(3):
        c = np.eye(3)[a]
        assert c @ g @ c == pytest.approx(law[a] * (1 - law[a]), rel=1e-6)
    assert np.allclose(g @ np.ones(3), 0)


def em_estimates(y, z, support, s, tau, iterations):
    """Maximum likelihood of the law on ``support`` from each row's observations (EM, one sample per
    row of y and z)."""
    log_f = (-0.5 * ((y[..., None] - np.sqrt(support)) / s) ** 2 - 0.5 * ((z[..., None] - support) ** 2) * tau)
    f = np.exp(log_f - log_f.max(axis=-1, keepdims=True))
    law = np.full((len(y), len(support)), 1 / len(support))
    for _ in range(iterations):
        weight = f * law[:, None, :]
        weight /= weight.sum(axis=-1, keepdims=True)
        law = weight.mean(axis=1)
    return law


SUPPORT, LAW, TAU, N, SAMPLES = np.array([2.0, 3.0, 4.0]), np.array([0.3, 0.45, 0.25]), 0.5, 1000, 200


@pytest.fixture(scope="module")
def maximum_likelihood_spread():
    """The sd of the EM estimate of p(3) over 200 samples of 1,000 establishments."""
    rng = np.random.default_rng(11)
    pick = rng.choice(3, size=(SAMPLES, N), p=LAW)
    y = np.sqrt(SUPPORT[pick]) + S * rng.standard_normal((SAMPLES, N))
    z = SUPPORT[pick] + rng.standard_normal((SAMPLES, N)) / np.sqrt(TAU)
    return em_estimates(y, z, SUPPORT, S, TAU, iterations=200)[:, 1].std(ddof=1)


@pytest.mark.parametrize("halved", [False, True])
def test_the_bound_is_the_spread_of_maximum_likelihood(maximum_likelihood_spread, halved):
    """One cell, 1,000 establishments, 200 samples: the sd of the EM estimate of p(3) within 18% of the
    bound's (the sample sd's own sd is 5%: 3.6 of them, false failure ~3e-4); the bound computed with
    the identity sd halved is refused (power)."""
    s = S / 2 if halved else S
    bound_sd = np.sqrt(ib.tangent_inverse(N * ib.pair_information(SUPPORT, LAW, s, TAU))[1, 1])
    ratio = maximum_likelihood_spread / bound_sd
    assert (0.82 <= ratio <= 1.18) != halved, ratio


def test_member_precision_is_a_sum_over_each_members_groups():
    rng = np.random.default_rng(5)
    members = pd.DataFrame({"county": rng.choice(["001", "003"], 40),
                            "naics5": rng.choice(["11111", "22222", "33333"], 40)})
    answers = []
    for by in (["county"], ["county", "naics5"]):
        keys = members[by].drop_duplicates().sort_values(by).reset_index(drop=True)
        answers.append(SimpleNamespace(keys=keys, sd=rng.uniform(1, 3, len(keys))))
    expected = np.zeros(40)
    for i in range(40):
        for answer in answers:
            for g in range(len(answer.keys)):
                if all(answer.keys.iloc[g][c] == members.iloc[i][c] for c in answer.keys.columns):
                    n = sum(all(members.iloc[j][c] == answer.keys.iloc[g][c] for c in answer.keys.columns)
                            for j in range(40))
                    expected[i] += n / answer.sd[g] ** 2
    assert np.allclose(ib.member_precision(answers, members), expected, rtol=1e-12)


def test_precisions_are_rounded_up_within_a_step():
    precision = np.array([0.0, 0.013, 0.5, 1.0, 7.3])
    up = ib.rounded_up(precision, 1.25)
    assert up[0] == 0 and np.all(up[1:] >= precision[1:]) and np.all(up[1:] < 1.25 * precision[1:] * (1 + 1e-12))


def small_state(seed=7, n=3000):
    rng = np.random.default_rng(seed)
    m1 = rng.poisson(3, n)
    m2 = np.clip(m1 + rng.choice([-1, 0, 0, 0, 1], n), 0, None)
    m3 = np.clip(m2 + rng.choice([-1, 0, 0, 1, 2], n), 0, None)
    return m1, m2, m3


def every_kind_of_cells(m1, m2, m3):
    precision = np.random.default_rng(1).uniform(0, 2, len(m1))
    return {
        "months, m2 unknown": ib.cells(np.column_stack([m1, m3]), m2, precision, S, unknown_month=2),
        "months, m3 unknown": ib.cells(np.column_stack([m1, m2]), m3, precision, S, unknown_month=3),
        "change": ib.cells(np.column_stack([m1, m3 - m2]), m2, precision, S, sibling=True),
        "level": ib.level_cells(np.column_stack([m1, m2, m3]), S, 4),
    }


def test_the_statistics_of_the_truths_laws_are_the_microdata_statistics():
    """At the truth's empirical laws each statistic is microdata_stats' on the truth (P10: the
    ceil(0.1 n)-th smallest rate, the population quantile), for every kind of cells."""
    m1, m2, m3 = small_state()
    rates = np.sort(growth_rates(m1.astype(float), m3.astype(float)))
    p10 = rates[int(np.ceil(0.1 * len(rates))) - 1]
    for kind, found in every_kind_of_cells(m1, m2, m3).items():
        laws = [c.law for c in found]
        assert ib.no_change_share(found, laws) == pytest.approx(no_change_share(m1 * 1.0, m2 * 1.0), abs=1e-12), kind
        assert ib.flows(found, laws) == pytest.approx(job_flow_rates(m1 * 1.0, m3 * 1.0), abs=1e-12), kind
        assert ib.growth_quantile(found, laws, 0.10) == pytest.approx(p10, abs=1e-12), kind
        assert sum(c.count for c in found) == len(m1)


def test_gradients_are_the_statistics_derivatives():
    """Each gradient against a central difference along a random direction of sum 0 in every cell."""
    m1, m2, m3 = small_state(n=800)
    rng = np.random.default_rng(2)
    for kind, found in every_kind_of_cells(m1, m2, m3).items():
        h = [rng.standard_normal(len(c.law)) * c.free for c in found]
        h = [v - (v.sum() / max(c.free.sum(), 1)) * c.free for v, c in zip(h, found)]
        laws, eps = [c.law for c in found], 1e-6
        pairs = [(ib.no_change_gradient(found), lambda ls: ib.no_change_share(found, ls)),
                 (ib.flow_gradients(found)[0], lambda ls: ib.flows(found, ls)[0]),
                 (ib.flow_gradients(found)[1], lambda ls: ib.flows(found, ls)[1]),
                 (ib.cdf_gradient(found, -0.3), lambda ls: ib.growth_cdf(found, ls, -0.3)),
                 (ib.total_gradient(found, ib.class_values(2, "m3emp")),
                  lambda ls: ib.total(found, ls, ib.class_values(2, "m3emp")))]
        for gradient, value in pairs:
            plus = value([p + eps * v for p, v in zip(laws, h)])
            minus = value([p - eps * v for p, v in zip(laws, h)])
            derivative = sum(g @ v for g, v in zip(gradient, h))
            assert (plus - minus) / (2 * eps) == pytest.approx(derivative, rel=1e-5, abs=1e-9), kind


def test_the_second_state_is_a_law_within_the_budget():
    m1, m2, m3 = small_state()
    found = ib.cells(np.column_stack([m1, m3 - m2]), m2, np.zeros(len(m1)), S, sibling=True)
    gradient = ib.no_change_gradient(found)
    best = ib.two_point_search(found, gradient, lambda laws: ib.no_change_share(found, laws), [1e-4, 1e-2, 1.0])
    assert best["chi2"] <= ib.CHI2_BUDGET * (1 + 1e-9) and abs(best["difference"]) > 0
    for law in best["laws"]:
        assert law.min() >= -1e-12 and law.sum() == pytest.approx(1, abs=1e-12)
    data = ib.drawn(found, best["laws"], np.random.default_rng(0))
    assert no_change_share(data[:, 0] * 1.0, data[:, 1] * 1.0) == pytest.approx(best["value"], abs=0.03)


def test_leaving_points_out_of_the_denominator_adds_information():
    """The level cells' sub-probability law: M with the fixed points' densities left out is at least
    M of the whole law restricted to the free points (positive semi-definite difference)."""
    pairs = np.array([[1, 1], [1, 2], [2, 2], [3, 3], [8, 9]])
    law = np.array([0.3, 0.1, 0.3, 0.2, 0.1])
    free = np.array([True, True, True, False, False])
    means = [np.sqrt(pairs[:, 0]), np.sqrt(pairs[:, 1])]
    whole = ib.information(means, [S, S], law)[np.ix_(free, free)]
    part = ib.information([m[free] for m in means], [S, S], law[free])
    assert np.linalg.eigvalsh(part - whole).min() > -1e-9
    assert np.linalg.eigvalsh(part - whole).max() > 1e-3


def test_kept_means_are_kept_by_the_second_state():
    """With keep_means every cell's mean m1 and m2 is the same under Q as under P (so every group
    answer's expectation is); without, the search moves them (the constraint does something)."""
    m1, m2, m3 = small_state()
    moved = []
    for keep in (True, False):
        found = ib.level_cells(np.column_stack([m1, m2, m3]), S, 4, keep_means=keep)
        best = ib.two_point_search(found, ib.no_change_gradient(found),
                                   lambda laws: ib.no_change_share(found, laws), [1e-3, 1e-1])
        assert abs(best["difference"]) > 0
        shift = max(abs((q - c.law) @ c.first) + abs((q - c.law) @ c.second) for c, q in zip(found, best["laws"]))
        moved.append(shift)
    assert moved[0] < 1e-12 < 1e-4 < moved[1]


def test_the_group_answers_chi_square_is_a_sum_over_groups(benchmark_script):
    """benchmarks/information_bounds.group_chi_square against a loop over groups and members (each
    member's mean and variance under P and Q from its cell's law); 0 when Q is P."""
    script = benchmark_script("information_bounds")
    m1, m2, m3 = small_state(n=300)
    months = np.column_stack([m1, m2, m3])
    rng = np.random.default_rng(4)
    truth = pd.DataFrame({"county": rng.choice(["001", "003", "005"], 300), "naics5": rng.choice(["1", "2"], 300)})
    groups = {}
    for month in script.MONTHS:
        groups[month] = []
        for by in (["county"], ["county", "naics5"]):
            keys = truth[by].drop_duplicates().sort_values(by).reset_index(drop=True)
            groups[month].append(SimpleNamespace(keys=keys, sd=rng.uniform(1, 4, len(keys))))
    found = ib.level_cells(months, S, 4)
    laws = ib.two_point_search(found, ib.no_change_gradient(found), lambda ls: ib.no_change_share(found, ls),
                               [1e-2])["laws"]
    assert script.group_chi_square(truth, months, groups, found, [c.law for c in found]) == 0
    cell_of = {c.known[0]: (c, q) for c, q in zip(found, laws)}
    expected = 0.0
    for month, values in zip(script.MONTHS, ("first", "second", "later")):
        for answer in groups[month]:
            for g in range(len(answer.keys)):
                mu = delta = var_p = 0.0
                for j in range(300):
                    if all(truth.iloc[j][c] == answer.keys.iloc[g][c] for c in answer.keys.columns):
                        cell, q = cell_of[int(m3[j] - m2[j])]
                        x = getattr(cell, values).astype(float)
                        mp, mq = cell.law @ x, q @ x
                        vp, vq = cell.law @ x ** 2 - mp ** 2, q @ x ** 2 - mq ** 2
                        mu, delta, var_p = mu + mq - mp, delta + vq - vp, var_p + vp
                v = answer.sd[g] ** 2 + var_p
                expected += mu ** 2 / v + delta ** 2 / (2 * v ** 2)
    got = script.group_chi_square(truth, months, groups, found, laws)
    assert got == pytest.approx(expected, rel=1e-9) and got > 0


def test_class_totals_at_the_truths_laws_are_the_size_class_table():
    """Each size class's establishments and month-3 employment (``total`` of ``class_values``) at the
    truth's laws against microdata_stats.size_class_table of the truth, for cells that hold month 3
    as the unknown and as revealed; classing by month 2 instead would be refused (power)."""
    from gedp.evaluation.microdata_stats import size_class_table
    from gedp.postprocess.sizeclass import size_class

    rng = np.random.default_rng(8)
    m1 = rng.geometric(0.12, 2000) - 1
    m2 = np.clip(m1 + rng.choice([-2, -1, 0, 0, 1, 3], 2000), 0, None)
    m3 = np.clip(m2 + rng.choice([-1, 0, 0, 1, 6], 2000), 0, None)
    frame = pd.DataFrame({"sector": "11", "m1emp": m1, "m2emp": m2, "m3emp": m3, "wage": 1.0})
    table = size_class_table(frame).query("sector == '' and size_class > 0").set_index(["statistic", "size_class"])
    kinds = {"months, m3 unknown": ib.cells(np.column_stack([m1, m2]), m3, np.zeros(2000), S, unknown_month=3),
             "level": ib.level_cells(np.column_stack([m1, m2, m3]), S, 6)}
    wrong = 0
    for kind, found in kinds.items():
        laws = [c.law for c in found]
        for code in range(1, 10):
            for statistic in ("estabs", "m3emp"):
                got = ib.total(found, laws, ib.class_values(code, statistic))
                assert got == pytest.approx(table.loc[(statistic, code), "value"], abs=1e-9), (kind, code, statistic)
            by_month_2 = sum(c.count * law @ (size_class(c.second) == code) for c, law in zip(found, laws))
            wrong += abs(by_month_2 - table.loc[("estabs", code), "value"]) > 0.5
    assert wrong >= 4


def test_a_class_totals_bound_with_exact_months_is_the_multinomials():
    """Month 3 observed exactly (a precise measurement): the efficient variance of a class's total is
    sum over cells of N_c Var_c(values) (the multinomial's, closed form); at measurement sd 1 it is
    larger (the answers' noise costs: power)."""
    m1, m2, m3 = small_state(n=2000)
    for code, statistic in ((1, "estabs"), (2, "m3emp")):
        values = ib.class_values(code, statistic)
        exact = sum(c.count * (c.law @ values(c) ** 2 - (c.law @ values(c)) ** 2)
                    for c in ib.cells(np.column_stack([m1, m2]), m3, np.zeros(2000), S, unknown_month=3))
        assert exact > 0
        for precision, matches in ((1e6, True), (1.0, False)):
            found = ib.cells(np.column_stack([m1, m2]), m3, np.full(2000, precision), S, unknown_month=3)
            variance = ib.bound(found, ib.total_gradient(found, values)).variance
            assert (variance == pytest.approx(exact, rel=1e-3)) == matches, (code, statistic, precision)


def test_the_identity_budget_is_the_plans_arithmetic(benchmark_script):
    """At factor 1 the plan's own total mu (its BudgetPlan); the months' identity mu^2 grows as
    1 / factor^2 against a loop over the shipped YAML's identity query."""
    import yaml

    from gedp import configs
    from gedp.config import load_config

    script = benchmark_script("information_bounds")
    raw = yaml.safe_load(configs.path("recommended").read_text())
    identity = sum(mu ** 2 for q in raw["queries"] if q["by"] == "identity" for a, mu in q["mu"].items()
                   if a != "wage")
    assert script.identity_budget(1.0)["total_mu"] == pytest.approx(load_config("recommended").plan.budget().total,
                                                                    rel=1e-12)
    for factor in (0.75, 0.5):
        budget = script.identity_budget(factor)
        assert budget["identity_mu2"] == pytest.approx(identity / factor ** 2, rel=1e-12)
        assert budget["total_mu"] ** 2 == pytest.approx(budget["plan_mu"] ** 2 + identity * (1 / factor ** 2 - 1))


def grid_chi_square(cell, q, s, width=0.02):
    """N_c times the chi-square between the cell's observation densities under q and its law, by a
    Riemann sum on a grid (the level cell's answers: sqrt(m1), sqrt(m2), and sqrt(m2 + d) unless d is
    0, when the last two are one answer of sd s / sqrt(2))."""
    d = cell.known[0]
    means = [np.sqrt(cell.first), np.sqrt(cell.second)] + ([] if d == 0 else [np.sqrt(cell.later)])
    sds = [s, s / np.sqrt(2)] if d == 0 else [s, s, s]
    axes = [np.arange(-5 * s, np.sqrt(15) + 5 * s, width)] * len(means)
    grid = np.meshgrid(*axes, indexing="ij")
    f_p, f_q = np.zeros(grid[0].shape), np.zeros(grid[0].shape)
    for a in range(len(cell.law)):
        density = np.prod([np.exp(-0.5 * ((g - mean[a]) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
                           for g, mean, sd in zip(grid, means, sds)], axis=0)
        f_p += cell.law[a] * density
        f_q += q[a] * density
    return cell.count * float(np.sum((f_q - f_p) ** 2 / np.maximum(f_p, 1e-300)) * width ** len(means))


def test_a_level_cells_chi_square_is_its_members_on_a_grid():
    """Level cells with every pair free: the release's chi-square between P and the two-point Q in a
    cell (h' M h) is N_c times the per-establishment chi-square of the observation's densities on a grid
    (2-D for d = 0, 3-D for d = 1), within 1%; the per-establishment value (M not summed over the
    cell's members, as before this check) is refused (power)."""
    rng = np.random.default_rng(9)
    m1 = rng.choice([1, 2, 3, 4], 1500, p=[0.2, 0.4, 0.3, 0.1])
    m2 = np.clip(m1 + rng.choice([-1, 0, 0, 1], 1500), 0, None)
    m3 = m2 + rng.choice([0, 1], 1500)
    found = ib.level_cells(np.column_stack([m1, m2, m3]), S, 20)
    assert all(c.free.all() for c in found)
    best = ib.two_point_search(found, ib.no_change_gradient(found), lambda ls: ib.no_change_share(found, ls), [1e-2])
    for cell, q in zip(found, best["laws"]):
        width = 0.04 if cell.known[0] == 0 else 0.1
        expected = grid_chi_square(cell, q, S, width)
        got = (q - cell.law) @ cell.information @ (q - cell.law)
        assert got == pytest.approx(expected, rel=0.01), cell.known
        assert got / cell.count != pytest.approx(expected, rel=0.5)
