"""Integer releases: controlled rounding of protected microdata to whole employees and whole dollars.

Every establishment value goes to its floor or ceiling, and so does every cell of the QCEW tables
(levels 51-58 statewide and 71-78 by county, by industry): each rounded cell is the floor or the
ceiling of its unrounded total. The cells are unions of county x NAICS-6 atoms and form two laminar
families (industries nested within each county; industries statewide), so their constraint matrix is
totally unimodular and such a rounding always exists (Cox's controlled rounding; the synthesizer
rounds published tables the same way, ``synth.qcew``). Two steps, per attribute:

1. atom totals: an integer program over the atoms, each between the floor and the ceiling of its
   total, every cell between the floor and the ceiling of its total, nearest rounding preferred
   (its LP relaxation has integral vertices; HiGHS solves it at the root);
2. establishments: within an atom, the establishments with the largest fractional parts go up until
   the atom's rounded total is reached (ties in release order), the rest go down.

Why this is postprocessing (no privacy cost): its only input is the protected microdata, itself
computed from released answers and public attributes; it reads nothing confidential.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from gedp.errors import SolverError
from gedp.measure.queries import Groupings
from gedp.postprocess.tabulate import qcew_keys
from gedp.synth.hierarchy import COUNTY_LEVELS, STATE_LEVELS

#: The finest QCEW cell: county x NAICS-6.
ATOM_LEVEL = 78


@dataclass(frozen=True)
class CellFamily:
    """The QCEW cells of a state's microdata as unions of county x NAICS-6 atoms."""

    atom_codes: np.ndarray  # per establishment
    membership: sp.csr_matrix  # cells x atoms, every level except the atoms' own
    n_atoms: int

    @classmethod
    def of(cls, public: pd.DataFrame) -> CellFamily:
        groupings = Groupings(public)
        atoms = groupings(qcew_keys(public, ATOM_LEVEL))
        first = np.zeros(atoms.n_groups, dtype=np.int64)
        first[atoms.codes[::-1]] = np.arange(len(public))[::-1]  # an establishment of each atom
        rows, offset = [], 0
        for level in (*STATE_LEVELS, *COUNTY_LEVELS):
            if level == ATOM_LEVEL:
                continue
            cells = groupings(qcew_keys(public, level))
            rows.append(cells.codes[first] + offset)
            offset += cells.n_groups
        row = np.concatenate(rows)
        column = np.tile(np.arange(atoms.n_groups), len(rows))
        membership = sp.csr_matrix((np.ones(len(row)), (row, column)), shape=(offset, atoms.n_groups))
        return cls(atoms.codes, membership, atoms.n_groups)


def whole_bounds(totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Floor and ceiling of float totals. No snapping to whole numbers: where round-off moved a whole
    total off its integer, the bounds still contain that integer, so they contain the exact bounds."""
    return np.floor(totals), np.ceil(totals)


def round_attribute(values: np.ndarray, family: CellFamily) -> np.ndarray:
    """Whole numbers, each the floor or ceiling of its value, whose atoms and QCEW cells are each the
    floor or ceiling of their unrounded totals (values >= 0; negatives count as 0)."""
    values = np.maximum(np.asarray(values, dtype=float), 0.0)
    down = np.floor(values)
    fraction = values - down
    atom_totals = np.bincount(family.atom_codes, weights=values, minlength=family.n_atoms)
    atom_low, atom_high = whole_bounds(atom_totals)
    # an atom's rounded total is reachable by its establishments: between the sums of floors and ceilings
    atom_low = np.maximum(atom_low, np.bincount(family.atom_codes, weights=down, minlength=family.n_atoms))
    atom_high = np.maximum(np.minimum(atom_high, np.bincount(family.atom_codes, weights=np.ceil(values),
                                                             minlength=family.n_atoms)), atom_low)
    cell_low, cell_high = whole_bounds(family.membership @ atom_totals)
    nearest = 1.0 - 2.0 * (atom_totals - np.floor(atom_totals))  # cost of going up: prefer the nearest whole
    atom_rounded = _vertex(nearest, atom_low, atom_high, family.membership, cell_low, cell_high)
    # within each atom, the largest fractional parts go up (ties in release order)
    up_count = (atom_rounded - np.bincount(family.atom_codes, weights=down, minlength=family.n_atoms)).astype(np.int64)
    order = np.lexsort((np.arange(len(values)), -fraction, family.atom_codes))
    start = np.searchsorted(family.atom_codes[order], np.arange(family.n_atoms))
    rank = np.empty(len(values), dtype=np.int64)
    rank[order] = np.arange(len(values)) - start[family.atom_codes[order]]
    return down + (rank < up_count[family.atom_codes])


def _vertex(cost: np.ndarray, low: np.ndarray, high: np.ndarray, matrix: sp.csr_matrix, row_low: np.ndarray,
            row_high: np.ndarray) -> np.ndarray:
    """An optimal vertex of min cost'x, low <= x <= high, row_low <= matrix x <= row_high, by the dual
    simplex (whole-numbered: the matrix is totally unimodular and the bounds whole); the integer
    program only if round-off left a vertex fractional."""
    import highspy  # imported when used: only a release rounded to whole numbers needs the LP solver

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "simplex")
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, low, high
    lp.row_lower_, lp.row_upper_ = row_low, row_high
    columns = matrix.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = columns.indptr, columns.indices, columns.data
    h.passModel(lp)
    h.run()
    if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        x = np.asarray(h.getSolution().col_value)
        if np.abs(x - np.rint(x)).max(initial=0.0) < 1e-6:
            return np.rint(x)
    result = milp(cost, integrality=np.ones(len(cost)), bounds=Bounds(low, high),
                  constraints=LinearConstraint(matrix, row_low, row_high))
    if result.status != 0 or result.x is None:
        raise SolverError(f"controlled rounding found no whole-number solution ({result.message})")
    return np.rint(result.x)


def round_values(before: np.ndarray, family: CellFamily) -> tuple[np.ndarray, dict]:
    """One attribute's protected values rounded (``round_attribute``) and what rounding changed:
    establishments moved up and down, the largest change of any QCEW cell and the change of the
    state total."""
    after = round_attribute(before, family)
    atom_change = np.bincount(family.atom_codes, weights=after - before, minlength=family.n_atoms)
    cell_change = np.abs(np.concatenate([atom_change, family.membership @ atom_change]))
    return after, {
        "establishments_rounded_up": int(np.count_nonzero(after > before)),
        "establishments_rounded_down": int(np.count_nonzero(after < before)),
        "largest_cell_change": float(cell_change.max(initial=0.0)),
        "state_total_change": float(after.sum() - before.sum()),
    }


class Rounder:
    """Rounds one release's attributes as ``protect_microdata`` solves them (its ``finish``), so the
    wage fit takes the rounded employment the release holds; ``report`` keeps, per attribute, what
    rounding changed (``round_values``)."""

    def __init__(self, public: pd.DataFrame):
        self.family = CellFamily.of(public)
        self.report: dict[str, dict] = {}

    def __call__(self, attribute: str, values: np.ndarray) -> np.ndarray:
        rounded, self.report[attribute] = round_values(values, self.family)
        return rounded
