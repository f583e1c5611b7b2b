"""QCEW sums over value columns held in one block: each column's sums have the bits of its own."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gedp.measure.queries import Groupings
from gedp.postprocess.tabulate import qcew_level, qcew_tables, values_in_one_block
from gedp.synth.hierarchy import COUNTY_LEVELS, STATE_LEVELS

VALUES = ["m1emp", "m2emp", "wage"]


def _values(rng, n):
    """Values of very different sizes (their sums' bits depend on the summation: power of the checks),
    a column per block as a frame assembled column by column holds them."""
    columns = [pd.DataFrame({c: rng.lognormal(3.0, 4.0, n).round(2)}) for c in VALUES]
    return pd.concat([*columns, pd.DataFrame({"other": np.arange(n)})], axis=1)


@pytest.mark.parametrize("in_order", [False, True])
def test_sums_have_the_bits_of_separate_columns(in_order):
    """Codes in random order (pandas' compensated sums) and in order (its np.add.reduceat path)."""
    rng = np.random.default_rng(5)
    frame = _values(rng, 20_000)
    codes = rng.integers(0, 7, len(frame))
    codes = np.sort(codes) if in_order else codes
    one_block = values_in_one_block(frame, VALUES)
    assert one_block[VALUES]._mgr.nblocks == 1 < frame[VALUES]._mgr.nblocks
    assert one_block.equals(frame) and list(one_block.columns) == list(frame.columns)
    expected = frame[VALUES].groupby(codes).sum()
    summed = one_block[VALUES].groupby(codes).sum()
    assert summed.to_numpy().tobytes() == expected.to_numpy().tobytes()
    # power: a plain sequential sum of the same values gives other bits
    plain = np.stack([np.bincount(codes, weights=frame[c].to_numpy()) for c in VALUES], axis=1)
    assert plain.tobytes() != expected.to_numpy().tobytes()


def test_mixed_dtypes_stay_as_they_are():
    frame = _values(np.random.default_rng(6), 100).astype({"m2emp": "int64"})
    assert values_in_one_block(frame, VALUES) is frame


def test_qcew_tables_have_the_bytes_of_each_level(small_state):
    """The stacked levels equal each level tabulated from the frame as it is."""
    groupings = Groupings(small_state)
    tables = qcew_tables(small_state, groupings)
    levels = pd.concat([qcew_level(small_state, level, groupings=groupings) for level in (*STATE_LEVELS,
                                                                                          *COUNTY_LEVELS)],
                       ignore_index=True)
    assert tables.equals(levels) and tables.to_csv() == levels.to_csv()
