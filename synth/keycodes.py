"""Sorted codes of key columns: ``pandas.factorize(values, sort=True)``, computed faster for the
columns that key establishments (Arrow text, whole numbers) and by pandas for every other column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def sorted_codes(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Each value's rank among the sorted distinct values (int64, -1 for a missing value) and those
    distinct values: what ``pandas.factorize(values, sort=True)`` gives, to the dtype and bit.

    Arrow text without missing values is encoded by Arrow (its dictionary ranked in code point order,
    the order pandas sorts Arrow text in); a column of one value, text or whole numbers, needs no
    encoding at all. Other columns (objects, categoricals, missing values, floats) go to pandas.
    """
    array = values.array
    if len(values) and _is_arrow_text(values.dtype) and not values.hasnans:
        text = pa.chunked_array(pa.array(array))
        if _one_value(text):
            return np.zeros(len(values), dtype=np.int64), pd.Index(array[:1])
        encoded = text.dictionary_encode().combine_chunks()
        order = pc.sort_indices(encoded.dictionary)
        rank = np.empty(len(order), dtype=np.int64)
        rank[np.asarray(order)] = np.arange(len(order))
        distinct = pd.array(encoded.dictionary.take(order), dtype=values.dtype)
        return rank[np.asarray(encoded.indices)], pd.Index(distinct)
    if len(values) and values.dtype.kind in "iu" and isinstance(values.dtype, np.dtype):
        numbers = values.to_numpy()
        if numbers.min() == numbers.max():
            return np.zeros(len(values), dtype=np.int64), pd.Index(numbers[:1])
    codes, distinct = pd.factorize(values, sort=True)
    return codes.astype(np.int64, copy=False), distinct


def _is_arrow_text(dtype: object) -> bool:
    """Whether ``dtype`` is pandas text stored in Arrow ('str' or 'string[pyarrow]')."""
    return isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow"


def _one_value(text: pa.ChunkedArray) -> bool:
    """Whether every value of ``text`` (no missing values) equals the first."""
    first = text[0]
    return bool(first == text[-1] and pc.all(pc.equal(text, first)).as_py())
