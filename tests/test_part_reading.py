"""A state of a folder of Parquet parts is read from the parts that may hold it, as the folder would be."""

import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gedp.config import load_config
from gedp.errors import InputError
from gedp.running.engine import input_states, protect_input, read_state
from gedp.synth.io import parts_holding, read_columns
from gedp.synth.schema import validate_microdata


@pytest.fixture
def folder(tmp_path, small_state):
    """Parts of states 09 and 44, one holding both, one without statistics (may hold any state)."""
    rows = small_state.head(400).reset_index(drop=True)
    path = tmp_path / "in.parquet"
    path.mkdir()
    layout = {"a-09": ["09"] * 100, "b-44": ["44"] * 100, "c-both": ["09"] * 50 + [" 44"] * 50,
              "d-bare": ["44"] * 100}
    for index, (name, states) in enumerate(layout.items()):
        part = rows.iloc[index * 100:(index + 1) * 100].assign(state=states)
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), path / f"{name}.parquet",
                       write_statistics=name != "d-bare")
    return path


def test_each_state_opens_only_the_parts_that_may_hold_it(folder):
    inputs = input_states(folder)
    assert inputs.codes == {"09": ["09"], "44": ["44", " 44"]} and inputs.rows == 400
    parts = parts_holding(folder, "state", inputs.codes, inputs.stamps)
    names = {state: [os.path.basename(file) for file in held.files] for state, held in parts.items()}
    assert names == {"09": ["a-09.parquet", "c-both.parquet", "d-bare.parquet"],
                     "44": ["b-44.parquet", "c-both.parquet", "d-bare.parquet"]}
    for state, stored in inputs.codes.items():
        expected = read_columns(folder, where=("state", stored))
        pd.testing.assert_frame_equal(read_columns(parts[state], where=("state", stored)), expected)
        assert set(expected["state"]) == set(stored)
        pd.testing.assert_frame_equal(read_state(parts[state], state, ("m1emp",), stored),
                                      read_state(folder, state, ("m1emp",), stored))


def test_a_part_changed_after_the_first_read_is_refused(folder, tmp_path):
    inputs = input_states(folder)
    part = folder / "a-09.parquet"
    frame = pd.read_parquet(part)
    frame.loc[1, "estab_id"] = frame.loc[0, "estab_id"]  # same rows, a repeated id the first read never saw
    frame.to_parquet(part, index=False)
    os.utime(part, ns=(0, inputs.stamps[str(part)][3] + 1))
    with pytest.raises(InputError, match="was changed while gedp read it"):
        protect_input(folder, load_config("recommended"), tmp_path / "out", seed=1, inputs=inputs, processes=1)
    assert not (tmp_path / "out").exists()


def test_repeated_ids_are_refused_unless_checked_over_the_whole_input(small_state):
    rows = small_state.head(50).reset_index(drop=True)
    rows.loc[3, "estab_id"] = rows.loc[0, "estab_id"]
    with pytest.raises(InputError, match="'estab_id': ids must be unique, .*; row 4 is the establishment of row 1$"):
        validate_microdata(rows, ("m1emp",))
    assert len(validate_microdata(rows, ("m1emp",), unique_ids_checked=True)) == 50


def test_a_parquet_file_is_its_one_part_and_refused_when_rewritten(folder, tmp_path):
    single = tmp_path / "one.parquet"
    pd.read_parquet(folder).to_parquet(single, index=False)
    inputs = input_states(single)
    parts = parts_holding(single, "state", inputs.codes, inputs.stamps)
    assert {state: held.files for state, held in parts.items()} == {"09": (str(single),), "44": (str(single),)}
    pd.testing.assert_frame_equal(read_columns(parts["44"], where=("state", ["44", " 44"])),
                                  read_columns(single, where=("state", ["44", " 44"])))
    os.utime(single, ns=(0, inputs.stamps[str(single)][3] + 1))
    with pytest.raises(InputError, match=f"input '{single}' was changed while gedp read it"):
        read_columns(parts["09"], where=("state", ["09"]))
