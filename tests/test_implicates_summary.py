"""benchmarks/implicates_summary.py: coverage and the bias / spread diagnosis against hand computations."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats


@pytest.fixture(scope="module")
def summary(benchmark_script):
    return benchmark_script("implicates_summary")


def rows_file(tmp_path: Path) -> Path:
    """Three releases: a statewide rate (truth 1.0) estimated 1.1, 1.2, 1.3 with half-widths 0.15 (two
    covered once), a sector x class cell of 25 establishments (always covered) and one of 5 (not judged)."""
    frames = []
    for seed, estimate in zip((1, 2, 3), (1.1, 1.2, 1.3)):
        frames.append(pd.DataFrame({
            "release_seed": seed, "statistic": ["job_creation_rate", "estabs", "estabs", "m3emp", "wage"],
            "sector": ["", "31-33", "42", "31-33", ""], "size_class": [0, 2, 2, 2, 0],
            "truth": [1.0, 25.0, 5.0, 200.0, 7.0], "release": 0.0,
            "implicates": [estimate, 25.0, 9.0, 210.0, 7.0],
            "lo": [estimate - 0.15, 24.0, 8.0, 205.0, 6.0], "hi": [estimate + 0.15, 26.0, 10.0, 215.0, 8.0],
            "seconds": 1.0}))
    path = tmp_path / "rows.csv"
    pd.concat(frames).to_csv(path, index=False)
    return path


def test_coverage_and_diagnosis_by_hand(summary, tmp_path):
    rows = summary.load(rows_file(tmp_path), m=10)
    state = summary.statewide(rows)
    assert list(state["statistic"].unique()) == ["job_creation_rate"]  # statewide wage totals are not judged
    assert state["covered"].tolist() == [True, False, False]  # 1.0 in [0.95, 1.25]; not in [1.05, 1.35]
    cells = summary.sector_cells(rows)
    assert set(cells["sector"]) == {"31-33"} and len(cells) == 6  # the 5-establishment cell is left out
    assert cells.groupby("statistic")["covered"].mean().to_dict() == {"estabs": 1.0, "m3emp": 0.0}
    d = summary.diagnosis(rows).loc[("job_creation_rate", 0)]
    sqrt_t = 0.15 / stats.t.ppf(0.975, 9)
    assert d["relative_error"] == pytest.approx(0.2)
    assert d["bias_over_sqrt_t"] == pytest.approx(0.2 / sqrt_t)
    assert d["spread_over_sqrt_t"] == pytest.approx(np.std([1.1, 1.2, 1.3], ddof=1) / sqrt_t)
    assert d["coverage"] == pytest.approx(1 / 3)
    table = summary.markdown({"run": summary.diagnosis(rows)})
    assert "| job_creation_rate | 33% (+20.0%) |" in table
    zero = summary.diagnosis(rows).loc[("job_creation_rate", 0)].copy()
    zero["truth"], zero["error"] = 0.0, 0.05
    assert summary.error_text("growth_p25", zero) == "+0.05, truth 0"
    assert summary.error_text("no_change_share", zero) == "+5.0 pts"
