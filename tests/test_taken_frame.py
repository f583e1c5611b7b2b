"""Rows taken by position with fixed-width text taken as bytes: what pandas' take gives, to the Arrow type."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from gedp.synth import keycodes
from gedp.synth.keycodes import fixed_width_bytes, taken_column, taken_frame


def text(values: list, arrow_type: pa.DataType, dtype: str = "str", chunks: int = 1) -> pd.Series:
    """Arrow text of ``arrow_type`` in one or two chunks, the first a slice of a longer array (offset not 0)."""
    half = len(values) // 2 if chunks == 2 else len(values)
    first = pa.array(["zz", *values[:half]], arrow_type).slice(1)
    parts = [first, pa.array(values[half:], arrow_type)] if chunks == 2 else [first]
    return pd.Series(pd.array(pa.chunked_array(parts), dtype=dtype))


def arrow_types(frame: pd.DataFrame) -> list:
    return [pa.array(frame[column].array).type if hasattr(frame[column].array, "_pa_array") else frame[column].dtype
            for column in frame.columns]


COLUMNS = {
    "ids": [f"{i:03d}-x" for i in range(40)],  # one width, not digits
    "accents": ["é1", "ab1", "zé", "012"] * 10,  # three bytes each, not three characters
    "widths": ["1", "22", "333", "31-33"] * 10,  # several widths: Arrow's take
    "missing": [None, "ab", "cd", "ef"] * 10,
    "empty": [""] * 40,
    "one": ["ab"] * 40,  # one value: the column itself when as many rows are taken
}


@pytest.mark.parametrize("arrow_type", [pa.large_string(), pa.string()])
@pytest.mark.parametrize("dtype", ["str", "string[pyarrow]"])
@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("least_rows", [0, keycodes.PANDAS_TAKE_ROWS], ids=["arrow", "pandas"])
def test_taken_frame_is_pandas_take(arrow_type, dtype, chunks, least_rows, monkeypatch):
    """Both ways a frame is taken (``PANDAS_TAKE_ROWS``: 0 takes these 40 rows' text as Arrow does a
    large frame's)."""
    monkeypatch.setattr(keycodes, "PANDAS_TAKE_ROWS", least_rows)
    rng = np.random.default_rng(chunks)
    frame = pd.DataFrame({name: text(values, arrow_type, dtype, chunks) for name, values in COLUMNS.items()})
    frame.insert(2, "number", rng.normal(size=40))
    frame["count"] = rng.integers(0, 9, 40)
    frame["objects"] = pd.Series(list("abcd") * 10, dtype=object)
    frame.index = frame.index + 7
    for positions in (rng.permutation(40), rng.integers(0, 40, 90), np.zeros(0, dtype=np.intp)):
        expected = frame.take(positions).reset_index(drop=True)
        result = taken_frame(frame, positions)
        pd.testing.assert_frame_equal(result, expected, check_exact=True)
        assert arrow_types(result) == arrow_types(expected)


def test_a_frame_without_text_or_with_repeated_names_is_taken_by_pandas():
    positions = np.array([2, 0, 1, 1])
    numbers = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4, 5, 6]})
    pd.testing.assert_frame_equal(taken_frame(numbers, positions), numbers.take(positions).reset_index(drop=True))
    repeated = pd.DataFrame([["x", "y"], ["z", "w"], ["v", "u"]], columns=["c", "c"]).astype("str")
    pd.testing.assert_frame_equal(taken_frame(repeated, positions), repeated.take(positions).reset_index(drop=True))


def test_fixed_width_bytes_are_each_value_bytes():
    values = ["ab-1", "é-1", "zz-9"]
    items = fixed_width_bytes(text(values, pa.large_string(), chunks=2))
    assert items is not None and items.tolist() == [value.encode() for value in values]
    for other in (["ab", "abc"], ["ab", None], ["", ""], []):
        assert fixed_width_bytes(pd.Series(other, dtype="str")) is None
    assert fixed_width_bytes(pd.Series(["ab"], dtype=object)) is None


def test_taken_column_keeps_trailing_zero_bytes():
    values = pd.Series(["a\x00", "b\x00", "\x00\x00"], dtype="str")
    assert taken_column(values, np.array([2, 0, 1])).tolist() == ["\x00\x00", "a\x00", "b\x00"]
