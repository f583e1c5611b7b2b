"""CSV written without pandas' formatter: the same bytes as ``DataFrame.to_csv(index=False)``."""

import io

import numpy as np
import pandas as pd
import pytest

from gedp.tabulation.csvtable import _plain_columns, write_csv


def _floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Floats of every magnitude pandas and repr switch notation around: subnormals, 1e-5, 1e15-1e17,
    whole numbers, signed zeros, values of few and of 17 significant digits."""
    mantissas = rng.uniform(-10, 10, n)
    exponents = rng.integers(-320, 300, n).astype(float)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.1, 1e-5, 1e-4, 9999999999999998.0, 1e16, 1e17, 123456789012345678.0,
                        2.0**53, 5e-324, 1.7976931348623157e308, 0.30000000000000004, 100.0, 1e22])
    return np.concatenate([special, mantissas * 10.0 ** np.clip(exponents, -300, 300), np.round(mantissas * 1e6),
                           rng.normal(1e4, 3e3, n)])


def _table(rng: np.random.Generator) -> pd.DataFrame:
    floats = _floats(rng, 400)
    n = len(floats)
    words = np.array(["001", "31-33", 'say "hi"', "a,b", "line\nbreak", "", " lead", "é ü", "tab\tend", "r\rn"])
    return pd.DataFrame({"state": words[rng.integers(0, len(words), n)], "estabs": rng.integers(-2**62, 2**62, n),
                         "m1emp": floats, "m1emp_moe": rng.permutation(floats), "small": rng.integers(0, 9, n)})


def test_bytes_as_pandas_writes_them(tmp_path):
    rng = np.random.default_rng(20261124)
    for _ in range(5):
        table = _table(rng)
        assert _plain_columns(table) is not None  # written here, not by pandas
        write_csv(table, tmp_path / "ours.csv")
        table.to_csv(tmp_path / "pandas.csv", index=False)
        assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
        ours, theirs = io.StringIO(), io.StringIO()
        write_csv(table, ours)
        table.to_csv(theirs, index=False)
        assert ours.getvalue() == theirs.getvalue()


@pytest.mark.parametrize("column", [
    pd.Series([1.5, np.nan]), pd.Series([1.0, np.inf]), pd.Series(["a", None], dtype=object),
    pd.Series(["a", None], dtype="str"), pd.Series([True, False]), pd.Series([1, None], dtype="Int64"),
    pd.to_datetime(pd.Series(["2016-01-01", "2016-04-01"])), pd.Series([1, "a"], dtype=object),
    pd.Series([0.1, 1e20], dtype=np.float32),  # pandas writes a float32's shortest digits
])
def test_other_columns_written_by_pandas(tmp_path, column):
    table = pd.DataFrame({"key": ["x", "y"], "value": column})
    assert _plain_columns(table) is None
    write_csv(table, tmp_path / "ours.csv")
    table.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_categories_empty_tables_and_other_names(tmp_path):
    tables = [pd.DataFrame({"sector": pd.Categorical(["31-33", "23", "31-33"]), "estabs": [1, 2, 3]}),
              pd.DataFrame({"state": pd.Series([], dtype="str"), "m1emp": pd.Series([], dtype=float)}),
              pd.DataFrame({0: [1.0], "b": [2]})]
    for table in tables:
        write_csv(table, tmp_path / "ours.csv")
        table.to_csv(tmp_path / "pandas.csv", index=False)
        assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
    assert _plain_columns(tables[0]) is not None and _plain_columns(tables[2]) is None
