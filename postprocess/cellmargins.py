"""Variances of tabulations by public columns, from per-cell pieces of a release's margin structure.

A tabulation by public columns (with a filter on public columns) is a union of the release's finest
public cells (``gedp.release.cells``): one row per distinct combination of every public column but
``estab_id``. Every cell of an attribute's model (the least squares' cells of all measured columns,
the wage fit's cells, the months' cells of shared errors) is a union of those finest cells, so a
tabulation's variance depends on the establishments only through per-finest-cell sums. The pieces
kept here are those sums and, per model cell, the rows of a factor of the model's low-rank part:

* least squares (``variances.EstablishmentVariances``, with identity answers): with
  G = L L' (its multi-cell groups' matrix, ``structured.CellOperator``), the form y' G^-1 y of a
  tabulation is |L^-1 y|^2, y = C_m D p; L^-1 C_m D is kept per measured cell (``projection``), so
  a tabulation's variance is ``sum_{j in T} v_j - sum_c e_c p_c^2 - |sum_c p_c projection_c|^2``;
* wages (``models.WageVariances``): the same for the plan cells' operator, and for the shared rates'
  form z' M^-1 z, z = links' K^-1 p, the rows of U^-T links' K^-1 per model cell (``rates``).

Each tabulation then costs a few bincounts and a sum of a few thousand rows (no solve, no scipy).
The pieces are functions of the margin structure and the release's protected microdata (public
columns), so of the release's files only, like the structure they come from: never of the
confidential input.

Their sums run in another order than the per-establishment computation's, so margins differ from
it in the last bits (relative 1e-12 or so); ``IndexedVariances`` answers every tabulation whose cells
are unions of finest cells from the pieces, whatever path asks (a first request reading the release
or a further one reading the kept cell index), so every request gives the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from gedp.measure.queries import Grouping
    from gedp.postprocess.models import VarianceFunction
    from gedp.postprocess.structured import CellOperator
    from gedp.postprocess.variances import CellVariances

#: The most entries (cells x rank) a kept factor may have (8 bytes each: 256 MiB): beyond it, no pieces
#: are kept and the per-establishment computation answers (its cost grows with the groups' blocks
#: instead). New Jersey's wage rates (13,663 model cells x 1,289 shared rates: 134 MiB) fit.
MAX_FACTOR_ENTRIES = 1 << 25
#: Entries of the factors' rows summed at a time (``_row_norms``).
ROW_BLOCK = 1 << 15


@dataclass(frozen=True, eq=False)
class LeastSquaresCells:
    """Per finest cell: its measured cell (``cell``), the sums of identity variances (``v``), of
    variance x slope (``moving``; None: no slopes), of shared-error loadings and their squares
    (``loading``, ``loading_squared``; None: no shared errors) and its cell of shared errors
    (``pattern``); per measured cell: its single-cell groups' weight (``folded``, e_c) and its row
    of the factor (``projection``, cells x multi-cell groups)."""

    cell: np.ndarray
    v: np.ndarray
    folded: np.ndarray
    projection: np.ndarray
    moving: np.ndarray | None = None
    loading: np.ndarray | None = None
    loading_squared: np.ndarray | None = None
    pattern: np.ndarray | None = None

    def variances(self, tab: np.ndarray, n_tab: int) -> tuple[np.ndarray, np.ndarray]:
        """Variance and slope of each of the ``n_tab`` cells of a tabulation whose cell of each
        finest cell is ``tab`` (-1: not tabulated), as ``EstablishmentVariances`` defines them."""
        inside = tab >= 0
        t, v = tab[inside], self.v[inside]
        base = np.bincount(t, weights=v, minlength=n_tab)
        variance = base - _cell_forms(self.cell[inside], t, v, self.folded, self.projection, n_tab)
        variance = np.maximum(variance, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(base > 0, variance / base, 0.0)
            slope = np.zeros(n_tab)
            if self.moving is not None:
                moving = np.bincount(t, weights=self.moving[inside], minlength=n_tab)
                slope = np.where(base > 0, share**2 * moving / base, 0.0)
        if self.loading is not None and self.loading_squared is not None and self.pattern is not None:
            together = _pair_sums(self.pattern[inside], t, self.loading[inside])
            shared = (np.bincount(together[1], weights=together[2]**2, minlength=n_tab)
                      - np.bincount(t, weights=self.loading_squared[inside], minlength=n_tab))
            variance = variance + share**2 * np.maximum(shared, 0.0)
        return variance, slope


@dataclass(frozen=True, eq=False)
class WageCells:
    """Per finest cell: its model cell (``cell``), the sums of its establishments' shares of their
    cell's total (``share``) and of their share variances (``share_variance``); per model cell: its
    total's variance (``cell_variance``, 0 where fixed), its plan cell (``coarse``), the sum of its
    share variances (``within``), its row of the rates' factor (``rates``) and the weight of its
    answers' noise where their wages lie (``noise_excess``, ``WageFit.noise_excess``); per plan cell:
    e_c (``folded``, f), the row of the plan cells' factor (``projection``, P) and
    P P' diag(W) P + 2 diag(W f) P (``projection_weighted``, PW; W the plan cells' summed
    ``noise_excess``). The sandwich's form (``CellsInPlanCells.noise_forms``) of a tabulation whose
    plan cells hold u = sum of variance x share and q = sum of noise_excess x share is then
    sum of noise_excess x share^2 + sum (W f^2 u^2 - 2 f u q) + y . (sum u PW - 2 sum q P), y = sum u P."""

    cell: np.ndarray
    share: np.ndarray
    share_variance: np.ndarray
    cell_variance: np.ndarray
    coarse: np.ndarray
    within: np.ndarray
    rates: np.ndarray
    folded: np.ndarray
    projection: np.ndarray
    noise_excess: np.ndarray
    projection_weighted: np.ndarray

    def variances(self, tab: np.ndarray, n_tab: int) -> tuple[np.ndarray, np.ndarray]:
        """Variance (slope 0) of each tabulation cell, as ``wage_margins.wage_variances`` defines it."""
        inside = tab >= 0
        cell, t, gs = _pair_sums(self.cell[inside], tab[inside], self.share[inside])
        p = self.cell_variance[cell] * gs
        weights = self.noise_excess[cell]
        coarse, tc, u = _pair_sums(self.coarse[cell], t, p)
        q = _pair_sums(self.coarse[cell], t, weights * gs)[2]
        f = self.folded[coarse]
        summed = np.bincount(self.coarse, weights=self.noise_excess, minlength=len(self.folded))[coarse]
        norms, dots = _projection_forms(self.projection, self.projection_weighted, coarse, tc, u, q, n_tab)
        variance = (np.bincount(t, weights=gs * p, minlength=n_tab)
                    - np.bincount(tc, weights=f * u**2, minlength=n_tab) - norms
                    + _row_norms(self.rates, cell, t, p, n_tab)
                    # the answers' noise where their wages lie (``CellsInPlanCells.noise_forms``)
                    + np.bincount(t, weights=weights * gs**2, minlength=n_tab)
                    + np.bincount(tc, weights=summed * f**2 * u**2 - 2 * f * u * q, minlength=n_tab) + dots)
        within = _pair_sums(self.cell[inside], tab[inside], self.share_variance[inside])
        whole = self.within[within[0]]
        part = within[2] - np.divide(within[2]**2, whole, out=np.zeros_like(whole), where=whole > 0)
        variance += np.bincount(within[1], weights=part, minlength=n_tab)
        return np.maximum(variance, 0.0), np.zeros(n_tab)


CellPieces = LeastSquaresCells | WageCells
_KINDS: dict[str, type] = {kind.__name__: kind for kind in (LeastSquaresCells, WageCells)}


@dataclass(frozen=True, eq=False)
class IndexedVariances:
    """A variance function (``models.VarianceFunction``) that answers every tabulation whose cells
    are unions of finest cells (``codes``: each establishment's) from ``pieces``, and any other
    (or one with entries: ``establishments``, ``coefficients``) with ``exact``."""

    pieces: CellPieces
    codes: np.ndarray
    exact: VarianceFunction

    def __call__(self, tab_codes: np.ndarray, n_tab: int, **entries: Any) -> CellVariances:
        """The variances of the cells of one tabulation (``tab_codes``: each establishment's cell)."""
        from gedp.postprocess.variances import CellVariances

        if not entries and len(tab_codes) == len(self.codes):
            tab = np.full(len(self.pieces.cell), -1, dtype=np.int64)
            tab[self.codes] = tab_codes
            if np.array_equal(tab[self.codes], tab_codes):
                return CellVariances(*self.pieces.variances(tab, n_tab))
        return self.exact(tab_codes, n_tab, **entries)


def cell_half_widths(pieces: Mapping[str, CellPieces], tab: np.ndarray, n_tab: int, level: float
                     ) -> dict[str, np.ndarray]:
    """Margins of error (``CellVariances.half_width``, the score interval's half-width) at confidence
    ``level`` of a tabulation whose cell of each finest cell is ``tab``, per attribute."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    out = {}
    for attribute, kept in pieces.items():
        variance, slope = kept.variances(tab, n_tab)
        out[attribute] = z * np.sqrt(variance + (z * slope / 2) ** 2)
    return out


def _pair_sums(first: np.ndarray, tab: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sums of ``values`` over each (first, tab) pair present, sorted by tab then first: the
    pairs' first codes, tab codes and sums."""
    n_first = int(first.max(initial=0)) + 1
    keys, inverse = np.unique(tab.astype(np.int64) * n_first + first, return_inverse=True)
    return keys % n_first, keys // n_first, np.bincount(inverse.ravel(), weights=values, minlength=len(keys))


def _cell_forms(first: np.ndarray, tab: np.ndarray, values: np.ndarray, folded: np.ndarray, projection: np.ndarray,
                n_tab: int) -> np.ndarray:
    """p' M (I + S M)^-1 p per tabulation cell (``CellOperator.forms_after_solve``), p its sums of
    ``values`` per cell (``first``): sum_c e_c p_c^2 + |sum_c p_c projection_c|^2."""
    cell, t, p = _pair_sums(first, tab, values)
    return np.bincount(t, weights=folded[cell] * p**2, minlength=n_tab) + _row_norms(projection, cell, t, p, n_tab)


def _row_norms(rows: np.ndarray, first: np.ndarray, tab: np.ndarray, weights: np.ndarray, n_tab: int) -> np.ndarray:
    """|sum over the pairs of T of weight x rows[first]|^2 per tabulation cell T (pairs sorted by tab),
    by blocks of whole tabulation cells of about ROW_BLOCK entries: each a bincount of the block's
    weighted rows, small enough to stay in the processor's cache."""
    out = np.zeros(n_tab)
    k = rows.shape[1]
    if k == 0 or len(tab) == 0:
        return out
    for low, high, local, n_local in _tab_blocks(tab, k):
        weighted = rows[first[low:high]]
        weighted *= weights[low:high, None]
        summed = _block_sums(weighted, local, n_local)
        out[tab[low]:tab[low] + n_local] = np.einsum("ij,ij->i", summed, summed)
    return out


def _tab_blocks(tab: np.ndarray, k: int) -> Iterator[tuple[int, int, np.ndarray, int]]:
    """Blocks of whole tabulation cells of about ROW_BLOCK entries of rows of ``k`` (pairs sorted by
    tab): each block's first and last pair, its pairs' tabulation cells from its first, and their number."""
    starts = np.flatnonzero(np.r_[True, tab[1:] != tab[:-1]])  # where each tabulation cell's pairs start
    every = np.arange(0, len(tab), max(1, ROW_BLOCK // k))  # the start of the cell holding each: a bound
    bounds = np.r_[starts[np.searchsorted(starts, every, side="right") - 1], len(tab)]  # non-decreasing
    bounds = bounds[np.r_[True, bounds[1:] != bounds[:-1]]]  # each once (np.unique would load numpy.ma)
    for low, high in zip(bounds[:-1], bounds[1:]):
        local = tab[low:high] - tab[low]
        yield int(low), int(high), local, int(local[-1]) + 1


def _block_sums(weighted: np.ndarray, local: np.ndarray, n_local: int) -> np.ndarray:
    """One block's sums of its pairs' ``weighted`` rows per tabulation cell (n_local x k): a bincount
    small enough to stay in the processor's cache."""
    k = weighted.shape[1]
    return np.bincount((local[:, None] * k + np.arange(k)).ravel(), weights=weighted.ravel(),
                       minlength=n_local * k).reshape(n_local, k)


def _projection_forms(projection: np.ndarray, weighted: np.ndarray, first: np.ndarray, tab: np.ndarray,
                      u: np.ndarray, q: np.ndarray, n_tab: int) -> tuple[np.ndarray, np.ndarray]:
    """Per tabulation cell T (pairs of plan cell ``first`` and T, sorted by tab): |y|^2 and
    y . (sum u PW - 2 sum q P), y = sum u P (P ``projection``, PW ``weighted``, sums over T's pairs),
    by the blocks of ``_row_norms`` (P's rows gathered once for both sums)."""
    norms, dots = np.zeros(n_tab), np.zeros(n_tab)
    k = projection.shape[1]
    if k == 0 or len(tab) == 0:
        return norms, dots
    for low, high, local, n_local in _tab_blocks(tab, k):
        rows = projection[first[low:high]]
        y = _block_sums(rows * u[low:high, None], local, n_local)
        own = y[local]  # each pair's tabulation cell's y: y . z as a sum over the pairs of scalars
        per_pair = (u[low:high] * np.einsum("ij,ij->i", own, weighted[first[low:high]])
                    - 2 * q[low:high] * np.einsum("ij,ij->i", own, rows))
        norms[tab[low]:tab[low] + n_local] = np.einsum("ij,ij->i", y, y)
        dots[tab[low]:tab[low] + n_local] = np.bincount(local, weights=per_pair, minlength=n_local)
    return norms, dots


def finest_cells(protected: pd.DataFrame) -> Grouping:
    """A release's finest public cells: the grouping of its protected microdata by every public
    column but ``estab_id``."""
    from gedp.measure.queries import Groupings
    from gedp.synth.schema import public_columns

    columns = [c for c in public_columns(protected) if c != "estab_id"]
    return Groupings(protected[columns])(columns)


def indexed_variances(variances: Mapping[str, VarianceFunction], protected: pd.DataFrame
                      ) -> dict[str, VarianceFunction]:
    """Each variance function of a release's protected microdata, answering from its per-cell pieces
    where it has them (``IndexedVariances``; unchanged where it has none)."""
    cells = finest_cells(protected)
    out: dict[str, VarianceFunction] = {}
    for attribute, variance in variances.items():
        pieces = pieces_of(variance, cells.codes, cells.n_groups)
        out[attribute] = variance if pieces is None else IndexedVariances(pieces, cells.codes, variance)
    return out


def pieces_of(variance: VarianceFunction, codes: np.ndarray, n_finest: int) -> CellPieces | None:
    """The per-cell pieces of one attribute's variance function, for the finest cells ``codes``
    (each establishment's, ``n_finest`` in all); None where there are none (no identity answers, a
    model cell that splits a finest cell, a sparse factorization, shared county deviations of wage
    shares, or a factor above MAX_FACTOR_ENTRIES): the per-establishment computation answers."""
    from gedp.postprocess.models import WageVariances
    from gedp.postprocess.variances import EstablishmentVariances

    if isinstance(variance, EstablishmentVariances) and variance.identity and np.isfinite(variance.v).all():
        return _least_squares_pieces(variance, codes, n_finest)
    if isinstance(variance, WageVariances) and variance.kept is not None and not variance.fit.county_loading.any():
        return _wage_pieces(variance, codes, n_finest)
    return None


def _per_finest(codes: np.ndarray, values: np.ndarray, n_finest: int) -> np.ndarray | None:
    """Each finest cell's value of ``values`` (per establishment), None where a finest cell holds two."""
    out = np.zeros(n_finest, dtype=values.dtype)
    out[codes] = values
    return out if np.array_equal(out[codes], values) else None


def _least_squares_pieces(variance: Any, codes: np.ndarray, n_finest: int) -> LeastSquaresCells | None:
    """``pieces_of`` an ``EstablishmentVariances`` with identity answers."""
    from gedp.postprocess.structured import CellOperator

    cell = _per_finest(codes, variance.cell_codes, n_finest)
    n_cells = int(variance.cell_codes.max()) + 1
    operator = CellOperator(variance.groups, variance.group_variance,
                            np.bincount(variance.cell_codes, weights=variance.v, minlength=n_cells))
    projection = _projection(operator)
    if cell is None or projection is None:
        return None

    def summed(values: np.ndarray) -> np.ndarray:
        return np.bincount(codes, weights=values, minlength=n_finest)

    pattern = None
    if variance.loading is not None and variance.pattern_cells is not None:
        pattern = _per_finest(codes, variance.pattern_cells, n_finest)
        if pattern is None:
            return None
    return LeastSquaresCells(cell=cell, v=summed(variance.v), folded=operator.diagonal * operator.shrink,
                             projection=projection,
                             moving=summed(variance.v * variance.slope) if variance.moving else None,
                             loading=None if pattern is None else summed(variance.loading),
                             loading_squared=None if pattern is None else summed(variance.loading**2),
                             pattern=pattern)


def _wage_pieces(variance: Any, codes: np.ndarray, n_finest: int) -> WageCells | None:
    """``pieces_of`` a ``WageVariances`` with dense factorizations and no shared county deviations."""
    import scipy.linalg
    import scipy.sparse as sp

    from gedp.postprocess.wage_margins import _cell_operator

    fit = variance.fit
    cell = _per_finest(codes, fit.cell_codes, n_finest)
    n_cells = len(fit.totals)
    operator, cell_variance = _cell_operator(fit, variance.kept)
    projection = _projection(operator.coarse)
    n_theta = fit.rates.links.shape[1]
    if cell is None or projection is None or n_cells * n_theta > MAX_FACTOR_ENTRIES:
        return None
    counts = np.bincount(fit.cell_codes, minlength=n_cells)[fit.cell_codes]
    totals = fit.totals[fit.cell_codes]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(totals > 0, fit.values / totals, 1.0 / counts)
    excess = np.where(fit.fixed_cells, 0.0, fit.noise_excess)
    folded = operator.coarse.diagonal * operator.coarse.shrink
    summed = np.bincount(fit.coarse_cells, weights=excess, minlength=projection.shape[0])  # W per plan cell
    z = operator.left_solve(fit.rates.links, sp.identity(n_cells, format="csc"))  # theta x model cells
    rates = np.zeros((n_theta, n_cells))
    for index, (factor, lower) in fit.rates.blocks:
        rates[index] = scipy.linalg.solve_triangular(factor, z[index], lower=lower, trans="N" if lower else "T")
    return WageCells(cell=cell, share=np.bincount(codes, weights=share, minlength=n_finest),
                     share_variance=np.bincount(codes, weights=fit.share_variance, minlength=n_finest),
                     cell_variance=cell_variance, coarse=fit.coarse_cells,
                     within=np.bincount(fit.cell_codes, weights=fit.share_variance, minlength=n_cells),
                     rates=np.ascontiguousarray(rates.T), folded=folded,
                     projection=projection, noise_excess=excess,
                     projection_weighted=(projection @ (projection.T @ (summed[:, None] * projection))
                                          + 2 * (summed * folded)[:, None] * projection))


def _projection(operator: CellOperator) -> np.ndarray | None:
    """(L^-1 C_m D)' (cells x multi-cell groups), G = L L' (``CellOperator``): |projection' p|^2 is
    p's form through G^-1; None for a G above DENSE_GROUPS or a factor above MAX_FACTOR_ENTRIES."""
    import scipy.linalg
    import scipy.sparse as sp

    from gedp.postprocess.structured import DENSE_GROUPS, _group_matrix

    k, n_cells = operator.c_multi.shape
    if k > DENSE_GROUPS or k * n_cells > MAX_FACTOR_ENTRIES:
        return None
    if k == 0:
        return np.zeros((n_cells, 0))
    lower = scipy.linalg.cholesky(_group_matrix(operator.c_multi, operator.w_multi, operator.s_folded).toarray(),
                                  lower=True)
    scaled = (operator.c_multi @ sp.diags(operator.shrink)).toarray()
    return np.ascontiguousarray(scipy.linalg.solve_triangular(lower, scaled, lower=True).T)


def pieces_arrays(pieces: CellPieces) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A JSON skeleton of ``pieces`` (its kind and fields) and its arrays by field name."""
    arrays = {field.name: getattr(pieces, field.name) for field in dataclasses.fields(pieces)
              if getattr(pieces, field.name) is not None}
    return {"kind": type(pieces).__name__, "fields": sorted(arrays)}, arrays


def pieces_from(skeleton: dict[str, Any], array: Any) -> CellPieces:
    """The inverse of ``pieces_arrays``: ``array`` reads a field's array by name."""
    return _KINDS[skeleton["kind"]](**{name: array(name) for name in skeleton["fields"]})
