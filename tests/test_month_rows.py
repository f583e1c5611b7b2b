"""Row sums and means over the months, added column by column, against numpy's own reductions."""

import numpy as np
import pytest

from gedp.postprocess.months import row_means, row_sums

SPECIAL = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324])


@pytest.mark.parametrize("columns", range(1, 11))
def test_row_sums_and_means_are_numpys_bit_for_bit(columns):
    rng = np.random.default_rng(columns)
    values = rng.standard_normal((5_000, columns)) * 10.0 ** rng.integers(-300, 300, (5_000, columns))
    special = rng.random(values.shape) < 0.2  # signed zeros, NaN, infinities, overflow, subnormals
    values[special] = rng.choice(SPECIAL, special.sum())
    values[0] = -0.0  # a row of negative zeros sums to +0 (numpy starts from 0)
    for layout in (values, np.asfortranarray(values), values[::3], values.astype(np.float32)):
        with np.errstate(all="ignore"):
            assert row_sums(layout).tobytes() == layout.sum(axis=1).tobytes()
            assert row_means(layout).tobytes() == layout.mean(axis=1).tobytes()
    assert row_sums(values)[0] == 0 and not np.signbit(row_sums(values)[0])


def test_row_sums_of_whole_numbers_are_numpys():
    values = np.arange(12, dtype=np.int64).reshape(4, 3)
    assert np.array_equal(row_sums(values), [3, 12, 21, 30]) and row_sums(values).dtype == np.int64
