"""Tabulations answered by looking up cells computed once: every cell of a release's standard
groupings (area x industry level x ownership, ``STANDARD``) with its establishment count and sums
(at load) and its margins' variances (each grouping's at the first request that needs it, or in the
background, ``CellLattice.compute_all``), so
that a request whose cells are such cells touches its cells, not its establishments.

A tabulation by public columns with a filter on public columns is a union of the release's finest
cells per row (``release.cells``), and everything ``release.cells.index_tabulation`` computes of a
row is a function of that set alone:

* its sums are computed over the row's establishments in the release's order by one of three
  kernels (``postprocess.tabulate``): with keys, ``ordered_sums`` where every group's establishments
  are consecutive and nothing is NaN, else ``compensated_sums``; without keys, pandas' sum of the
  selection (``np.add.reduce`` of each attribute over the rows in order, NaN as 0). Each is computed for
  every cell by the same function over the same values in the same order (the rows gathered into
  the same layout), so it has the same bits;
* its variance and slope (``postprocess.cellmargins``: each row's pair sums, forms and row norms
  are accumulated over its own finest cells in their order, whatever the other rows are), from
  which the margin at any level follows by ``CellVariances.half_width``.

A request is answered here when each of its rows is, as a set of finest cells, a cell of one of the
groupings (which grouping may differ by row): found by a hash of the set (a random 64-bit number
per finest cell, summed), then checked exactly (its size and each of its finest cells' cell), so a
collision only sends the request to the computation over establishments. That covers every
tabulation by area, industry and ownership columns with no filter or a filter fixing some of those
columns to one value each (``own == '5'``, ``sector == '44-45'``, ``county == '001' and naics3 ==
'441'``); a filter selecting several values of a column that is not a key (``county in [...]``),
a key or filter on year or quarter that splits a cell, margins of an attribute without per-cell
pieces, and any request a kept index does not answer go to ``index_tabulation``'s pass over the
establishments, with the same numbers.

Everything here is a function of the kept cell index and pieces (the release's files alone).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gedp.postprocess.cellmargins import LeastSquaresCells, WageCells

if TYPE_CHECKING:
    import pandas as pd

    from gedp.measure.queries import Grouping
    from gedp.release.cells import CellIndex

#: The groupings whose cells are computed once: each area x industry level x ownership choice (those
#: whose columns a release has; groupings with the same cells kept once).
AREAS = ((), ("state",), ("state", "county"))
INDUSTRIES = ((), ("domain",), ("supersector",), ("sector",), ("naics3",), ("naics4",), ("naics5",), ("naics",))
OWNERSHIPS = ((), ("own",))
STANDARD = tuple(area + industry + own for area, industry, own in itertools.product(AREAS, INDUSTRIES, OWNERSHIPS))
#: Groupings of all the cells kept for further requests (``CellLattice.kept_grouping``), at most.
KEPT_GROUPINGS = 512
#: The seed of the finest cells' hash numbers (not secret: they only find candidates, checked after).
HASH_SEED = 47


@dataclass(frozen=True, eq=False)
class CellLattice:
    """Every cell of a release's standard groupings (ids 0..n-1 over all groupings), computed once.

    Attributes:
        attributes: the summed attributes, in the cell index's order.
        codes: groupings x finest cells: each finest cell's cell in each grouping.
        grouping: each cell's grouping (a row of ``codes``).
        sizes: each cell's number of finest cells.
        estabs: each cell's number of establishments.
        ordered, compensated, whole: attributes x cells, each cell's sums by each kernel (module).
        variance, slope: attributes x cells (None: some attribute has no per-cell pieces, or no
            margins were given; NaN until their grouping's are computed, ``margins``).
        finest_hash: each finest cell's hash number; hashes: the cells' hashes, sorted, and
            ``hash_cells`` their cells.
        runs: the finest cell of each run of consecutive establishments of one finest cell.
        with_nan: whether a finest cell holds a NaN value.
    """

    attributes: list[str]
    codes: np.ndarray
    grouping: np.ndarray
    sizes: np.ndarray
    estabs: np.ndarray
    ordered: np.ndarray
    compensated: np.ndarray
    whole: np.ndarray
    variance: np.ndarray | None
    slope: np.ndarray | None
    finest_hash: np.ndarray
    hashes: np.ndarray
    hash_cells: np.ndarray
    runs: np.ndarray
    with_nan: np.ndarray
    #: Each attribute's per-cell pieces, the first cell of each grouping (and the number of cells
    #: last), whether each grouping's variances are computed (``margins``).
    pieces: list = dataclasses.field(default_factory=list)
    offsets: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    computed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: The groupings of all the cells by keys asked for (``kept_grouping``), made once.
    groupings: dict[tuple[str, ...], Grouping] = dataclasses.field(default_factory=dict)
    locks: list[threading.Lock] = dataclasses.field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        """Memory held, bytes."""
        return sum(getattr(self, name).nbytes for name in self.__dataclass_fields__
                   if isinstance(getattr(self, name), np.ndarray))

    def margins(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The variances and slopes (attributes x ``cells``) of cells, their groupings' computed from
        the pieces at the first request that needs them (``compute``)."""
        assert self.variance is not None and self.slope is not None
        for group in np.unique(self.grouping[cells]):
            self.compute(int(group))
        return self.variance[:, cells], self.slope[:, cells]

    def compute(self, group: int) -> None:
        """Compute one grouping's variances and slopes, once (under its lock): the pieces'
        ``LeastSquaresCells.variances`` and ``WageCells.variances`` of the grouping as a tabulation."""
        if self.computed[group] or self.variance is None or self.slope is None:
            return
        with self.locks[group]:
            if self.computed[group]:
                return
            low, high = self.offsets[group], self.offsets[group + 1]
            for number, kept in enumerate(self.pieces):
                self.variance[number, low:high], self.slope[number, low:high] = kept.variances(
                    self.codes[group] - low, high - low)
            self.computed[group] = True

    def compute_all(self) -> None:
        """Compute every grouping's variances, the groupings of fewer cells first (a server does it
        in the background once it is ready)."""
        for group in np.argsort(np.diff(self.offsets), kind="stable"):
            self.compute(int(group))

    def table(self, index: CellIndex, kept_cells: np.ndarray, by_cell: Grouping | None, margins: list[str] | None,
              level: float) -> pd.DataFrame | None:
        """``lattice_table`` of this lattice (what ``release.cells.index_tabulation`` asks of it)."""
        return lattice_table(self, index, kept_cells, by_cell, margins, level)

    def kept_grouping(self, index: CellIndex, keys: list[str], kept_cells: np.ndarray) -> Grouping:
        """``Groupings(index.cells[kept_cells].reset_index(drop=True))(keys)``, from the grouping of
        all the cells (groups sorted by their keys: those of the kept cells keep their order)."""
        from gedp.measure.queries import Grouping, Groupings

        whole = self.groupings.get(tuple(keys))
        if whole is None:
            whole = Groupings(index.cells)(keys)
            if len(self.groupings) < KEPT_GROUPINGS:
                self.groupings[tuple(keys)] = whole
        if kept_cells.all():
            return whole
        present, codes = np.unique(whole.codes[kept_cells], return_inverse=True)
        return Grouping(whole.by, codes.ravel().astype(np.int64), whole.keys.iloc[present].reset_index(drop=True))

    def cells_of(self, tab: np.ndarray, n_tab: int) -> np.ndarray | None:
        """The cell equal to each of the ``n_tab`` rows of a tabulation whose row of each finest cell is
        ``tab`` (-1: not tabulated; every row has a finest cell), None when some row is no cell."""
        inside = np.flatnonzero(tab >= 0)
        t = tab[inside]
        order = np.argsort(t, kind="stable")
        starts = np.flatnonzero(np.r_[True, t[order][1:] != t[order][:-1]])
        if len(starts) != n_tab:
            return None
        found = np.add.reduceat(self.finest_hash[inside[order]], starts)  # uint64: sums modulo 2^64
        position = np.minimum(np.searchsorted(self.hashes, found), len(self.hashes) - 1)
        cells = self.hash_cells[position]
        if not (self.hashes[position] == found).all():
            return None
        counts = np.diff(np.r_[starts, len(t)])
        if not (self.sizes[cells] == counts).all():
            return None
        if not (self.codes[self.grouping[cells[t]], inside] == cells[t]).all():
            return None
        return cells

    def in_order(self, tab: np.ndarray) -> bool:
        """Whether a tabulation's rows (``tab``: each finest cell's, -1 not tabulated) have consecutive
        establishments in row order (``postprocess.tabulate.kernel_sums``'s codes in order)."""
        rows = tab[self.runs]
        rows = rows[rows >= 0]
        return bool(np.all(rows[1:] >= rows[:-1]))

    def sums(self, cells: np.ndarray, tab: np.ndarray, keys: bool) -> np.ndarray:
        """The sums (attributes x rows) of a tabulation whose rows are ``cells``: by the kernel that
        ``index_tabulation`` runs on it (module)."""
        if not keys:
            return self.whole[:, cells]
        if self.in_order(tab) and not self.with_nan[tab >= 0].any():
            return self.ordered[:, cells]
        return self.compensated[:, cells]


def build_lattice(index: CellIndex, pieces: Mapping[str, object] | None = None) -> CellLattice:
    """The lattice of a release's cell index (``release.cells.CellIndex``), with the variances of the
    per-cell ``pieces`` (by attribute, as kept) when every attribute has them: each grouping's
    computed at its first request (``CellLattice.margins``)."""
    codes = _standard_codes(index)
    sizes = [np.bincount(row) for row in codes]
    offsets = np.cumsum([0, *map(len, sizes)])
    block = np.ascontiguousarray(index.values.to_numpy(dtype=np.float64).T)  # attributes x establishments
    estabs: list[np.ndarray] = []
    ordered: list[np.ndarray] = []
    compensated: list[np.ndarray] = []
    whole: list[np.ndarray] = []
    for row, size in zip(codes, sizes):
        per_establishment = row[index.codes]
        estabs.append(np.bincount(per_establishment, minlength=len(size)))
        for kept, summed in zip((ordered, compensated, whole), _kernel_sums(block, per_establishment, len(size))):
            kept.append(summed)
    attributes = [str(column) for column in index.values.columns]
    margins = {a: kept for a, kept in (pieces or {}).items() if a in attributes}
    with_pieces = set(margins) == set(attributes) and all(isinstance(kept, (LeastSquaresCells, WageCells))
                                                          for kept in margins.values())
    drawn = np.random.default_rng(HASH_SEED).integers(0, 2**63, size=codes.shape[1], dtype=np.uint64)
    finest_hash = np.asarray(drawn * np.uint64(2) + np.uint64(1))  # odd numbers below 2^64
    cell_hash = np.concatenate([_summed(finest_hash, row, len(size)) for row, size in zip(codes, sizes)])
    order = np.argsort(cell_hash, kind="stable")
    runs = np.flatnonzero(np.r_[True, index.codes[1:] != index.codes[:-1]])
    with_nan = np.zeros(codes.shape[1], dtype=bool)
    with_nan[index.codes[np.isnan(block).any(axis=0)]] = True
    unknown = np.full((len(attributes), offsets[-1]), np.nan)
    codes = codes + offsets[:-1, None]
    return CellLattice(attributes=attributes, codes=codes.astype(np.int32 if offsets[-1] < 2**31 else np.int64),
                       grouping=np.repeat(np.arange(len(sizes)), list(map(len, sizes))), sizes=np.concatenate(sizes),
                       estabs=np.concatenate(estabs), ordered=np.concatenate(ordered, axis=1),
                       compensated=np.concatenate(compensated, axis=1), whole=np.concatenate(whole, axis=1),
                       variance=unknown if with_pieces else None, slope=unknown.copy() if with_pieces else None,
                       finest_hash=finest_hash, hashes=cell_hash[order], hash_cells=order,
                       runs=np.asarray(index.codes[runs]), with_nan=with_nan,
                       pieces=[margins[a] for a in attributes] if with_pieces else [], offsets=offsets,
                       computed=np.zeros(len(sizes), dtype=bool), locks=[threading.Lock() for _ in sizes])


def _standard_codes(index: CellIndex) -> np.ndarray:
    """Groupings x finest cells: each finest cell's cell in each standard grouping the release has
    the columns of (groupings with the same cells once)."""
    from gedp.measure.queries import Groupings

    groupings = Groupings(index.cells)
    rows: list[np.ndarray] = []
    seen: set[bytes] = set()
    for by in STANDARD:
        if not set(by) <= set(index.cells.columns):
            continue
        codes = groupings(by).codes.astype(np.int64)
        if codes.tobytes() not in seen:
            seen.add(codes.tobytes())
            rows.append(codes)
    return np.array(rows, dtype=np.int64)


def _summed(numbers: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:
    """Sums modulo 2^64 of ``numbers`` (uint64) by ``codes`` (0..n-1, each present)."""
    order = np.argsort(codes, kind="stable")
    return np.add.reduceat(numbers[order], np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0]))[:n]


def _kernel_sums(block: np.ndarray, codes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each cell's sums (attributes x cells) by the three kernels, its establishments (``codes``:
    each one's cell) gathered in order into the layout the kernels get."""
    from gedp.postprocess.tabulate import compensated_sums, ordered_sums

    order = np.argsort(codes, kind="stable")
    gathered = block if np.all(order[1:] > order[:-1]) else np.ascontiguousarray(block[:, order])
    starts = np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0])
    bounds = np.r_[starts, len(codes)]
    missing = np.isnan(gathered)
    counted = np.where(missing, 0.0, gathered) if missing.any() else gathered  # pandas' sum skips NaN
    whole = np.array([np.add.reduce(counted[:, low:high], axis=1) for low, high in zip(bounds[:-1], bounds[1:])]).T
    return ordered_sums(gathered, starts), compensated_sums(block, codes, n), whole.reshape(len(block), n)


def lattice_table(lattice: CellLattice, index: CellIndex, kept_cells: np.ndarray, by_cell: Grouping | None,
                  margins: list[str] | None, level: float) -> pd.DataFrame | None:
    """``index_tabulation``'s table of the kept cells (``kept_cells``; ``by_cell``: their grouping by
    the keys, None for the total), with the margins at ``level`` of the attributes ``margins`` (in
    that order; None: without), from the lattice; None when a row is no cell of it, or margins are
    asked and it has no variances."""
    import pandas as pd

    from gedp.postprocess.moe import normal_quantile
    from gedp.postprocess.variances import CellVariances

    if margins is not None and lattice.variance is None:
        return None
    tab = np.full(len(kept_cells), -1, dtype=np.int64)
    tab[kept_cells] = by_cell.codes if by_cell is not None else 0
    n_tab = by_cell.n_groups if by_cell is not None else 1
    cells = lattice.cells_of(tab, n_tab)
    if cells is None:
        return None
    sums = lattice.sums(cells, tab, by_cell is not None)
    half_widths = {}
    if margins is not None:
        z = normal_quantile(level)
        variance, slope = lattice.margins(cells)
        for attribute in margins:
            number = lattice.attributes.index(attribute)
            half_widths[f"{attribute}_moe"] = CellVariances(variance[number], slope[number]).half_width(z)
    if by_cell is None:
        table = pd.Series(sums[:, 0], index=index.values.columns).to_frame().T
        table.insert(0, "estabs", int(lattice.estabs[cells[0]]))
        for name, values in half_widths.items():
            table[name] = values
        return table
    columns = {column: by_cell.keys[column].array for column in by_cell.keys.columns}
    columns["estabs"] = lattice.estabs[cells]
    columns.update(zip(lattice.attributes, sums))
    return pd.DataFrame(columns | half_widths, copy=False)  # made once: no column added after
