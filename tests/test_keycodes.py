"""sorted_codes against pandas.factorize(sort=True), and the groupings built on it against pandas groupby."""

import numpy as np
import pandas as pd
import pytest

from gedp.measure.queries import Groupings
from gedp.synth.keycodes import sorted_codes

RNG = np.random.default_rng(7)
MANY = [f"{code:06d}" for code in RNG.integers(0, 10**6, 5000)]

COLUMNS = {
    "empty strings": pd.Series(["", "b", "", "a"], dtype="str"),
    "non-ASCII": pd.Series(["é", "e", "z", "É", "日本", "e\u0301", "Z"], dtype="str"),
    "one value": pd.Series(["44"] * 5, dtype="str"),
    "one row": pd.Series(["x"], dtype="str"),
    "empty": pd.Series([], dtype="str"),
    "many values": pd.Series(MANY, dtype="str"),
    "many values in chunks": pd.concat([pd.Series(MANY[:2500], dtype="str"), pd.Series(MANY[2500:], dtype="str")]),
    "missing values": pd.Series(["b", None, "a", "b"], dtype="str"),
    "missing only": pd.Series([None, None], dtype="str"),
    "nullable text": pd.Series(["b", "a", "b"], dtype="string[pyarrow]"),
    "nullable text, missing": pd.Series(["b", pd.NA, "a"], dtype="string[pyarrow]"),
    "python text": pd.Series(["b", "a", "b"], dtype="string[python]"),
    "object": pd.Series(["b", 1, "a", 1], dtype=object),
    "categorical": pd.Series(pd.Categorical(["b", "a", "c", "a"], categories=["c", "b", "a"])),
    "int64": pd.Series([3, -1, 3, 7]),
    "int64 one value": pd.Series([2016] * 4),
    "int32 one value": pd.Series([1] * 3, dtype=np.int32),
    "uint8": pd.Series([200, 3, 200], dtype=np.uint8),
    "float": pd.Series([0.5, np.nan, -0.0, 0.0, 0.5]),
    "float one value": pd.Series([1.5] * 3),
    "bool": pd.Series([True, False, True]),
    "nullable int": pd.Series([1, None, 1], dtype="Int64"),
}


@pytest.mark.parametrize("name", list(COLUMNS))
def test_sorted_codes_are_pandas_factorize(name: str) -> None:
    values = COLUMNS[name]
    codes, distinct = sorted_codes(values)
    expected_codes, expected_distinct = pd.factorize(values, sort=True)
    assert codes.dtype == np.int64
    np.testing.assert_array_equal(codes, expected_codes)
    assert type(distinct) is type(expected_distinct)
    assert distinct.dtype == expected_distinct.dtype
    pd.testing.assert_index_equal(distinct, expected_distinct, exact=True)


def test_text_is_ranked_in_code_point_order() -> None:
    codes, distinct = sorted_codes(COLUMNS["non-ASCII"])
    assert list(distinct) == sorted(set(COLUMNS["non-ASCII"]))  # Python compares str by code point
    assert [distinct[code] for code in codes] == list(COLUMNS["non-ASCII"])


def test_groupings_match_pandas_groupby() -> None:
    n = 3000
    frame = pd.DataFrame({
        "state": pd.Series(["44"] * n, dtype="str"),
        "county": pd.Series(RNG.choice(["001", "003", "é05"], n), dtype="str"),
        "year": np.full(n, 2016),
        "naics": pd.Series(RNG.choice(MANY[:40], n), dtype="str"),
        "size": RNG.integers(0, 4, n),
    })
    groupings = Groupings(frame)
    for by in [("state",), ("state", "year"), ("state", "county", "year"), ("county", "state", "naics"),
               ("naics", "size", "state"), ("year", "naics")]:
        grouping = groupings(by)
        grouped = frame.groupby(list(by), sort=True, observed=True)
        np.testing.assert_array_equal(grouping.codes, grouped.ngroup().to_numpy())
        pd.testing.assert_frame_equal(grouping.keys, grouped.size().index.to_frame(index=False)[list(by)])
