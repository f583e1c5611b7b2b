"""Exact structured solver for nested measurement plans (identity + group-by queries).

Every group-by query is a union of the *cells* of the grouping by all query columns together, and
every establishment has its own identity answer (a_j, v_j). The objective

    f(x) = sum_j (x_j - a_j)^2 / v_j + sum_g ((C t)_g - b_g)^2 / w_g,   t = cell totals of x,

with C the (groups x cells) 0/1 matrix, has on any set F of free establishments (the others at 0)
the closed-form minimizer

    x_j = a_j + v_j lambda_c(j),   lambda = C' W (b - C t),   W = diag(1 / w),
    t = q - S C' G^-1 C q,   G = W^-1 + C S C',   S = diag(sum of v_j over free j of each cell),
    q_c = sum over free j in c of (a_j + v_j mu_c),   mu = C' W b,

(Woodbury twice: establishments -> cells -> groups), so each solve costs one factorization of a
groups x groups matrix and a few bincounts over the establishments. Groups that are single cells
(the finest query) only add a diagonal term at the cell level and are folded in first, so G spans
only the groups of several cells: a few hundred for a state, factorized densely. Nonnegativity is handled by
block principal pivoting (Portugal, Judice & Vicente 1994; Kim & Park 2011) with the single-pivot
backup rule that guarantees finite termination. The KKT conditions then hold exactly up to
round-off: free x_j >= 0 with zero gradient, and gradient >= 0 where x_j = 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ContextDecorator
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import splu

from gedp.errors import ConfigError, SolverError

#: Backup rule: full exchanges allowed without progress before single pivots take over.
FULL_EXCHANGE_TRIES = 3
MAX_ITERATIONS = 10_000
#: Iterative refinement steps after the last pivot (each removes most of the remaining round-off).
REFINEMENT_STEPS = 1
#: Up to this many multi-cell groups, G is factorized densely (Cholesky); beyond, sparse LU.
DENSE_GROUPS = 4_000
#: Dense entries (tabulation cells x groups of a block of G) per step of the margins of error's forms.
FORM_ENTRIES = 1 << 22
#: Connected components of G smaller than this are gathered into blocks of up to this many rows (their
#: inverse is block diagonal), so that thousands of tiny components are not visited one by one.
GATHERED_ROWS = 256


@cache
def _blas_threads():
    from threadpoolctl import ThreadpoolController  # imported when first needed: solving, not every command

    return ThreadpoolController()


def _take_blas_control() -> None:
    """Let the calling thread set OpenBLAS's thread count: threadpoolctl (3.8) lets only the first thread
    that set a process-wide OpenBLAS's count set it again while that thread lives, and ignores the others.
    ``one_blas_thread`` sets and restores the count under its own lock, for the whole process, from
    whichever thread enters first or leaves last (a server's request, a dask worker's thread)."""
    for library in _blas_threads().select(user_api="blas").lib_controllers:
        clear = getattr(type(library), "clear_controlling_thread", None)
        if clear is not None:
            clear(force=True)


class _OneBlasThread(ContextDecorator):
    """BLAS on one thread inside ``with one_blas_thread:`` (or a function decorated with it), restored after.

    The dense factorizations are small (a few hundred groups a state), where threads gain nothing, and on a
    busy machine (other work, or states in parallel on dask) every synchronization of BLAS threads can wait
    for a time slice: a 353 x 353 Cholesky took 0.6 s instead of 0.6 ms. BLAS's thread count is a setting of
    the whole process, so overlapping scopes (threads of one dask worker) share one limit: the first to
    enter sets it and the last to leave restores the count found before, whatever order they leave in,
    whichever threads they run in (``_take_blas_control``: before, a scope entered in a thread other than the
    first that set the count did nothing, so a solve overlapping it ran on every thread, with other bits).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._limiter = None

    def __enter__(self) -> _OneBlasThread:
        with self._lock:
            if self._inside == 0:
                _take_blas_control()
                self._limiter = _blas_threads().limit(limits=1, user_api="blas")
            self._inside += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                _take_blas_control()
                self._limiter.restore_original_limits()
                self._limiter = None


one_blas_thread = _OneBlasThread()


class NotNested(ConfigError):
    """A query group is not a union of cells: the structured solver does not apply (a config error
    when the config asks for that solver; ``solver: auto`` falls back instead)."""


def cell_to_group_matrix(groups: sp.csr_matrix, cell_codes: np.ndarray, n_cells: int) -> sp.csr_matrix:
    """C with C[g, c] = 1 when cell c lies inside group g (groups: 0/1 rows over establishments).

    Raises:
        NotNested: some group contains part of a cell only.
    """
    # one entry per establishment, in its cell's column: built as CSR directly (no COO conversion)
    cells = sp.csr_matrix((np.ones(len(cell_codes)), cell_codes, np.arange(len(cell_codes) + 1)),
                          shape=(len(cell_codes), n_cells))
    overlap = (groups @ cells).tocsr().tocoo()  # a product: no repeated entries; in the order of nonzero()
    nonzero = overlap.data != 0
    row, column = overlap.row[nonzero], overlap.col[nonzero]
    sizes = np.bincount(cell_codes, minlength=n_cells)
    if np.any(overlap.data[nonzero] != sizes[column]):
        raise NotNested("a query group splits a cell; use a generic solver")
    return sp.csr_matrix((np.ones(len(row)), (row, column)), shape=overlap.shape)


@one_blas_thread
def solve_nested(
    a: np.ndarray,
    v: np.ndarray,
    cell_codes: np.ndarray,
    c: sp.csr_matrix,
    b: np.ndarray,
    w: np.ndarray,
    *,
    fixed_zero: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """min_{x >= 0} sum (x - a)^2 / v + sum (C t - b)^2 / w, t_c = sum of x_j in cell c.

    Args:
        a, v: identity estimates and their variances (> 0), one per establishment.
        cell_codes: cell of each establishment (0..n_cells-1).
        c: groups x cells 0/1 matrix; b, w: group answers and variances (> 0).
        fixed_zero: establishments held at 0 (excluded from the pivoting).

    Returns:
        The minimizer and the number of pivoting iterations.
    """
    n_cells = c.shape[1]
    mu = c.T @ (b / w)
    free = np.ones(len(a), dtype=bool) if fixed_zero is None else ~fixed_zero
    movable = free.copy()
    tolerance = 1e-12 * max(float(np.max(np.abs(a), initial=0.0)), 1.0)
    a_shifted = _plus_scaled(a, v, mu[cell_codes])  # per free establishment: a_j + v_j mu_c (fixed across pivots)
    best_infeasible, tries = np.inf, FULL_EXCHANGE_TRIES
    # Cell sums over the free establishments, updated from the flipped ones only after the first pass.
    s, q = _free_cell_sums(cell_codes, free, v, a_shifted, n_cells)

    groups = CellGroups.split(c, w)  # C does not change across pivots, only S
    for iteration in range(1, MAX_ITERATIONS + 1):
        operator = CellOperator.at(groups, s)
        t = operator.solve(q)
        lam = c.T @ ((b - c @ t) / w)
        # Unconstrained value a_j + v_j lambda_c: the free x_j, and minus v_j times the gradient of a
        # fixed one, so a free value < 0 or a fixed one > 0 breaks the KKT conditions.
        unconstrained = _plus_scaled(a, v, lam[cell_codes])
        infeasible = movable & np.where(free, unconstrained < -tolerance, unconstrained > tolerance)
        count = int(np.count_nonzero(infeasible))
        if count == 0:
            x = _zero_where_fixed(unconstrained, free)
            for _ in range(REFINEMENT_STEPS):
                x = _refine(x, free, operator, a, v, cell_codes, b, w)
            return np.maximum(x, 0.0, out=x), iteration
        if count < best_infeasible:
            best_infeasible, tries = count, FULL_EXCHANGE_TRIES
            flip = infeasible
        elif tries > 0:
            tries -= 1
            flip = infeasible
        else:  # backup rule: exchange only the last infeasible variable
            flip = np.zeros_like(infeasible)
            flip[np.flatnonzero(infeasible)[-1]] = True
        flipped = np.flatnonzero(flip)
        sign = np.where(free[flipped], -1.0, 1.0)  # free -> fixed removes, fixed -> free adds
        s += np.bincount(cell_codes[flipped], weights=sign * v[flipped], minlength=n_cells)
        q += np.bincount(cell_codes[flipped], weights=sign * a_shifted[flipped], minlength=n_cells)
        free = free ^ flip
    raise SolverError(f"block principal pivoting did not finish in {MAX_ITERATIONS} iterations")


def _free_cell_sums(cell_codes, free, v, a_shifted, n_cells) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, over its free establishments: the sum of v_j (S) and of a_j + v_j mu_c (q)."""
    if free.all():  # the values themselves: no zeroed copies
        return (np.bincount(cell_codes, weights=v, minlength=n_cells),
                np.bincount(cell_codes, weights=a_shifted, minlength=n_cells))
    return (np.bincount(cell_codes, weights=np.where(free, v, 0.0), minlength=n_cells),
            np.bincount(cell_codes, weights=np.where(free, a_shifted, 0.0), minlength=n_cells))


def _plus_scaled(a: np.ndarray, v: np.ndarray, gathered: np.ndarray) -> np.ndarray:
    """a + v * gathered, computed in ``gathered`` (a fresh array the caller gives up): the same bits
    without two temporaries of the establishments' length."""
    gathered *= v
    gathered += a
    return gathered


def _zero_where_fixed(values: np.ndarray, free: np.ndarray) -> np.ndarray:
    """np.where(free, values, 0.0), in ``values`` (a fresh array the caller gives up)."""
    if not free.all():
        values[~free] = 0.0
    return values


@one_blas_thread
def unbounded_cell_totals(a: np.ndarray, v: np.ndarray, cell_codes: np.ndarray, groups: sp.csr_matrix,
                          b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The cell totals t of min sum (x - a)^2 / v + sum (C t - b)^2 / w without the bounds x >= 0
    (arguments as ``solve_structured_wls``; zero-variance groups still pin their establishments at
    0): the generalized least squares totals, linear in the answers, so unbiased where they are."""
    exact, fixed = pinned_at_zero(groups, b, w)
    n_cells = int(cell_codes.max()) + 1 if len(cell_codes) else 0
    c = cell_to_group_matrix(groups[~exact], cell_codes, n_cells)
    b, w = b[~exact], w[~exact]
    s, q = _free_cell_sums(cell_codes, ~fixed, v, a + v * (c.T @ (b / w))[cell_codes], n_cells)
    return CellOperator(c, w, s).solve(q)


def _refine(x, free, operator: CellOperator, a, v, cell_codes, b, w) -> np.ndarray:
    """One step of iterative refinement on the final free set: solve H_FF d = -g_F with the same
    operator, factorized already (answers a' = -g v, group answers 0) to remove the round-off of the
    first solve."""
    c = operator.c
    n_cells = c.shape[1]
    lam = c.T @ ((b - c @ np.bincount(cell_codes, weights=x, minlength=n_cells)) / w)
    correction_a = x - a  # then the gradient (x - a) / v - lambda_c on the free, then -gradient v
    correction_a /= v
    correction_a -= lam[cell_codes]
    correction_a = _zero_where_fixed(correction_a, free)
    np.negative(correction_a, out=correction_a)
    correction_a *= v
    q = np.bincount(cell_codes, weights=correction_a, minlength=n_cells)  # correction_a is -0 where fixed
    t = operator.solve(q)
    lam_correction = c.T @ (-(c @ t) / w)
    step = _zero_where_fixed(_plus_scaled(correction_a, v, lam_correction[cell_codes]), free)
    step += x
    return step


@dataclass(frozen=True, eq=False)
class DenseFactor:
    """A Cholesky factor (``scipy.linalg.cho_factor``) of a dense positive definite matrix; solves with it."""

    factor: np.ndarray
    lower: bool

    def __call__(self, right: np.ndarray) -> np.ndarray:
        """The matrix's inverse times ``right``."""
        return scipy.linalg.cho_solve((self.factor, self.lower), right)


@dataclass(frozen=True, eq=False)
class DenseInverse:
    """The explicit inverse of a symmetric block; part -> (inverse part)' for sparse parts."""

    inverse: np.ndarray

    def __call__(self, part: sp.spmatrix) -> np.ndarray:
        """(inverse part)' (the inverse is symmetric)."""
        return part.T @ self.inverse


@dataclass(frozen=True, eq=False)
class GroupFactorizations:
    """A ``CellOperator``'s factorizations of its multi-cell groups' matrix G, when all are dense (kept
    with a margin structure: they depend on the operator's inputs only)."""

    solve_groups: DenseFactor
    group_blocks: tuple[tuple[np.ndarray, DenseInverse], ...]


@dataclass(frozen=True, eq=False)
class CellGroups:
    """The groups x cells matrix C and the groups' variances w, split into the single-cell groups (their
    precisions summed per cell: ``diagonal``) and the multi-cell ones (``c_multi``, ``w_multi``)."""

    c: sp.csr_matrix
    w: np.ndarray
    diagonal: np.ndarray
    c_multi: sp.csr_matrix
    w_multi: np.ndarray

    @classmethod
    def split(cls, c: sp.csr_matrix, w: np.ndarray) -> CellGroups:
        """C and w split by the number of cells in each group."""
        single = np.diff(c.indptr) == 1
        diagonal = np.bincount(c[single].indices, weights=1.0 / w[single], minlength=c.shape[1])
        return cls(c, w, diagonal, c[~single], w[~single])


class CellOperator:
    """Solves (I + S C' W C) t = p at the cell level for fixed cell variances S (may be inf).

    Groups that are single cells contribute a diagonal E to C' W C and are folded in first:
    (I + S' C_m' W_m C_m) t = p' with S' = S / (1 + S E) and p' = p / (1 + S E); the multi-cell
    groups C_m then take one Woodbury step through G = W_m^-1 + C_m S' C_m', factorized once.
    With S = inf (no identity answers), S' = 1/E and ``inverse_m_forms`` gives forms of M^-1, M = C' W C.
    """

    def __init__(self, c: sp.csr_matrix, w: np.ndarray, s: np.ndarray, kept: GroupFactorizations | None = None):
        self._setup(CellGroups.split(c, w), s, kept)

    @classmethod
    def at(cls, groups: CellGroups, s: np.ndarray, kept: GroupFactorizations | None = None) -> CellOperator:
        """The operator of ``groups`` (split already: callers with one C and several S split it once) at S."""
        operator = cls.__new__(cls)
        operator._setup(groups, s, kept)
        return operator

    def _setup(self, groups: CellGroups, s: np.ndarray, kept: GroupFactorizations | None) -> None:
        self.c, self.w, self.kept = groups.c, groups.w, kept
        self._last_left: tuple | None = None  # (left, left' S' C_m') of the last left_solve
        self.diagonal, self.c_multi, self.w_multi = groups.diagonal, groups.c_multi, groups.w_multi
        with np.errstate(divide="ignore", invalid="ignore"):
            self.shrink = np.where(np.isinf(s), 0.0, 1.0 / (1.0 + s * self.diagonal))
            self.s_folded = np.where(np.isinf(s), 1.0 / self.diagonal, s * self.shrink)
        if np.any(~np.isfinite(self.s_folded)):
            raise NotNested("a cell without identity answers is in no single-cell group: its total is not estimable")

    @cached_property
    def _solve_groups(self) -> Callable[[np.ndarray], np.ndarray]:
        if self.kept is not None:
            return self.kept.solve_groups
        return _group_solver(self.c_multi, self.w_multi, self.s_folded)

    def factorizations(self) -> GroupFactorizations | None:
        """The factorizations of G (made now if not yet), or None where one is a sparse LU (not kept)."""
        solve, blocks = self._solve_groups, self._group_blocks
        if not isinstance(solve, DenseFactor) or not all(isinstance(block, DenseInverse) for _, block in blocks):
            return None
        return GroupFactorizations(solve, tuple(blocks))  # type: ignore[arg-type]

    def _woodbury(self, folded: np.ndarray) -> np.ndarray:
        s_folded = self.s_folded if folded.ndim == 1 else self.s_folded[:, None]
        return folded - s_folded * (self.c_multi.T @ self._solve_groups(self.c_multi @ folded))

    def solve(self, p: np.ndarray) -> np.ndarray:
        """t = (I + S M)^-1 p for a vector or a (cells x k) matrix p."""
        return self._woodbury(p * (self.shrink if p.ndim == 1 else self.shrink[:, None]))

    def forms_after_solve(self, p: sp.spmatrix) -> np.ndarray:
        """p_T' M (I + S M)^-1 p_T for every column p_T of ``p`` (cells x tabulations).

        With the single-cell groups folded in, M (I + S M)^-1 = diag(E D) + D C_m' G^-1 C_m D, D = diag(shrink)
        (Woodbury, and C_m S' C_m' = G - W_m^-1), so each form is a weighted sum of squares over the
        column's cells plus y' G^-1 y, y = C_m D p_T: no dense cells x tabulations block.
        """
        scaled = sp.diags(self.shrink) @ p
        return _column_forms(p, self.diagonal * self.shrink) + self._group_forms(self.c_multi @ scaled)

    def left_solve(self, left: sp.spmatrix, p: sp.spmatrix) -> np.ndarray:
        """left' (I + S M)^-1 p, dense (columns of left x columns of p), without a dense cells x columns
        block: (I + S M)^-1 p = f - S' C_m' G^-1 C_m f with f = D p (Woodbury, as ``solve``)."""
        f = sp.diags(self.shrink) @ p
        direct = (left.T @ f).toarray()
        if self.c_multi.shape[0] == 0:
            return direct
        if self._last_left is None or self._last_left[0] is not left:  # callers solve several p with one left
            self._last_left = (left, left.T @ sp.diags(self.s_folded) @ self.c_multi.T)
        through_groups = self._last_left[1]
        return direct - through_groups @ self._solve_groups((self.c_multi @ f).toarray())

    def weighted_forms(self, p: sp.spmatrix, q: sp.spmatrix, weights: np.ndarray) -> np.ndarray:
        """b_T' diag(weights) b_T - 2 b_T' q_T with b_T = M (I + S M)^-1 p_T, for every column of ``p``
        and ``q`` (cells x tabulations; weights of either sign).

        With M (I + S M)^-1 = diag(f) + D C_m' G^-1 C_m D (f = E D, ``forms_after_solve``) and
        a = G^-1 C_m D p_T: sum over cells of (weights f^2 p^2 - 2 f p q), less 2 a' C_m D (q - weights f p),
        plus a' N a with N = C_m D diag(weights) D C_m' (N lies within G's blocks: a cell with weight
        has a variance, so its groups are joined in G).
        """
        p, q = sp.csc_matrix(p), sp.csc_matrix(q)
        f = self.diagonal * self.shrink
        out = (_column_forms(p, weights * f**2)
               - 2 * np.asarray(p.multiply(sp.diags(f) @ q).sum(axis=0)).ravel())
        if self.c_multi.shape[0] == 0:
            return out
        scaled = self.c_multi @ sp.diags(self.shrink)
        r = (scaled @ p).tocsr()
        rv = (scaled @ (q - sp.diags(weights * f) @ p)).tocsr()
        n = (scaled @ sp.diags(weights) @ scaled.T).tocsr()
        for rows, solve_transposed in self._group_blocks:
            block, block_v, block_n = r[rows].tocsc(), rv[rows].tocsc(), n[rows][:, rows]
            columns = np.flatnonzero(np.diff(block.indptr))
            step = max(1, FORM_ENTRIES // len(rows))
            for start in range(0, len(columns), step):
                chosen = columns[start:start + step]
                a = solve_transposed(block[:, chosen])  # chosen x rows: (G^-1 r)'
                out[chosen] += (np.einsum("ij,ij->i", a, np.asarray(block_n @ a.T).T)
                                - 2 * np.asarray(block_v[:, chosen].T.multiply(a).sum(axis=1)).ravel())
        return out

    def inverse_m_forms(self, p: sp.spmatrix) -> np.ndarray:
        """p_T' M^-1 p_T for every column (valid where S = inf): M^-1 = S' - S' C_m' G^-1 C_m S'."""
        return _column_forms(p, self.s_folded) - self._group_forms(self.c_multi @ (sp.diags(self.s_folded) @ p))

    def _group_forms(self, y: sp.spmatrix) -> np.ndarray:
        """y_T' G^-1 y_T for every column of y (multi-cell groups x tabulations), block by block of G
        (its connected components: one per state for the shipped plans), a few columns at a time."""
        y = sp.csr_matrix(y)
        out = np.zeros(y.shape[1])
        if y.shape[0] == 0:
            return out
        for rows, solve_transposed in self._group_blocks:
            block = y[rows].tocsc()
            columns = np.flatnonzero(np.diff(block.indptr))
            step = max(1, FORM_ENTRIES // len(rows))
            for start in range(0, len(columns), step):
                chosen = columns[start:start + step]
                part = block[:, chosen]
                out[chosen] += np.asarray(part.T.multiply(solve_transposed(part)).sum(axis=1)).ravel()
        return out

    @cached_property
    @one_blas_thread
    def _group_blocks(self) -> list[tuple[np.ndarray, Callable[[sp.spmatrix], np.ndarray]]]:
        """Each diagonal block of G (its rows) with a function part -> (G_block^-1 part)' for sparse parts:
        through the block's explicit inverse (a sparse-times-dense product, cost nnz(part) x block size)
        up to DENSE_GROUPS rows, else by a sparse LU on dense columns."""
        if self.kept is not None:
            return list(self.kept.group_blocks)
        g = _group_matrix(self.c_multi, self.w_multi, self.s_folded).tocsr()
        n_blocks, labels = connected_components(g, directed=False)
        blocks = []
        for rows in _gathered(np.split(np.argsort(labels, kind="stable"), np.cumsum(np.bincount(labels))[:-1])):
            block = g[rows][:, rows]
            if len(rows) <= DENSE_GROUPS:
                inverse = scipy.linalg.cho_solve(scipy.linalg.cho_factor(block.toarray()), np.eye(len(rows)))
                blocks.append((rows, DenseInverse(inverse)))
            else:
                lu = splu(block.tocsc(), permc_spec="MMD_AT_PLUS_A")
                blocks.append((rows, lambda part, lu=lu: lu.solve(part.toarray()).T))
        return blocks


def _gathered(components: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The rows of G's blocks: each component of at least GATHERED_ROWS rows alone, the smaller ones
    gathered, in order, into blocks of at most GATHERED_ROWS rows."""
    out: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    pending_rows = 0
    for rows in components:
        if len(rows) >= GATHERED_ROWS:
            out.append(rows)
            continue
        if pending_rows + len(rows) > GATHERED_ROWS:
            out.append(np.concatenate(pending))
            pending, pending_rows = [], 0
        pending.append(rows)
        pending_rows += len(rows)
    if pending:
        out.append(np.concatenate(pending))
    return out


def _column_forms(p: sp.spmatrix, weights: np.ndarray) -> np.ndarray:
    """p_T' diag(weights) p_T for every column of p."""
    return np.asarray(p.multiply(sp.diags(weights) @ p).sum(axis=0)).ravel()


def _group_matrix(c: sp.csr_matrix, w: np.ndarray, s: np.ndarray) -> sp.spmatrix:
    """G = W^-1 + C S C' over the multi-cell groups."""
    return sp.diags(w) + c @ sp.diags(s) @ c.T


def _group_solver(c: sp.csr_matrix, w: np.ndarray, s: np.ndarray):
    """A function solving (W^-1 + C S C') z = right for the multi-cell groups (factorized once)."""
    if c.shape[0] == 0:
        return lambda right: np.zeros((0, *right.shape[1:]))
    g = _group_matrix(c, w, s)
    if c.shape[0] <= DENSE_GROUPS:
        return DenseFactor(*scipy.linalg.cho_factor(g.toarray()))
    lu = splu(g.tocsc(), permc_spec="MMD_AT_PLUS_A")
    return lu.solve


def pinned_at_zero(rows: sp.csr_matrix, answers: np.ndarray, variances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of zero variance and the establishments they pin at 0.

    A zero variance only arises for pnc groups whose clip level is 0 (the exact answer is then 0):
    with x >= 0 that pins every establishment of the group at 0, which every solver and the
    margins of error impose directly.
    """
    exact = variances <= 0
    if np.any(answers[exact] != 0):
        raise ValueError("an answer with variance 0 is not 0; zero variance is only valid for empty clipped sums")
    fixed = np.zeros(rows.shape[1], dtype=bool)
    if exact.any():
        fixed[rows[exact].indices] = True
    return exact, fixed


def solve_structured_wls(
    a: np.ndarray,
    v: np.ndarray,
    cell_codes: np.ndarray,
    groups: sp.csr_matrix,
    b: np.ndarray,
    w: np.ndarray,
    cells_inside: Callable[[], sp.csr_matrix] | None = None,
) -> tuple[np.ndarray, int, float]:
    """Structured solve from group rows over establishments; zero-variance groups pin their
    establishments at 0. Returns the values, the iterations and the seconds taken. ``cells_inside``
    gives ``cell_to_group_matrix`` of all the group rows, made already (used when no row is exact)."""
    start = time.perf_counter()
    exact, fixed = pinned_at_zero(groups, b, w)
    n_cells = int(cell_codes.max()) + 1 if len(cell_codes) else 0
    if exact.any():  # else all rows: no copy
        groups, b, w = groups[~exact], b[~exact], w[~exact]
        cells_inside = None  # made for all the group rows, not these
    c = cell_to_group_matrix(groups, cell_codes, n_cells) if cells_inside is None else cells_inside()
    values, iterations = solve_nested(a, v, cell_codes, c, b, w, fixed_zero=fixed)
    return values, iterations, time.perf_counter() - start
