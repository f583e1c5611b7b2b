"""Codes of fixed-width digits read and built as bytes: the same columns as text operations give."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from gedp.errors import InputError
from gedp.synth.hierarchy import GOODS_SUPERSECTORS, MERGED_SECTORS, SUPERSECTOR_OF_SECTOR, derive_industry_codes
from gedp.synth.keycodes import digit_bytes, prefix_text, taken_text
from gedp.synth.schema import code_text, normalize_code, validate_microdata

NAICS = ["111110", "311000", "332999", "445110", "493100", "541511", "999999", "001234", "221122", "722511"]


def chunked(values: list, dtype: str = "str") -> pd.Series:
    """Arrow text stored in three chunks, a slice of a longer column (its Arrow offset is not 0)."""
    chunks = [values[: len(values) // 3], values[len(values) // 3: len(values) // 2], values[len(values) // 2:]]
    array = pa.chunked_array([pa.array(["000000", *chunks[0]], pa.large_string()), *chunks[1:]], pa.large_string())
    return pd.Series(pd.array(array, dtype=dtype)).iloc[1:].reset_index(drop=True)


@pytest.mark.parametrize("dtype", ["str", "string[pyarrow]"])
def test_digit_bytes_are_the_bytes_of_each_code(dtype):
    values = list(np.random.default_rng(2).choice(NAICS, 300))
    rows = digit_bytes(chunked(values, dtype), 6)
    assert rows is not None and rows.shape == (300, 6)
    assert rows.tolist() == [[ord(c) for c in value] for value in values]
    for width in (6, 3, 1):
        prefixes = prefix_text(rows, width)
        assert prefixes.tolist() == [value[:width] for value in values] and prefixes.dtype == "str"


@pytest.mark.parametrize("values", [["123456", " 12345"], ["123456", "12345"], ["123456", "1234567"], ["123456", None],
                                    ["123456", "12345a"], ["123456", "12345\u0663"], ["123456", "12345/"]])
def test_anything_but_width_ascii_digits_has_no_digit_bytes(values):
    assert digit_bytes(pd.Series(values, dtype="str"), 6) is None


@pytest.mark.parametrize("series", [pd.Series([123456, 222222]), pd.Series(["123456"], dtype=object),
                                    pd.Series(["123456"], dtype="string[python]")])
def test_columns_not_in_arrow_have_no_digit_bytes(series):
    assert digit_bytes(series, 6) is None


def test_empty_text_has_no_rows():
    rows = digit_bytes(pd.Series([], dtype="str"), 3)
    assert rows.shape == (0, 3) and len(prefix_text(rows, 2)) == 0


TABLE = ["1011", "31-33", None, "1021", "\u00e91", "102", "1012"]


@pytest.mark.parametrize("used", [[0, 3, 6], [0, 1], [0, 2], [0, 4], [5], [1, 5], []])
def test_taken_text_is_arrow_take(used):
    positions = np.random.default_rng(6).choice(used, 50) if used else np.zeros(0, dtype=np.intp)
    values = pd.Series(TABLE, dtype="str")
    pd.testing.assert_extension_array_equal(taken_text(values, positions), values.array.take(positions))


@pytest.mark.parametrize("dtype", ["str", "string[pyarrow]"])
def test_normalized_codes_are_their_own_normalization(dtype):
    values = list(np.random.default_rng(3).choice(["001", "005", "013", "999"], 200))
    frame = pd.DataFrame({"county": chunked(values, dtype).set_axis(np.arange(200) + 5)})
    result = normalize_code(frame, "county", 3)
    pd.testing.assert_series_equal(result, code_text(frame["county"], 3)[0].astype(str), check_exact=True)
    assert result.dtype == "str" and result.tolist() == values


def industry_by_hand(codes: list[str], index: pd.Index) -> pd.DataFrame:
    """derive_industry_codes code by code, from the hierarchy's tables."""
    sectors = [MERGED_SECTORS.get(code[:2], code[:2]) for code in codes]
    supersectors = [SUPERSECTOR_OF_SECTOR.get(sector) for sector in sectors]
    domains = [None if s is None else "101" if s in GOODS_SUPERSECTORS else "102" for s in supersectors]
    columns = {"naics5": [c[:5] for c in codes], "naics4": [c[:4] for c in codes], "naics3": [c[:3] for c in codes],
               "sector": sectors, "supersector": supersectors, "domain": domains}
    return pd.DataFrame({name: pd.array(values, dtype="str") for name, values in columns.items()}, index=index)


@pytest.mark.parametrize("kind", ["str", "chunked", "object", "int64", "blanks"])
def test_industry_codes_match_code_by_code(kind):
    codes = list(np.random.default_rng(5).choice(NAICS, 500))
    index = pd.RangeIndex(500) + 11
    naics = {"str": lambda: pd.Series(codes, dtype="str"), "chunked": lambda: chunked(codes),
             "object": lambda: pd.Series(codes, dtype=object), "int64": lambda: pd.Series(codes).astype("int64"),
             "blanks": lambda: pd.Series([c + " " for c in codes], dtype="str")}[kind]().set_axis(index)
    expected = industry_by_hand([str(int(c)) if kind == "int64" else c for c in codes], index)
    pd.testing.assert_frame_equal(derive_industry_codes(naics), expected, check_exact=True)


def test_an_unknown_sector_is_refused_by_its_first_row():
    frame = pd.DataFrame({"estab_id": ["a", "b", "c"], "state": "44", "county": "001",
                          "naics": ["111110", "001234", "001234"], "m1emp": 1.0, "m2emp": 1.0, "m3emp": 1.0,
                          "wage": 1.0}).astype({"naics": "str"})
    with pytest.raises(InputError, match=r"column 'naics': codes must be in a private NAICS sector; first at row 2 "
                                         r"\(estab_id b\)"):
        validate_microdata(frame, ["wage"])
