"""Schema validation, industry derivation, readers, the month-2 rule and the default state."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gedp.synth.hierarchy import derive_industry_codes
from gedp.synth.io import read_microdata
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.rules import month2_employment
from gedp.synth.schema import InputError, validate_microdata


def records(**overrides) -> pd.DataFrame:
    frame = pd.DataFrame({
        "estab_id": ["A", "B", "C"],
        "state": ["44", "44", "44"],
        "county": ["001", "007", "007"],
        "naics": ["311811", "445110", "722511"],
        "m1emp": [3.0, 10.0, 0.0],
        "m2emp": [3.0, 11.0, 0.0],
        "m3emp": [4.0, 12.0, 0.0],
        "wage": [30_000.0, 90_000.0, 0.0],
    })
    for column, values in overrides.items():
        frame[column] = values
    return frame


def test_industry_codes_follow_the_bls_hierarchy():
    codes = derive_industry_codes(pd.Series(["311811", "326199", "445110", "484110", "541512", "111421", "999999"]))
    assert list(codes["sector"]) == ["31-33", "31-33", "44-45", "48-49", "54", "11", "99"]
    assert list(codes["supersector"]) == ["1013", "1013", "1021", "1021", "1024", "1011", "1029"]
    assert list(codes["domain"]) == ["101", "101", "102", "102", "102", "101", "102"]
    assert list(codes["naics3"]) == ["311", "326", "445", "484", "541", "111", "999"]
    assert codes["naics5"].iloc[0] == "31181" and codes["naics4"].iloc[0] == "3118"


def test_industry_codes_of_repeated_and_missing_codes_are_row_by_row_codes():
    """Codes derived once per distinct value and taken back to the rows are each row's own codes
    (a shuffled index, repeats, a missing code, a sector outside the supersectors)."""
    raw = ["311811", "445110", None, "311811", "921110", "445110", "541512", "311811"]
    naics = pd.Series(raw, index=[7, 3, 5, 0, 1, 6, 2, 4], dtype="str")
    codes = derive_industry_codes(naics)
    assert codes.index.equals(naics.index)
    for code, row in zip(raw, codes.itertuples(index=False)):
        if code is None:
            assert all(pd.isna(value) for value in row)
            continue
        alone = derive_industry_codes(pd.Series([code])).iloc[0].tolist()
        assert [None if pd.isna(v) else v for v in row] == [None if pd.isna(v) else v for v in alone]
        assert (row.naics5, row.naics4, row.naics3) == (code[:5], code[:4], code[:3])
    assert pd.isna(codes.loc[1, "supersector"]) and pd.isna(codes.loc[1, "domain"])  # 921110: public administration


def test_valid_records_get_canonical_columns():
    out = validate_microdata(records(county=[1, 7, 7]))  # integer FIPS are zero-padded
    assert list(out["county"]) == ["001", "007", "007"]
    assert list(out["own"]) == ["5", "5", "5"]
    assert out["m1emp"].dtype == np.float64
    assert {"naics5", "sector", "supersector", "domain"} <= set(out.columns)


@pytest.mark.parametrize(
    "frame, message",
    [
        (records().iloc[:0], "zero establishments"),
        (records().drop(columns=["wage"]), "missing column 'wage'"),
        (records(estab_id=["A", "B", "A"]),
            r"column 'estab_id': ids must be unique, .*; row 3 is the establishment of row 1$"),
        (records(estab_id=["A", None, "C"]), r"column 'estab_id': values must not be missing; first at row 2$"),
        (records(m1emp=[3.0, -1.0, -2.0]), r"column 'm1emp': values must be >= 0; first at row 2 \(estab_id B\)$"),
        (records(wage=[1.0, np.inf, 2.0]),
            r"column 'wage': values must be finite numbers; first at row 2 \(estab_id B\)$"),
        (records(m2emp=[1.0, np.nan, 2.0]), "column 'm2emp': values must be finite numbers; first at row 2"),
        (records(m3emp=["1", "x", "2"]),
            r"column 'm3emp': values must be finite numbers; first at row 2 \(estab_id B\)$"),
        (records(naics=["31181", "445110", "7225111"]),
            r"column 'naics': codes must be 6 ASCII digits; first at row 1 \(estab_id A\)$"),
        (records(county=["1", "007", "007"]), r"column 'county': codes must be 3 ASCII digits"),
        (records(state=["44", "4a", "44"]), r"column 'state': codes must be 2 ASCII digits"),
        (records(naics=["921110", "445110", "722511"]), r"column 'naics': codes must be in a private NAICS sector"),
    ],
)
def test_bad_input_is_refused_with_column_rule_and_first_row(frame, message):
    """The message names the column, the rule and the first offending row, never a value or a count."""
    with pytest.raises(InputError, match=message):
        validate_microdata(frame)


def test_csv_reader_keeps_leading_zeros_and_reports_unreadable_files(tmp_path):
    path = tmp_path / "in.csv"
    records().to_csv(path, index=False)
    assert list(read_microdata(path)["county"]) == ["001", "007", "007"]
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match="is empty"):
        read_microdata(tmp_path / "empty.csv")
    (tmp_path / "latin.csv").write_bytes("estab_id,state\n\xe9t\xe9,44\n".encode("latin-1"))
    with pytest.raises(InputError, match="cannot be read"):
        read_microdata(tmp_path / "latin.csv")
    with pytest.raises(InputError, match="does not exist"):
        read_microdata(tmp_path / "nope.parquet")
    with pytest.raises(InputError, match="unknown type '.xlsx'"):
        (tmp_path / "a.xlsx").write_text("x")
        read_microdata(tmp_path / "a.xlsx")


def test_parquet_round_trip(tmp_path):
    path = tmp_path / "in.parquet"
    validate_microdata(records()).to_parquet(path)
    pd.testing.assert_frame_equal(read_microdata(path), validate_microdata(records()))


def test_month2_rule():
    rng = np.random.default_rng(0)
    m1 = np.array([0.0, 0.0, 5.0, 10.0, 100.0])
    m3 = np.array([0.0, 4.0, 0.0, 10.0, 100.0])
    m2 = month2_employment(m1, m3, rng=rng)
    assert m2[0] == 0  # m1 = m3 = 0
    assert m2[3] == 10 and m2[4] == 100  # no change: sigma = 0
    # m2 <= 0 becomes 0 when m1 or m3 is 0, else 1: force it with a huge eta
    many = 20_000
    draw = month2_employment(np.full(many, 1.0), np.full(many, 3.0), eta=50.0, rng=rng)
    assert draw.min() == 1.0
    draw = month2_employment(np.full(many, 0.0), np.full(many, 3.0), eta=50.0, rng=rng)
    assert draw.min() == 0.0 and np.all(draw == np.rint(draw))
    # the mean is the midpoint and the variance 2 eta |m3 - m1| / (m3 + m1) (no clamping at these sizes)
    draw = month2_employment(np.full(many, 100.0), np.full(many, 300.0), eta=0.5, rng=rng)
    assert abs(draw.mean() - 200.0) < 4 * np.sqrt((0.5 + 1 / 12) / many)
    assert draw.var() == pytest.approx(0.5 + 1 / 12, rel=0.05)  # + rounding variance 1/12


def test_small_profile_is_realistic_and_reproducible():
    profile = load_profile("small")
    state = generate_profile(profile, rng=np.random.default_rng(2016))
    pd.testing.assert_frame_equal(state, generate_profile(profile, rng=np.random.default_rng(2016)))
    assert len(state) == 35_796 and state["county"].nunique() == 6 and "999" in set(state["county"])
    counts = state.groupby(["county", "sector"]).size()
    expected = {(c, s): n for c, sectors in profile["county_sector_establishments"].items() for s, n in sectors.items()}
    assert counts.to_dict() == expected
    employment = state["m1emp"]
    assert employment.mean() > 2 * employment.median()  # heavy-tailed
    assert employment.max() > 100 * employment.median()
    assert stats.spearmanr(employment, state["wage"])[0] > 0.7  # wages rise with employment
    assert state["sector"].nunique() == 20


def test_profile_wages_per_employee_follow_the_profile():
    """Per sector, the mean log wage per employee is the profile's log-normal location, within 4 SE."""
    profile = load_profile("large")
    state = generate_profile(profile, rng=np.random.default_rng(4))
    average = state[["m1emp", "m2emp", "m3emp"]].mean(axis=1)
    paid = state[average > 0]
    log_wage = np.log(paid["wage"] / average[average > 0])
    for sector, values in log_wage.groupby(paid["sector"]):
        if len(values) < 2_000:
            continue
        spec = profile["sectors"][sector]
        # whole-dollar rounding of quarterly wages is negligible at these sizes
        assert abs(values.mean() - spec["log_wage_per_employee_mean"]) < 4 * values.std() / np.sqrt(len(values)), sector
        sd = spec["log_wage_per_employee_sd"]
        assert abs(values.std() - sd) < 4 * sd / np.sqrt(2 * len(values)), sector


def test_profile_keeps_each_sectors_mean_employment():
    """Per sector, mean month-1 employment of employed establishments = the profile's, within 4 SE."""
    profile = load_profile("large")
    state = generate_profile(profile, rng=np.random.default_rng(3))
    employed = state[state["m1emp"] > 0]
    checked = 0
    for sector, group in employed.groupby("sector"):
        if len(group) < 2_000:
            continue
        target = profile["sectors"][sector]["mean_employment"]
        standard_error = group["m1emp"].std() / np.sqrt(len(group))
        # rounding to whole employees (at least 1) shifts the mean by a fraction of an employee
        assert abs(group["m1emp"].mean() - target) < 4 * standard_error + 0.5, sector
        checked += 1
    assert checked >= 10


def test_profile_rescaled_to_any_size():
    state = generate_profile(load_profile("small"), n_establishments=1_234, rng=np.random.default_rng(0))
    assert len(state) == 1_234 and state["estab_id"].is_unique
    with pytest.raises(InputError, match=r"number of establishments \(0\) must be >= 1"):
        generate_profile(load_profile("small"), n_establishments=0, rng=np.random.default_rng(0))
    with pytest.raises(InputError, match="profile 'texas' is neither a file nor shipped"):
        load_profile("texas")
