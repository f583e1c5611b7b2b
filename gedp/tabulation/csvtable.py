"""Tables written as CSV with the bytes of pandas' ``DataFrame.to_csv(index=False)``, without its
per-column formatting machinery: a tabulation of a few thousand rows is written in about half the
time, which a further request answered from a release's kept index notices.

Only columns whose text pandas and Python's ``csv`` module write alike are written here: integers,
finite floats (both write the shortest text that reads back as the same number, ``repr``) and text
without missing values, under text column names. Any other table (categories, missing values,
dates, ...) is written by pandas itself.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def write_csv(table: pd.DataFrame, target: str | Path | TextIO) -> None:
    """Write ``table`` as CSV (no index) to a file path or an open text stream: what
    ``table.to_csv(target, index=False)`` writes, byte for byte."""
    columns = _plain_columns(table)
    if columns is None:
        table.to_csv(target, index=False)
        return
    write_columns(dict(zip(table.columns, columns)), target)


def write_columns(columns: dict[str, list], target: str | Path | TextIO) -> None:
    """Write a table given as its columns by name (each a list of Python integers, finite floats or
    text) as CSV to a file path or an open text stream: what pandas writes of the same table."""
    if isinstance(target, (str, Path)):
        with open(target, "w", encoding="utf-8", newline="") as file:
            _write_rows(file, columns)
    else:
        _write_rows(target, columns)


def _write_rows(file: TextIO, columns: dict[str, list]) -> None:
    """The header and the rows, quoted where needed and ended as pandas ends them (``os.linesep``)."""
    writer = csv.writer(file, lineterminator=os.linesep)
    writer.writerow(list(columns))
    writer.writerows(zip(*columns.values()))


def _plain_columns(table: pd.DataFrame) -> list[list] | None:
    """Each column's values as Python objects whose text is the one pandas writes; None when a
    column (or its name) is not an integer, a finite float64 or text without missing values."""
    if not all(isinstance(name, str) for name in table.columns):
        return None
    columns = []
    for name in table.columns:
        series = table[name]
        kind = series.dtype.kind if isinstance(series.dtype, np.dtype) else None
        # float64 only: a float32's Python float prints all of its float64 digits, pandas its shortest
        if kind in ("i", "u") or (series.dtype == np.float64 and np.isfinite(series.to_numpy()).all()):
            columns.append(series.to_numpy().tolist())
            continue
        if kind is not None and kind != "O":
            return None
        values = series.tolist()  # text (pandas' str, object or category dtype): each value checked
        if not all(type(value) is str for value in values):
            return None
        columns.append(values)
    return columns
