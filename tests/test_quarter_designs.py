"""A grown panel as employment by quarter, and the design comparison on it."""

import numpy as np
import pytest

from gedp.evaluation import quarter_designs as qd
from gedp.measure import over_time as ot
from gedp.synth.panel import quarter_range, synthesize_panel


@pytest.fixture(scope="module")
def grown(small_state):
    return synthesize_panel(small_state, quarter_range("2016Q1:2017Q1"), rng=np.random.default_rng(3))


@pytest.fixture(scope="module")
def panel(grown):
    return qd.panel_levels(grown)


def test_panel_levels_hold_each_establishments_employment_by_quarter(grown, panel):
    public, values = panel
    assert len(public) == len(values) == grown["estab_id"].nunique() and public["estab_id"].is_unique
    quarters = sorted(set(zip(grown["year"], grown["qtr"])))
    position = {estab: i for i, estab in enumerate(public["estab_id"])}
    expected = np.zeros_like(values)
    for estab, year, qtr, level in grown[["estab_id", "year", "qtr", qd.ATTRIBUTE]].itertuples(index=False):
        expected[position[str(estab)], quarters.index((year, qtr))] = level
    np.testing.assert_array_equal(values, expected)
    first = grown.drop_duplicates("estab_id").set_index("estab_id")
    assert (public.set_index("estab_id")["county"] == first["county"].reindex(public["estab_id"])).all()


def test_cell_totals_add_up_to_the_state(panel):
    public, values = panel
    totals = qd.cell_totals(public, values)
    np.testing.assert_allclose(totals.sum(axis=0), values.sum(axis=0))
    assert len(totals) == public.groupby(list(qd.CELL)).ngroups


def test_estimated_levels_are_unbiased():
    # 200,000 draws of one cell: the mean error's z statistic is below 4.4 (false-failure rate 1e-5)
    design = ot.optimal_design(5, {"level": 1, "year": 3})
    truth = np.tile([4.0, 9.0, 0.0, 30.0, 6.0], (200_000, 1))
    sd = ot.design_sd(design, 0.5, 1.0)
    levels = qd.estimated_levels(design, truth, sd, rng=np.random.default_rng(11))
    error = levels - truth
    standard_error = error.std(axis=0) / np.sqrt(len(error))
    assert (np.abs(error.mean(axis=0) / standard_error) < 4.4).all()
    # power: the plain square (no variance correction) is rejected
    z_plain = (error + np.diag(ot.estimate_covariance(design, sd))).mean(axis=0) / standard_error
    assert (np.abs(z_plain) > 4.4).all()


def test_compare_designs_reports_each_design_and_measurement(panel):
    public, values = panel
    designs = [ot.independent_design(5), ot.optimal_design(5, {"level": 1, "year": 10})]
    table = qd.compare_designs(public, values, designs, mu=2.0, gamma=0.5, replications=4, seed=5)
    assert list(table["path"]) == ["cells", "identity"] * 2
    independent, changes = table.iloc[0], table.iloc[2]
    # the design that puts most of its budget on the year change measures it better, levels worse
    assert changes.year_abs < independent.year_abs and changes.level_abs > independent.level_abs


def test_year_change_margins_cover_at_the_nominal_rate_on_large_cells():
    # 4,000 trials per band: coverage within 4.4 standard errors of 0.95 (false-failure rate 1e-5)
    design = ot.optimal_design(5, {"level": 1, "year": 3})
    truth = np.array([[150.0, 160, 155, 170, 180], [2_000, 2_100, 1_900, 2_050, 2_300]]).repeat(100, axis=0)
    coverage = qd.year_change_coverage(design, truth, mu=1.0, gamma=0.5, replications=40, seed=8)
    assert set(coverage) == {"100+", "1000+"}
    limit = 4.4 * np.sqrt(0.95 * 0.05 / 4_000)
    assert all(abs(value - 0.95) < limit for value in coverage.values())
