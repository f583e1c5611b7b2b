"""Wages informed by protected employment (issue 13): what the identity wage answers cannot say alone.

At the baseline budget an establishment's identity wage answer is almost pure noise (sd 333 on the
sqrt scale), so the plain weighted least squares (``postprocess.wls``) gives most employers $0 and,
through the nonnegativity bound on those noisy answers, pushes wage totals up. Protected employment
is far more accurate, and wage per employee varies far less than wages. So, per state:

1. **Cell measurements.** A cell is a group of the finest measured grouping (county x NAICS-5 in the
   shipped plans). Its identity answers are summed (unbiased for the cell total) with the variance
   evaluated at the state's wage per protected employee times the cell's employment: a weight that
   does not depend on the answers' own noise, so weighting adds no bias (the E3 effect).
2. **Industry rates.** r_g, wage per protected employee of each group g of the plan's
   [state, naics5] query, from the fitted group totals, shrunk toward its NAICS-3 parent's rate by
   empirical Bayes (the spread between sibling industries estimated by moments).
3. **Cell prior.** The cell's wage is about r_g E_c (E_c its protected employment), with relative
   spread CELL_SPREAD between cells of one industry plus the spread of its establishments and of the
   rate. The prior and the cell measurement are combined by inverse variance, and the weighted least
   squares over every group answer (state, county, industry, cell: their rows are unchanged) gives
   cell totals >= 0 with the structured solver. Steps 2-3 run PASSES times (rates from the last fit).
4. **Shares.** Each cell's total is shared among its establishments: each establishment's identity
   answer (variance at its employment share of the total) and its employment share (relative spread
   estimated by moments from the identity answers) combined by inverse variance, the shares >= 0 and
   adding up exactly to the cell total.

Why this is postprocessing (no privacy cost): its inputs are released answers, public attributes and
protected employment (itself postprocessing of released answers), and the constants below are fixed
in the code, not read from confidential data. The margins of error (``wage_variances``) recompute
the same fit from a release's files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.measure.queries import group_establishments
from gedp.postprocess.structured import (
    CellOperator,
    cell_to_group_matrix,
    pinned_at_zero,
    solve_nested,
)

#: How wages are postprocessed: "employment" (this module; the default when it applies) or "wls"
#: (the plain weighted least squares of SPEC section 5).
WAGE_METHODS = ("employment", "wls")
WAGE = "wage"
EMPLOYMENT = ("m1emp", "m2emp", "m3emp")
#: The query whose groups get their own wage per employee, and the parent it is pooled toward.
RATE_QUERY = ("state", "naics5")
PARENT_DIGITS = 3
#: Bounds of the relative spread of a cell's wage per employee around its industry's rate
#: (estimated by moments per state).
CELL_SPREAD_BOUNDS = (0.1, 1.0)
#: Relative spread of an establishment's wage per employee around its cell's (used for a cell's
#: prior variance; the shares use the spread estimated from the identity answers).
ESTABLISHMENT_SPREAD = 0.3
#: Bounds of the estimated establishment spread, and the smallest relative spread between sibling rates.
SPREAD_BOUNDS = (0.05, 3.0)
MIN_RATE_SPREAD = 0.1
#: Employment an establishment counts for at least (its share of a cell total is never 0).
EMPLOYMENT_FLOOR = 0.5
#: Fits of the cell totals (rates refreshed from the previous fit).
PASSES = 3
#: Bisection steps of the shares (then solved exactly on the final free set).
SHARE_STEPS = 100


@dataclass(frozen=True, eq=False)
class WageFit:
    """Protected wages and what their margins of error need."""

    values: np.ndarray  # per establishment
    cell_codes: np.ndarray  # per establishment
    totals: np.ndarray  # per cell
    cell_measurement: np.ndarray  # per cell: its direct measurement and prior combined
    cell_variance: np.ndarray  # per cell: the combined measurement's variance
    groups: sp.csr_matrix  # groups x cells (groups with an exact answer left out)
    group_answers: np.ndarray
    group_variance: np.ndarray
    fixed_cells: np.ndarray  # cells held at 0 by an exact answer
    share_variance: np.ndarray  # per establishment: variance of its combined share measurement (0 if at 0)


def applies(answers: Sequence[NoisyAnswer], attribute: str, protected_attributes: Sequence[str]) -> bool:
    """Whether ``attribute``'s answers can be postprocessed this way: wages, one identity answer, the
    rate query measured, and protected employment available."""
    return (attribute == WAGE and any(m in protected_attributes for m in EMPLOYMENT)
            and sum(a.query.is_identity for a in answers) == 1
            and any(tuple(a.query.by) == RATE_QUERY for a in answers))


def protected_employment(protected: pd.DataFrame, answers: Mapping[str, Sequence[NoisyAnswer]],
                         identity_codes: np.ndarray, psi: NeighborFunction) -> tuple[np.ndarray, np.ndarray]:
    """Each establishment's employment for the model, the mean of its protected months (floored),
    and that mean's noise variance: each month's identity-answer variance at the protected value
    (independent noise across months; 0 for a month without identity answer). ``identity_codes``:
    each establishment's row in the identity answers."""
    months = [m for m in EMPLOYMENT if m in protected]
    values = protected[months].to_numpy(dtype=float)
    variance = np.zeros(len(protected))
    for k, month in enumerate(months):
        identity = [a for a in answers.get(month, []) if a.query.is_identity]
        if identity:
            variance += psi.estimate_variance(values[:, k], per_establishment(identity[0].sd, identity_codes))
    return np.maximum(values.mean(axis=1), EMPLOYMENT_FLOOR), variance / len(months) ** 2


def per_establishment(values: np.ndarray | float, identity_codes: np.ndarray) -> np.ndarray:
    """An identity answer's per-row values (or one value for all), in establishment order."""
    return np.broadcast_to(values, (int(identity_codes.max()) + 1,))[identity_codes]


def _by_state(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(codes, weights=values, minlength=n)


def _pooled_rates(totals: np.ndarray, variances: np.ndarray, employment: np.ndarray, parent: np.ndarray,
                  state: np.ndarray, cell_group: np.ndarray, cell_totals: np.ndarray, cell_employment: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each cell's industry rate, left one out: its group's total / employment without the cell itself
    (so a cell's prior does not reuse the cell's own measurements), shrunk toward the group's parent
    rate by empirical Bayes, the relative spread between sibling groups estimated by moments per
    state. Returns the rates and their variances, per cell."""
    tiny = np.finfo(float).tiny
    rate_variance = np.maximum(variances / employment**2, tiny)
    n_parents, n_states = int(parent.max()) + 1, int(state.max()) + 1
    parent_rate = np.maximum(np.bincount(parent, weights=totals, minlength=n_parents)
                             / np.bincount(parent, weights=employment, minlength=n_parents), 0.0)[parent]
    excess = _by_state(state, (totals / employment - parent_rate) ** 2 - rate_variance, n_states)
    scale = _by_state(state, parent_rate**2, n_states)
    spread2 = np.maximum(np.divide(excess, scale, out=np.zeros(n_states), where=scale > 0), MIN_RATE_SPREAD**2)
    prior_variance = np.maximum(spread2[state] * parent_rate**2, tiny)[cell_group]
    others = employment[cell_group] - cell_employment
    kept = others / employment[cell_group]  # the others' share of the group: their variance, roughly
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(others > EMPLOYMENT_FLOOR, (totals[cell_group] - cell_totals) / others, 0.0)
        own_variance = np.where(others > EMPLOYMENT_FLOOR, variances[cell_group] * kept / others**2, np.inf)
    own_variance = np.maximum(own_variance, tiny)
    precision = 1.0 / own_variance + 1.0 / prior_variance
    return (rate / own_variance + parent_rate[cell_group] / prior_variance) / precision, 1.0 / precision


def share_cells(totals: np.ndarray, cell_codes: np.ndarray, target: np.ndarray, variance: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """x = argmin sum_j (x_j - target_j)^2 / variance_j over x >= 0 with every cell adding up to its total.

    x_j = max(0, target_j + variance_j lambda_c); lambda_c by bisection per cell, then exactly on the
    final free set. Returns x and the free set (x_j > 0 or in a cell of positive total).
    """
    n_cells = len(totals)
    ratio = -target / variance  # x_j > 0 exactly when lambda > ratio_j
    low, high = np.full(n_cells, np.inf), np.full(n_cells, -np.inf)
    np.minimum.at(low, cell_codes, ratio)
    np.maximum.at(high, cell_codes, ratio)
    spare = totals - np.bincount(cell_codes, weights=target, minlength=n_cells)
    summed = np.bincount(cell_codes, weights=variance, minlength=n_cells)
    high = np.maximum(high, np.divide(spare, summed, out=np.zeros(n_cells), where=summed > 0))
    low = np.minimum(low, high)
    for _ in range(SHARE_STEPS):
        middle = (low + high) / 2
        shared = np.bincount(cell_codes, weights=np.maximum(target + variance * middle[cell_codes], 0.0),
                             minlength=n_cells)
        above = shared > totals
        high, low = np.where(above, middle, high), np.where(above, low, middle)
    free = (target + variance * high[cell_codes] > 0) & (totals[cell_codes] > 0)
    free_variance = np.bincount(cell_codes, weights=np.where(free, variance, 0.0), minlength=n_cells)
    free_target = np.bincount(cell_codes, weights=np.where(free, target, 0.0), minlength=n_cells)
    lam = np.divide(totals - free_target, free_variance, out=np.zeros(n_cells), where=free_variance > 0)
    return np.where(free, np.maximum(target + variance * lam[cell_codes], 0.0), 0.0), free


def fit_wages(answers: Sequence[NoisyAnswer], public: pd.DataFrame, *, group_rows: sp.csr_matrix,
              group_answers: np.ndarray, group_variances: np.ndarray, cell_codes: np.ndarray,
              identity_codes: np.ndarray, employment: np.ndarray, employment_variance: np.ndarray,
              psi: NeighborFunction) -> WageFit:
    """Protected wages from the wage answers, public attributes and protected employment (see the module).

    ``group_rows``, ``group_answers``, ``group_variances``: the group-by answers stacked over the
    establishments (``postprocess.wls.build_system``); ``cell_codes`` each establishment's cell and
    ``identity_codes`` its row in the identity answers (``postprocess.wls.fit_wages`` gives them all).
    """
    [identity] = [a for a in answers if a.query.is_identity]
    groups = [a for a in answers if not a.query.is_identity]
    answer, sd = identity.estimate[identity_codes], per_establishment(identity.sd, identity_codes)
    n_cells = int(cell_codes.max()) + 1
    exact, fixed = pinned_at_zero(group_rows, group_answers, group_variances)
    c = cell_to_group_matrix(group_rows[~exact], cell_codes, n_cells)
    b, w = group_answers[~exact], group_variances[~exact]
    fixed_cells = np.zeros(n_cells, dtype=bool)
    fixed_cells[cell_codes[fixed]] = True

    state = pd.factorize(public["state"])[0]
    n_states = int(state.max()) + 1
    cell_state = np.zeros(n_cells, dtype=np.int64)
    cell_state[cell_codes] = state
    [rate_answer] = [a for a in groups if tuple(a.query.by) == RATE_QUERY]
    rate_codes = group_establishments(public, list(RATE_QUERY)).codes
    n_rates = len(rate_answer)
    cell_rate = np.zeros(n_cells, dtype=np.int64)
    cell_rate[cell_codes] = rate_codes
    rate_state = np.zeros(n_rates, dtype=np.int64)
    rate_state[rate_codes] = state
    parent = pd.factorize(rate_answer.keys["state"].astype(str) + "/"
                          + rate_answer.keys["naics5"].astype(str).str[:PARENT_DIGITS])[0]

    # 1. cell measurements, variances at the state's rate
    state_rate = np.maximum(_by_state(state, answer, n_states), 0.0) / _by_state(state, employment, n_states)
    direct = np.bincount(cell_codes, weights=answer, minlength=n_cells)
    direct_variance = np.bincount(cell_codes, weights=psi.estimate_variance(state_rate[state] * employment, sd),
                                  minlength=n_cells)
    cell_employment = np.bincount(cell_codes, weights=employment, minlength=n_cells)
    cell_squares = np.bincount(cell_codes, weights=employment**2, minlength=n_cells)
    cell_employment_variance = np.bincount(cell_codes, weights=employment_variance, minlength=n_cells)
    rate_employment = np.bincount(rate_codes, weights=employment, minlength=n_rates)
    rate_totals, rate_variance = np.maximum(rate_answer.estimate, 0.0), rate_answer.variance
    cell_totals = np.zeros(n_cells)  # the first pass: rates from the rate query's answers, nothing left out
    for _ in range(PASSES):
        # 2-3. rates, the cell prior, and the cell totals
        rates, rates_variance = _pooled_rates(rate_totals, rate_variance, rate_employment, parent, rate_state,
                                              cell_rate, cell_totals, cell_employment)
        prior = rates * cell_employment
        if cell_totals.any():  # after the first pass: identity variances at the (left-one-out) prior
            direct_variance = np.bincount(cell_codes, weights=psi.estimate_variance(rates[cell_codes] * employment, sd),
                                          minlength=n_cells)
        spread_free = (rates**2 * (ESTABLISHMENT_SPREAD**2 * cell_squares + cell_employment_variance)
                       + cell_employment**2 * rates_variance + 1.0)
        excess = _by_state(cell_state, (direct - prior) ** 2 - direct_variance - spread_free, n_states)
        scale = _by_state(cell_state, prior**2, n_states)
        cell_spread = np.clip(np.sqrt(np.maximum(np.divide(excess, scale, out=np.zeros(n_states), where=scale > 0),
                                                 0.0)), *CELL_SPREAD_BOUNDS)
        prior_variance = (cell_spread[cell_state] * prior) ** 2 + spread_free
        precision = 1.0 / direct_variance + 1.0 / prior_variance
        combined = (direct / direct_variance + prior / prior_variance) / precision
        totals, _ = solve_nested(combined, 1.0 / precision, np.arange(n_cells), c, b, w, fixed_zero=fixed_cells)
        rate_totals, cell_totals = np.bincount(cell_rate, weights=totals, minlength=n_rates), totals
        rate_variance = 1.0 / (1.0 / np.maximum(rate_answer.variance, np.finfo(float).tiny)
                               + 1.0 / np.bincount(cell_rate, weights=direct_variance, minlength=n_rates))

    # 4. shares within cells
    share_prior = totals[cell_codes] * employment / cell_employment[cell_codes]
    noise = psi.estimate_variance(share_prior, sd)
    excess = _by_state(state, (answer - share_prior) ** 2 - noise, n_states)
    scale = _by_state(state, share_prior**2, n_states)
    spread = np.clip(np.sqrt(np.maximum(np.divide(excess, scale, out=np.zeros(n_states), where=scale > 0), 0.0)),
                     *SPREAD_BOUNDS)
    cell_rate_now = np.divide(totals, cell_employment, out=np.zeros(n_cells), where=cell_employment > 0)[cell_codes]
    spread_variance = (spread[state] * share_prior) ** 2 + cell_rate_now**2 * employment_variance + np.finfo(float).tiny
    share_precision = 1.0 / noise + 1.0 / spread_variance
    target = (answer / noise + share_prior / spread_variance) / share_precision
    values, free = share_cells(totals, cell_codes, target, 1.0 / share_precision)
    values[fixed] = 0.0
    return WageFit(values=values, cell_codes=cell_codes, totals=totals, cell_measurement=combined,
                   cell_variance=1.0 / precision, groups=c, group_answers=b, group_variance=w,
                   fixed_cells=fixed_cells, share_variance=np.where(free, 1.0 / share_precision, 0.0))


def wage_variances(fit: WageFit, tab_codes: np.ndarray, n_tab: int) -> np.ndarray:
    """Variance of every tabulation cell's protected wage total (tab_codes -1: not tabulated).

    Two parts: the cell totals' covariance from the cell-level least squares, H^-1 with
    H = diag(1 / cell_variance) + C' W C (fixed cells excluded), for the tabulation's share of each
    cell (the share of the cell's protected wages it holds; a share moves with its cell's total); and
    the within-cell part, K_T - K_T^2 / K_c per cell, K the share variances summed over the
    tabulation's (K_T) and the cell's (K_c) establishments.
    """
    codes, inside = fit.cell_codes, tab_codes >= 0
    n_cells = len(fit.totals)
    cell_of = codes[inside]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(fit.totals[cell_of] > 0, fit.values[inside] / fit.totals[cell_of], 0.0)
    g = sp.csr_matrix((share, (cell_of, tab_codes[inside])), shape=(n_cells, n_tab))
    cell_variance = np.where(fit.fixed_cells, 0.0, fit.cell_variance)
    operator = CellOperator(fit.groups, fit.group_variance, cell_variance)
    p = sp.diags(cell_variance) @ g
    base = np.asarray(g.multiply(p).sum(axis=0)).ravel()
    variances = base - operator.forms_after_solve(p)
    within_tab = sp.csr_matrix((fit.share_variance[inside], (cell_of, tab_codes[inside])), shape=(n_cells, n_tab))
    within_cell = np.bincount(codes, weights=fit.share_variance, minlength=n_cells)
    entries = within_tab.tocoo()
    part = entries.data - np.divide(entries.data**2, within_cell[entries.row], out=np.zeros_like(entries.data),
                                    where=within_cell[entries.row] > 0)
    variances += np.bincount(entries.col, weights=part, minlength=n_tab)
    return np.maximum(variances, 0.0)

