"""The microdata users' validation (evaluation.utility, gedp evaluate utility) and the moving cells'
figures of the accuracy report (evaluation.moving_cells), against computations by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from gedp.cli import app
from gedp.evaluation.accuracy import AccuracyResult, LevelCells
from gedp.evaluation.moving_cells import moving_cells, moving_industries, moving_summary
from gedp.evaluation.utility import UtilityResult, comparison, implicate_statistics


def test_moving_cells_and_industries_by_rule():
    m1 = np.array([10.0, 10, 10, 100, 100, 4, 0, 1000, 1000, 900])
    m3 = np.array([16.0, 15, 6, 66, 67, 12, 12, 1101, 1099, 1000])
    # cells: m3 > 1.5 m1 or m3 < m1 / 1.5, with 10+ employees in month 1 or 3
    assert moving_cells(m1, m3).tolist() == [True, False, True, True, False, True, True, False, False, False]
    # industries: 1,000+ employees, |m3 - m1| > 10% of m1
    assert moving_industries(m1, m3).tolist() == [False] * 7 + [True, False, True]


def _level(true1, true3, protected, margin):
    months = ("m1emp", "m2emp", "m3emp")
    true = {"m1emp": np.array(true1, float), "m2emp": (np.array(true1) + np.array(true3)) / 2.0,
            "m3emp": np.array(true3, float)}
    return LevelCells(true, None, {m: np.array(protected, float) for m in months},
                      {m: np.array(margin, float) for m in months})


def test_moving_summary_counts_covered_cells_by_hand():
    # level 78: cells 0 and 1 move (20 -> 40, 30 -> 10), cell 2 does not (50 -> 55); two releases
    cells = _level([20, 30, 50], [40, 10, 55], [[25, 30, 52], [45, 12, 50]], [[3, 3, 3], [3, 3, 3]])
    industries = _level([2000, 3000], [2500, 3050], [[2400, 3000], [2000, 3040]], [[200, 10], [200, 10]])
    result = AccuracyResult({78: cells, 58: industries}, {}, "", np.zeros(2), "", 2, 1, 0.0, "")
    summary = moving_summary(result)
    moving = summary["moving_cells"]
    assert moving["cells"] == 2
    # month 3 (true 40, 10): release 1 gives 30 (off 10) and 30 (off 20): none; release 2 gives 50 and 12: one
    assert moving["m3emp"]["coverage_95"] == pytest.approx(1 / 4)
    # month 1 (true 20, 30): |25 - 20| > 3, |30 - 30| <= 3, |45 - 20| > 3, |12 - 30| > 3
    assert moving["m1emp"]["coverage_95"] == pytest.approx(1 / 4)
    assert moving["m1emp"]["median_relative_error"] == pytest.approx(np.median([5 / 20, 0, 25 / 20, 18 / 30]))
    assert summary["other_cells_10plus"]["cells"] == 1
    assert summary["moving_industries_58"]["cells"] == 1  # 2000 -> 2500 moves, 3000 -> 3050 does not
    assert summary["moving_industries_58"]["m3emp"]["coverage_95"] == pytest.approx(1 / 2)  # 2400 - 2500 <= 200


def _stats(values: dict[str, float], variance: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame({"statistic": list(values), "sector": "", "size_class": 0, "value": list(values.values()),
                         "variance": variance})


def test_comparison_errors_and_naive_coverage_by_hand():
    truth = _stats({"job_creation_rate": 0.04, "slope_pooled": 0.4})
    point = [_stats({"job_creation_rate": 0.03, "slope_pooled": 0.25}, variance=0.01),
             _stats({"job_creation_rate": 0.05, "slope_pooled": 0.35}, variance=0.01)]
    result = UtilityResult(truth, point, None, 10, "", 2, 1, 0.0, "")
    table = comparison(result).set_index("statistic")
    assert table.loc["job_creation_rate", "point"] == pytest.approx(0.04)
    assert table.loc["job_creation_rate", "point_error"] == pytest.approx(0.0)  # -25% and +25%
    assert table.loc["job_creation_rate", "point_error_max"] == pytest.approx(0.25)
    assert table.loc["slope_pooled", "point_error"] == pytest.approx(((0.25 - 0.4) + (0.35 - 0.4)) / 2 / 0.4)
    # naive intervals +- 1.96 x 0.1 = 0.196: 0.25 (off 0.15) and 0.35 (off 0.05) both cover 0.4
    assert table.loc["slope_pooled", "point_naive_coverage"] == pytest.approx(1.0)
    assert "coverage" not in table


class _FakeRelease:
    """A release whose implicates are given frames (what ``Release.implicates`` returns)."""

    def __init__(self, frames):
        self.frames = frames

    def implicates(self, m, seed=None):
        return pd.concat([f.assign(implicate=k + 1) for k, f in enumerate(self.frames[:m])], ignore_index=True)


def _frame(rng, n=300):
    m1 = np.floor(rng.lognormal(1.5, 1.2, n))
    m3 = np.maximum(m1 + rng.integers(-2, 3, n), 0)
    return pd.DataFrame({"m1emp": m1, "m2emp": m1, "m3emp": m3, "wage": m1 * 9000 * rng.lognormal(0, 0.3, n),
                         "sector": rng.choice(["23", "62"], n), "county": "001",
                         "naics": rng.choice(["236115", "621111"], n)})


def test_implicates_plug_in_through_one_function():
    assert implicate_statistics(object(), 10, seed=1) is None  # a gedp without implicates
    gedp = pytest.importorskip("gedp")
    if not hasattr(gedp, "combine"):
        pytest.skip("this gedp has no combine")
    rng = np.random.default_rng(5)
    frames = [_frame(rng) for _ in range(4)]
    combined = implicate_statistics(_FakeRelease(frames), 4, seed=1).set_index(["statistic", "sector", "size_class"])
    from gedp.evaluation.microdata_stats import microdata_statistics

    values = np.array([microdata_statistics(f).set_index(["statistic", "sector", "size_class"])
                       .loc[("job_creation_rate", "", 0), "value"] for f in frames])
    half = stats.t.ppf(0.975, 3) * np.sqrt((1 + 1 / 4) * values.var(ddof=1))  # census: u = 0, nu = M - 1
    row = combined.loc[("job_creation_rate", "", 0)]
    assert row["estimate"] == pytest.approx(values.mean())
    assert row["lower"] == pytest.approx(values.mean() - half) and row["upper"] == pytest.approx(values.mean() + half)


def test_evaluate_utility_end_to_end(tmp_path, small_state):
    source = tmp_path / "state.parquet"
    small_state.to_parquet(source)
    out = tmp_path / "utility"
    result = CliRunner().invoke(app, ["evaluate", "utility", "--data", str(source), "--replications", "1",
                                      "--implicates", "0", "--structure", "moving-cells", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "utility" and summary["implicates"] == 0 and summary["coverage"] is None
    names = {row["statistic"] for row in summary["headline"]}
    assert {"job_creation_rate", "no_change_share", "slope_pooled", "slope_cells", "hhi", "estabs"} <= names
    assert "moving-cells" in (out / "report.md").read_text()
    assert sorted(summary["figures"]) == sorted(p.name for p in out.glob("*.png"))


@pytest.mark.parametrize("arguments, message", [
    (["evaluate", "e4", "--implicates", "3"], "--implicates (3) goes with utility"),
    (["evaluate", "utility", "--structure", "calm"], "structure 'calm' is unknown"),
    (["evaluate", "e4", "--structure", "moving-cells"], "--structure goes with an experiment on data"),
])
def test_evaluate_utility_options_are_checked(tmp_path, arguments, message):
    result = CliRunner().invoke(app, [*arguments, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "x").exists()
