"""Group sums by a grouping's codes: the bits of pandas' own ``groupby(codes).sum()``, on every path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gedp.postprocess.tabulate import kernel_sums, kernels_are_pandas, sums_by_codes, values_in_one_block

COLUMNS = ["m1emp", "m2emp", "wage"]


def _frame(rng, n, dtype, one_block):
    """Values of very different sizes, so that the sums' bits depend on how they are added (the power
    of the comparison); in one 2-D block or a block per column."""
    if dtype == "int64":
        columns = {c: rng.integers(-10**12, 10**12, n) for c in COLUMNS}
    else:
        columns = {c: rng.lognormal(3.0, 4.0, n).round(2) * rng.choice([-1.0, 1.0], n) for c in COLUMNS}
    frame = pd.concat([pd.DataFrame({c: values}) for c, values in columns.items()], axis=1)
    return values_in_one_block(frame, COLUMNS) if one_block else frame


def _codes(rng, n, n_groups, in_order):
    codes = np.concatenate([np.arange(n_groups), rng.integers(0, n_groups, n - n_groups)])  # every group has rows
    return np.sort(codes) if in_order else rng.permutation(codes)


def _bits(columns):
    return [np.asarray(column).view(np.int64) for column in columns]


@pytest.mark.parametrize("dtype", ["float64", "int64"])
@pytest.mark.parametrize("in_order", [False, True])
@pytest.mark.parametrize("one_block", [False, True])
def test_sums_have_pandas_bits(dtype, in_order, one_block):
    rng = np.random.default_rng(11)
    frame = _frame(rng, 30_000, dtype, one_block)
    codes = _codes(rng, len(frame), 37, in_order)
    expected = frame.groupby(codes).sum()
    got = sums_by_codes(frame, codes, 37)
    assert [np.asarray(c).dtype for c in got] == list(expected.dtypes)
    for column, sums in zip(COLUMNS, _bits(got)):
        np.testing.assert_array_equal(sums, expected[column].to_numpy().view(np.int64))


def test_float_sums_depend_on_the_summation():
    """Power check: on these values pandas' compensated sums and plain sums in row order differ, so a
    path adding otherwise than pandas would fail the comparison above."""
    rng = np.random.default_rng(11)
    frame = _frame(rng, 30_000, "float64", True)
    codes = _codes(rng, len(frame), 37, False)
    compensated = frame.groupby(codes).sum()["wage"].to_numpy()
    plain = np.bincount(codes, weights=frame["wage"].to_numpy(), minlength=37)
    assert (compensated != plain).any()


@pytest.mark.parametrize("in_order", [False, True])
def test_nan_sums_as_pandas(in_order):
    """Missing values are skipped as pandas skips them (the in-order path hands them to pandas' kernel)."""
    rng = np.random.default_rng(3)
    frame = _frame(rng, 5_000, "float64", True)
    frame.iloc[::7, 1] = np.nan
    codes = _codes(rng, len(frame), 5, in_order)
    expected = frame.groupby(codes).sum()
    for column, sums in zip(COLUMNS, _bits(sums_by_codes(frame, codes, 5))):
        np.testing.assert_array_equal(sums, expected[column].to_numpy().view(np.int64))


def test_sums_by_hand():
    frame = values_in_one_block(pd.DataFrame({"a": [1.5, 2.0, 4.0, 8.0], "b": [1.0, 0.0, 3.0, 0.5]}), ["a", "b"])
    a, b = sums_by_codes(frame, np.array([1, 0, 1, 0]), 2)
    assert list(a) == [10.0, 5.5] and list(b) == [0.5, 4.0]


def test_the_kernels_are_this_pandas():
    """The pandas installed sums by the kernels called (else every sum goes through pandas, and the
    comparisons above would not exercise the kernels)."""
    assert kernels_are_pandas()
    values = [5.0, 1e16, 1.0, -1e16, 1.0]
    block = values_in_one_block(pd.DataFrame({"a": values, "b": values}), ["a", "b"]).to_numpy().T
    in_order = kernel_sums(block, np.array([0, 1, 1, 1, 1]), 2)[0][1]
    compensated = kernel_sums(block, np.array([1, 0, 0, 0, 0]), 2)[0][0]
    assert in_order != compensated  # power: the kernels differ on these values
