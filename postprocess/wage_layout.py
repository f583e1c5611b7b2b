"""Where the wage fit's unknowns sit (``postprocess.wages``): its cells (the plan's cells split by the
finest industry, with the group answers over the plan's cells and the cells an exact answer holds at 0)
and theta, the rates' vector (NAICS-5 rates, NAICS-3 parent rates, county offsets, detail rates), with
the state, rate and county of every establishment and cell."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import Groupings
from gedp.postprocess.structured import cell_to_group_matrix, pinned_at_zero
from gedp.postprocess.wls import LinearSystem

#: The NAICS digits of the parent rate a NAICS-5 rate is pooled toward.
PARENT_DIGITS = 3
#: The finest industry: the model's cells are the plan's cells split by it (county x NAICS-6), and a
#: NAICS-5 industry with several of them gives each its own rate around the NAICS-5 rate.
DETAIL = "naics"


def detail_cells(groupings: Groupings, cell_codes: np.ndarray, rate_codes: np.ndarray,
                 n_rates: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The model's cells: the plan's cells split by the finest industry (DETAIL), each
    establishment's new cell code; and per detail rate (a DETAIL industry of a state whose NAICS-5
    rate group holds several), its rate group; and each establishment's detail rate (-1: none, its
    NAICS-5 group has one DETAIL industry)."""
    if DETAIL not in groupings.public:
        return cell_codes, np.zeros(0, dtype=np.int64), np.full(len(cell_codes), -1)
    detail = groupings((DETAIL,)).codes  # sorted: numbering independent of the row order
    radix = int(detail.max()) + 1
    cells = pd.factorize(cell_codes * radix + detail, sort=True)[0]
    industry, keys = pd.factorize(rate_codes * radix + detail, sort=True)  # as np.unique's inverse, by hashing
    group = keys // radix
    several = np.bincount(group, minlength=n_rates)[group] > 1
    node = np.full(len(keys), -1)
    node[several] = np.arange(np.count_nonzero(several))
    return cells, group[several], node[industry]


def _cell_counties(groupings: Groupings, cell_codes: np.ndarray, n_cells: int) -> np.ndarray | None:
    """Each cell's county (state and county code), or None when the input has no county column or
    a cell spans several counties (a plan whose finest grouping is not within counties)."""
    if "county" not in groupings.public:
        return None
    county = establishment_counties(groupings)
    first, last = np.full(n_cells, county.max() + 1), np.full(n_cells, -1)
    np.minimum.at(first, cell_codes, county)
    np.maximum.at(last, cell_codes, county)
    if np.any(first != last):
        return None
    return pd.factorize(first)[0]


def establishment_counties(groupings: Groupings) -> np.ndarray:
    """Each establishment's county (state and county), numbered in order of first appearance (as the
    texts "state/county" were numbered; validated codes are digits, never missing)."""
    return first_appearance(groupings, ("state", "county"))


def first_appearance(groupings: Groupings, by: tuple[str, ...]) -> np.ndarray:
    """Each establishment's group of ``by``, numbered in order of first appearance (pd.factorize's
    numbering of the key values), from the shared grouping's codes."""
    return pd.factorize(groupings(by).codes)[0]


@dataclass(frozen=True, eq=False)
class ModelCells:
    """The model's cells (the plan's cells split by DETAIL) and the group answers over the plan's cells
    (groups with an exact answer left out)."""

    codes: np.ndarray  # per establishment: its cell
    coarse: np.ndarray  # per cell: its plan cell
    fixed: np.ndarray  # per establishment: held at 0 by an exact answer
    fixed_cells: np.ndarray  # per cell: held at 0 by an exact answer
    c: sp.csr_matrix  # groups x the plan's cells
    b: np.ndarray
    w: np.ndarray


def model_cells(groupings: Groupings, plan_codes: np.ndarray, rate_codes: np.ndarray, n_rates: int,
                system: LinearSystem) -> tuple[ModelCells, np.ndarray, np.ndarray]:
    """The model's cells from each establishment's plan cell ``plan_codes`` and the group answers'
    ``system``; and the detail rates' NAICS-5 groups and each establishment's detail rate (``detail_cells``)."""
    cell_codes, detail_group, establishment_detail = detail_cells(groupings, plan_codes, rate_codes, n_rates)
    n_cells = int(cell_codes.max()) + 1
    coarse_cells = np.zeros(n_cells, dtype=np.int64)  # each cell's plan cell
    coarse_cells[cell_codes] = plan_codes
    exact, fixed = pinned_at_zero(system.matrix, system.b, system.v)
    c = cell_to_group_matrix(system.matrix[~exact] if exact.any() else system.matrix, plan_codes,
                             int(plan_codes.max()) + 1)
    fixed_cells = np.zeros(n_cells, dtype=bool)
    fixed_cells[cell_codes[fixed]] = True
    return (ModelCells(cell_codes, coarse_cells, fixed, fixed_cells, c, system.b[~exact], system.v[~exact]),
            detail_group, establishment_detail)


@dataclass(frozen=True, eq=False)
class ThetaLayout:
    """The layout of theta = (NAICS-5 rates, NAICS-3 parent rates, county offsets, detail rates) and
    the states, rates and counties of the establishments and cells."""

    state: np.ndarray  # per establishment
    n_states: int
    rate_codes: np.ndarray  # per establishment: its group of RATE_QUERY
    cell_state: np.ndarray
    cell_rate: np.ndarray
    cell_county: np.ndarray | None
    cell_node: np.ndarray  # per cell: its prior rate's entry in theta
    rate_state: np.ndarray
    parent: np.ndarray  # per rate: its parent rate
    parent_state: np.ndarray
    county_state: np.ndarray
    detail_group: np.ndarray  # per detail rate: its NAICS-5 rate
    incidence: sp.csr_matrix  # cells x theta: each cell's rate and county offset
    theta_state: np.ndarray
    edges: tuple[np.ndarray, np.ndarray]  # (child, parent) in theta

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """How many rates, parent rates, county offsets and detail rates theta holds."""
        return len(self.rate_state), len(self.parent_state), len(self.county_state), len(self.detail_group)


def theta_layout(groupings: Groupings, rate_answer: NoisyAnswer, rate_codes: np.ndarray, cells: ModelCells,
                 detail_group: np.ndarray, establishment_detail: np.ndarray) -> ThetaLayout:
    """Where each establishment's and cell's state, rate, parent rate and county offset sit in theta."""
    n_cells, n_rates, n_details = len(cells.coarse), len(rate_answer), len(detail_group)
    state = first_appearance(groupings, ("state",))
    cell_state = np.zeros(n_cells, dtype=np.int64)
    cell_state[cells.codes] = state
    cell_rate = np.zeros(n_cells, dtype=np.int64)
    cell_rate[cells.codes] = rate_codes
    rate_state = np.zeros(n_rates, dtype=np.int64)
    rate_state[rate_codes] = state
    parent = pd.factorize(rate_answer.keys["state"].astype(str) + "/"
                          + rate_answer.keys["naics5"].astype(str).str[:PARENT_DIGITS])[0]
    n_parents = int(parent.max()) + 1
    parent_state = np.zeros(n_parents, dtype=np.int64)
    parent_state[parent] = rate_state
    cell_county = _cell_counties(groupings, cells.codes, n_cells)
    n_counties = 0 if cell_county is None else int(cell_county.max()) + 1
    county_state = np.zeros(n_counties, dtype=np.int64)
    first_detail = n_rates + n_parents + n_counties
    cell_node = cell_rate.copy()  # each cell's prior rate in theta: its detail rate, or its NAICS-5 rate
    cell_node[cells.codes] = np.where(establishment_detail >= 0, first_detail + establishment_detail, rate_codes)
    columns = [cell_node]  # theta's entries in each cell's prior rate: its industry's rate, its county's offset
    if cell_county is not None:
        county_state[cell_county] = cell_state
        columns.append(n_rates + n_parents + cell_county)
    incidence = sp.csr_matrix((np.ones(n_cells * len(columns)), (np.tile(np.arange(n_cells), len(columns)),
                                                                  np.concatenate(columns))),
                              shape=(n_cells, first_detail + n_details))
    return ThetaLayout(state=state, n_states=int(state.max()) + 1, rate_codes=rate_codes, cell_state=cell_state,
                       cell_rate=cell_rate, cell_county=cell_county, cell_node=cell_node, rate_state=rate_state,
                       parent=parent, parent_state=parent_state, county_state=county_state, detail_group=detail_group,
                       incidence=incidence,
                       theta_state=np.concatenate([rate_state, parent_state, county_state, rate_state[detail_group]]),
                       edges=(np.concatenate([np.arange(n_rates), first_detail + np.arange(n_details)]),
                         np.concatenate([n_rates + parent, detail_group])))
