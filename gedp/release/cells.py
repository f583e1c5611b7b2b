"""Tabulations of a release answered from its kept cell index: a further request reads a few arrays
instead of the protected microdata, and groups a few thousand cells instead of every establishment.

The index is kept with the release's margin structure (``gedp.release.margins``, same folder, same
digest of the release's files) and holds, from the protected microdata alone:

* the release's finest public cells: one row per distinct combination of every public column but
  ``estab_id`` (state, county, own, the NAICS codes and what derives from them, year, qtr);
* each establishment's cell (in the release's row order);
* each protected attribute, one array per attribute, in the same order.

A tabulation by public columns, with a filter on public columns only, is a function of the cells:
its groups and selection are computed on the cells table and carried to the establishments by their
cell. The sums and margins of error are then computed exactly as ``postprocess.tabulate.tabulate``
computes them (the same compensated sums over the same establishments in the same order, the same
variance functions on the same cell codes), so the answer is bit for bit the one a full read gives.
Anything else (a filter or a key on protected values or ``estab_id``, an empty selection, no kept
index) is not answered here: the caller reads the release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gedp.postprocess.cellmargins import CellPieces, LeastSquaresCells, WageCells, cell_half_widths, finest_cells
from gedp.synth.columns import CONFIDENTIAL

if TYPE_CHECKING:  # pandas and the stages are loaded when a table is read (a name of a file needs neither)
    import pandas as pd

    from gedp.measure.queries import Grouping
    from gedp.postprocess.models import VarianceFunction

CELLS_FILE = "cells.parquet"
CELL_CODES_FILE = "cell_codes.npy"
VALUES_PREFIX = "values-"


class CellAnswers(Protocol):
    """Precomputed cells that answer some tabulations of an index (``release.lattice.CellLattice``):
    the grouping of the kept cells by the keys, and the table, None where they do not answer it."""

    def kept_grouping(self, index: CellIndex, keys: list[str], kept_cells: np.ndarray) -> Grouping: ...

    def table(self, index: CellIndex, kept_cells: np.ndarray, by_cell: Grouping | None, margins: list[str] | None,
              level: float) -> pd.DataFrame | None: ...


@dataclass(frozen=True)
class CellIndex:
    """A release's finest public cells (``cells``), each establishment's cell (``codes``) and its
    protected attributes (``values``, one column per attribute, the release's row order)."""

    cells: pd.DataFrame
    codes: np.ndarray
    values: pd.DataFrame


def write_cell_index(protected: pd.DataFrame, folder: Path) -> None:
    """Write the cell index of a release's protected microdata (as the release reader gives them) into
    ``folder``."""
    grouping = finest_cells(protected)
    cells = pa.Table.from_pandas(grouping.keys, preserve_index=False)
    pq.write_table(cells.replace_schema_metadata(None), folder / CELLS_FILE)  # types as stored, as the reader's
    np.save(folder / CELL_CODES_FILE, grouping.codes.astype(np.int32), allow_pickle=False)
    for attribute in (a for a in CONFIDENTIAL if a in protected.columns):
        np.save(folder / f"{VALUES_PREFIX}{attribute}.npy", protected[attribute].to_numpy(dtype=np.float64),
                allow_pickle=False)


def read_cell_arrays(folder: Path) -> tuple[pa.Table, np.ndarray, dict[str, np.ndarray]] | None:
    """The cell index kept in ``folder`` as Arrow and numpy, without pandas: the cells' keys, each
    establishment's cell code and each attribute's values, the arrays mapped from the files, not
    copied (None when there is none, or it cannot be read)."""

    def mapped(name: str) -> np.ndarray:
        return np.asarray(np.load(folder / name, mmap_mode="r", allow_pickle=False))

    try:
        cells = pq.ParquetFile(folder / CELLS_FILE).read()  # as pandas.read_parquet, without datasets
        codes = mapped(CELL_CODES_FILE)
        values = {attribute: mapped(f"{VALUES_PREFIX}{attribute}.npy")
                  for attribute in CONFIDENTIAL if (folder / f"{VALUES_PREFIX}{attribute}.npy").is_file()}
    except (OSError, ValueError, pa.ArrowException):
        return None
    return cells, codes, values


def read_cell_index(folder: Path) -> CellIndex | None:
    """The cell index kept in ``folder`` (``read_cell_arrays``, the cells and values as pandas frames)."""
    import pandas as pd

    arrays = read_cell_arrays(folder)
    if arrays is None:
        return None
    cells, codes, values = arrays
    return CellIndex(cells.to_pandas(), codes, pd.DataFrame(values, copy=False))


def indexed_tabulation(folder: Path, by: str, *, margins: Mapping[str, VarianceFunction | CellPieces] | None = None,
                       where: str | None = None, level: float = 0.95) -> tuple[list[str], pd.DataFrame] | None:
    """``tabulate`` of a release's protected microdata by public columns (``by``, as for ``tabulate``),
    from the cell index kept in ``folder`` (with the ``margins`` kept beside it, when given: every
    attribute's per-cell pieces, ``postprocess.cellmargins``, or its variance functions): the keys
    grouped by and the table; None when it cannot be answered from them (no kept index, a key or a
    filter that is not a function of the public cells, an empty selection)."""
    index = read_cell_index(folder)
    if index is None:
        return None
    return index_tabulation(index, by, margins=margins, where=where, level=level)


def index_tabulation(index: CellIndex, by: str, *, margins: Mapping[str, VarianceFunction | CellPieces] | None = None,
                     where: str | None = None, level: float = 0.95, lattice: CellAnswers | None = None
                     ) -> tuple[list[str], pd.DataFrame] | None:
    """``indexed_tabulation`` of a cell index held in memory (a server reads it once), from its
    ``lattice`` (``release.lattice``: the same numbers) where that answers it."""
    from gedp.measure.queries import Grouping, Groupings
    from gedp.postprocess.tabulate import group_keys, select, tabulation_sums

    try:
        keys = group_keys(index.cells, by)
        kept_cells = select(index.cells, where)
    except ValueError:
        return None
    if not kept_cells.any():
        return None
    grouping = by_cell = None
    if keys:
        by_cell = (Groupings(index.cells[kept_cells].reset_index(drop=True))(keys) if lattice is None
                   else lattice.kept_grouping(index, keys, kept_cells))
    if lattice is not None:
        wanted = None if margins is None else [attribute for attribute in margins if attribute in index.values]
        table = lattice.table(index, kept_cells, by_cell, wanted, level)
        if table is not None:
            return keys, table
    every = bool(kept_cells.all())
    keep = None if every else kept_cells[index.codes]
    if by_cell is not None:
        position = np.cumsum(kept_cells) - 1  # each kept cell's row among the kept cells
        grouping = Grouping(tuple(keys), by_cell.codes[index.codes if every else position[index.codes[keep]]],
                            by_cell.keys)
    table = tabulation_sums(index.values if every else index.values[keep], list(index.values.columns), grouping)
    if margins is not None:
        for attribute, margin in _margins(margins, index, kept_cells, by_cell, level,
                                          len(table)).items():
            table[f"{attribute}_moe"] = margin
    return keys, table


def _margins(margins: Mapping[str, VarianceFunction | CellPieces], index: CellIndex, kept_cells: np.ndarray,
             by_cell: Grouping | None, level: float, n_tab: int) -> dict[str, np.ndarray]:
    """The margins of error of a tabulation of the kept cells (``by_cell``: their grouping, None for
    the total), per attribute of the index: from per-cell pieces when every attribute has them, else
    from the variance functions over the establishments."""
    wanted = {attribute: variance for attribute, variance in margins.items() if attribute in index.values}
    tab = np.full(len(kept_cells), -1, dtype=np.int64)
    tab[kept_cells] = by_cell.codes if by_cell is not None else 0
    if all(isinstance(variance, (LeastSquaresCells, WageCells)) for variance in wanted.values()):
        return cell_half_widths(wanted, tab, n_tab, level)
    from gedp.postprocess.moe import half_widths

    return half_widths(wanted, tab[index.codes], n_tab, level)
