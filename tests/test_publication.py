"""QCEW tables ready to publish: rounding, average weekly wage, totals over ownerships, titles,
the qcew CSV and the xlsx workbook."""

from __future__ import annotations

import json

import numpy as np
import openpyxl
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
import gedp.postprocess.publication
from gedp.cli import app
from gedp.errors import InputError
from gedp.postprocess.publication import average_weekly_wage, qcew_publication, rounded_up, whole
from gedp.postprocess.tabulate import qcew_level
from gedp.synth.titles import published_titles, shipped_titles


@pytest.fixture(scope="module")
def integer_release(small_state, tmp_path_factory):
    """The small state protected with whole numbers (seed 1, not for publication), written to a folder."""
    release = gedp.protect(small_state, gedp.load(integer=True), seed=1, not_for_publication=True)
    return release.write(tmp_path_factory.mktemp("integer") / "release")


def test_whole_numbers_round_half_up():
    rounded = whole(pd.Series([0.0, 0.49, 0.5, 1.5, 2.5, 7.2, np.nan]))
    assert rounded.iloc[:6].tolist() == [0, 0, 1, 2, 3, 7]
    assert rounded.isna().iloc[6]


def test_margins_are_rounded_up_never_understated():
    margins = pd.Series(np.random.default_rng(3).uniform(0, 500, 10_000))
    published = rounded_up(margins).astype(float)
    assert (published >= margins).all()
    assert (published - margins < 1).all()
    assert rounded_up(pd.Series([4.0])).tolist() == [4]  # a whole margin stays as it is


def test_average_weekly_wage_by_hand():
    wages = pd.Series([130_000, 1_365, 1_364, 5_000, 0])
    months = [pd.Series([10, 1, 1, 0, 3]), pd.Series([10, 2, 2, 0, 3]), pd.Series([10, 3, 3, 0, 3])]
    # 130000 / 10 / 13 = 1000; 1365 / 2 / 13 = 52.5 -> 53 (half up); 1364 / 2 / 13 = 52.46 -> 52;
    # no employment: no average; no wages: 0.
    wage = average_weekly_wage(wages, months)
    assert wage.iloc[[0, 1, 2, 4]].tolist() == [1000, 53, 52, 0]
    assert wage.isna().iloc[3]


def test_size_class_layout_rounds_as_the_level_tables_do():
    """The size-class layout's rules are the level tables': whole numbers half up (integers, not 8.0),
    margins up to the next whole number, the average weekly wage from the published (rounded) values,
    empty where their mean employment is 0 (it was 2,268 for a class of 0.4 employees and $1,474)."""
    from gedp.postprocess.derived import size_class_publication

    table = pd.DataFrame({"state": ["44", "44"], "sector": ["22", "23"], "size_class": [1, 2],
                          "estabs": [1.2, 189.5], "m1emp": [0.4, 394.5], "m2emp": [0.3, 400.2],
                          "m3emp": [0.45, 383.0], "wage": [1_474.4, 5_127_083.0],
                          "estabs_moe": [0.9, 3.0], "wage_moe": [800.2, 15_000.5]})
    out = size_class_publication(table, 2016, 1)
    assert out["qtrly_estabs"].tolist() == [1, 190] and out["qtrly_estabs"].dtype == "Int64"
    assert out["month1_emplvl"].tolist() == [0, 395] and out["total_qtrly_wages"].tolist() == [1_474, 5_127_083]
    assert out["qtrly_estabs_moe"].tolist() == [1, 3] and out["total_qtrly_wages_moe"].tolist() == [801, 15_001]
    # 5,127,083 / ((395 + 400 + 383) / 3) / 13 = 1,004.39 -> 1,004; a class of 0 employees: empty.
    assert out["avg_wkly_wage"].isna().iloc[0]
    assert out["avg_wkly_wage"].iloc[1] == int(np.floor(5_127_083 / ((395 + 400 + 383) / 3) / 13 + 0.5))
    assert out["size_title"].tolist() == ["n < 5", "5 <= n < 10"]


def test_qcew_format_of_an_integer_release(integer_release, tmp_path):
    out = tmp_path / "t78.csv"
    result = CliRunner().invoke(app, ["tabulate", str(integer_release), "--agglvl", "78", "--moe", "--format", "qcew",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out, dtype={"area_fips": str, "industry_code": str, "own_code": str},
                        keep_default_na=False, na_values=[""])
    for column in ("area_title", "industry_title", "avg_wkly_wage", "disclosure_code", "own_title"):
        assert column in table.columns
    assert table["disclosure_code"].isna().all()  # written empty: nothing suppressed
    values = ["qtrly_estabs", "month1_emplvl", "month2_emplvl", "month3_emplvl", "total_qtrly_wages",
              "month1_emplvl_moe", "total_qtrly_wages_moe"]
    assert all(pd.api.types.is_integer_dtype(table[c]) for c in values)
    raw = qcew_level(pd.read_parquet(integer_release / "protected.parquet"), 78)
    assert (table["total_qtrly_wages"].to_numpy() == raw["total_qtrly_wages"].to_numpy()).all()  # already whole
    employed = table[["month1_emplvl", "month2_emplvl", "month3_emplvl"]].mean(axis=1)
    expected = np.floor(table["total_qtrly_wages"] / employed / 13 + 0.5)
    assert np.array_equal(table["avg_wkly_wage"].dropna(), expected[employed > 0])
    assert (table["area_fips"].str[:2] == "44").all()  # the small profile is Rhode Island's
    assert table["area_title"].str.endswith(", Rhode Island").all()  # "<county>, <state>", none untitled
    assert all(f"{title} ".startswith(f"NAICS {code} ")  # "NAICS <code> <title>", or the code alone
               for title, code in zip(table["industry_title"], table["industry_code"]))
    sidecar = json.loads(out.with_name(out.name + ".json").read_text())
    assert "naics 1.0.1" in sidecar["titles"]["industries"] and "Privacy guarantee" in sidecar["notes"]


def test_xlsx_has_a_sheet_per_level_and_notes(small_state, tmp_path):
    micro = small_state.copy()
    micro.loc[micro.index % 7 == 0, "own"] = "3"  # local government beside private: totals over ownerships
    micro.to_parquet(tmp_path / "micro.parquet")
    out = tmp_path / "t.xlsx"
    result = CliRunner().invoke(app, ["tabulate", str(tmp_path / "micro.parquet"), "--out", str(out), "--unprotected"])
    assert result.exit_code == 0, result.output
    book = openpyxl.load_workbook(out)
    levels = [50, *range(51, 59), 70, *range(71, 79)]
    assert book.sheetnames == [f"agglvl {n}" for n in levels] + ["notes"]
    notes = {row[0]: row[1] for row in book["notes"].iter_rows(min_row=2, values_only=True)}
    assert notes["Release"].startswith("NOT PROTECTED")
    header = [cell.value for cell in book["agglvl 50"][1]]
    total = dict(zip(header, [cell.value for cell in book["agglvl 50"][2]]))
    assert (total["own_code"], total["industry_code"], total["own_title"]) == ("0", "10", "Total Covered")
    assert total["disclosure_code"] == "NOT PROTECTED"
    assert total["month1_emplvl"] == int(np.floor(micro["m1emp"].sum() + 0.5))
    assert total["qtrly_estabs"] == len(micro)


def test_release_tabulate_xlsx_states_the_privacy(small_release, tmp_path):
    release = gedp.read_release(small_release[0])
    table = release.tabulate(agglvl=54, format="xlsx", out=tmp_path / "s.xlsx", moe=True)
    book = openpyxl.load_workbook(tmp_path / "s.xlsx")
    assert book.sheetnames == ["agglvl 54", "notes"]
    notes = {row[0]: row[1] for row in book["notes"].iter_rows(min_row=2, values_only=True)}
    from scipy.optimize import brentq
    from scipy.stats import norm

    mu = release.manifest["mu_total"]
    # epsilon at delta 1e-6 by Dong, Roth & Su's Corollary 2.13, solved here by root finding
    epsilon = brentq(lambda e: norm.cdf(-e / mu + mu / 2) - np.exp(e) * norm.cdf(-e / mu - mu / 2) - 1e-6, 0, 100)
    assert f"total mu {mu:.4f} (epsilon {epsilon:.2f} at delta 1e-6)" in notes["Privacy guarantee"]
    assert "rounded up" in notes["Margins of error"]
    # what is hidden is bounded by mu, not absolute (a reader tells values apart as well as mu allows)
    assert "no better than the privacy guarantee's mu allows" in notes["What is protected"]
    assert "no one can tell" not in notes["What is protected"]
    assert len(table) == book["agglvl 54"].max_row - 1


def test_ownership_totals_need_several_own_codes(small_state):
    with pytest.raises(ValueError, match=r"level 50 totals over ownerships.*one own code \(5\)"):
        qcew_publication(small_state, 50, shipped_titles())
    with pytest.raises(InputError, match="format qcew needs an aggregation level"):
        gedp.postprocess.publication.publish_levels(small_state, None, "qcew", None)


@pytest.mark.shared_data
@pytest.mark.parametrize("file_name", ["qcew_2016q1_44.csv", "qcew_2016q1_34.csv"])
def test_titles_against_the_published_files(shared_data, file_name):
    published = pd.read_csv(shared_data / file_name, dtype=str, keep_default_na=False)
    carried = published_titles(shared_data / file_name)
    assert (carried.area_titles(published["area_fips"]) == published["area_title"]).all()
    assert (carried.industry_titles(published["industry_code"]) == published["industry_title"]).all()
    shipped = shipped_titles()
    assert (shipped.area_titles(published["area_fips"]) == published["area_title"]).all()
    aggregate = published["agglvl_code"].isin(["50", "51", "52", "53", "70", "71", "72", "73"])
    titled = shipped.industry_titles(published["industry_code"])
    assert (titled[aggregate] == published["industry_title"][aggregate]).all()
    naics = published.loc[~aggregate, "industry_code"].drop_duplicates()
    assert naics.isin(list(shipped.industries)).mean() > 0.8  # NAICS 2022 titles for 2012 codes: 84-85% measured
