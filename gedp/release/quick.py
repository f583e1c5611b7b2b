"""A further tabulation of a release answered from its kept cell index without pandas: importing
pandas is most of what such a request would otherwise cost.

It answers what ``release.cells.indexed_tabulation`` answers, with the same numbers bit for bit,
when that can be done with numpy alone: keys that are text or integer columns of the kept cells
(no missing values), no filter, and groups whose establishments are consecutive rows of the release
(keys that follow the release's order: state, county, an industry level, ...). pandas sums such
groups with ``np.add.reduceat`` over the rows in order (the total with ``np.add.reduce``), as here;
it sums other groups with compensated sums in row order, which numpy does not give, so those
requests, and anything else (a filter, a panel release, margins some attribute has no per-cell
pieces for, a sum or margin that is not a finite number), are left to the full path (None).

Privacy: it reads only what a further request reads already, the kept cell index and the margin
structure's per-cell pieces (``release.cells``, ``release.margins``), which are functions of the
release's files alone; nothing else is read and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from gedp.errors import InputError
from gedp.postprocess.cellmargins import cell_half_widths
from gedp.postprocess.keys import tabulation_keys
from gedp.release.cells import read_cell_arrays
from gedp.release.margins import is_complete, kept_path, read_pieces, shared_cache
from gedp.release.validation import manifest_json


@dataclass(frozen=True)
class QuickTable:
    """A tabulation's keys (``keys``, the columns grouped by) and its columns by name, in order, as
    Python values (``columns``: text, integers and finite floats, each column a list)."""

    keys: list[str]
    columns: dict[str, list]

    @property
    def n_rows(self) -> int:
        return len(next(iter(self.columns.values())))


def quick_tabulation(release: str | Path, by: str, *, moe: bool = False, level: float = 0.95) -> QuickTable | None:
    """``margins.kept_tabulation(release, by, moe=moe, level=level)`` (no filter) without pandas:
    the same keys, columns and numbers; None when it cannot be answered so (see the module)."""
    try:
        manifest = manifest_json(release)  # bounded (a FIFO, 300 MB or deep nesting: the full path refuses it)
    except InputError:
        return None
    if not isinstance(manifest, dict) or manifest.get("quarters"):
        return None  # a linked manifest, or a panel release: both left to the full path
    folder = kept_path(release)
    with shared_cache():  # the kept files opened (mapped) while no request may remove them
        arrays = read_cell_arrays(folder) if is_complete(folder) else None
        pieces = read_pieces(folder) if moe and arrays is not None else {}
    if arrays is None:
        return None
    cells, codes, values = arrays
    try:
        keys = tabulation_keys(by, cells.column_names, cells.column_names)
    except ValueError:
        return None
    if pieces is None or any(kept is None for kept in pieces.values()) or len(codes) == 0:
        return None
    grouped = _cell_groups(cells, keys)
    if grouped is None:
        return None
    tab, columns = grouped
    runs = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])  # where each run of one cell's rows starts
    groups = tab[codes[runs]]  # each run's group
    if (groups[1:] < groups[:-1]).any():
        return None  # groups not consecutive in the release: pandas' compensated sums
    starts = runs[np.r_[True, groups[1:] != groups[:-1]]]
    columns["estabs"] = np.diff(np.r_[starts, len(codes)])
    for attribute, column in values.items():
        columns[attribute] = np.add.reduceat(column, starts) if keys else np.add.reduce(column, keepdims=True)
    wanted = {attribute: kept for attribute, kept in pieces.items() if kept is not None and attribute in values}
    for attribute, margin in cell_half_widths(wanted, tab, len(starts), level).items():
        columns[f"{attribute}_moe"] = margin
    if not all(np.isfinite(column).all() for column in columns.values() if column.dtype.kind == "f"):
        return None
    return QuickTable(keys, {name: column.tolist() for name, column in columns.items()})


def _cell_groups(cells: pa.Table, keys: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """Each kept cell's group (groups sorted by their keys, as ``measure.queries.Groupings`` sorts
    them) and the groups' key columns; None for a key column that is not text or integers without
    missing values."""
    if not keys:
        return np.zeros(cells.num_rows, dtype=np.int64), {}
    combined = np.zeros(cells.num_rows, dtype=np.int64)
    uniques = []
    for key in keys:
        column = cells.column(key)
        if column.null_count or not (pa.types.is_integer(column.type) or pa.types.is_string(column.type)
                                     or pa.types.is_large_string(column.type)):
            return None
        kind = np.int64 if pa.types.is_integer(column.type) else object  # text as Python str, as pandas keeps it
        found, digit = np.unique(np.array(column.to_pylist(), dtype=kind), return_inverse=True)
        uniques.append(found)
        combined = combined * len(found) + digit.ravel()
    if np.prod([len(found) for found in uniques], dtype=float) >= 2.0**62:
        return None
    present, tab = np.unique(combined, return_inverse=True)
    columns = {}
    for key, found in zip(reversed(keys), reversed(uniques)):
        present, digit = np.divmod(present, len(found))
        columns[key] = found[digit]
    return tab.ravel(), {key: columns[key] for key in keys}
