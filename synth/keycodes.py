"""Sorted codes of key columns: ``pandas.factorize(values, sort=True)``, computed faster for the
columns that key establishments (Arrow text, whole numbers) and by pandas for every other column;
and Arrow text of fixed-width digit codes read and built as bytes, without a string per row."""

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


def digit_bytes(values: pd.Series, width: int) -> np.ndarray | None:
    """The bytes of Arrow text whose every value is ``width`` ASCII digits, one row per value (uint8,
    shape ``(len(values), width)``, a view of the Arrow data); None for any other column (another
    dtype, a missing value, another length, another character)."""
    if not _is_arrow_text(values.dtype) or values.hasnans:
        return None
    text = pa.chunked_array(pa.array(values.array)).combine_chunks()
    if len(text) == 0:
        return np.zeros((0, width), dtype=np.uint8)
    offset_type = np.int64 if pa.types.is_large_string(text.type) else np.int32
    offsets = np.frombuffer(text.buffers()[1], dtype=offset_type)[text.offset: text.offset + len(text) + 1]
    if not (np.diff(offsets) == width).all():
        return None
    data = np.frombuffer(text.buffers()[2], dtype=np.uint8)[offsets[0]: offsets[-1]].reshape(len(text), width)
    return data if data.min() >= ord("0") and data.max() <= ord("9") else None


def prefix_text(rows: np.ndarray, width: int) -> pd.api.extensions.ExtensionArray:
    """Text ('str', stored in Arrow) of the first ``width`` bytes of each row of ``rows`` (ASCII bytes,
    C-contiguous, as ``digit_bytes`` gives them): one value per row."""
    count, row_width = rows.shape
    prefix = np.dtype({"names": ["prefix"], "formats": [f"S{width}"], "offsets": [0], "itemsize": row_width})
    data = np.ascontiguousarray(rows.reshape(-1).view(prefix)["prefix"]) if count else b""
    offsets = np.arange(0, (count + 1) * width, width, dtype=np.int64)
    text = pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))
    return pd.array(text, dtype="str")


def taken_text(values: pd.Series, positions: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``values.array.take(positions)`` of short text ``values`` ('str'; ``positions`` in range): built
    from bytes when every value taken is present and of one width in ASCII, else by Arrow's take."""
    texts = values.tolist()
    used = np.bincount(positions, minlength=len(texts)) > 0
    taken = [texts[i] for i in np.flatnonzero(used)]
    widths = {len(text) if isinstance(text, str) and text.isascii() else -1 for text in taken}
    if len(widths) != 1 or -1 in widths:
        return values.array.take(positions)
    width = widths.pop()
    table = np.array([text if use else "" for text, use in zip(texts, used)], dtype=f"S{width}")
    return prefix_text(table.view(np.uint8).reshape(len(texts), width).take(positions, axis=0), width)
