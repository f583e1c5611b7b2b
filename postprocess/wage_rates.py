"""The industry rates the wage fit's cell priors share (``postprocess.wages``, steps 2-3), as latent
variables of its least squares: the cell-level operator of the model's cells inside the plan's cells,
the blocks of the rates' system and their solve (Woodbury through the cell operator), and the priors'
part of the Hessian over the rates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from gedp.postprocess.structured import FORM_ENTRIES, CellGroups, CellOperator, GroupFactorizations


@dataclass(frozen=True, eq=False)
class SharedRates:
    """The industry rates as latent variables of the cell-level least squares (steps 2-3).

    theta = (the NAICS-5 rates, the NAICS-3 parent rates, the county offsets). ``links`` (cells x
    theta) holds E_c / vp_c at each cell's rate and county offset (the Hessian's cross term is
    -links); ``precision`` is theta's own block of the Hessian; ``blocks`` holds, per state, its theta
    indices and the Cholesky factor of the Schur complement M = precision - links' K^-1 links (K: the
    Hessian's cell block).
    """

    links: sp.csr_matrix
    precision: sp.csr_matrix
    blocks: tuple[tuple[np.ndarray, tuple], ...]

    def correlated_forms(self, operator: CellsInPlanCells, p: sp.csc_matrix) -> np.ndarray:
        """z' M^-1 z with z = links' K^-1 g for every column of p = D g (K^-1 g = (I + D M_c)^-1 p, the
        cell operator's solve): what the rates' uncertainty adds to the variance of each tabulation g' t
        (Woodbury), a few columns at a time."""
        out = np.zeros(p.shape[1])
        step = max(1, FORM_ENTRIES // max(self.links.shape[1], 1))
        for start in range(0, p.shape[1], step):
            z = operator.left_solve(self.links, p[:, start:start + step])
            for index, (factor, lower) in self.blocks:
                # z' M^-1 z = |L^-1 z|^2 with M = L L' (one triangular solve, not cho_solve's two)
                half = scipy.linalg.solve_triangular(factor, z[index], trans=0 if lower else 1, lower=lower,
                                                     check_finite=False)
                out[start:start + step] += np.sum(half**2, axis=0)
        return out


class CellsInPlanCells:
    """``CellOperator`` one level down: solves (I + S A' M A) t = p for the model's cells, each inside
    one of the plan's cells (A: plan cells x cells, 0/1; M = C' W C over the plan's cells), through the
    plan-level operator at S_c = A S A' (push-through: A' M A (I + S A' M A)^-1 = A' M (I + S_c M)^-1 A,
    and M (I + S_c M)^-1 = S_c^-1 (I - (I + S_c M)^-1) on the rows with S_c > 0). The groups' system
    keeps its size: the plan's cells, not the model's finer ones."""

    def __init__(self, c: sp.csr_matrix, w: np.ndarray, s: np.ndarray, coarse_cells: np.ndarray,
                 kept: GroupFactorizations | None = None):
        self._setup(CellGroups.split(c, w), cells_inside(coarse_cells, c.shape[1]), s, kept)

    @classmethod
    def at(cls, groups: CellGroups, inside: sp.csr_matrix, s: np.ndarray) -> CellsInPlanCells:
        """The operator of the plan's ``groups`` (split already) and the cells ``inside`` the plan's
        (``cells_inside``) at the cells' variances S: callers with one layout and several S build those once."""
        operator = cls.__new__(cls)
        operator._setup(groups, inside, s, None)
        return operator

    def _setup(self, groups: CellGroups, inside: sp.csr_matrix, s: np.ndarray,
               kept: GroupFactorizations | None) -> None:
        self.a, self.s = inside, s
        coarse_s = self.a @ s
        self.coarse = CellOperator.at(groups, coarse_s, kept)
        self.inverse = np.divide(1.0, coarse_s, out=np.zeros(len(coarse_s)), where=coarse_s > 0)
        self._last_left: tuple | None = None  # (left, its coarse_left) of the last left_solve

    def _coarse_left(self, left: sp.spmatrix) -> sp.csc_matrix:
        """S_c^-1 A S left, kept for the last ``left`` (callers solve several p with one left)."""
        if self._last_left is None or self._last_left[0] is not left:
            self._last_left = (left, (sp.diags(self.inverse) @ self.a @ sp.diags(self.s) @ left).tocsc())
        return self._last_left[1]

    def left_solve(self, left: sp.spmatrix, p: sp.spmatrix) -> np.ndarray:
        """left' (I + S A' M A)^-1 p, dense (columns of left x columns of p)."""
        coarse_p = (self.a @ p).tocsc()
        coarse_left = self._coarse_left(left)
        return ((left.T @ p).toarray() - (coarse_left.T @ coarse_p).toarray()
                + self.coarse.left_solve(coarse_left, coarse_p))

    def forms_after_solve(self, p: sp.spmatrix) -> np.ndarray:
        """p_T' A' M A (I + S A' M A)^-1 p_T for every column p_T of ``p`` (cells x tabulations)."""
        return self.coarse.forms_after_solve((self.a @ p).tocsc())

    def noise_forms(self, g: sp.spmatrix, weights: np.ndarray) -> np.ndarray:
        """sum_j eps_j ((K^-1 g_T)_j)^2 for every column g_T of ``g`` (cells x tabulations), K = S^-1 +
        A' M A, ``weights`` = eps S^2 per cell (either sign): the noise part of the sandwich
        K^-1 (K + diag(eps)) K^-1. K^-1 g = S (g - A' b) with b = M (I + S_c M)^-1 A S g (push-through), so
        the form is sum_j weights_j g_j^2 + b' diag(A weights) b - 2 b' A diag(weights) g, the plan-level
        part from ``CellOperator.weighted_forms``."""
        g = sp.csc_matrix(g)
        u = (self.a @ sp.diags(self.s) @ g).tocsc()
        q = (self.a @ sp.diags(weights) @ g).tocsc()
        own = np.asarray(g.multiply(g).T @ weights).ravel()
        return own + self.coarse.weighted_forms(u, q, self.a @ weights)


def cells_inside(coarse_cells: np.ndarray, n_coarse: int) -> sp.csr_matrix:
    """A: plan cells x cells, 1 where the cell lies in the plan cell."""
    n_cells = len(coarse_cells)
    return sp.csr_matrix((np.ones(n_cells), (coarse_cells, np.arange(n_cells))), shape=(n_coarse, n_cells))


@dataclass(frozen=True, eq=False)
class RateBlock:
    """One block of the rates' system (``solve_rates``; a state's, when every query groups by state):
    its cells, its entries in theta, its plan's groups and the cells inside its plan's cells."""

    cells: np.ndarray
    index: np.ndarray
    groups: CellGroups
    inside: sp.csr_matrix


def rate_system_blocks(c: sp.csr_matrix, w: np.ndarray, cell_state: np.ndarray, coarse_cells: np.ndarray,
                       theta_state: np.ndarray) -> tuple[RateBlock, ...]:
    """The blocks of the rates' system (``c`` over the plan's cells, ``coarse_cells`` each cell's): one
    per state when every query groups by state (the shipped plans), otherwise one for all states. Made
    once per fit: every pass solves the same blocks at other variances."""
    coarse_state = np.zeros(c.shape[1], dtype=np.int64)
    coarse_state[coarse_cells] = cell_state
    row_state = coarse_state[c.indices[c.indptr[:-1]]]
    if np.any(coarse_state[c.indices] != np.repeat(row_state, np.diff(c.indptr))):  # a query across states
        cell_state, coarse_state, row_state, theta_state = (
            np.zeros_like(codes) for codes in (cell_state, coarse_state, row_state, theta_state))
    blocks = []
    for state in range(int(cell_state.max()) + 1):
        cells, rows = np.flatnonzero(cell_state == state), np.flatnonzero(row_state == state)
        coarse = np.flatnonzero(coarse_state == state)
        blocks.append(RateBlock(cells, np.flatnonzero(theta_state == state),
                                CellGroups.split(c[rows][:, coarse], w[rows]),
                                cells_inside(np.searchsorted(coarse, coarse_cells[cells]), len(coarse))))
    return tuple(blocks)


def solve_rates(rate_blocks: Sequence[RateBlock], cell_variance: np.ndarray, links: sp.csr_matrix,
                precision: sp.csr_matrix, right: np.ndarray, rate_prior: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The rates theta of the joint least squares with the cell totals unconstrained, their posterior
    variances, and the per-block factors (``SharedRates.blocks``).

    Eliminating the cells (t = K^-1 (right + links theta)) leaves M theta = links' K^-1 right +
    rate_prior, M = precision - links' K^-1 links; links' K^-1 x = links' (I + D M_c)^-1 D x comes
    from the cell operator (``CellsInPlanCells.left_solve``: sparse products and the multi-cell groups'
    G^-1) with D = ``cell_variance``. K is block diagonal by the ``rate_blocks`` (``rate_system_blocks``):
    one small dense system per block.
    """
    theta, variance, blocks = np.zeros(len(rate_prior)), np.zeros(len(rate_prior)), []
    for block in rate_blocks:
        cells, index = block.cells, block.index
        operator = CellsInPlanCells.at(block.groups, block.inside, cell_variance[cells])
        link, variance_of = _part(links, cells, index).tocsc(), sp.diags(cell_variance[cells])
        factor = scipy.linalg.cho_factor(_part(precision, index, index).toarray()
                                         - operator.left_solve(link, variance_of @ link))
        link_right = operator.left_solve(link, sp.csc_matrix(variance_of @ right[cells][:, None]))[:, 0]
        theta[index] = scipy.linalg.cho_solve(factor, link_right + rate_prior[index])
        variance[index] = np.diag(scipy.linalg.lapack.dpotri(*factor)[0])  # diag of M^-1 from its Cholesky factor
        blocks.append((index, factor))
    return theta, variance, tuple(blocks)


def _part(matrix: sp.csr_matrix, rows: np.ndarray, columns: np.ndarray) -> sp.csr_matrix:
    """matrix[rows][:, columns] for sorted distinct ``rows`` and ``columns``: the matrix itself (no copy)
    where they are all its rows and columns (one block: a fit of one state)."""
    if len(rows) == matrix.shape[0] and len(columns) == matrix.shape[1]:
        return matrix
    return matrix[rows][:, columns]


def prior_precision(children: np.ndarray, parents: np.ndarray, edge_variance: np.ndarray,
                    own_variance: np.ndarray) -> sp.csr_matrix:
    """The priors' part of the Hessian over theta = (rates, parent rates, county offsets, detail
    rates): (theta_i - theta_j)^2 / v for each edge (a rate and its parent rate, a detail rate and
    its NAICS-5 rate), and theta_i^2 / own_i for the parents' vague priors and the county offsets
    (inf: no own prior)."""
    n_theta = len(own_variance)
    inverse = 1.0 / edge_variance
    diagonal = (1.0 / own_variance + np.bincount(children, weights=inverse, minlength=n_theta)
                + np.bincount(parents, weights=inverse, minlength=n_theta))
    return sp.csr_matrix((np.concatenate([diagonal, -inverse, -inverse]),
                          (np.concatenate([np.arange(n_theta), children, parents]),
                           np.concatenate([np.arange(n_theta), parents, children]))), shape=(n_theta, n_theta))


def parent_deviations(parent: np.ndarray, theta: np.ndarray, blocks: Sequence[tuple[np.ndarray, tuple]]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Each NAICS-5 rate's deviation from its parent rate (``parent``: each rate's, theta = (rates,
    parent rates, ...)) and that deviation's posterior variance (``difference_variances``)."""
    children, parents = np.arange(len(parent)), len(parent) + parent
    return theta[children] - theta[parents], difference_variances(blocks, children, parents)


def difference_variances(blocks: Sequence[tuple[np.ndarray, tuple]], children: np.ndarray, parents: np.ndarray
                         ) -> np.ndarray:
    """Var(theta_child - theta_parent) for each pair (``children``, ``parents``: theta indices of one
    block each) under theta's posterior covariance M^-1 (``solve_rates``' per-block factors, M = L L'):
    |L^-1 (e_child - e_parent)|^2."""
    out = np.zeros(len(children))
    for index, (factor, lower) in blocks:
        pairs = np.flatnonzero(np.isin(children, index))
        if len(pairs) == 0:
            continue
        where = np.searchsorted(index, children[pairs]), np.searchsorted(index, parents[pairs])
        difference = np.zeros((len(index), len(pairs)))
        difference[where[0], np.arange(len(pairs))] = 1.0
        difference[where[1], np.arange(len(pairs))] -= 1.0
        half = scipy.linalg.solve_triangular(factor, difference, trans=0 if lower else 1, lower=lower,
                                             check_finite=False)
        out[pairs] = np.sum(half**2, axis=0)
    return out
