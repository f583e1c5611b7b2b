"""benchmarks/coverage_compare.py (two coverage runs compared cell by cell) against a direct count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


@pytest.fixture(scope="module")
def compare(benchmark_script):
    return benchmark_script("coverage_compare").compare


def _run(covered: np.ndarray) -> pd.DataFrame:
    """One run's rows: ``covered`` is releases x cells of one band (level 78, wage, < 100k)."""
    releases, cells = covered.shape
    return pd.DataFrame({"release": np.repeat(np.arange(releases), cells), "level": "78", "attribute": "wage",
                         "band": "< 100k", "cell": np.tile(np.arange(cells), releases), "covered": covered.ravel()})


def test_counts_flips_and_standard_errors_as_a_direct_computation(compare):
    """Random coverage flags for 4 releases x 150 cells, the second run flipping 20 of them: the coverages,
    the flips each way, the binomial and between-release standard errors and the paired difference's,
    against numpy on the arrays; the target's bounds (93-97% at 500+, 91-98% at 100-499)."""
    rng = np.random.default_rng(2)
    before = rng.random((4, 150)) < 0.95
    after = before.copy()
    flipped = rng.choice(before.size, 20, replace=False)
    after.flat[flipped] = ~after.flat[flipped]
    [row] = compare(_run(before), _run(after)).to_dict(orient="records")
    assert row["cells"] == 600 and row["before"] == before.mean() and row["after"] == after.mean()
    assert row["gained"] == np.sum(after & ~before) and row["lost"] == np.sum(before & ~after)
    assert row["gained"] + row["lost"] == 20
    p = before.mean()
    assert np.isclose(row["se_binomial"], np.sqrt(p * (1 - p) / 600))
    assert np.isclose(row["se_releases"], before.mean(axis=1).std(ddof=1) / 2)
    assert np.isclose(row["se_difference"], (after.mean(axis=1) - before.mean(axis=1)).std(ddof=1) / 2)
    assert row["outside_before"] == (not 0.93 <= p <= 0.97)
    narrow = compare(_run(np.ones((1, 300), dtype=bool)), _run(np.arange(300)[None, :] >= 27))
    assert narrow[["outside_before", "outside_after"]].values.tolist() == [[True, False]]  # 100%; 91.0%


def test_runs_of_other_cells_are_refused(compare):
    before = _run(np.ones((1, 5), dtype=bool))
    with pytest.raises(ValueError, match="not the same state"):
        compare(before, before.assign(band="1-10M"))
