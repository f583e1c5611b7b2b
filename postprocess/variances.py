"""Variances of tabulations of protected microdata from the weighted least squares (their margins of error).

The weighted least squares estimate x^ has covariance H^-1, H = A' W A, for the measured queries A
and weights W = diag(1 / variance) of the release; a tabulation c'x^ has variance c' H^-1 c. This
ignores the bounds x >= 0; where they bind (small establishments at low mu), the identity variances
are shrunk first (below), and the coverage study measures how well the intervals hold.

With identity answers (variances v_j), H = D + B' M B with D = diag(1 / v), B the establishments ->
cells map and M = C' W C; Woodbury gives, for a tabulation T with p_c = sum of v_j over j in T and c,

    Var(T) = sum_{j in T} v_j - p' M (I + S M)^-1 p,    S = diag(cell sums of v),

computed for all tabulation cells at once with the same cell operator as the structured solver.
Without identity answers, only unions of measured cells are estimable: Var(T) = 1_T' M^-1 1_T.
No dense inverse is formed.

Where the identity answers' variances are stated at levels estimated from their own noise (the
smoothed months: ``NoisyAnswer.variance_slope``), Var(T) is too small exactly when the noise pulled
T^ down, and symmetric intervals z sqrt(Var(T)) under-cover small cells (91% at 1-10 employees on
Rhode Island). Linearly, the variance at the true total is Var(T) + g (T - T^), with g the
regression of the stated variance on the error: g = rho^2 sum v_j s_j / sum v_j over T's
establishments, s_j = d v_j / d level, rho = Var(T) / sum v_j (the identity answers' share of T^).
The score interval |T^ - T| <= z sqrt(Var(T) + g (T - T^)) has half-width z sqrt(Var(T) + (z g / 2)^2)
(a Wilson interval); the margin of error is that half-width (``CellVariances.half_width``). g is 0
for pnc answers (exact variances) and for variances taken from other answers (pooled months).

The bounds x >= 0 make an establishment's protected value err less than its identity variance v_j
says where the noise is large against its value (the solve holds it at or near 0). From the release
alone, each establishment's unconstrained value u_j = a_j + v_j lambda_c(j) (its identity answer
moved by the group answers' residuals at the protected values, lambda = C' W (b - C t): the value it
has where free, <= 0 where held at 0) gives, with a flat prior on its true value x_j >= 0, x_j ~
N(u_j, v_j) truncated to x_j >= 0, and the expected squared error of the protected value max(u_j, 0)
is v_j f(u_j / sqrt(v_j)) (``bounded_error_factor``: f(k) = 1 - k l(k) for k >= 0, 1 + k l(k) + k^2
for k < 0, l = phi / Phi: 1 at the bound and far above it, 0.71 one sd above, 0.47 one sd below, -> 0
far below). With the protected values given (``values``), v_j f enters every cell's variance in
place of v_j, and s_j f its slope (the variance of a value held near 0 barely moves with the
level): a cell held at the bound keeps a positive margin. Nothing is fitted: the flat prior and the
release's answers are all it takes.

Smoothed months also share errors within county x NAICS-6 cells (``NoisyAnswer.pattern_loading``,
sd a_j): Var(T) adds rho^2 sum over those cells c of (sum_{j in T and c} a_j)^2 - sum a_j^2, exact
with identity answers only (rho = 1); with group answers rho^2 approximates how the least squares
passes the shared errors on (it weighs every identity answer of T alike: the state total's part
comes out about half of a dense computation's on a small nested instance, a cell's close to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import special

from gedp.measure.answers import NoisyAnswer
from gedp.postprocess.months import pattern_cells as month_pattern_cells
from gedp.postprocess.structured import (
    CellOperator,
    cell_to_group_matrix,
    pinned_at_zero,
)
from gedp.postprocess.wls import LinearSystem, build_system, system_structure


@dataclass(frozen=True)
class CellVariances:
    """Variances of tabulation cells (NaN where not estimable) and the slopes g of those variances
    in the cells' true totals (module docstring; 0 where the variances do not move with the noise)."""

    variance: np.ndarray
    slope: np.ndarray

    def half_width(self, z: float) -> np.ndarray:
        """Margins of error at normal quantile ``z``: the score interval's half-width."""
        return z * np.sqrt(self.variance + (z * self.slope / 2) ** 2)


@dataclass(frozen=True, eq=False)
class EstablishmentVariances:
    """What the variances of any tabulation of one attribute's least squares need, per establishment
    and per cell of the grouping by all measured columns: a function of the release's answers and
    public columns only, built once and applied to any tabulation (``__call__``).

    Attributes:
        v: identity variance per establishment (inf without one; 0 where an exact answer fixes it).
        slope: d v / d level per establishment (0 where the variances do not move with the noise).
        cell_codes: each establishment's cell of the grouping by all measured columns.
        groups: the group rows over the cells (C; identity rows and exact answers left out).
        group_variance: their variances (w).
        identity: whether the plan has identity answers.
        moving: whether the identity variances move with the answers' noise (slopes stated).
        loading: sd of each establishment's error shared within its ``pattern_cells`` cell (0 where
            fixed), or None: no shared errors.
        pattern_cells: each establishment's cell of shared errors (None without loadings).
    """

    v: np.ndarray
    slope: np.ndarray
    cell_codes: np.ndarray
    groups: sp.csr_matrix
    group_variance: np.ndarray
    identity: bool
    moving: bool
    loading: np.ndarray | None = None
    pattern_cells: np.ndarray | None = None

    def __call__(self, tab_codes: np.ndarray, n_tab: int, *, establishments: np.ndarray | None = None,
                 coefficients: np.ndarray | None = None) -> CellVariances:
        """Variance of every tabulation cell total (NaN where not estimable), and its slope.

        Args:
            tab_codes: each establishment's tabulation cell (0..n_tab-1; -1 for none), or with
                ``establishments``, each entry's.
            n_tab: the number of tabulation cells.
            establishments: entries (establishment, tab_codes[i], coefficients[i]) instead of one per
                establishment: a cell total is then sum over its entries of coefficient x value, and an
                establishment may enter several cells (a job tabulation's worker categories).
            coefficients: each entry's coefficient (default 1).
        """
        cell_codes, v = self.cell_codes, self.v
        n_cells = int(cell_codes.max()) + 1
        inside = tab_codes >= 0
        entry = (np.arange(len(v)) if establishments is None else np.asarray(establishments))[inside]
        coefficient = np.ones(len(entry)) if coefficients is None else np.asarray(coefficients, dtype=float)[inside]
        tab = tab_codes[inside]
        if not self.identity:
            return CellVariances(_group_variances(self.groups, self.group_variance, cell_codes, entry, coefficient,
                                                  tab, n_tab, uneven=coefficients is not None), np.zeros(n_tab))
        operator = self._operator
        base = np.bincount(tab, weights=coefficient**2 * v[entry], minlength=n_tab)
        # P[c, T]: identity variances of T's establishments in cell c, times their coefficients
        p = sp.csr_matrix((coefficient * v[entry], (cell_codes[entry], tab)), shape=(n_cells, n_tab)).tocsc()
        variances = base - operator.forms_after_solve(p)
        variances = np.maximum(variances, 0.0, where=~np.isnan(variances), out=variances)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(base > 0, variances / base, 0.0)  # rho: the identity answers' share of T^
        slopes = np.zeros(n_tab)
        if self.moving:
            moving = np.bincount(tab, weights=coefficient**2 * v[entry] * self.slope[entry], minlength=n_tab)
            with np.errstate(divide="ignore", invalid="ignore"):
                slopes = np.where(base > 0, share**2 * moving / base, 0.0)
        if self.loading is not None and self.pattern_cells is not None:
            variances = variances + share**2 * _shared_variances(coefficient * self.loading[entry],
                                                                 self.pattern_cells[entry], tab, n_tab)
        return CellVariances(variances, slopes)


    @cached_property
    def _operator(self) -> CellOperator:
        """The cell-level operator every tabulation's variances use (its factorizations made once)."""
        n_cells = int(self.cell_codes.max()) + 1
        return CellOperator(self.groups, self.group_variance, np.bincount(self.cell_codes, weights=self.v,
                                                                          minlength=n_cells))


def establishment_variances(
    system: LinearSystem,
    identity_rows: np.ndarray | None,
    cell_codes: np.ndarray,
    *,
    variance_slopes: np.ndarray | None = None,
    pattern_loadings: np.ndarray | None = None,
    pattern_cells: np.ndarray | None = None,
    values: np.ndarray | None = None,
) -> EstablishmentVariances:
    """What the variances of any tabulation need (``EstablishmentVariances``), from a release's system.

    Args:
        system: the release's query rows over establishments, answers and variances.
        identity_rows: rows of the identity answers (None when the plan has none).
        cell_codes: each establishment's cell of the grouping by all measured columns.
        variance_slopes: d variance / d level of each identity answer (in ``identity_rows`` order;
            None: the variances do not move with the answers' noise, slope 0).
        pattern_loadings: sd of each identity answer's error shared with the answers of its
            ``pattern_cells`` cell (``NoisyAnswer.pattern_loading``, in ``identity_rows`` order), and
            pattern_cells: each establishment's cell; None: no shared errors.
        values: the protected values per establishment, whose bound x >= 0 shrinks the identity
            variances (module docstring; None: the variances as the answers state them).
    """
    n_cells = int(cell_codes.max()) + 1
    v, slope, fixed, c, w, b = _establishment_parts(system, identity_rows, cell_codes, n_cells, variance_slopes)
    if identity_rows is not None and values is not None:
        factor = bounded_error_factor(unconstrained_values(system, identity_rows, cell_codes, values, c, b, w)
                                      / np.sqrt(np.where(v > 0, v, 1.0)))
        v, slope = v * factor, slope * factor
    loading = None
    if identity_rows is not None and pattern_loadings is not None and pattern_cells is not None:
        loading = np.zeros(len(v))
        loading[system.matrix[identity_rows].indices] = pattern_loadings
        loading[fixed] = 0.0
    return EstablishmentVariances(v, slope, cell_codes, c, w, identity=identity_rows is not None,
                                  moving=variance_slopes is not None, loading=loading,
                                  pattern_cells=None if loading is None else pattern_cells)


def tabulation_variances(system: LinearSystem, identity_rows: np.ndarray | None, cell_codes: np.ndarray,
                         tab_codes: np.ndarray, n_tab: int, *, establishments: np.ndarray | None = None,
                         coefficients: np.ndarray | None = None, **parts: np.ndarray | None) -> CellVariances:
    """Variance of every tabulation cell total (NaN where not estimable), and its slope: the
    structure (``establishment_variances``; ``parts``: its keyword arguments) applied to one
    tabulation (``EstablishmentVariances.__call__``: ``tab_codes``, ``n_tab``, ``establishments``,
    ``coefficients``)."""
    return establishment_variances(system, identity_rows, cell_codes, **parts)(
        tab_codes, n_tab, establishments=establishments, coefficients=coefficients)


def _establishment_parts(system: LinearSystem, identity_rows: np.ndarray | None, cell_codes: np.ndarray,
                         n_cells: int, variance_slopes: np.ndarray | None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, sp.csr_matrix, np.ndarray, np.ndarray]:
    """Per establishment its identity variance (inf without one; 0 when an exact answer fixes it at
    0) and variance slope, which establishments are fixed, and the group rows over the cells (C)
    with their variances (w) and answers (b): identity rows and exact answers left out."""
    n = system.matrix.shape[1]
    rows = np.ones(system.matrix.shape[0], dtype=bool)
    v = np.full(n, np.inf)
    slope = np.zeros(n)
    if identity_rows is not None:
        rows[identity_rows] = False
        v[system.matrix[identity_rows].indices] = system.v[identity_rows]
        if variance_slopes is not None:
            slope[system.matrix[identity_rows].indices] = variance_slopes
    exact, fixed = pinned_at_zero(system.matrix, system.b, system.v)
    v[fixed] = 0.0  # empty clipped sums: these establishments are known to be 0
    slope[fixed] = 0.0
    rows &= ~exact
    return (v, slope, fixed, cell_to_group_matrix(system.matrix[rows], cell_codes, n_cells), system.v[rows],
            system.b[rows])


def unconstrained_values(system: LinearSystem, identity_rows: np.ndarray, cell_codes: np.ndarray,
                         values: np.ndarray, c: sp.csr_matrix, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per establishment u_j = a_j + v_j lambda_c(j), lambda = C' W (b - C t) at the cell totals t of
    the protected ``values``: the value where the solve leaves it free, <= 0 where it holds it at 0
    (the KKT conditions; ``c``, ``b``, ``w``: the group rows over the cells, their answers and variances)."""
    a = np.zeros(system.matrix.shape[1])
    v = np.zeros(system.matrix.shape[1])
    establishment = system.matrix[identity_rows].indices
    a[establishment], v[establishment] = system.b[identity_rows], system.v[identity_rows]
    totals = np.bincount(cell_codes, weights=values, minlength=c.shape[1])
    residual = c.T @ ((b - c @ totals) / w)
    return a + v * residual[cell_codes]


def bounded_error_factor(k: np.ndarray) -> np.ndarray:
    """E (X - max(k, 0))^2 for X ~ N(k, 1) truncated to X >= 0: the mean squared error, in units of
    its variance, of a protected value max(u, 0) whose true value is N(u, v) truncated at 0, k = u /
    sqrt(v). k is taken at -30 below -30 (0.0022: wider, never narrower) and at 30 above (1)."""
    k = np.clip(np.asarray(k, dtype=float), -30.0, 30.0)
    ratio = np.sqrt(2.0 / np.pi) / special.erfcx(-k / np.sqrt(2.0))  # phi(k) / Phi(k), without underflow
    return np.where(k >= 0, 1.0 - k * ratio, 1.0 + k * ratio + k**2)


def _group_variances(c: sp.csr_matrix, w: np.ndarray, cell_codes: np.ndarray, entry: np.ndarray,
                     coefficient: np.ndarray, tab: np.ndarray, n_tab: int, *, uneven: bool) -> np.ndarray:
    """Without identity answers: 1_T' M^-1 1_T for tabulation cells that are unions of whole measured
    cells, NaN for the others (and for all, with ``uneven`` coefficients: not checked, not claimed)."""
    n_cells = int(cell_codes.max()) + 1
    operator = CellOperator(c, w, np.full(n_cells, np.inf))
    weights = 1.0 / np.bincount(cell_codes, minlength=n_cells)[cell_codes]
    # P[c, T]: the share of cell c inside T, 1 for a whole cell
    p = sp.csr_matrix((coefficient * weights[entry], (cell_codes[entry], tab)), shape=(n_cells, n_tab)).tocsc()
    variances = operator.inverse_m_forms(p)
    entries = p.tocoo()
    part = np.abs(entries.data - 1.0) > 1e-9
    variances[np.bincount(entries.col[part], minlength=n_tab) > 0] = np.nan
    if uneven:
        variances[:] = np.nan
    return np.maximum(variances, 0.0, where=~np.isnan(variances), out=variances)


def _shared_variances(loading: np.ndarray, cells: np.ndarray, tab_codes: np.ndarray, n_tab: int) -> np.ndarray:
    """Per tabulation cell T: the covariances of errors shared within cells, sum over cells c of
    (sum of loadings in T and c)^2 less each loading squared (the variances, counted already)."""
    by_cell = sp.csr_matrix((loading, (cells, tab_codes)), shape=(int(cells.max(initial=-1)) + 1, n_tab))
    together = np.asarray(by_cell.multiply(by_cell).sum(axis=0)).ravel()
    return np.maximum(together - np.bincount(tab_codes, weights=loading**2, minlength=n_tab), 0.0)


def answers_structure(answers: Sequence[NoisyAnswer], public: pd.DataFrame,
                      pattern_cells: np.ndarray | None = None, values: np.ndarray | None = None
                      ) -> EstablishmentVariances:
    """What the variances of tabulations need, from a release's answers of one attribute (their own
    variances: estimated for the psi-mechanism, exact for pnc) over its public microdata;
    ``pattern_cells``: ``month_pattern_cells(public)`` when the caller has it already; ``values``:
    the attribute's protected values (in ``public``'s order), whose bound shrinks the variances."""
    system = build_system(answers, public, [answer.variance for answer in answers])
    identity_rows, cell_codes = system_structure(answers, public)
    identity = None if identity_rows is None else next(a for a in answers if a.query.is_identity)
    loadings = None if identity is None else identity.pattern_loading
    return establishment_variances(system, identity_rows, cell_codes,
                                   variance_slopes=None if identity is None else identity.variance_slope,
                                   pattern_loadings=loadings,
                                   pattern_cells=None if loadings is None else (
                                       month_pattern_cells(public) if pattern_cells is None else pattern_cells),
                                   values=values)


def answers_variances(answers: Sequence[NoisyAnswer], public: pd.DataFrame, tab_codes: np.ndarray,
                      n_tab: int, pattern_cells: np.ndarray | None = None, **entries: np.ndarray) -> CellVariances:
    """Variances of tabulation cells from a release's answers of one attribute over its public
    microdata (``answers_structure``), with their slopes; ``entries`` (establishments, coefficients)
    as for ``EstablishmentVariances.__call__``."""
    return answers_structure(answers, public, pattern_cells)(tab_codes, n_tab, **entries)
