"""Reading one state of a Parquet input: the filter is dropped only when statistics show every row passes."""

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gedp.synth.io import _every_row_holds, read_columns


@pytest.fixture
def two_states(small_state):
    """The small state's rows split into states 44 and 09, the second also stored as " 09"."""
    frame = small_state.head(300).copy()
    frame["state"] = ["44"] * 100 + ["09"] * 150 + [" 09"] * 50
    return frame


def write(frame: pd.DataFrame, path, **options) -> str:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, **options)
    return str(path)


@pytest.mark.parametrize("values", [["44"], ["09", " 09"], ["09"], ["44", "09", " 09"], ["10"]])
@pytest.mark.parametrize("row_group_size", [50, 100, 1000])
def test_read_rows_of_some_states_as_pandas_filters_them(tmp_path, two_states, values, row_group_size):
    path = write(two_states, tmp_path / "in.parquet", row_group_size=row_group_size)
    expected = two_states[two_states["state"].isin(values)].reset_index(drop=True)
    pd.testing.assert_frame_equal(read_columns(path, where=("state", values)), expected)


def test_statistics_decide_whether_every_row_passes(tmp_path, two_states):
    grouped = write(two_states, tmp_path / "grouped.parquet", row_group_size=50)  # one value per group
    assert _every_row_holds(grouped, "state", ["44", "09", " 09"])
    assert not _every_row_holds(grouped, "state", ["44", "09"])
    whole = write(two_states, tmp_path / "whole.parquet")  # one group of three values
    assert not _every_row_holds(whole, "state", ["44", "09", " 09"])
    bare = write(two_states.head(100), tmp_path / "bare.parquet", write_statistics=False)
    assert not _every_row_holds(bare, "state", ["44"])
    assert _every_row_holds(write(two_states.head(100), tmp_path / "one.parquet"), "state", ["44"])


def test_a_missing_value_keeps_the_filter(tmp_path, two_states):
    frame = two_states.head(100).copy()
    frame.loc[5, "state"] = None
    path = write(frame, tmp_path / "missing.parquet")
    assert not _every_row_holds(path, "state", ["44"])
    assert len(read_columns(path, where=("state", ["44"]))) == 99
