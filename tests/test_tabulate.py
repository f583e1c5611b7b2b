"""Tabulations and QCEW aggregation levels against hand computations."""

import numpy as np
import pandas as pd
import pytest

from gedp.evaluation.compare import compare_tabulations, error_summary
from gedp.postprocess.tabulate import QCEW_COLUMNS, group_keys, qcew_level, qcew_tables, tabulate
from gedp.synth.schema import validate_microdata

HAND = validate_microdata(pd.DataFrame({
    "estab_id": ["a", "b", "c", "d"],
    "state": ["44"] * 4,
    "county": ["001", "001", "007", "007"],
    "naics": ["311811", "236118", "311812", "722511"],
    "year": 2016, "qtr": 1,
    "m1emp": [1.0, 2.0, 4.0, 8.0],
    "m2emp": [1.0, 2.0, 4.0, 8.0],
    "m3emp": [1.0, 2.0, 4.0, 8.0],
    "wage": [10.0, 20.0, 40.0, 80.0],
}))


def test_tabulate_by_columns_and_total():
    by_county = tabulate(HAND, ["county"])
    assert list(by_county["county"]) == ["001", "007"]
    assert list(by_county["m1emp"]) == [3.0, 12.0]
    assert list(by_county["estabs"]) == [2, 2]
    total = tabulate(HAND, [])
    assert total["wage"].iloc[0] == 150.0 and total["estabs"].iloc[0] == 4
    with pytest.raises(ValueError, match="cannot tabulate by zipcode"):
        tabulate(HAND, ["zipcode"])


def test_qcew_levels_use_bls_codes_and_layout():
    assert list(qcew_level(HAND, 51).columns) == list(QCEW_COLUMNS)
    state = qcew_level(HAND, 51).iloc[0]
    assert (state["area_fips"], state["industry_code"], state["qtrly_estabs"], state["month1_emplvl"]) == (
        "44000",
        "10",
        4,
        15.0,
    )
    domains = qcew_level(HAND, 52).set_index("industry_code")["month1_emplvl"].to_dict()
    assert domains == {"101": 7.0, "102": 8.0}  # manufacturing + construction are goods-producing
    sectors = qcew_level(HAND, 74)
    cell = sectors[(sectors["area_fips"] == "44007") & (sectors["industry_code"] == "31-33")].iloc[0]
    assert cell["month1_emplvl"] == 4.0 and cell["total_qtrly_wages"] == 40.0 and cell["agglvl_code"] == 74
    naics5 = qcew_level(HAND, 57).set_index("industry_code")["qtrly_estabs"].to_dict()
    assert naics5 == {"23611": 1, "31181": 2, "72251": 1}
    with pytest.raises(ValueError, match=r"aggregation level \(60\)"):
        qcew_level(HAND, 60)


def test_every_qcew_level_adds_up_to_the_state_total(small_state):
    tables = qcew_tables(small_state)
    assert sorted(tables["agglvl_code"].unique()) == [*range(51, 59), *range(71, 79)]
    totals = tables.groupby("agglvl_code")[["qtrly_estabs", "month1_emplvl", "total_qtrly_wages"]].sum()
    for column in totals.columns:
        np.testing.assert_allclose(totals[column], totals[column].iloc[0], rtol=1e-12)
    assert totals["qtrly_estabs"].iloc[0] == len(small_state)


def test_comparison_metrics_by_hand():
    protected = HAND.assign(m1emp=[2.0, 2.0, 1.0, 8.0])
    comparison = compare_tabulations(HAND, protected, ["county"], "m1emp")
    assert list(comparison["signed"]) == [1.0, -3.0]
    assert list(comparison["relative"]) == [1 / 4, 3 / 13]
    summary = error_summary(comparison)
    assert summary["signed_mean"] == -1.0 and summary["mean_absolute"] == 2.0
    assert summary["signed_q1"] == -2.0 and summary["signed_q3"] == 0.0
    assert summary["median_relative"] == pytest.approx((1 / 4 + 3 / 13) / 2)


# --- requests a new user makes (issue 15) ------------------------------------------------------------

def test_confidential_attributes_are_not_group_keys():
    with pytest.raises(ValueError, match="cannot tabulate by m1emp: confidential attributes are summed, not grouped "
                                         "by"):
        tabulate(HAND, ["county", "m1emp"])
    assert group_keys(HAND, "county, naics3") == ["state", "county", "naics3"]
    assert group_keys(HAND, "total") == [] and group_keys(HAND, ()) == []


def test_county_keys_carry_the_state():
    """County 001 of state 44 and county 001 of state 34 are different counties."""
    two_states = validate_microdata(pd.concat([HAND.assign(estab_id=HAND["estab_id"] + "-nj", state="34"), HAND]))
    by_county = tabulate(two_states, ["county"])
    assert by_county[["state", "county"]].values.tolist() == [
        ["34", "001"],
        ["34", "007"],
        ["44", "001"],
        ["44", "007"],
    ]
    assert by_county["m1emp"].tolist() == [3.0, 12.0, 3.0, 12.0]


def test_where_selects_establishments():
    table = tabulate(HAND, "county", where="sector == '31-33'")
    assert table["estabs"].tolist() == [1, 1] and table["m1emp"].tolist() == [1.0, 4.0]
    with pytest.raises(ValueError, match="no establishments to tabulate match where"):
        tabulate(HAND, "county", where="sector == '11'")
    with pytest.raises(ValueError, match="margins of error need the release's answers"):
        tabulate(HAND, "county", moe=True)
