"""Quality flags (``postprocess.quality``): each value's CV band, against a computation written out
here (scipy's normal quantile, the bands one by one), and the flag columns of ``gedp tabulate
--format qcew`` against the unrounded values and margins of the same level."""

import io

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from gedp.cli import app
from gedp.postprocess.quality import quality_flags


def band(value: float, margin: float, level: float) -> str:
    sd = margin / stats.norm.ppf((1 + level) / 2)
    if sd == 0:
        return "A"
    if value == 0:
        return "X"
    cv = sd / abs(value)
    for bound, flag in ((0.05, "A"), (0.15, "B"), (0.30, "C"), (1.0, "D")):
        if cv < bound:
            return flag
    return "X"


@pytest.mark.parametrize("level", [0.8, 0.9, 0.95, 0.99])
def test_flags_are_the_bands_of_the_cv(level):
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.lognormal(5, 3, 2000), -rng.lognormal(2, 1, 50), [0.0, 0.0, 12.0]])
    margins = np.concatenate([values[:-3] * rng.lognormal(-1.5, 1.5, len(values) - 3) * np.sign(values[:-3]),
                              [0.0, 3.0, 0.0]])
    flags = quality_flags(values, margins, level)
    assert flags.tolist() == [band(v, m, level) for v, m in zip(values, margins)]
    assert set(flags) == set("ABCDX")


def test_a_missing_margin_is_flagged_as_noisy():
    assert quality_flags(np.array([10.0, np.nan]), np.array([np.nan, 1.0]), 0.95).tolist() == ["X", "X"]


def test_qcew_tables_flag_each_value_from_its_unrounded_margin(small_release, tmp_path):
    release = str(small_release[0])
    runner = CliRunner()
    published = runner.invoke(app, ["tabulate", release, "--agglvl", "75", "--format", "qcew", "--moe", "--level",
                                    "0.9"])
    raw = runner.invoke(app, ["tabulate", release, "--agglvl", "75", "--moe", "--level", "0.9"])
    assert published.exit_code == 0 and raw.exit_code == 0, published.output + raw.output
    table = pd.read_csv(io.StringIO(published.stdout), dtype=str, keep_default_na=False)
    unrounded = pd.read_csv(io.StringIO(raw.stdout), dtype={"area_fips": str, "industry_code": str, "own_code": str})
    assert len(table) == len(unrounded)
    columns = ["month1_emplvl", "month2_emplvl", "month3_emplvl", "total_qtrly_wages"]
    assert list(table.columns[-8:]) == [f"{c}_moe" for c in columns] + [f"{c}_flag" for c in columns]
    for column in columns:
        expected = [band(v, m, 0.9) for v, m in zip(unrounded[column], unrounded[f"{column}_moe"])]
        assert table[f"{column}_flag"].tolist() == expected
    without = runner.invoke(app, ["tabulate", release, "--agglvl", "75", "--format", "qcew"])
    assert "_flag" not in without.stdout.splitlines()[0]
