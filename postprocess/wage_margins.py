"""Margins of error of the wage fit's tabulations (``postprocess.wages``): the variance of every
tabulation cell's protected wage total, from the cell totals' covariance, what the shared rates'
uncertainty adds, the identity answers' noise where their wages lie, the shares within a cell
and the counties' shared deviations."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from gedp.postprocess.structured import GroupFactorizations
from gedp.postprocess.wage_rates import CellsInPlanCells
from gedp.postprocess.wages import WageFit


def _cell_operator(fit: WageFit, kept: GroupFactorizations | None = None) -> tuple[CellsInPlanCells, np.ndarray]:
    """The cell-level operator of the wage fit's margins (``kept``: its factorizations, made before),
    and the cells' variances (0 where fixed)."""
    cell_variance = np.where(fit.fixed_cells, 0.0, fit.cell_variance)
    return CellsInPlanCells(fit.coarse_groups, fit.group_variance, cell_variance, fit.coarse_cells, kept), cell_variance


def wage_factorizations(fit: WageFit) -> GroupFactorizations | None:
    """The factorizations ``wage_variances`` makes for every tabulation, made once (None: not dense)."""
    return _cell_operator(fit)[0].coarse.factorizations()


def wage_variances(fit: WageFit, tab_codes: np.ndarray, n_tab: int, kept: GroupFactorizations | None = None
                   ) -> np.ndarray:
    """Variance of every tabulation cell's protected wage total (tab_codes -1: not tabulated); ``kept``:
    ``wage_factorizations(fit)``, made before.

    Four parts: the cell totals' covariance from the cell-level least squares with the rates fixed,
    K^-1 with K = diag(1 / cell_variance) + C' W C (fixed cells excluded); what the shared rates'
    uncertainty adds, z' M^-1 z with z = links' K^-1 g (``SharedRates``; together the cell block of
    the joint Hessian's inverse), both for the tabulation's share g of each cell (the share of the
    cell's protected wages it holds, a share moving with its cell's total; of its establishments, in
    a cell at 0 that no exact answer fixes); what the identity answers' noise where their released
    wages lie adds, the sandwich g' K^-1 diag(e / vd^2) K^-1 g (``WageFit.noise_excess``,
    ``CellsInPlanCells.noise_forms``; the rates held fixed in it); and the within-cell part,
    K_T - K_T^2 / K_c per cell, K the share variances summed over the tabulation's (K_T) and the
    cell's (K_c) establishments.
    """
    codes, inside = fit.cell_codes, tab_codes >= 0
    n_cells = len(fit.totals)
    cell_of = codes[inside]
    counts = np.bincount(codes, minlength=n_cells)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(fit.totals[cell_of] > 0, fit.values[inside] / fit.totals[cell_of], 1.0 / counts[cell_of])
    g = sp.csr_matrix((share, (cell_of, tab_codes[inside])), shape=(n_cells, n_tab))
    operator, cell_variance = _cell_operator(fit, kept)
    p = sp.diags(cell_variance) @ g
    base = np.asarray(g.multiply(p).sum(axis=0)).ravel()
    variances = base - operator.forms_after_solve(p) + fit.rates.correlated_forms(operator, p.tocsc())
    variances += operator.noise_forms(g, fit.noise_excess)  # the answers' noise where their wages lie
    within_tab = sp.csr_matrix((fit.share_variance[inside], (cell_of, tab_codes[inside])), shape=(n_cells, n_tab))
    within_cell = np.bincount(codes, weights=fit.share_variance, minlength=n_cells)
    entries = within_tab.tocoo()
    part = entries.data - np.divide(entries.data**2, within_cell[entries.row], out=np.zeros_like(entries.data),
                                    where=within_cell[entries.row] > 0)
    variances += np.bincount(entries.col, weights=part, minlength=n_tab)
    if fit.county_loading.any():
        ratio = sp.csr_matrix((np.divide(entries.data, within_cell[entries.row], out=np.zeros_like(entries.data),
                                         where=within_cell[entries.row] > 0), (entries.row, entries.col)),
                              shape=(n_cells, n_tab))
        variances += _county_variances(fit, tab_codes, n_tab, ratio)
    return np.maximum(variances, 0.0)


def _county_variances(fit: WageFit, tab_codes: np.ndarray, n_tab: int, ratio: sp.csr_matrix) -> np.ndarray:
    """What the counties' shared deviations add (``WageFit.county_loading``, u): per tabulation T,
    sum over counties k of L_Tk^2, L_Tk = sum of u over T's establishments in k less, per cell c, the
    ``ratio`` K_(T and c) / K_c of the sum of u over c's establishments in k (the cell's total is
    fixed: its shares absorb the deviation as they absorb any, in proportion to their variances)."""
    inside = tab_codes >= 0
    n_counties = int(fit.county_codes.max()) + 1
    own = sp.csr_matrix((fit.county_loading[inside], (tab_codes[inside], fit.county_codes[inside])),
                        shape=(n_tab, n_counties))
    by_cell = sp.csr_matrix((fit.county_loading, (fit.cell_codes, fit.county_codes)),
                            shape=(len(fit.totals), n_counties))
    loadings = (own - ratio.T @ by_cell).tocsr()
    return np.asarray(loadings.multiply(loadings).sum(axis=1)).ravel()
