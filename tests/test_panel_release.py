"""Panels of quarters out: a panel release keyed by quarter, level tables of a quarter, changes
between quarters with margins, and BLS's over-the-year columns."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.measure.design import ChangeCells
from gedp.postprocess.changes import change_table
from gedp.release.format import QUARTER_KEY
from gedp.running.panel_protect import quarter_seed
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile
from gedp.tabulation.panel_tables import tabulate_quarter

QUARTERS = ["2016Q1", "2016Q2", "2016Q3", "2016Q4", "2017Q1"]
SEED = 11


@pytest.fixture(scope="module")
def panel() -> pd.DataFrame:
    first = generate_profile(load_profile("small"), n_establishments=1_200, rng=np.random.default_rng(5))
    return synthesize_panel(first, quarter_range("2016Q1:2017Q1"), rng=np.random.default_rng(5))


@pytest.fixture(scope="module")
def release(panel):
    return gedp.protect(panel, seed=SEED, not_for_publication=True, allow_over_cap=True)


def test_the_release_holds_every_quarter_under_its_key(panel, release):
    manifest = release.manifest
    assert manifest["quarters"] == QUARTERS
    assert manifest["design"]["name"] == "independent"
    assert set(manifest["per_quarter"]) == set(QUARTERS)
    counts = release.microdata.groupby(QUARTER_KEY).size()
    expected = panel.groupby(["year", "qtr"]).size()
    assert counts.tolist() == expected.tolist()
    assert sorted(release.measurements[QUARTER_KEY].unique()) == QUARTERS


def test_the_panel_spends_sqrt_quarters_times_a_quarter(release):
    manifest = release.manifest
    assert manifest["mu_total"] == pytest.approx(math.sqrt(5) * manifest["mu_quarter"])
    quarter = manifest["per_quarter"]["2016Q1"]["mu_total"]
    assert manifest["mu_quarter"] == pytest.approx(quarter, rel=1e-12)


def test_quarters_draw_their_own_noise():
    seeds = {quarter_seed(SEED, quarter) for quarter in quarter_range("2016Q1:2017Q1")}
    assert len(seeds) == 5 and quarter_seed(None, (2016, 1)) is None


def test_a_quarter_is_the_release_of_that_quarter_alone(panel, release):
    """The quarter's rows protected alone with the quarter's seed give the same protected values and
    the same margins as the panel release's quarter."""
    rows = panel[(panel["year"] == 2016) & (panel["qtr"] == 3)]
    alone = gedp.protect(rows, seed=quarter_seed(SEED, (2016, 3)), not_for_publication=True)
    ours = release.tabulate("county,naics3", quarter="2016Q3", moe=True)
    theirs = alone.tabulate("county,naics3", moe=True)
    pd.testing.assert_frame_equal(ours, theirs)


def test_levels_of_a_quarter_sum_its_protected_rows(release):
    table = release.tabulate("county", quarter="2017Q1")
    rows = release.microdata[release.microdata[QUARTER_KEY] == "2017Q1"]
    by_hand = rows.groupby(["state", "county"])["m3emp"].sum().to_numpy()
    np.testing.assert_allclose(table["m3emp"].to_numpy(), by_hand)


def test_changes_are_the_difference_of_the_level_tables(release):
    keys = ["state", "county", "naics3"]
    first = release.tabulate("county,naics3", quarter="2016Q1", moe=True).set_index(keys)
    second = release.tabulate("county,naics3", quarter="2017Q1", moe=True).set_index(keys)
    change = release.tabulate("county,naics3", change="2016Q1:2017Q1", moe=True).set_index(keys)
    cells = first.index.union(second.index)
    assert change.index.equals(cells)
    before = first.reindex(cells).fillna(0.0)
    after = second.reindex(cells).fillna(0.0)
    slopes = [tabulate_quarter(release.folder, "county,naics3", quarter, moe=True, slopes=True).set_index(keys)
              .reindex(cells).fillna(0.0) for quarter in ("2016Q1", "2017Q1")]
    z = NormalDist().inv_cdf(0.975)
    for attribute in ("m1emp", "m3emp", "wage"):
        assert (change[f"{attribute}_chg"] == after[attribute] - before[attribute]).all()
        # the change's score interval {d : d^2 <= z^2 (V + g d)}, g the levels' slopes' regression on d
        g1, g2 = (table[f"{attribute}_moe_slope"] for table in slopes)
        v1, v2 = ((level[f"{attribute}_moe"] / z) ** 2 - (z * g / 2) ** 2 for level, g in ((before, g1), (after, g2)))
        g = ((g2 * v2 - g1 * v1) / (v1 + v2)).fillna(0.0)
        margin = [(brentq(lambda d, v=v, s=s: d * d - z * z * (v + s * d), 0.0, 1e9)
                   - brentq(lambda d, v=v, s=s: d * d - z * z * (v + s * d), -1e9, 0.0)) / 2 if v > 0 else 0.0
                  for v, s in zip(v1 + v2, g)]
        np.testing.assert_allclose(change[f"{attribute}_chg_moe"], margin, rtol=1e-9, atol=1e-9)
        if attribute == "wage":  # no slopes: the levels' squared margins add
            np.testing.assert_allclose(change["wage_chg_moe"], np.hypot(before["wage_moe"], after["wage_moe"]),
                                       rtol=1e-12)
        positive = before[attribute] > 0
        np.testing.assert_allclose(change.loc[positive, f"{attribute}_pct_chg"],
                                   100 * (after[attribute] - before[attribute])[positive] / before[attribute][positive])
        assert change.loc[~positive, f"{attribute}_pct_chg"].isna().all()


def test_a_design_covariance_enters_the_change_margin():
    """Var(L2 - L1) = V1 + V2 - 2 C, with C from the design (here half the geometric mean)."""
    z = NormalDist().inv_cdf(0.975)
    first = pd.DataFrame({"county": ["001", "003"], "estabs": [2, 1], "wage": [10.0, 0.0], "wage_moe": [3.0, 2.0]})
    second = pd.DataFrame({"county": ["001", "005"], "estabs": [2, 4], "wage": [14.0, 5.0], "wage_moe": [4.0, 1.0]})

    def covariance(cells: ChangeCells) -> np.ndarray:
        return 0.5 * np.sqrt(cells.first_variance * cells.second_variance)

    table = change_table(first, second, ["county"], ["wage"], z=z, covariance=covariance)
    assert table["county"].tolist() == ["001", "003", "005"]
    assert table["wage_chg"].tolist() == [4.0, 0.0, 5.0]
    assert table["estabs_chg"].tolist() == [0, -1, 4]
    expected = [math.sqrt(9 + 16 - 2 * 0.5 * 12), 2.0, 1.0]  # a cell absent from a quarter adds no variance
    np.testing.assert_allclose(table["wage_chg_moe"], expected, rtol=1e-12)


def test_the_qcew_format_adds_over_the_year_columns(release):
    year_before = release.tabulate(agglvl=75, format="qcew", quarter="2016Q1", moe=True)
    published = release.tabulate(agglvl=75, format="qcew", change="2016Q1:2017Q1", moe=True)
    cell = ["area_fips", "industry_code"]
    joined = published.merge(year_before, on=cell, how="left", suffixes=("", "_before"))
    for column in ("qtrly_estabs", "month3_emplvl", "total_qtrly_wages"):
        before = joined[f"{column}_before"].fillna(0).astype(float)
        assert (joined[f"oty_{column}_chg"] == joined[column].astype(float) - before).all(), column
    assert (joined["oty_month3_emplvl_chg_moe"] >= np.sqrt(joined["month3_emplvl_moe"] ** 2)).all()


def test_over_the_year_changes_and_their_margins_are_whole_numbers_as_bls_writes_them(release, tmp_path):
    published = release.tabulate(agglvl=75, format="qcew", change="2016Q1:2017Q1", moe=True)
    result = CliRunner().invoke(app, ["tabulate", str(release.folder), "--agglvl", "75", "--format", "qcew",
                                      "--change", "2016Q1:2017Q1", "--moe", "--out", str(tmp_path / "oty.csv")])
    assert result.exit_code == 0, result.output
    whole = [c for c in published.columns if c.startswith("oty_") and c.endswith(("_chg", "_chg_moe"))
             and not c.endswith("_pct_chg")]
    assert len(whole) == 6 + 4  # every changed column's change; the margins of the four attributes
    for column in whole:
        assert pd.api.types.is_integer_dtype(published[column]), column
    written = pd.read_csv(tmp_path / "oty.csv", dtype=str, keep_default_na=False)
    for column in whole:
        assert written[column].str.fullmatch(r"-?\d*").all(), column  # 12, -3 or empty; never 12.0
    assert written["oty_month1_emplvl_pct_chg"].str.contains(r"\.").any()  # percents keep their decimal


@pytest.mark.parametrize("options, rule", [
    ({}, "give one of --quarter"),
    ({"quarter": "2018Q1"}, "2018Q1 is not in"),
    ({"change": "2017Q1:2016Q1"}, "must come after the first"),
    ({"change": "2016Q1:2016Q2", "agglvl": 75, "format": "qcew"}, "over the year"),
])
def test_a_bad_panel_tabulation_is_refused(release, options, rule):
    with pytest.raises(InputError, match=rule):
        release.tabulate("county", **options)


def test_a_release_of_one_quarter_takes_no_quarter(recommended_release):
    single = recommended_release
    with pytest.raises(InputError, match="holds one quarter"):
        single.tabulate("county", quarter="2016Q1")


def test_the_command_line_protects_and_tabulates_a_panel(tmp_path):
    runner = CliRunner()
    panel = tmp_path / "panel.parquet"
    result = runner.invoke(app, ["synth", "--profile", "small", "--establishments", "800", "--quarters",
                                 "2016Q1:2016Q3", "--out", str(panel)])
    assert result.exit_code == 0, result.output
    release = tmp_path / "release"
    result = runner.invoke(app, ["protect", str(panel), "--out", str(release), "--seed", "2", "--not-for-publication",
                                 "--allow-over-cap"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "change.csv"
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--change", "2016Q1:2016Q3", "--moe",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out, dtype={"county": str})
    assert {"m3emp_chg", "m3emp_chg_moe", "m3emp_pct_chg"} <= set(table.columns)
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county"])
    assert result.exit_code == 2 and "give one of --quarter Q" in result.output
    assert "--gains-losses FROM:TO" in result.output and "gains_losses FROM" not in result.output


def test_the_panel_is_recorded_in_the_ledger_as_one_release_of_its_quarters(panel, tmp_path):
    """With a ledger, the panel is one release whose quarters each charge the establishments in them."""
    from gedp.accounting.ledger_file import read_ledger

    ledger = tmp_path / "ledger.json"
    two = panel[panel["year"] == 2016]
    two = two[two["qtr"] <= 2]
    release = gedp.protect(two, ledger=gedp.Ledger(ledger, lifetime_cap=20.0, dataset_id="panel"), allow_over_cap=True)
    releases = list(read_ledger(ledger)["releases"].values())
    assert len(releases) == 1 and releases[0]["status"] == "committed"
    assert releases[0]["quarters"] == [[q, n] for q, n in zip(QUARTERS[:2], two.groupby("qtr").size().tolist())]
    assert set(release.manifest["lifetime"]) >= {"spent_before", "spent_after", "largest_charge"}


def test_report_refuses_a_panel_release_and_audit_checks_each_quarter(release):
    from gedp.audit.release import audit_release

    with pytest.raises(InputError, match="panel release.*gedp report"):
        gedp.report(release)
    checks = audit_release(release.folder)
    assert all(check.passed for check in checks), checks
    # the value checks run on panels too (each quarter re-solved and its tables rebuilt)
    assert {"files", "counts", "re-solved values", "tables"} <= {check.name for check in checks}, checks


def test_a_bad_quarter_leaves_nothing_behind(panel, tmp_path):
    from gedp.api import load
    from gedp.running.panel_protect import protect_panel

    broken = panel.copy()
    broken.loc[broken.index[-1], "wage"] = -1.0  # a row of the last quarter
    with pytest.raises(InputError, match="wage.*>= 0"):
        protect_panel(broken, load(), tmp_path / "release", ledger=None, seed=1, allow_over_cap=True)
    assert list(tmp_path.iterdir()) == []


def test_a_panel_csv_in_agency_names_is_checked_per_quarter_and_protected(panel, tmp_path):
    runner = CliRunner()
    stored = panel.rename(columns={"m1emp": "month1_emplvl", "county": "cnty"})
    good = tmp_path / "panel.csv"
    stored.to_csv(good, index=False)
    release = tmp_path / "release"
    result = runner.invoke(app, ["protect", str(good), "--out", str(release), "--seed", "2", "--not-for-publication",
                                 "--allow-over-cap"])
    assert result.exit_code == 0, result.output
    assert gedp.Release(release).manifest["quarters"] == QUARTERS
    repeated = tmp_path / "repeated.csv"
    pd.concat([stored, stored.iloc[[3]]]).to_csv(repeated, index=False)  # one id twice in the same quarter
    result = runner.invoke(app, ["protect", str(repeated), "--out", str(tmp_path / "r2"), "--not-for-publication",
                                 "--allow-over-cap"])
    assert result.exit_code == 2 and "repeating an earlier row" in result.output
    assert f"row {len(stored) + 1}" in result.output and not (tmp_path / "r2").exists()


def _quarters_read(monkeypatch) -> list:
    """Calls of ``input_quarters`` (which reads the rows' year and qtr) made from now on."""
    import gedp.running.panel_protect as panel_module

    calls: list = []
    monkeypatch.setattr(panel_module, "input_quarters", lambda source, read=panel_module.input_quarters:
                        calls.append(source) or read(source))
    return calls


@pytest.mark.parametrize("statistics", [True, False])
def test_a_panel_is_told_by_its_footers_or_its_rows(panel, tmp_path, monkeypatch, statistics):
    """One quarter in every footer: not a panel, rows unread; several quarters, or footers without
    statistics: the rows tell (a panel in parts of one quarter each, a CSV, one file)."""
    from gedp.running.panel_protect import is_panel

    one_quarter = panel[(panel["year"] == 2016) & (panel["qtr"] == 1)]
    folder = tmp_path / f"parts-{statistics}"
    folder.mkdir()
    for (year, qtr), rows in panel.groupby(["year", "qtr"]):
        rows.to_parquet(folder / f"part-{year}-{qtr}.parquet", index=False, write_statistics=statistics)
    one_quarter.to_parquet(tmp_path / "one.parquet", index=False, write_statistics=statistics)
    panel.to_csv(tmp_path / "panel.csv", index=False)
    calls = _quarters_read(monkeypatch)
    assert not is_panel(tmp_path / "one.parquet")
    assert len(calls) == (0 if statistics else 1)  # read only when the footers do not tell
    assert is_panel(folder) and is_panel(tmp_path / "panel.csv") and is_panel(panel)
    assert not is_panel(one_quarter)
