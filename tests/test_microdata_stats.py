"""The microdata statistics (evaluation.microdata_stats) and BLS size classes, each against an
independent computation: by hand, brute force over establishments, or a dummy-variable regression."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gedp.evaluation.microdata_stats import (
    concentration,
    growth_rates,
    job_flow_rates,
    microdata_statistics,
    no_change_share,
    within_slope,
)
from gedp.postprocess.sizeclass import SIZE_CODES, SIZE_TITLES, size_class


def _class_by_rule(m3: float) -> int:
    """BLS's rule written out, on whole employees half up."""
    n = int(np.floor(m3 + 0.5))
    for code, (low, high) in enumerate([(0, 5), (5, 10), (10, 20), (20, 50), (50, 100), (100, 250), (250, 500),
                                        (500, 1000)], start=1):
        if low <= n < high:
            return code
    return 9


def test_size_class_edges_by_rule():
    values = np.array([0, 0.2, 4, 4.49, 4.5, 5, 9, 9.5, 10, 19, 20, 49, 50, 99, 100, 249, 250, 499, 500, 999, 999.4,
                       999.5, 1000, 25_000])
    assert size_class(values).tolist() == [_class_by_rule(v) for v in values]
    assert size_class(np.array([0.0, 4.0, 1000.0])).tolist() == [1, 1, 9]
    assert SIZE_CODES == tuple(range(1, 10))
    assert SIZE_TITLES[1] == "n < 5" and SIZE_TITLES[2] == "5 <= n < 10" and SIZE_TITLES[9] == "n >= 1000"


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    m1 = np.floor(np.exp(rng.normal(1.5, 1.4, n)))
    m3 = np.maximum(m1 + rng.integers(-3, 4, n) * (rng.random(n) < 0.5), 0)
    m2 = np.maximum(np.round((m1 + m3) / 2 + rng.normal(0, 1, n)), 0)
    wage = np.round(m1 * 9000 * np.exp(rng.normal(0, 0.4, n)))
    return pd.DataFrame({"m1emp": m1, "m2emp": m2, "m3emp": m3, "wage": wage,
                         "sector": rng.choice(["23", "44-45", "62"], n), "county": rng.choice(["001", "003"], n),
                         "naics": rng.choice(["236115", "238210", "445110"], n)})


def test_size_class_table_brute_force():
    frame = _frame(3_000, 1)
    table = microdata_statistics(frame).set_index(["statistic", "sector", "size_class"])["value"]
    for sector in ["", "23", "44-45", "62"]:
        part = frame if sector == "" else frame[frame["sector"] == sector]
        for code in range(0, 10):
            rows = [r for _, r in part.iterrows() if code == 0 or _class_by_rule(r["m3emp"]) == code]
            assert table[("estabs", sector, code)] == len(rows)
            assert table[("m3emp", sector, code)] == pytest.approx(sum(r["m3emp"] for r in rows))
            assert table[("wage", sector, code)] == pytest.approx(sum(r["wage"] for r in rows))
            months = sum(r["m1emp"] + r["m2emp"] + r["m3emp"] for r in rows) / 3
            wage = sum(r["wage"] for r in rows)
            if months > 0:
                assert table[("avg_weekly_wage", sector, code)] == pytest.approx(wage / months / 13)
            else:
                assert np.isnan(table[("avg_weekly_wage", sector, code)])


def test_job_flows_and_no_change_by_hand():
    before, after = np.array([10.0, 5, 0, 7]), np.array([12.0, 3, 4, 7])
    creation, destruction = job_flow_rates(before, after)
    # gains 2 + 4, losses 2, over the average of the totals (22 + 26) / 2
    assert creation == pytest.approx(6 / 24) and destruction == pytest.approx(2 / 24)
    # employing in either month: 4 of 5; unchanged in whole employees (half up): 10/10.4 and 7/7, not 3.4/2.4
    assert no_change_share(np.array([10.0, 3.4, 0, 0, 7]), np.array([10.4, 2.4, 0, 1, 7])) == pytest.approx(2 / 4)
    assert np.isnan(job_flow_rates(np.zeros(3), np.zeros(3))[0])


def test_growth_quantiles_brute_force():
    frame = _frame(501, 2)
    rates = [(b3 - b1) / ((b1 + b3) / 2) for b1, b3 in zip(frame["m1emp"], frame["m3emp"]) if b1 + b3 > 0]
    assert np.allclose(growth_rates(frame["m1emp"].to_numpy(), frame["m3emp"].to_numpy()), rates)
    ordered = sorted(rates)
    table = microdata_statistics(frame).set_index("statistic")["value"]
    for name, q in (("growth_p10", 0.1), ("growth_p25", 0.25), ("growth_p75", 0.75), ("growth_p90", 0.9)):
        position = q * (len(ordered) - 1)  # linear interpolation between order statistics
        low = int(np.floor(position))
        expected = ordered[low] + (position - low) * (ordered[min(low + 1, len(ordered) - 1)] - ordered[low])
        assert table[name] == pytest.approx(expected)


def test_concentration_brute_force():
    values = np.array([5.0, 1, 40, 3, 3, 9, 0, 12, 7, 7, 2, 30])
    top, hhi = concentration(values)
    assert top == pytest.approx(sum(sorted(values)[-10:]) / values.sum())
    assert hhi == pytest.approx(sum((v / values.sum()) ** 2 for v in values))
    assert concentration(np.array([4.0, 6.0])) == pytest.approx((1.0, 0.52))


def test_within_slope_against_dummy_regression():
    rng = np.random.default_rng(3)
    groups = np.r_[rng.integers(0, 12, 300), [12]]  # group 12 is a singleton: left out
    x = rng.normal(2, 1, len(groups)) + groups * 0.1
    y = 0.4 * x + groups * 0.3 + rng.normal(0, 0.5 + 0.2 * np.abs(x), len(groups))
    slope, variance = within_slope(x, y, groups)
    keep = groups != 12
    design = np.column_stack([x[keep], (groups[keep][:, None] == np.arange(12)).astype(float)])
    coef, *_ = np.linalg.lstsq(design, y[keep], rcond=None)
    residual = y[keep] - design @ coef
    bread = np.linalg.inv(design.T @ design)
    n, k = design.shape
    sandwich = n / (n - k) * bread @ (design.T * residual**2) @ design @ bread
    assert slope == pytest.approx(coef[0], rel=1e-10)
    assert variance == pytest.approx(sandwich[0, 0], rel=1e-8)
    assert np.isnan(within_slope(x[:3], y[:3], np.arange(3))[0])  # only singletons


def test_slopes_recover_a_known_elasticity_and_cover():
    """log wage per employee = 0.3 log e + cell effect + noise: the pooled-with-cells slope covers 0.3
    with its 95% interval in about 95% of 200 samples (binomial: below 88% has probability < 1e-4
    at 95%, and at a variance 0.5x the true one the coverage would be about 84%)."""
    rng = np.random.default_rng(4)
    covered = 0
    for _ in range(200):
        n = 400
        frame = pd.DataFrame({"sector": rng.choice(["23", "62"], n), "county": rng.choice(["001", "003"], n),
                              "naics": rng.choice(["236115", "621111"], n)})
        employment = np.exp(rng.uniform(0, 5, n))
        effect = frame.groupby(["county", "naics"]).ngroup().to_numpy() * 0.2
        per_employee = np.exp(9 + 0.3 * np.log(employment) + effect + rng.normal(0, 0.3 + 0.1 * np.log(employment)))
        frame = frame.assign(m1emp=employment, m2emp=employment, m3emp=employment, wage=per_employee * employment)
        row = microdata_statistics(frame).set_index("statistic").loc["slope_cells"]
        covered += abs(row["value"] - 0.3) <= 1.96 * np.sqrt(row["variance"])
    assert covered >= 176


def test_statistics_table_shape():
    frame = _frame(800, 5)
    table = microdata_statistics(frame)
    assert list(table.columns) == ["statistic", "sector", "size_class", "value", "variance"]
    assert not table.duplicated(["statistic", "sector", "size_class"]).any()
    by_name = table.groupby("statistic").size()
    assert by_name["estabs"] == 4 * 10 and by_name["hhi"] == 4 and by_name["slope_pooled"] == 1
    assert (table.loc[~table["statistic"].str.startswith("slope"), "variance"] == 0).all()
