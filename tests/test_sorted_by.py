"""sorted_by against pandas' stable sort on frames with repeated, missing and non-ASCII keys."""

import numpy as np
import pandas as pd
import pytest

from gedp.synth import io, keycodes
from gedp.synth.io import sorted_by


def keyed_frame(rows: int, seed: int) -> pd.DataFrame:
    """Few-valued text codes (some missing, some non-ASCII), a whole-number key and unique ids."""
    rng = np.random.default_rng(seed)
    codes = np.array(["01", "1", "10", "9", "é", "z", "Z", "ab", ""], dtype=object)
    frame = pd.DataFrame({
        "state": rng.choice(codes[:4], rows),
        "county": rng.choice(codes, rows),
        "naics": rng.integers(0, 7, rows),
        "estab_id": [f"id{value}" for value in rng.permutation(rows * 3)[:rows]],
        "value": rng.normal(size=rows),
    })
    frame.loc[rng.random(rows) < 0.1, "county"] = None
    frame["county"] = frame["county"].astype("str")
    return frame


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("columns", [["state", "county", "naics", "estab_id"], ["county", "state"], ["estab_id"],
                                     ["naics", "county", "value"]])
@pytest.mark.parametrize("least_rows", [0, keycodes.PANDAS_TAKE_ROWS], ids=["arrow", "pandas"])
def test_sorted_by_is_pandas_stable_sort(seed, columns, least_rows, monkeypatch):
    """The rows taken in order both ways (``keycodes.PANDAS_TAKE_ROWS``: 0 takes these 500 rows' text as
    Arrow does a large frame's)."""
    monkeypatch.setattr(keycodes, "PANDAS_TAKE_ROWS", least_rows)
    frame = keyed_frame(500, seed)
    expected = frame.sort_values(columns, kind="stable", ignore_index=True, na_position="last")
    pd.testing.assert_frame_equal(sorted_by(frame, columns), expected)


def test_ties_keep_the_input_order():
    frame = pd.DataFrame({"state": ["b", "a", "b", "a"], "county": ["x", "x", "x", "x"], "row": [0, 1, 2, 3]})
    assert sorted_by(frame, ["state", "county"])["row"].tolist() == [1, 3, 0, 2]


def test_keys_too_many_to_fold_into_one_number_still_sort(monkeypatch):
    """With a tiny fold limit every leading column is a key of its own."""
    monkeypatch.setattr(io, "MAX_FOLDED", 4)
    frame = keyed_frame(300, 7)
    columns = ["state", "county", "naics", "estab_id"]
    assert len(io._leading_ranks(frame, columns[:-1])) == 3
    expected = frame.sort_values(columns, kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(sorted_by(frame, columns), expected)
