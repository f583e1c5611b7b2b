"""Panels of quarters in: reading and checking a panel, and the synthetic panel's dynamics against
the public BED rates it states (computed here independently, by BED's definitions, from the panel)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gedp.errors import InputError
from gedp.synth.panel import (
    BED_2016,
    SEASONAL,
    Dynamics,
    quarter_range,
    read_panel,
    synthesize_panel,
    validate_panel,
)
from gedp.synth.profiles import generate_profile, load_profile

QUARTERS = "2016Q1:2017Q1"


def panel_of(seed: int = 3, dynamics: Dynamics = BED_2016, establishments: int | None = None,
             seasonal=SEASONAL) -> pd.DataFrame:
    first = generate_profile(load_profile("small"), n_establishments=establishments, rng=np.random.default_rng(seed))
    return synthesize_panel(first, quarter_range(QUARTERS), rng=np.random.default_rng(seed), dynamics=dynamics,
                            seasonal=seasonal)


@pytest.fixture(scope="module")
def panel() -> pd.DataFrame:
    """The small profile's 35,796 establishments grown over five quarters (seed 3)."""
    return panel_of()


@pytest.fixture(scope="module")
def steady_panel() -> pd.DataFrame:
    """The same without seasonal movement (the BED rates are seasonally adjusted)."""
    return panel_of(seasonal={})


def bed_rates(panel: pd.DataFrame) -> pd.DataFrame:
    """BED's measures for each pair of consecutive quarters, from month-3 employment of the union
    of both quarters' establishments (absent = 0), as shares of the earlier quarter's employment and
    establishment count."""
    level = panel.pivot_table(index="estab_id", columns=["year", "qtr"], values="m3emp", aggfunc="sum")
    present = level.notna()
    level = level.fillna(0.0)
    rows = []
    for before, after in zip(level.columns[:-1], level.columns[1:]):
        change = level[after] - level[before]
        employment, count = level[before].sum(), present[before].sum()
        opened, closed = present[after] & ~present[before], present[before] & ~present[after]
        rows.append({"gains": change[change > 0].sum() / employment, "losses": -change[change < 0].sum() / employment,
                     "openings": opened.sum() / count, "closings": closed.sum() / count,
                     "opening_employment": level[after][opened].sum() / employment})
    return pd.DataFrame(rows)


#: Tolerances of the quarterly rates, in shares (a quarter's sampling noise on 36,000 establishments
#: is a few hundredths of a point; the rest is the rounding of whole employees).
TOLERANCE = {"gains": 0.004, "losses": 0.004, "openings": 0.002, "closings": 0.002, "opening_employment": 0.002}
STATED = {"gains": BED_2016.gains, "losses": BED_2016.losses, "openings": BED_2016.opening_share,
          "closings": BED_2016.closing_share, "opening_employment": BED_2016.opening_employment}


def test_the_panel_moves_at_the_stated_bed_rates(steady_panel):
    rates = bed_rates(steady_panel)
    for measure, stated in STATED.items():
        assert rates[measure].to_numpy() == pytest.approx(stated, abs=TOLERANCE[measure]), measure


def test_the_rates_check_detects_other_dynamics():
    """Power: a panel grown with gains of 7.5% and closings of 4.5% fails the stated tolerances."""
    rates = bed_rates(panel_of(dynamics=Dynamics(gains=0.075, closing_share=0.045), seasonal={}))
    assert (abs(rates["gains"] - STATED["gains"]) > TOLERANCE["gains"]).all()
    assert (abs(rates["closings"] - STATED["closings"]) > TOLERANCE["closings"]).all()


def test_most_change_comes_from_continuing_establishments(steady_panel):
    rates = bed_rates(steady_panel)
    assert (rates["opening_employment"] < rates["gains"] / 3).all()


def test_seasonal_sectors_follow_their_table(panel):
    """Construction's employment from Q1 to Q3, over the steady sectors' growth, is the table's ratio."""
    totals = panel.groupby(["qtr", "year", panel["sector"] == "23"])["m3emp"].sum()
    steady = totals[(3, 2016, False)] / totals[(1, 2016, False)]
    construction = totals[(3, 2016, True)] / totals[(1, 2016, True)]
    assert construction / steady == pytest.approx(SEASONAL["23"][2] / SEASONAL["23"][0], rel=0.02)


def test_wages_per_employee_grow_by_the_stated_term(panel):
    continuing = panel.groupby("estab_id")["qtr"].transform("size") == 5
    by_quarter = panel[continuing & ~panel["sector"].isin(list(SEASONAL))].groupby(["year", "qtr"])
    per_employee = by_quarter["wage"].sum() / by_quarter[["m1emp", "m2emp", "m3emp"]].sum().sum(axis=1)
    yearly = per_employee.iloc[-1] / per_employee.iloc[0]
    assert yearly == pytest.approx((1 + BED_2016.wage_growth) ** 4, abs=0.005)


def test_a_seed_gives_one_panel(panel):
    again = panel_of(establishments=2_000)
    pd.testing.assert_frame_equal(again, panel_of(establishments=2_000))
    assert not again.equals(panel_of(seed=4, establishments=2_000))


def test_establishments_keep_their_public_columns(panel):
    assert (panel.groupby("estab_id")[["county", "naics"]].nunique() == 1).all().all()
    assert not panel.duplicated(["estab_id", "year", "qtr"]).any()


def test_a_quarter_range_lists_every_quarter():
    assert quarter_range("2016Q3:2017Q2") == [(2016, 3), (2016, 4), (2017, 1), (2017, 2)]


@pytest.mark.parametrize("text, rule", [("2016Q1-2017Q1", "must be FIRST:LAST"), ("2016Q5:2017Q1", "quarter 1-4"),
                                        ("2017Q1:2016Q1", "must come after the first")])
def test_a_bad_quarter_range_is_refused(text, rule):
    with pytest.raises(InputError, match=rule):
        quarter_range(text)


def two_quarters() -> pd.DataFrame:
    row = {"state": "44", "county": "001", "naics": "236115", "own": "5", "m1emp": 3, "m2emp": 3, "m3emp": 3,
           "wage": 9000, "year": 2016}
    return pd.DataFrame([{**row, "estab_id": "a", "qtr": 1}, {**row, "estab_id": "b", "qtr": 1},
                         {**row, "estab_id": "a", "qtr": 2}])


def test_a_repeated_establishment_quarter_is_refused():
    frame = pd.concat([two_quarters(), two_quarters().iloc[[0]]], ignore_index=True)
    with pytest.raises(InputError, match="estab_id.*unique within a quarter"):
        validate_panel(frame)


def test_an_establishment_that_moves_is_refused():
    frame = two_quarters()
    frame.loc[2, "county"] = "003"
    with pytest.raises(InputError, match="county.*same in every quarter"):
        validate_panel(frame)


def test_a_folder_of_quarter_files_is_one_panel(tmp_path):
    frame = two_quarters()
    for qtr, rows in frame.groupby("qtr"):
        rows.to_csv(tmp_path / f"q{qtr}.csv", index=False)
    pd.testing.assert_frame_equal(read_panel(tmp_path), validate_panel(frame))
