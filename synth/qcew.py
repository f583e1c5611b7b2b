"""Published QCEW aggregates (BLS open-data by-area layout) and the cell fit that fills suppression.

A state's private QCEW file publishes, at every aggregation level (state 51-58, county 71-78), the
establishment count of every cell and, unless the cell is suppressed (disclosure code "N"), its
monthly employment and wages. The finest cells are county x NAICS-6 (level 78).

``fit_cells`` finds whole-number values for every suppressed finest cell such that every published
cell at every level is reproduced exactly, nothing is negative, and suppressed cells are close to
a plausible target (establishment count x the industry's average size among suppressed cells):

1. a quadratic program (cvxpy) gives the closest fractional fit under all published totals;
2. a linear program (HiGHS) rounds it: each cell goes to the floor or ceiling of its fractional
   value and every total stays exact. Every published total is a sum over a group in one of two
   laminar families (industry hierarchy within each county; industry hierarchy statewide), so the
   constraint matrix is totally unimodular and the box [floor, ceil] around the fractional fit has
   an integral vertex solution: the rounding always exists.

Suppressed cells without a published statewide ancestor (a file of county rows only) take their
target from their finest published county industry. The program is solved in units of a typical
cell (wage totals reach 1e9 dollars). If it has no optimum, a linear program either finds a
nonnegative fit (numerical trouble: its point is rounded instead) or shows there is none and names
the published cell the closest fit misses.

If the published file is inconsistent (a cell whose published parts exceed it, counts that do not
add up), the reader refuses it with the offending cell named; nothing is fitted or written.
Fractional published values (gedp's own protected qcew_tables.csv) are rounded on reading, each
cell to its floor or ceiling with every total still the sum of its parts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from gedp.synth.columns import count
from gedp.synth.hierarchy import COUNTY_LEVELS, INDUSTRY_OF_STATE_LEVEL, STATE_LEVELS
from gedp.synth.schema import CONFIDENTIAL, MAX_VALUE, InputError, validate_microdata

if TYPE_CHECKING:
    import scipy.sparse as sp

#: BLS open-data column of each confidential attribute.
QCEW_VALUE_COLUMNS = {
    "m1emp": "month1_emplvl",
    "m2emp": "month2_emplvl",
    "m3emp": "month3_emplvl",
    "wage": "total_qtrly_wages",
}
#: Establishment counts: BLS's current layout (and gedp's qcew_tables.csv) says ``qtrly_estabs``;
#: older by-area files say ``qtrly_estabs_count``. Read as the current name.
ESTABS_COLUMN = "qtrly_estabs"
ESTABS_ALIASES = ("qtrly_estabs_count",)
REQUIRED_COLUMNS = (
    "area_fips", "own_code", "industry_code", "agglvl_code", "year", "qtr", ESTABS_COLUMN,
    *QCEW_VALUE_COLUMNS.values(),
)
#: Optional: without it nothing is suppressed (gedp's own qcew_tables.csv has no suppression).
DISCLOSURE_COLUMN = "disclosure_code"
PRIVATE = "5"
FINEST_LEVEL = 78
#: Levels a state's file must have for its totals to be known: the county private totals (the
#: statewide ones are their sum) and the county x NAICS-6 cells. A file of level 78 alone, cut from
#: BLS's national single-level files, would give a state whose totals are those of its published
#: cells only: its suppressed cells would be filled from nothing.
REQUIRED_LEVELS = {71: "the county private totals", FINEST_LEVEL: "the county x NAICS-6 cells"}
#: Order in which attributes are fitted: month 2's target is the midpoint of the fitted months 1 and 3.
FIT_ORDER = ("m1emp", "m3emp", "wage", "m2emp")


@dataclass(frozen=True, eq=False)
class PublishedState:
    """One state's published private QCEW cells for one quarter.

    Attributes:
        state, year, qtr: the state FIPS code and the quarter.
        aggregates: one row per published row (levels 51-58, 71-78): ``agglvl``, ``county`` ("" at
            state levels), ``industry``, ``estabs``, ``suppressed`` and the attribute values.
        cells: the finest cells (county x NAICS-6): ``county``, ``naics``, ``estabs`` and derived
            industry codes, in the order of ``aggregates``' level-78 rows.
        membership: sparse (aggregates x cells) 0/1 matrix: which finest cells make up each row.
        rounded: attributes whose published values were fractional (e.g. gedp's own protected
            tables) and were rounded to whole numbers by controlled rounding on reading.
    """

    state: str
    year: int
    qtr: int
    aggregates: pd.DataFrame
    cells: pd.DataFrame
    membership: sp.csr_matrix
    rounded: tuple[str, ...] = ()

    def suppressed_shares(self) -> pd.Series:
        """Share of the published rows of each aggregation level that the agency suppressed."""
        return self.aggregates.groupby("agglvl")["suppressed"].mean()


def _industry_key(level: int) -> str | None:
    return INDUSTRY_OF_STATE_LEVEL[level - 20 if level in COUNTY_LEVELS else level]


def read_qcew(path: str | Path, state: str | None = None) -> PublishedState:
    """Read and check BLS QCEW by-area open-data CSV for one state and one quarter: one file, or a
    folder of per-area or per-level files (e.g. the statewide file and every county file, or BLS's
    national single-level files of levels 51-58 and 71-78), read as one. ``state`` (2-digit FIPS)
    takes that state's rows of a file of several states.

    Raises:
        InputError: unreadable file, missing columns, no private rows, several quarters, several
            states without ``state``, a level of ``REQUIRED_LEVELS`` missing, or published cells that
            are inconsistent with their parts.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(f for f in path.glob("*.csv") if not f.name.startswith("."))
        if not files:
            raise InputError(f"QCEW folder '{path}' holds no .csv files")
        raw = pd.concat([_read_csv(f) for f in files], ignore_index=True)
    elif path.is_file():
        raw = _read_csv(path)
    else:
        raise InputError(f"QCEW file '{path}' does not exist")
    return published_state(raw, str(path), state)


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        raw = pd.read_csv(path, dtype={"area_fips": str, "industry_code": str, DISCLOSURE_COLUMN: str, "own_code": str})
    except pd.errors.EmptyDataError:
        raise InputError(f"QCEW file '{path}' is empty") from None
    except (UnicodeDecodeError, pd.errors.ParserError, ValueError) as err:
        raise InputError(f"QCEW file '{path}' cannot be read: {str(err).strip().splitlines()[0]}") from None
    return _checked_columns(raw, str(path))


def _checked_columns(raw: pd.DataFrame, source: str) -> pd.DataFrame:
    """The rows with the column names of the current BLS layout; refused when a column is missing."""
    aliases = [a for a in ESTABS_ALIASES if a in raw.columns]
    if ESTABS_COLUMN in raw.columns and aliases:
        raise InputError(f"{source}: holds both {ESTABS_COLUMN!r} and {aliases[0]!r}, two establishment counts "
                         "(a BLS file has one): keep one of them")
    if ESTABS_COLUMN not in raw.columns and aliases:
        raw = raw.rename(columns={aliases[0]: ESTABS_COLUMN})
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        shown = ", ".join(repr(c) + (f" (or {ESTABS_ALIASES[0]!r})" if c == ESTABS_COLUMN else "") for c in missing)
        raise InputError(f"{source}: missing column{'s' if len(missing) > 1 else ''} {shown}")
    return raw


def published_state(raw: pd.DataFrame, source: str = "QCEW data", state: str | None = None) -> PublishedState:
    """Check QCEW rows (BLS layout) of one state (``state``, or the only one) and index them by
    finest cell; see ``read_qcew``."""
    raw = _checked_columns(raw, source)
    for column in ("agglvl_code", "year", "qtr"):
        numbers = pd.to_numeric(raw[column], errors="coerce")
        bad = numbers.isna() | (numbers != numbers.round())
        if bad.any():
            raise InputError(f"{source}: column '{column}' is missing or not a whole number in "
                             f"{count(int(bad.sum()), 'row')}; "
                             f"e.g. row {int(np.flatnonzero(bad.to_numpy())[0]) + 2}: {raw[column][bad].iloc[0]!r}")
        raw = raw.assign(**{column: numbers.astype("int64")})
    levels = (*STATE_LEVELS, *COUNTY_LEVELS)
    private = raw[(raw["own_code"].astype(str).str.strip() == PRIVATE) & raw["agglvl_code"].isin(levels)]
    if private.empty:
        raise InputError(f"{source}: no private-ownership rows (own_code 5 at aggregation levels 51-58, 71-78)")
    quarters = sorted({(int(y), int(q)) for y, q in zip(private["year"], private["qtr"])})
    if len(quarters) > 1:
        shown = ", ".join(f"{y} Q{q}" for y, q in quarters)
        raise InputError(f"{source}: rows of {len(quarters)} quarters ({shown}); give one state and quarter per file")
    fips = private["area_fips"].astype(str).str.strip()
    bad_fips = ~fips.str.fullmatch("[0-9]{5}")
    if bad_fips.any():
        raise InputError(f"{source}: {count(int(bad_fips.sum()), 'row')} with an area_fips that is not 5 digits; "
                         f"e.g. {fips[bad_fips].iloc[0]!r}")
    state = _one_state(fips, state, source)
    private, fips = private[fips.str[:2] == state], fips[fips.str[:2] == state]
    _check_levels(set(private["agglvl_code"]), source)
    numbers = [ESTABS_COLUMN, *QCEW_VALUE_COLUMNS.values()]
    values = private[numbers].apply(pd.to_numeric, errors="coerce")
    _check_counts_and_values(private[numbers], values, source)

    aggregates = pd.DataFrame({
        "agglvl": private["agglvl_code"].astype(int).to_numpy(),
        "county": np.where(private["agglvl_code"].isin(COUNTY_LEVELS), fips.str[2:], ""),
        "industry": private["industry_code"].astype(str).str.strip().to_numpy(),
        "estabs": values[ESTABS_COLUMN].astype(np.int64).to_numpy(),
        "suppressed": (private[DISCLOSURE_COLUMN].fillna("").astype(str).str.strip() == "N").to_numpy()
        if DISCLOSURE_COLUMN in private else np.zeros(len(private), dtype=bool),
    })
    for attribute, column in QCEW_VALUE_COLUMNS.items():
        aggregates[attribute] = values[column].to_numpy(dtype=float)
    duplicated = aggregates.duplicated(["agglvl", "county", "industry"])
    if duplicated.any():
        row = aggregates[duplicated].iloc[0]
        raise InputError(f"{source}: cell agglvl {row.agglvl} county {row.county or '-'} industry {row.industry} "
                         "appears twice")
    aggregates = aggregates.sort_values(["agglvl", "county", "industry"], ignore_index=True)

    finest = aggregates[aggregates["agglvl"] == FINEST_LEVEL]
    cells = validate_microdata(
        pd.DataFrame({"estab_id": np.arange(len(finest)), "state": state, "county": finest["county"].to_numpy(),
                      "naics": finest["industry"].to_numpy()}),
        attributes=(),
    ).drop(columns=["estab_id", "own"])
    cells["estabs"] = finest["estabs"].to_numpy()
    membership = _membership(aggregates, cells, source)
    published = PublishedState(state, quarters[0][0], quarters[0][1], aggregates, cells, membership)
    _check_consistency(published, source)
    return _whole_numbers(published, source)


def _check_counts_and_values(raw: pd.DataFrame, values: pd.DataFrame, source: str) -> None:
    """Refuse a count or value column (``raw``, read as ``values``) that is empty, not a number,
    negative or above MAX_VALUE (the bound of microdata, so of every value gedp measures) in a private
    row, saying which, how many rows and the first row's number (its line in the file), never the value."""
    empty = raw.isna() | raw.astype(str).apply(lambda column: column.str.strip() == "")
    reasons = {"empty": empty, "not a number": values.isna() & ~empty, "negative": values < 0,
               f"above {MAX_VALUE:.0e}": values > MAX_VALUE}
    for column in raw.columns:
        for reason, bad in reasons.items():
            rows = bad[column].to_numpy()
            if rows.any():
                first = int(raw.index[int(rows.argmax())]) + 2  # the file's line: a header, then rows from 0
                raise InputError(f"{source}: column '{column}' is {reason} in {count(int(rows.sum()), 'private row')} "
                                 f"(first at line {first}); counts and values must be numbers from 0 to "
                                 f"{MAX_VALUE:.0e}")


def _one_state(fips: pd.Series, state: str | None, source: str) -> str:
    """The state whose rows are read: ``state``, or the only state of the rows' area codes."""
    states = sorted(fips.str[:2].unique())
    if state is not None and state not in states:
        raise InputError(f"{source}: no private rows of state {state!r}; it has {', '.join(states)}")
    if state is None and len(states) > 1:
        shown = ", ".join(states[:10]) + (", ..." if len(states) > 10 else "")
        raise InputError(f"{source}: rows of {len(states)} states ({shown}); choose one with --state "
                         f"(state= in Python), e.g. --state {states[0]}")
    return states[0] if state is None else state


def _check_levels(present: set[int], source: str) -> None:
    """Refuse a file without a level of ``REQUIRED_LEVELS``: its suppressed cells would be filled
    from nothing and its totals would be those of its published cells."""
    missing = [level for level in REQUIRED_LEVELS if level not in present]
    if missing:
        named = "; ".join(f"{level} ({REQUIRED_LEVELS[level]})" for level in missing)
        raise InputError(
            f"{source}: no private rows at aggregation level{'s' if len(missing) > 1 else ''} {named}: without "
            "them the state's totals are unknown; give the state's by-area file (or its county files), or a "
            "folder holding BLS's single-level files of levels 71-78 (51-58 too, for statewide cells) with "
            "--state; it has levels "
            f"{', '.join(str(level) for level in sorted(present))}")


def _whole_numbers(published: PublishedState, source: str) -> PublishedState:
    """Published values rounded to whole numbers where they are fractional (BLS publishes whole
    employees and dollars; gedp's protected tables are fractional): controlled rounding moves each
    published cell to its floor or ceiling and keeps every published total equal to the sum of its
    parts. The two laminar families of totals make the constraint matrix totally unimodular, so the
    linear program's vertex is whole-numbered (checked)."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # imported when used: reading microdata needs none

    aggregates, membership = published.aggregates, published.membership
    shown = ~aggregates["suppressed"].to_numpy()
    finest = aggregates["agglvl"].to_numpy() == FINEST_LEVEL
    rounded = []
    for attribute in CONFIDENTIAL:
        value = aggregates[attribute].to_numpy()
        if np.all(value[shown] == np.round(value[shown])):
            continue
        low, high = np.floor(value + 1e-7), np.maximum(np.ceil(value - 1e-7), np.floor(value + 1e-7))
        # One variable per finest cell (membership columns are the level-78 rows in order).
        cell_low = np.where(shown[finest], low[finest], 0.0)
        cell_high = np.where(shown[finest], high[finest], np.inf)
        totals = np.flatnonzero(shown & ~finest)
        remainder = np.where(shown[finest], value[finest] - low[finest], 0.5)
        result = milp(1.0 - 2.0 * remainder, integrality=np.ones(len(cell_low)), bounds=Bounds(cell_low, cell_high),
                      constraints=LinearConstraint(membership[totals], low[totals], high[totals]))
        if result.status != 0:
            raise InputError(f"{source}: the fractional published {attribute} values cannot be rounded to whole "
                             f"numbers that keep every total equal to the sum of its parts")
        whole = np.rint(result.x)
        aggregates.loc[shown, attribute] = (membership @ whole)[shown]
        rounded.append(attribute)
    return dataclasses.replace(published, rounded=tuple(rounded)) if rounded else published


def _describe(row: pd.Series) -> str:
    where = f"county {row['county']}" if row["county"] else "statewide"
    return f"agglvl {row['agglvl']} {where} industry {row['industry']}"


def _membership(aggregates: pd.DataFrame, cells: pd.DataFrame, source: str) -> sp.csr_matrix:
    """0/1 matrix of which finest cells each published row sums (rows in ``aggregates`` order)."""
    rows, columns = [], []
    cell_index = np.arange(len(cells))
    for level, group in aggregates.groupby("agglvl", sort=False):
        industry = _industry_key(level)
        keys = pd.DataFrame({
            "county": cells["county"] if level in COUNTY_LEVELS else "",
            "industry": cells[industry] if industry else "10",
        }, index=cells.index)
        lookup = pd.Series(group.index.to_numpy(), index=pd.MultiIndex.from_frame(group[["county", "industry"]]))
        position = lookup.reindex(pd.MultiIndex.from_frame(keys)).to_numpy()
        orphan = np.isnan(position.astype(float)) & (cells["estabs"].to_numpy() > 0)
        if orphan.any():
            cell = cells[orphan].iloc[0]
            raise InputError(
                f"{source}: county {cell['county']} NAICS {cell['naics']} has establishments but no row at agglvl "
                f"{level}"
            )
        found = ~np.isnan(position.astype(float))
        rows.append(position[found].astype(np.int64))
        columns.append(cell_index[found])
    import scipy.sparse as sp  # imported when used: tabulating needs none

    rows, columns = np.concatenate(rows), np.concatenate(columns)
    return sp.csr_matrix((np.ones(len(rows)), (rows, columns)), shape=(len(aggregates), len(cells)))


def _check_consistency(published: PublishedState, source: str) -> None:
    """Counts add up at every level; no published cell is exceeded by its published parts."""
    aggregates, membership = published.aggregates, published.membership
    counts = membership @ published.cells["estabs"].to_numpy()
    wrong = counts != aggregates["estabs"].to_numpy()
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise InputError(
            f"{source}: cell {_describe(aggregates.iloc[i])} has {aggregates['estabs'].iloc[i]} establishments "
            f"but its county x NAICS-6 cells have {int(counts[i])}"
        )
    # Children at the next finer level of the same geography, and county cells within state cells.
    levels = aggregates["agglvl"].to_numpy()
    for attribute in CONFIDENTIAL:
        value = aggregates[attribute].to_numpy()
        published_value = np.where(aggregates["suppressed"], 0.0, value)
        for parent_level in (*STATE_LEVELS, *COUNTY_LEVELS):
            for child_level in (parent_level + 1, parent_level + 20):
                county_beyond_detail = parent_level in COUNTY_LEVELS and child_level > 78
                if child_level not in levels or child_level in (59, 79) or county_beyond_detail:
                    continue
                parents = np.flatnonzero((levels == parent_level) & ~aggregates["suppressed"].to_numpy())
                children = np.flatnonzero(levels == child_level)
                # parent_of_child[c] = the parent row containing child c's cells.
                overlap = membership[parents] @ membership[children].T
                parent_row, child_row = overlap.nonzero()
                parts = np.bincount(parent_row, weights=published_value[children][child_row], minlength=len(parents))
                exceeded = parts > value[parents] + 1e-6
                if exceeded.any():
                    i = parents[int(np.flatnonzero(exceeded)[0])]
                    raise InputError(
                        f"{source}: published cell {_describe(aggregates.iloc[i])} has {attribute} "
                        f"{value[i]:,.0f} but its published parts at agglvl {child_level} add up to "
                        f"{parts[np.flatnonzero(exceeded)[0]]:,.0f}"
                    )


def _targets(published: PublishedState, attribute: str, known: np.ndarray, unknown_mask: np.ndarray) -> np.ndarray:
    """Target of each suppressed cell: its establishments x the average size among suppressed
    establishments of its finest published statewide industry (the remainder average). A cell with
    no such statewide row (a file of county rows only) takes the remainder average of its finest
    published industry within its county."""
    aggregates, membership = published.aggregates, published.membership
    estabs = published.cells["estabs"].to_numpy(dtype=float)
    rows = np.flatnonzero(~aggregates["suppressed"].to_numpy())
    block = membership[rows]
    remainder_value = aggregates[attribute].to_numpy()[rows] - block @ known
    remainder_estabs = block @ (estabs * unknown_mask)
    usable = remainder_estabs > 0
    average = np.divide(np.maximum(remainder_value, 0.0), remainder_estabs, out=np.zeros(len(rows)), where=usable)
    # Later levels overwrite earlier ones: county levels, then statewide ones, each coarse to fine,
    # so a cell takes its finest usable statewide ancestor, else its finest usable county one.
    per_cell = np.zeros(len(estabs))
    level_of = aggregates["agglvl"].to_numpy()[rows]
    for level in (*COUNTY_LEVELS, *STATE_LEVELS):
        at_level = np.flatnonzero((level_of == level) & usable)
        if len(at_level):
            covered = block[at_level].T @ np.ones(len(at_level)) > 0
            per_cell[covered] = (block[at_level].T @ average[at_level])[covered]
    return estabs * per_cell


def fit_cells(published: PublishedState, *, solver: str = "CLARABEL") -> pd.DataFrame:
    """Whole-number values of every finest cell that reproduce every published cell exactly.

    Returns ``published.cells`` with the four attributes filled in (published values kept as is).

    Raises:
        InputError: no nonnegative fit reproduces the published totals (an inconsistent file); the
            message names a published cell that cannot be reproduced.
    """
    cells = published.cells.copy()
    finest = published.aggregates[published.aggregates["agglvl"] == FINEST_LEVEL]
    empty = cells["estabs"].to_numpy() == 0
    for attribute in FIT_ORDER:
        value = finest[attribute].to_numpy(dtype=float)
        unknown_mask = finest["suppressed"].to_numpy() & ~empty
        known = np.where(unknown_mask, 0.0, value)
        if attribute == "m2emp":
            target = (cells["m1emp"].to_numpy() + cells["m3emp"].to_numpy()) / 2
        else:
            target = _targets(published, attribute, known, unknown_mask)
        fitted = known.copy()
        if unknown_mask.any():
            fitted[unknown_mask] = _fit_suppressed(
                published, attribute, known, unknown_mask, target[unknown_mask], solver
            )
        cells[attribute] = fitted
    return cells


def _feasible_point(totals: pd.DataFrame, attribute: str, matrix: sp.csr_matrix, right: np.ndarray) -> np.ndarray:
    """A nonnegative solution of ``matrix @ x == right`` by a linear program (HiGHS), used when the
    quadratic program fails; when there is none, the published cell (a row of ``totals``) that the
    least-violation solution misses most is named."""
    import scipy.sparse as sp
    from scipy.optimize import linprog  # imported when used: reading microdata needs none

    n, m = matrix.shape[1], matrix.shape[0]
    identity = sp.identity(m, format="csr")
    elastic = linprog(np.concatenate([np.zeros(n), np.ones(2 * m)]), A_eq=sp.hstack([matrix, identity, -identity]),
                      b_eq=right, bounds=(0, None), method="highs")
    if elastic.status != 0:
        raise InputError(f"the published {attribute} totals could not be fitted ({elastic.message})")
    violation = elastic.x[n:n + m] + elastic.x[n + m:]
    if violation.max() > 0.5:
        i = int(np.argmax(violation))
        raise InputError(
            f"published cell {_describe(totals.iloc[i])} ({attribute} {totals[attribute].iloc[i]:,.0f}) cannot be "
            f"reproduced: no nonnegative values of the suppressed county x NAICS-6 cells fit it together with the "
            f"other published cells (the closest fit misses it by {violation[i]:,.0f})"
        )
    return elastic.x[:n]


def _fit_suppressed(published, attribute, known, unknown_mask, target, solver) -> np.ndarray:
    aggregates = published.aggregates
    rows = np.flatnonzero(~aggregates["suppressed"].to_numpy())
    block = published.membership[rows]
    right = aggregates[attribute].to_numpy()[rows] - block @ known
    matrix = block[:, np.flatnonzero(unknown_mask)].tocsr()
    involved = np.diff(matrix.indptr) > 0
    if np.any(np.abs(right[~involved]) > 1e-6):
        i = rows[np.flatnonzero(~involved & (np.abs(right) > 1e-6))[0]]
        raise InputError(f"published cell {_describe(aggregates.iloc[i])} does not equal the sum of its published "
                         f"parts ({attribute})")
    matrix, right = matrix[involved], np.rint(right[involved])

    # Solve in units of a typical cell (wage totals reach 1e9 dollars): the median target, or without
    # targets the median published remainder per suppressed cell.
    typical = target[target > 0] if np.any(target > 0) else (right / np.diff(matrix.indptr))[right > 0]
    scale = max(1.0, float(np.median(typical))) if len(typical) else 1.0
    import cvxpy as cp  # imported when used: it takes ~1 s, and most commands never fit suppressed cells
    from scipy.optimize import linprog

    x = cp.Variable(matrix.shape[1], nonneg=True)
    weight = 1.0 / np.sqrt(np.maximum(target / scale, 1e-3))
    problem = cp.Problem(
        cp.Minimize(cp.sum_squares(cp.multiply(weight, x - target / scale))), [matrix @ x == right / scale]
    )
    try:
        problem.solve(solver=solver)
        solved = problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and x.value is not None
    except cp.error.SolverError:
        solved = False
    # Without an optimum (an inconsistent file, or numerical trouble), a linear program decides which.
    fractional = (np.maximum(x.value * scale, 0.0) if solved
                  else _feasible_point(aggregates.iloc[rows[involved]], attribute, matrix, right))

    # Controlled rounding: floor or ceiling of each cell, every published total exact (TU matrix).
    low = np.floor(fractional + 1e-7)
    high = np.maximum(np.ceil(fractional - 1e-7), low)
    remainder = fractional - low
    result = linprog(
        1.0 - 2.0 * remainder, A_eq=matrix, b_eq=right, bounds=np.column_stack([low, high]), method="highs-ds"
    )
    if result.status != 0:
        # The fractional fit was within solver tolerance only: widen the box by one unit each way.
        result = linprog(np.zeros(len(low)), A_eq=matrix, b_eq=right,
                         bounds=np.column_stack([np.maximum(low - 1, 0), high + 1]), method="highs-ds")
    if result.status != 0:
        raise InputError(f"the published {attribute} totals are inconsistent: no whole-number fit reproduces them")
    whole = np.rint(result.x) + 0.0  # no negative zeros
    if np.max(np.abs(result.x - whole)) > 1e-6 or np.any(matrix @ whole != right):
        raise RuntimeError(f"controlled rounding of {attribute} did not reach an integral solution")
    return whole
