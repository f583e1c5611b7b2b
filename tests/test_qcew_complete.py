"""Incomplete published QCEW files are refused with the reason; a file of several states is split."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.errors import InputError
from gedp.synth.qcew import read_qcew

pytestmark = pytest.mark.shared_data
runner = CliRunner()
RI, NJ = "qcew_2016q1_44.csv", "qcew_2016q1_34.csv"
TEXT = {"area_fips": str, "industry_code": str, "own_code": str, "disclosure_code": str}


def rows(shared_data, name: str) -> pd.DataFrame:
    return pd.read_csv(shared_data / name, dtype=TEXT)


def synth(source, out, *options):
    return runner.invoke(app, ["synth", "--from-qcew", str(source), "--out", str(out), "--seed", "5",
                               *map(str, options)], catch_exceptions=False)


def refused_by_synth(tmp_path, frame: pd.DataFrame, message: str, *options) -> None:
    source = tmp_path / "published.csv"
    frame.to_csv(source, index=False)
    result = synth(source, tmp_path / "out.parquet", *options)
    assert result.exit_code == 2 and message in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["published.csv"]


def test_a_file_of_level_78_alone_is_refused_with_the_levels_it_lacks(shared_data, tmp_path):
    ri = rows(shared_data, RI)
    finest = ri[ri["agglvl_code"] == 78]
    refused_by_synth(tmp_path, finest, "no private rows at aggregation level 71 (the county private totals): "
                                       "without them the state's totals are unknown")
    county_totals_missing = ri[ri["agglvl_code"] != 71]
    refused_by_synth(tmp_path, county_totals_missing, "level 71 (the county private totals)")
    with pytest.raises(InputError, match=r"level 78 \(the county x NAICS-6 cells\).* it has levels 51, 52, .*, 77$"):
        frame = ri[ri["agglvl_code"] != 78]
        frame.to_csv(tmp_path / "no78.csv", index=False)
        read_qcew(tmp_path / "no78.csv")


def test_a_second_quarter_and_cells_above_their_totals_are_refused(shared_data, tmp_path):
    ri = rows(shared_data, RI)
    refused_by_synth(tmp_path, pd.concat([ri, ri.assign(qtr=2)]), "rows of 2 quarters (2016 Q1, 2016 Q2)")
    inflated = ri.copy()
    published = (inflated["agglvl_code"] == 78) & (inflated["disclosure_code"].fillna("") != "N")
    cell = inflated.index[published][0]
    inflated.loc[cell, "month1_emplvl"] = int(inflated.loc[cell, "month1_emplvl"]) + 10**6
    refused_by_synth(tmp_path, inflated, "but its published parts at agglvl 78 add up to")


def test_a_file_of_several_states_is_split_by_state(shared_data, tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    ri, nj = rows(shared_data, RI), rows(shared_data, NJ)
    for level, part in pd.concat([nj, ri]).groupby("agglvl_code"):  # BLS's single-level files, national
        part.to_csv(both / f"2016.q1 {level}.csv", index=False)
    result = synth(both, tmp_path / "none.parquet")
    assert result.exit_code == 2 and "rows of 2 states (34, 44); choose one with --state" in result.output
    split = read_qcew(both, state="44")
    alone = read_qcew(shared_data / RI)
    pd.testing.assert_frame_equal(split.aggregates, alone.aggregates)
    assert (split.membership != alone.membership).nnz == 0
    assert synth(both, tmp_path / "ri.parquet", "--state", "44").exit_code == 0
    assert synth(shared_data / RI, tmp_path / "alone.parquet").exit_code == 0
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ri.parquet"), pd.read_parquet(tmp_path / "alone.parquet"))
    report = json.loads((tmp_path / "ri.validation.json").read_text())
    totals = ri[(ri["agglvl_code"] == 51)].iloc[0]
    synthetic = pd.read_parquet(tmp_path / "ri.parquet")
    assert report["exact"] and synthetic["m1emp"].sum() == int(totals["month1_emplvl"])  # the state's total
    assert np.mean(synthetic["m1emp"] == 0) < 0.2
    (both / "2016.q1 78.csv").unlink()
    with pytest.raises(InputError, match="no private rows at aggregation level 78"):
        read_qcew(both, state="44")
    with pytest.raises(InputError, match="no private rows of state '45'; it has 34, 44"):
        read_qcew(both, state="45")
