"""The lattice of a release's standard groupings (``gedp.release.lattice``): a request answered from
it gives the bytes of the pass over the establishments (``index_tabulation`` without it), for
releases in their order and shuffled, with and without margins, with a NaN value; its cells are the
sets a brute force finds; a request whose rows are not cells of it is left to the pass."""

import math
import shutil

import numpy as np
import pandas as pd
import pytest

from gedp.release.cells import CellIndex, index_tabulation, read_cell_index
from gedp.release.lattice import build_lattice, lattice_table
from gedp.release.margins import kept_path, kept_variances, read_pieces

BY = ["total", "state", "county", "sector", "naics3", "county,naics", "county,sector,own", "own,supersector",
      "naics4,county", "domain,year,qtr", "naics5"]


@pytest.fixture(scope="module")
def kept(small_release, tmp_path_factory):
    """The release's cell index and per-cell pieces, as a server holds them."""
    cache = tmp_path_factory.mktemp("lattice-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GEDP_CACHE_DIR", str(cache))
        folder = tmp_path_factory.mktemp("lattice") / "release"
        shutil.copytree(small_release[0], folder)
        kept_variances(folder)
        index, pieces = read_cell_index(kept_path(folder)), read_pieces(kept_path(folder))
    assert index is not None and pieces is not None and all(p is not None for p in pieces.values())
    return index, pieces


def filters(cells: pd.DataFrame) -> list[str | None]:
    """Filters on cell keys: none, one value of a column (answered from the lattice), and several
    values of a column that is not a key (not, in general)."""
    middle = cells.iloc[len(cells) // 2]
    counties = list(cells["county"].unique()[:2])
    return [None, f"own == '{cells['own'].iloc[-1]}'", f"sector == '{cells['sector'].iloc[-1]}'",
            f"county == '{middle['county']}' and naics3 == '{middle['naics3']}'", f"county in {counties}",
            f"naics3 != '{middle['naics3']}'"]


def same_bytes(first: pd.DataFrame, second: pd.DataFrame) -> bool:
    """Equal columns, dtypes, and values bit for bit (CSV text and each column's array)."""
    return (list(first.columns) == list(second.columns) and list(first.dtypes) == list(second.dtypes)
            and first.to_csv(index=False) == second.to_csv(index=False)
            and all(first[c].to_numpy().tobytes() == second[c].to_numpy().tobytes()
                    for c in first if first[c].dtype.kind in "fi"))


def compared(index: CellIndex, pieces, levels=(0.95, 0.9)) -> tuple[int, int]:
    """Every request of BY x filters x (no margins, margins at ``levels``) with the lattice and without:
    asserts the same bytes; returns how many requests, and how many the lattice answered itself."""
    lattice = build_lattice(index, pieces)
    asked = answered = 0
    for by in BY:
        for where in filters(index.cells):
            for level in (None, *levels):
                margins = None if level is None else pieces
                options = {"margins": margins, "where": where, "level": level or 0.95}
                full = index_tabulation(index, by, **options)
                fast = index_tabulation(index, by, lattice=lattice, **options)
                assert full is not None and fast is not None
                assert fast[0] == full[0]
                assert same_bytes(fast[1], full[1]), (by, where, level)
                asked += 1
                answered += _answered(lattice, index, by, where, margins)
    return asked, answered


def _answered(lattice, index, by, where, margins) -> bool:
    from gedp.postprocess.tabulate import group_keys, select

    keys = group_keys(index.cells, by)
    kept_cells = select(index.cells, where)
    by_cell = lattice.kept_grouping(index, keys, kept_cells) if keys else None
    return lattice_table(lattice, index, kept_cells, by_cell, None if margins is None else list(margins),
                         0.95) is not None


def test_lattice_answers_are_the_bytes_of_the_pass_over_establishments(kept):
    index, pieces = kept
    asked, answered = compared(index, pieces)
    assert asked == len(BY) * 6 * 3
    # every request without a filter, or fixing one value of a column, is a lattice answer
    assert answered >= len(BY) * 4 * 3


def test_shuffled_rows_take_the_compensated_sums_as_the_pass_does(kept):
    """Rows out of cell order: tabulations whose groups are not consecutive use pandas' compensated
    sums, which differ from the ordered ones in the last bits; the lattice follows."""
    index, pieces = kept
    order = np.random.default_rng(5).permutation(len(index.codes))
    shuffled = CellIndex(index.cells, np.asarray(index.codes)[order],
                         index.values.iloc[order].reset_index(drop=True))
    asked, answered = compared(shuffled, pieces, levels=(0.95,))
    assert answered >= len(BY) * 4 * 2


def test_a_nan_value_takes_the_compensated_sums(kept):
    index, _ = kept
    values = index.values.copy()
    values.iloc[3, 0] = np.nan
    compared(CellIndex(index.cells, index.codes, values), None, levels=())


def test_the_lattice_cells_are_the_sets_a_brute_force_finds(kept):
    index, pieces = kept
    lattice = build_lattice(index, pieces)
    codes = np.asarray(index.codes)
    for by in (["county", "sector"], ["naics3"], ["own"]):
        groups = index.cells.groupby(by, observed=True).ngroup().to_numpy()
        cells = lattice.cells_of(groups, groups.max() + 1)
        assert cells is not None
        for group, cell in enumerate(cells):
            finest = set(np.flatnonzero(groups == group))
            assert set(np.flatnonzero(lattice.codes[lattice.grouping[cell]] == cell)) == finest
            rows = np.isin(codes, list(finest))
            assert lattice.estabs[cell] == rows.sum()
            for number, attribute in enumerate(lattice.attributes):  # independent: an exactly rounded sum
                exact = math.fsum(index.values[attribute].to_numpy()[rows])
                assert lattice.compensated[number, cell] == pytest.approx(exact, rel=1e-13, abs=1e-9)
                assert lattice.ordered[number, cell] == pytest.approx(exact, rel=1e-12, abs=1e-9)
    # a union of two counties' cells of one sector is no cell of any standard grouping
    sector = index.cells["sector"].iloc[0]
    counties = index.cells.loc[index.cells["sector"] == sector, "county"].unique()[:2]
    union = np.where(index.cells["county"].isin(counties) & (index.cells["sector"] == sector), 0, -1)
    assert len(counties) == 2 and lattice.cells_of(union, 1) is None


def test_a_groupings_variances_are_computed_at_the_first_request_that_needs_them(kept):
    index, pieces = kept
    lattice = build_lattice(index, pieces)
    assert not lattice.computed.any() and np.isnan(lattice.variance).all()
    first = index_tabulation(index, "county", margins=pieces, lattice=lattice)
    assert lattice.computed.sum() == 1 and first is not None
    index_tabulation(index, "county", margins=pieces, lattice=lattice, level=0.9)  # the same grouping
    index_tabulation(index, "sector", lattice=lattice)  # no margins: none computed
    assert lattice.computed.sum() == 1
    group = int(np.flatnonzero(lattice.computed)[0])
    low, high = lattice.offsets[group], lattice.offsets[group + 1]
    assert np.isfinite(lattice.variance[:, low:high]).all() and np.isnan(np.delete(lattice.variance, np.s_[low:high],
                                                                                     axis=1)).all()
