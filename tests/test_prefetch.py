"""A one-state Parquet file read ahead on a thread gives read_columns the frames pd.read_parquet gives."""

import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gedp.running.engine import input_states
from gedp.synth import io, prefetch
from gedp.synth.io import parts_holding, read_columns
from gedp.synth.prefetch import prefetch_input


@pytest.fixture(autouse=True)
def nothing_left_read_ahead():
    yield
    for left in prefetch._prefetched:
        left.thread.join()
    prefetch._prefetched.clear()


@pytest.fixture(params=["range index", "stored index"])
def one_state(request, tmp_path, small_state):
    """300 establishments of state 44, written by pandas with its metadata (and an attribute)."""
    rows = small_state.head(300).assign(state="44")
    stored = request.param == "stored index"
    if stored:
        rows.index = pd.Index(range(1000, 1300), name="row")
    rows.attrs = {"made_by": "test"}
    path = tmp_path / "one.parquet"
    rows.to_parquet(path, index=stored)
    return path


def test_columns_rows_and_the_whole_file_come_from_the_table_read_ahead(one_state, monkeypatch):
    expected = {"ids": pd.read_parquet(one_state, columns=["state", "estab_id"]),
                "none": pd.read_parquet(one_state, columns=["state", "m1emp"], filters=[("state", "in", ["09"])]),
                "all": pd.read_parquet([str(one_state)], schema=pq.read_schema(one_state))}
    prefetch_input(one_state)
    assert len(prefetch._prefetched) == 1
    monkeypatch.setattr(io.pd, "read_parquet", lambda *a, **k: pytest.fail("the file was read again"))
    inputs = input_states(one_state)  # reads state and estab_id
    assert inputs.codes == {"44": ["44"]} and inputs.rows == 300
    got = {"ids": read_columns(one_state, ["state", "estab_id"]),
           "none": read_columns(one_state, ["state", "m1emp"], where=("state", ["09"]))}
    parts = parts_holding(one_state, "state", inputs.codes, inputs.stamps)["44"]
    got["all"] = read_columns(parts, where=("state", ["44"]))
    for name, frame in expected.items():
        pd.testing.assert_frame_equal(got[name], frame, check_exact=True)
        assert got[name].attrs == frame.attrs
    assert len(got["none"]) == 0 and got["all"].attrs == {"made_by": "test"}
    assert prefetch._prefetched == []  # the read of every column was its last use


def test_a_file_rewritten_after_it_was_read_ahead_is_read_again(one_state):
    prefetch_input(one_state)
    prefetch._prefetched[0].thread.join()
    changed = pd.read_parquet(one_state).assign(m1emp=7.0)
    changed.to_parquet(one_state)
    os.utime(one_state, ns=(0, prefetch._prefetched[0].stamp[3] + 1))
    pd.testing.assert_frame_equal(read_columns(one_state), pd.read_parquet(one_state), check_exact=True)
    assert (read_columns(one_state)["m1emp"] == 7.0).all()


def test_a_failed_read_ahead_leaves_the_read_to_the_reader(one_state, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(prefetch.pq, "read_table", refuse)
    prefetch_input(one_state)
    monkeypatch.undo()
    pd.testing.assert_frame_equal(read_columns(one_state), pd.read_parquet(one_state), check_exact=True)


def test_files_of_several_states_folders_and_unreadable_files_are_not_read_ahead(tmp_path, small_state):
    rows = small_state.head(100).reset_index(drop=True)
    several = tmp_path / "several.parquet"
    pq.write_table(pa.Table.from_pandas(rows.assign(state=["09", "44"] * 50), preserve_index=False), several)
    folder = tmp_path / "folder.parquet"
    folder.mkdir()
    pq.write_table(pa.Table.from_pandas(rows.assign(state="44"), preserve_index=False), folder / "a.parquet")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    for path in (several, folder, broken):
        prefetch_input(path)
        assert prefetch._prefetched == [], path
