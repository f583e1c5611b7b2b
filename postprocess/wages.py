"""Wages informed by protected employment: what the identity wage answers cannot say alone.

At the baseline budget an establishment's identity wage answer is almost pure noise (sd 333 on the
sqrt scale), so the plain weighted least squares (``postprocess.wls``) gives most employers $0 and,
through the nonnegativity bound on those noisy answers, pushes wage totals up. Protected employment
is far more accurate, and wage per employee varies far less than wages. So, per state:

1. **Cell measurements.** A cell is a group of the finest measured grouping (county x NAICS-5 in the
   shipped plans, the *plan's cell*) split by NAICS-6 (DETAIL). Its identity answers are summed
   (unbiased for the cell total) with the variance evaluated at the state's wage per protected
   employee times the cell's employment: a weight that does not depend on the answers' own noise,
   so weighting adds no bias (the E3 effect).
2. **Industry rates, shared.** Each group g of the plan's [state, naics5] query has a wage per
   protected employee r_g; the rates of one NAICS-3 parent p scatter around a parent rate rho_p
   (relative spread between siblings estimated by moments per state), and rho_p has only a vague
   prior; a NAICS-5 group with several NAICS-6 industries gives each its own rate around r_g (spread
   by moments per state: the NAICS-6 industries' summed identity answers per protected employee
   against the rate query's r_g, at least MIN_RATE_SPREAD), so the NAICS-6 split of a plan's cell,
   shared by its industry in every county, is an unknown of the fit and of the margins (both
   spreads by weighted moments, ``spread_moments``: each industry counts by what its noise lets it
   tell, so the noisiest ones do not drive the estimate negative at a small wage share); each county
   k has an offset kappa_k to its industries' rates (sd by moments per state).
   Rates, parent rates and offsets are latent variables of the least squares, not plug-ins: a
   cell's prior error is shared by every cell of its industry (or county), and the margins carry
   that correlation.
3. **Cell prior.** The cell's wage is about (r_g + kappa_k) E_c (E_c its protected employment), with
   variance (s E_c r)^2 + b E_c r^2 (r its prior rate) plus the noise of E_c: a relative variance
   s^2 + b / E_c that is large for small cells (part-time work, turnover, a few people's pay). s is
   estimated by moments per state (its information is in the large cells); b is EMPLOYEE_VARIANCE,
   fixed from public data (published county x NAICS-6 cells, 2016 Q1: Rhode Island fits 2.8, New
   Jersey 3.8, tests/test_wages.py; the larger kept), or, with EMPLOYEE_VARIANCE_ESTIMATED, estimated
   per state from the release with s (``employee_variance``; EMPLOYEE_VARIANCE where not identified).
   An establishment without protected employment (under EMPLOYMENT_FLOOR) adds the variance of such
   establishments' wages around their prior, by weighted moments per state from their identity
   answers (``spread_moments``; at least 0; separately for the establishments of cells without
   protected employment, ``idle_classes``), to its cell's prior variance and to its share's. The
   least squares over cell totals t >= 0 and rates,

       sum_c (d_c - t_c)^2 / vd_c + (t_c - E_c (r_g(c) + kappa_k(c)))^2 / vp_c
         + sum_g (r_g - rho_p(g))^2 / vr_g + sum_p (rho_p - m_p)^2 / vague_p + sum_k kappa_k^2 / vk
         + every group answer's row (state, county, industry, cell),

   is solved for the rates exactly (Woodbury through the plan's cells and the cell operator, per
   state; the nonnegativity of t is left out there) and then for t >= 0 with the rates fixed, by the
   structured solver, then the rates at those totals and the totals again (a prior rate is at least
   RATE_FLOOR of the state's). An establishment's wage is at least WAGE_FLOOR x the state's rate x
   its protected employment, a cell's total at least its establishments' (the least squares over
   t - that bound >= 0): a cell with employment is released at $0 only when an exact answer (a pnc
   group clipped at 0) pins it. Steps 2-3 run PASSES times (spreads from the last fit; knobs below).
4. **Shares.** Each cell's total is shared among its establishments: each establishment's identity
   answer (variance at its employment share of the total) and its employment share (variance
   (s x share)^2 + b x rate^2 x its employment, as a cell's prior; s by moments
   from the identity answers) combined by inverse variance, the shares at least their bounds and
   adding up exactly to the cell total. Where the cells span counties (a plan without county wage
   queries), a county's establishments share a deviation from their employment shares (sd by
   moments per state), which the margins carry.

Why this is postprocessing (no privacy cost): its inputs are released answers, public attributes and
protected employment (itself postprocessing of released answers), and the constants below are fixed
in the code, not read from confidential data. The margins of error (``wage_margins.wage_variances``)
recompute the same fit from a release's files, and state the identity answers' noise where their
released wages lie rather than where the fit weighed them: the fit's sandwich (``_noise_excess``).

This module holds the fit (its constants, the moments' spreads, the passes, the checked result); its
parts live beside it: ``wage_layout`` (the model's cells and where the rates sit), ``wage_rates`` (the
shared rates' system and its solve), ``wage_shares`` (step 4's shares) and ``wage_margins`` (the
tabulations' margins of error).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve

from gedp.errors import SolverError
from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.measure.queries import IDENTITY, Groupings
from gedp.postprocess.attributes import MONTHS, WAGE
from gedp.postprocess.cell_spread import layout_cell_spread
from gedp.postprocess.cell_tails import cell_tail_variances
from gedp.postprocess.employee_variance import LEAST_EMPLOYMENT, spread_and_employee_variance
from gedp.postprocess.months import row_means
from gedp.postprocess.rate_tails import effective_deviations, tail_variances
from gedp.postprocess.spread_moments import (
    county_spread,
    detail_spread,
    idle_classes,
    idle_wage_variance,
    plain_squared_spread,
    sibling_spread,
)
from gedp.postprocess.structured import one_blas_thread, solve_nested
from gedp.postprocess.wage_answers import held_by_group
from gedp.postprocess.wage_layout import ModelCells, ThetaLayout, establishment_counties, model_cells, theta_layout
from gedp.postprocess.wage_rates import (
    RateBlock,
    SharedRates,
    cells_inside,
    parent_deviations,
    prior_precision,
    rate_system_blocks,
    solve_rates,
)
from gedp.postprocess.wage_shares import share_cells
from gedp.postprocess.wls import LinearSystem, WLSResult, build_system, checked_result, system_structure
from gedp.synth.schema import public_columns

#: How wages are postprocessed: "employment" (this module; the default when it applies) or "wls"
#: (the plain weighted least squares, ``postprocess.wls``).
WAGE_METHODS = ("employment", "wls")
#: The query whose groups get their own wage per employee (pooled toward a NAICS-3 parent rate).
RATE_QUERY = ("state", "naics5")
#: Bounds of the relative spread of a cell's wage per employee around its industry's rate
#: (estimated by moments per state).
CELL_SPREAD_BOUNDS = (0.1, 1.0)
#: Relative variance per employee b: a cell of E employees varies around its prior by b x rate^2 x E
#: beyond its cell spread (a relative variance of b / E, large for small cells); from published
#: QCEW cells (module docstring): the larger of the two states' fits, the conservative choice.
EMPLOYEE_VARIANCE = 3.8
#: b estimated per state from the release's answers (``employee_variance``); off: EMPLOYEE_VARIANCE.
EMPLOYEE_VARIANCE_ESTIMATED = False
#: Bounds of the estimated establishment spread, and the smallest relative spread between sibling rates.
SPREAD_BOUNDS = (0.05, 3.0)
MIN_RATE_SPREAD = 0.1
#: Sibling rates scatter around at least this share of the state's rate (a parent rate near 0 does
#: not pin its children), and a parent rate's vague prior has this many state rates as its sd.
RATE_FLOOR = 0.1
PARENT_VAGUENESS = 10.0
#: The smallest state wage per employee the priors are scaled by: a state whose wage answers sum to
#: nothing (or less) still gets priors of positive width (wages then follow the measurements).
MIN_STATE_RATE = 1.0
#: The smallest sd of a county's offset to its industries' rates, as a share of the state's rate.
MIN_COUNTY_SPREAD = 0.02
#: Employment an establishment counts for at least (its share of a cell total is never 0).
EMPLOYMENT_FLOOR = 0.5
#: The least wage per protected employee of an establishment (so of a cell), as a share of the
#: state's rate: one with protected employment is paid at least this (its wage answers cannot pin it
#: at $0 unless an exact answer does). Below every published county x NAICS-6 cell of Rhode Island
#: (lowest 0.070) and New Jersey (lowest 0.063), 2016 Q1 (tests/test_wages.py re-derives both).
WAGE_FLOOR = 0.05
#: Fits of the cell totals (rates refreshed from the previous fit).
PASSES = 3
#: The sibling rates' prior heavier-tailed (``rate_tails``: a Student-t fitted by marginal likelihood to
#: the last fit's deviations, each rate's prior variance from its own); off: normal (measured, not shipped).
RATE_TAILS = False
#: Passes 2-3 keep pass 1's sibling spread (from the rate query's answers) rather than re-estimate it
#: from the last fit's posterior means less their variance (biased: ``sibling_spread``); off: measured.
RATE_SPREAD_KEPT = False
#: Every pass: the cell spread of pass 1 corrected for each cell's share of its rate (``cell_spread``); off: measured.
CELL_SPREAD_CORRECTED = False
TAIL_SPREAD_BOUNDS = (MIN_RATE_SPREAD**2, 4.0)  # bounds of the t-prior's squared relative scale between siblings
#: The cells' wages around their priors heavier-tailed (``cell_tails``: a Student-t fitted by marginal likelihood
#: per state to each pass's cells, each cell's prior variance from its own answers); off: normal (measured).
CELL_TAILS = False


@dataclass(frozen=True, eq=False)
class WageFit:
    """Protected wages and what their margins of error need."""

    values: np.ndarray  # per establishment
    cell_codes: np.ndarray  # per establishment
    totals: np.ndarray  # per cell
    cell_measurement: np.ndarray  # per cell: its direct measurement and prior combined
    cell_variance: np.ndarray  # per cell: the combined measurement's variance
    coarse_groups: sp.csr_matrix  # groups x the plan's cells (groups with an exact answer left out)
    coarse_cells: np.ndarray  # per cell: its plan cell
    group_answers: np.ndarray
    group_variance: np.ndarray
    fixed_cells: np.ndarray  # cells held at 0 by an exact answer
    lower: np.ndarray  # per cell: its least total (WAGE_FLOOR x the state's rate x its protected employment)
    share_variance: np.ndarray  # per establishment: variance of its combined share measurement (0 if fixed)
    county_codes: np.ndarray  # per establishment: its county (state and county)
    county_loading: np.ndarray  # per establishment: sd of its share's part of its county's shared deviation
    rates: SharedRates  # the industry rates shared by the cells' priors
    noise_excess: np.ndarray  # per cell: v^2 e / vd^2, its answers' noise where their wages lie (``_noise_excess``)
    employee_variance: np.ndarray  # per state: b, the per-employee variance of the priors (with its se: inf if fixed)
    employee_variance_se: np.ndarray

    @property
    def groups(self) -> sp.csr_matrix:
        """Groups x cells (each cell in the groups of its plan cell)."""
        return (self.coarse_groups @ cells_inside(self.coarse_cells, self.coarse_groups.shape[1])).tocsr()


def applies(answers: Sequence[NoisyAnswer], attribute: str, protected_attributes: Sequence[str]) -> bool:
    """Whether ``attribute``'s answers can be postprocessed this way: wages, one identity answer, the
    rate query measured, and protected employment available."""
    return (attribute == WAGE and any(m in protected_attributes for m in MONTHS)
            and sum(a.query.is_identity for a in answers) == 1
            and any(tuple(a.query.by) == RATE_QUERY for a in answers))


def protected_employment(protected: pd.DataFrame, answers: Mapping[str, Sequence[NoisyAnswer]],
                         identity_codes: np.ndarray, psi: NeighborFunction) -> tuple[np.ndarray, np.ndarray]:
    """Each establishment's protected employment, the mean of its protected months, and that mean's
    noise variance: each month's identity-answer variance at the protected value
    (independent noise across months; 0 for a month without identity answer). ``identity_codes``:
    each establishment's row in the identity answers."""
    months = [m for m in MONTHS if m in protected]
    values = protected[months].to_numpy(dtype=float)
    variance = np.zeros(len(protected))
    for k, month in enumerate(months):
        identity = [a for a in answers.get(month, []) if a.query.is_identity]
        if identity:
            variance += psi.estimate_variance(values[:, k], per_establishment(identity[0].sd, identity_codes))
    return row_means(values), variance / len(months) ** 2


def per_establishment(values: np.ndarray | float, identity_codes: np.ndarray) -> np.ndarray:
    """An identity answer's per-row values (or one value for all), in establishment order."""
    return np.broadcast_to(values, (int(identity_codes.max()) + 1,))[identity_codes]


def _by_state(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(codes, weights=values, minlength=n)


@dataclass(frozen=True, eq=False)
class _Problem:
    """What every pass of the cell fit reads (step 1 and the fixed parts of steps 2-3)."""

    cells: ModelCells
    theta: ThetaLayout
    psi: NeighborFunction
    answer: np.ndarray  # per establishment: its identity answer
    sd: np.ndarray
    employment: np.ndarray
    employment_variance: np.ndarray
    state_rate: np.ndarray  # per state: wage per protected employee
    direct: np.ndarray  # per cell: its summed identity answers
    direct_noise: np.ndarray  # per cell: their noise variance evaluated at the answers (unbiased for it)
    cell_employment: np.ndarray
    cell_employment_variance: np.ndarray
    idle: np.ndarray  # per establishment: without protected employment (and not fixed)
    idle_variance: np.ndarray  # per establishment: its wages' variance without protected employment (0 if employed)
    cell_idle_variance: np.ndarray  # per cell: its establishments' idle_variance summed
    rate_employment: np.ndarray  # per rate
    group_right: np.ndarray  # per cell: C' W^-1 b
    floor: np.ndarray  # per state: RATE_FLOOR of its rate
    parent_vagueness: np.ndarray  # per parent rate: its vague prior's variance
    detail_spread2: np.ndarray  # per detail rate
    lower: np.ndarray  # per establishment: its least wage (WAGE_FLOOR; 0 when fixed)
    cell_lower: np.ndarray  # per cell: its establishments' least wages summed
    county_codes: np.ndarray  # per establishment: its county (state and county; 0 without counties)
    rate_blocks: tuple[RateBlock, ...]  # the blocks of the rates' system (``rate_system_blocks``)


@dataclass(frozen=True, eq=False)
class _Pass:
    """What one pass of the cell fit hands the next."""

    rate_totals: np.ndarray  # per rate: the wages its rate is taken from
    rate_variance: np.ndarray  # per rate
    cell_rate_variance: np.ndarray  # per cell: of its prior rate
    weight_rate: np.ndarray  # per establishment: the rate its identity answer's variance is evaluated at
    cell_rates: np.ndarray | None = None  # per cell: its prior wage per employee (None before the first fit)
    totals: np.ndarray | None = None  # per cell: the last fit's totals (None before the first fit)
    deviation: tuple | None = None  # RATE_TAILS: per rate, u - rho's posterior mean, variance, prior variance
    rate_spread2: np.ndarray | None = None  # per state: the sibling rates' spread squared (None before the first fit)
    cell_spread2: np.ndarray | None = None  # per state: the cell spread squared (None before the first fit)
    employee_variance: tuple = ()  # per state: b and its standard error (empty before the first fit)


@dataclass(frozen=True, eq=False)
class _Fit:
    """One pass's fit of the cell totals."""

    totals: np.ndarray
    combined: np.ndarray  # per cell: its direct measurement and prior combined
    cell_variance: np.ndarray  # per cell: the combined measurement's variance
    rates: SharedRates
    direct_variance: np.ndarray  # per cell: its direct measurement's variance (at ``weighed_at``)
    weighed_at: np.ndarray  # per establishment: the wage its identity answer's variance was evaluated at


def _problem(answers: Sequence[NoisyAnswer], groupings: Groupings, system: LinearSystem, plan_codes: np.ndarray,
             employment: np.ndarray, employment_variance: np.ndarray, psi: NeighborFunction
             ) -> tuple[_Problem, _Pass]:
    """The fixed inputs of the cell fit (step 1: the cell measurements) and the first pass's start;
    ``employment``: each establishment's protected employment (``protected_employment``)."""
    identity_codes, rate_codes = groupings(IDENTITY).codes, groupings(RATE_QUERY).codes
    [identity] = [a for a in answers if a.query.is_identity]
    [rate_answer] = [a for a in answers if not a.query.is_identity and tuple(a.query.by) == RATE_QUERY]
    sd = per_establishment(identity.sd, identity_codes)
    answer = held_by_group(psi, identity, identity_codes, sd, rate_answer, rate_codes)
    n_rates = len(rate_answer)
    cells, detail_group, establishment_detail = model_cells(groupings, plan_codes, rate_codes, n_rates, system)
    theta = theta_layout(groupings, rate_answer, rate_codes, cells, detail_group, establishment_detail)
    n_cells, state, n_states = len(cells.coarse), theta.state, theta.n_states
    protected_employment = np.maximum(employment, 0.0)
    employment = np.maximum(employment, EMPLOYMENT_FLOOR)
    # the first pass weighs the cell measurements at the state's rate
    state_rate = np.maximum(_by_state(state, answer, n_states) / _by_state(state, employment, n_states), MIN_STATE_RATE)
    rate_employment = np.bincount(rate_codes, weights=employment, minlength=n_rates)
    rate_variance = rate_answer.variance / rate_employment**2  # of each rate
    weight_rate = state_rate[state]  # per establishment
    detail_spread2 = detail_spread(answer, employment, psi.estimate_variance(weight_rate * employment, sd),
                                   establishment_detail, detail_group, rate_answer.estimate / rate_employment,
                                   rate_variance, theta.rate_state, n_states, MIN_RATE_SPREAD)
    lower = np.where(cells.fixed, 0.0, WAGE_FLOOR * state_rate[state] * protected_employment)
    idle = (protected_employment < EMPLOYMENT_FLOOR) & ~cells.fixed
    idle_variance = idle_wage_variance(answer, weight_rate * employment, psi.estimate_variance(answer, sd),
                                       psi.estimate_variance(weight_rate * employment, sd), idle,
                                       *idle_classes(idle, cells.codes, n_cells, state, n_states))
    problem = _Problem(
        cells=cells, theta=theta, psi=psi, answer=answer, sd=sd, employment=employment,
        employment_variance=employment_variance, state_rate=state_rate,
        direct=np.bincount(cells.codes, weights=answer, minlength=n_cells),
        direct_noise=np.bincount(cells.codes, weights=psi.estimate_variance(answer, sd), minlength=n_cells),
        cell_employment=np.bincount(cells.codes, weights=employment, minlength=n_cells),
        cell_employment_variance=np.bincount(cells.codes, weights=employment_variance, minlength=n_cells),
        idle=idle, idle_variance=idle_variance, cell_idle_variance=np.bincount(cells.codes, weights=idle_variance,
                                                                    minlength=n_cells),
        rate_employment=rate_employment, group_right=(cells.c.T @ (cells.b / cells.w))[cells.coarse],
        floor=RATE_FLOOR * state_rate, parent_vagueness=(PARENT_VAGUENESS * state_rate[theta.parent_state]) ** 2,
        detail_spread2=detail_spread2,
        lower=lower, cell_lower=np.bincount(cells.codes, weights=lower, minlength=n_cells),
        county_codes=(establishment_counties(groupings) if "county" in groupings.public
                      else np.zeros(len(identity_codes), dtype=np.int64)),
        rate_blocks=rate_system_blocks(cells.c, cells.w, theta.cell_state, cells.coarse, theta.theta_state))
    # the first pass: rates from the rate query's answers
    start = _Pass(rate_totals=np.maximum(rate_answer.estimate, 0.0), rate_variance=rate_variance,
                  cell_rate_variance=rate_variance[theta.cell_rate], weight_rate=weight_rate)
    return problem, start


def _rate_priors(p: _Problem, last: _Pass) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Step 2: the observed rates, their parent rates, and the variances of the sibling rates around
    their parent and of the detail rates around their NAICS-5 rate (spreads by weighted moments per
    state, ``spread_moments``; with RATE_TAILS after the first pass, the sibling rates' from the last
    fit's deviations by ``rate_tails``)."""
    theta = p.theta
    parent, rate_state = theta.parent, theta.rate_state
    observed, parent_rate, spread2 = sibling_spread(parent, rate_state, last.rate_totals, p.rate_employment,
                                                    last.rate_variance, len(theta.parent_state), theta.n_states,
                                                    MIN_RATE_SPREAD)
    if RATE_SPREAD_KEPT and last.rate_spread2 is not None:
        spread2 = last.rate_spread2  # pass 1's: passes 2-3 carry posterior means (``sibling_spread``)
    scale = np.maximum(parent_rate[parent], p.floor[rate_state]) ** 2
    rate_spread_variance = spread2[rate_state] * scale
    if RATE_TAILS and last.deviation is not None:  # heavier tails, from the last fit (``rate_tails``)
        rate_spread_variance, _, _ = tail_variances(rate_state, *effective_deviations(*last.deviation), scale,
                                                    theta.n_states, TAIL_SPREAD_BOUNDS)
    detail_variance = p.detail_spread2 * np.maximum(observed, p.floor[rate_state])[theta.detail_group] ** 2
    return observed, parent_rate, rate_spread_variance, detail_variance, spread2


def _cell_priors(p: _Problem, last: _Pass, observed: np.ndarray, detail_variance: np.ndarray
                 ) -> tuple[np.ndarray, ...]:
    """Step 3's priors: cell prior rates, direct measurements' variances, county offsets' variances, cell prior
    variances, cell spread squared per state (by moments), at the last fit's rates (the first pass: observed)."""
    theta = p.theta
    cell_state, n_cells = theta.cell_state, len(p.cells.coarse)
    cell_rates = (np.maximum(observed, p.floor[theta.rate_state])[theta.cell_rate] if last.cell_rates is None
                  else last.cell_rates)
    prior = cell_rates * p.cell_employment
    direct_variance = np.bincount(p.cells.codes, weights=p.psi.estimate_variance(last.weight_rate * p.employment, p.sd),
                                  minlength=n_cells)
    county_variance = county_spread(theta.cell_county, theta.county_state, p.cell_employment,
                                    p.direct if last.totals is None else last.totals,
                                    direct_variance if last.totals is None else np.zeros(n_cells),
                                    observed[theta.cell_rate] * p.cell_employment,
                                    (MIN_COUNTY_SPREAD * p.state_rate) ** 2)
    known = cell_rates**2 * p.cell_employment_variance + 1.0 + p.cell_idle_variance + p.cell_employment**2 * \
        last.cell_rate_variance
    shared = _shared_effects(theta, detail_variance, county_variance) * p.cell_employment**2  # not in pass 1's prior
    b, b_error = last.employee_variance or _employee_variance(p, prior, cell_rates, direct_variance, known + shared)
    employee_part = (cell_rates**2 * (b[cell_state] * p.cell_employment + p.cell_employment_variance) + 1.0
                     + p.cell_idle_variance)
    spread2 = plain_squared_spread(cell_state, (p.direct - prior) ** 2 - direct_variance - employee_part
                                   - p.cell_employment**2 * last.cell_rate_variance, prior**2, theta.n_states)
    if CELL_SPREAD_CORRECTED:  # every pass: pass 1's corrected moment (``cell_spread``)
        spread2 = last.cell_spread2 if last.cell_spread2 is not None else layout_cell_spread(
            theta, p.direct, prior, p.cell_employment, direct_variance, employee_part, last.rate_variance,
            detail_variance, county_variance)
    cell_spread = np.clip(np.sqrt(np.maximum(spread2, 0.0)), *CELL_SPREAD_BOUNDS)
    prior_variance = (cell_spread[cell_state] * prior) ** 2 + employee_part
    if CELL_TAILS:  # noise: the answers', the prior rate's (pass 1: and the effects the fit carries apart)
        noise = direct_variance + p.cell_employment**2 * last.cell_rate_variance
        noise += shared if last.totals is None else 0.0
        prior_variance = cell_tail_variances(cell_state, p.direct - prior, noise, prior_variance, p.cells.fixed_cells,
                                             theta.n_states)[0]
    return cell_rates, direct_variance, county_variance, prior_variance, spread2, (b, b_error)


def _shared_effects(theta: ThetaLayout, detail_variance: np.ndarray, county_variance: np.ndarray) -> np.ndarray:
    """Per cell: the variance of its NAICS-6 rate around its NAICS-5 rate and of its county's offset."""
    n_rates, n_parents, n_counties, _ = theta.sizes
    detail = theta.cell_node - (n_rates + n_parents + n_counties)
    out = np.where(detail >= 0, detail_variance[np.maximum(detail, 0)] if len(detail_variance) else 0.0, 0.0)
    return out + (county_variance[theta.cell_county] if theta.cell_county is not None else 0.0)


def _employee_variance(p: _Problem, prior: np.ndarray, cell_rates: np.ndarray, direct_variance: np.ndarray,
                       known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per state: b and its standard error, EMPLOYEE_VARIANCE (se inf) unless EMPLOYEE_VARIANCE_ESTIMATED
    (``employee_variance``: from the cells no exact answer fixes, ``known`` their other prior variance;
    in pass 1, where the prior rates are the rate query's answers, independent of the identity answers'
    noise; later passes' rates are fitted to those answers and keep pass 1's b)."""
    n_states = p.theta.n_states
    if not EMPLOYEE_VARIANCE_ESTIMATED:
        return np.full(n_states, EMPLOYEE_VARIANCE), np.full(n_states, np.inf)
    free = ~p.cells.fixed_cells & (prior > 0) & (p.cell_employment >= LEAST_EMPLOYMENT)
    squared = (p.direct - prior)[free] ** 2 - known[free]
    _, b, error = spread_and_employee_variance(
        p.theta.cell_state[free], squared - direct_variance[free], squared - p.direct_noise[free], prior[free],
        cell_rates[free] ** 2 * p.cell_employment[free], direct_variance[free] + known[free], n_states,
        CELL_SPREAD_BOUNDS, EMPLOYEE_VARIANCE)
    return b, error


def _fit_pass(p: _Problem, last: _Pass) -> tuple[_Pass, _Fit]:
    """Steps 2-3 once: the priors' spreads, then the rates of the joint least squares and the cell
    totals >= 0 at those rates; the rates at those totals and the totals again."""
    theta, cells = p.theta, p.cells
    n_rates, _, n_counties, n_details = theta.sizes
    observed, parent_rate, rate_spread_variance, detail_variance, spread2 = _rate_priors(p, last)
    _, direct_variance, county_variance, prior_variance, cell_spread2, b = _cell_priors(p, last, observed,
                                                                                        detail_variance)
    weighed_at = last.weight_rate * p.employment
    cell_variance = 1.0 / (1.0 / direct_variance + 1.0 / prior_variance)
    free_variance = np.where(cells.fixed_cells, 0.0, cell_variance)  # fixed cells are pinned: no variance
    cell_links = np.where(cells.fixed_cells, 0.0, p.cell_employment / prior_variance)
    links = sp.diags(cell_links) @ theta.incidence
    own_variance = np.concatenate([np.full(n_rates, np.inf), p.parent_vagueness, county_variance,
                                   np.full(n_details, np.inf)])
    precision = (theta.incidence.T @ sp.diags(cell_links * p.cell_employment) @ theta.incidence
                 + prior_precision(*theta.edges, np.concatenate([rate_spread_variance, detail_variance]),
                                   own_variance)).tocsr()
    theta_prior = np.concatenate([np.zeros(n_rates), parent_rate / p.parent_vagueness,
                                  np.zeros(n_counties + n_details)])
    rates, theta_variance, blocks = solve_rates(p.rate_blocks, free_variance, links.tocsr(), precision,
                                                p.direct / direct_variance + p.group_right, theta_prior)
    deviation = (*parent_deviations(theta.parent, rates, blocks), rate_spread_variance) if RATE_TAILS else None
    for refresh in (True, False):  # cell totals >= 0 at the rates; the rates at those totals; the totals again
        cell_rates = np.maximum(theta.incidence @ rates, p.floor[theta.cell_state])  # never near 0
        combined = (p.direct / direct_variance + cell_rates * p.cell_employment / prior_variance) * cell_variance
        totals = _bounded_totals(p, combined, cell_variance)
        if refresh:
            rates = spsolve(precision.tocsc(), links.T @ totals + theta_prior)
    carry = _Pass(rate_totals=np.maximum(np.bincount(theta.cell_rate, weights=totals, minlength=n_rates), 0.0),
                  rate_variance=theta_variance[:n_rates], cell_rate_variance=theta_variance[theta.cell_node],
                  weight_rate=cell_rates[cells.codes],  # later passes weigh the identity answers at the rates
                  cell_rates=cell_rates, totals=totals, deviation=deviation, rate_spread2=spread2,
                  cell_spread2=cell_spread2, employee_variance=b)
    return carry, _Fit(totals, combined, cell_variance, SharedRates(links, precision, blocks), direct_variance,
                       weighed_at)


def _bounded_totals(p: _Problem, combined: np.ndarray, cell_variance: np.ndarray) -> np.ndarray:
    """The cell totals t >= the sums of their establishments' ``p.lower`` of the least squares of the
    combined cell measurements and the group answers: t = lower + u with u >= 0 (the group answers
    less the lower bounds' sums), by the structured solver."""
    cells = p.cells
    lower = p.cell_lower
    lower_sums = cells.c @ np.bincount(cells.coarse, weights=lower, minlength=cells.c.shape[1])
    above, _ = solve_nested(combined - lower, cell_variance, cells.coarse, cells.c, cells.b - lower_sums, cells.w,
                            fixed_zero=cells.fixed_cells)
    return lower + above


def _shares(p: _Problem, totals: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 4: each establishment's share of its cell's total, its combined share measurement's
    variance (also where the share sits at 0: the bound does not make it certain; 0 where an exact
    answer fixes it), and its county loading (``_county_loadings``)."""
    codes, state, n_cells = p.cells.codes, p.theta.state, len(totals)
    share_prior = totals[codes] * p.employment / p.cell_employment[codes]
    noise = p.psi.estimate_variance(share_prior, p.sd)
    cell_rate_now = np.divide(totals, p.cell_employment, out=np.zeros(n_cells), where=p.cell_employment > 0)[codes]
    employee_part = cell_rate_now**2 * (b[state] * p.employment + p.employment_variance) + p.idle_variance
    spread2 = plain_squared_spread(state, (p.answer - share_prior) ** 2 - noise - employee_part, share_prior**2,
                                   p.theta.n_states)
    spread = np.clip(np.sqrt(np.maximum(spread2, 0.0)), *SPREAD_BOUNDS)
    spread_variance = (spread[state] * share_prior) ** 2 + employee_part + np.finfo(float).tiny
    share_precision = 1.0 / noise + 1.0 / spread_variance
    target = (p.answer / noise + share_prior / spread_variance) / share_precision
    above, _ = share_cells(totals - p.cell_lower, codes, target - p.lower, 1.0 / share_precision)
    values = p.lower + above
    values[p.cells.fixed] = 0.0
    prior_weight = np.where(p.cells.fixed, 0.0, (1.0 / spread_variance) / share_precision)
    loading = _county_loadings(p, share_prior, p.answer - share_prior, noise + spread_variance, prior_weight)
    return values, np.where(p.cells.fixed, 0.0, 1.0 / share_precision), loading


def _noise_excess(p: _Problem, fit: _Fit, values: np.ndarray) -> np.ndarray:
    """Per cell c: v_c^2 e_c / vd_c^2, the weight of its answers' noise where their wages lie in the
    sandwich of the margins (``wage_rates.CellsInPlanCells.noise_forms``). The cell's combined
    measurement weighs its summed identity answers by 1 / vd (vd: their noise variance at
    ``fit.weighed_at``, the cell's rate x protected employment, not where the wages lie: weighing at the
    answers would bias the fit); their noise variance is vd + e at the released wages (e: the sum over
    the cell's establishments of that variance at the released wage less at the weighed one, of either
    sign), so the fit's score has covariance K + diag(e / vd^2) where its precision is K, and its
    totals' covariance is the sandwich K^-1 (K + diag(e / vd^2)) K^-1; with K^-1 g = S (g - b) (S the
    cells' variances v) the added form is sum_c v_c^2 e_c / vd_c^2 (g_c - b_c)^2. A negative e is
    kept: vd + e is the noise variance at the released wages, never negative, so K + diag(e / vd^2)
    is the precision of a least squares at those variances and the sandwich is positive semidefinite.
    0 for a fixed cell and where vd is 0."""
    noise = p.psi.estimate_variance(values, p.sd) - p.psi.estimate_variance(fit.weighed_at, p.sd)
    excess = np.bincount(p.cells.codes, weights=noise, minlength=len(fit.totals))
    added = np.divide(fit.cell_variance**2 * excess, fit.direct_variance**2, out=np.zeros(len(excess)),
                      where=fit.direct_variance > 0)
    return np.where(p.cells.fixed_cells, 0.0, added)


def _county_loadings(p: _Problem, share_prior: np.ndarray, residual: np.ndarray, variance: np.ndarray,
                     prior_weight: np.ndarray) -> np.ndarray:
    """Where the model's cells span counties (no county offsets in the cell priors), establishments of
    a county share a relative deviation from their employment shares ``share_prior`` (sd kappa, by
    moments per state: the county sums of the identity answers' ``residual`` from the shares, less
    their ``variance``, over the county's summed shares squared); each share carries kappa x its
    share prior x the prior's weight in it. Zeros where cells lie in counties."""
    n = len(residual)
    if p.theta.cell_county is not None or not p.county_codes.any():
        return np.zeros(n)
    county, state = p.county_codes, p.theta.state
    n_counties = int(county.max()) + 1
    county_state = np.zeros(n_counties, dtype=np.int64)
    county_state[county] = state

    def by_county(values):
        return np.bincount(county, weights=values, minlength=n_counties)

    kappa2 = plain_squared_spread(county_state, by_county(residual) ** 2 - by_county(variance),
                             by_county(share_prior) ** 2, p.theta.n_states)
    return np.sqrt(np.maximum(kappa2, 0.0))[state] * prior_weight * share_prior


@one_blas_thread
def fit_cells(answers: Sequence[NoisyAnswer], groupings: Groupings, system: LinearSystem, plan_codes: np.ndarray,
              employment: np.ndarray, employment_variance: np.ndarray, psi: NeighborFunction) -> WageFit:
    """Protected wages from the wage answers, public attributes and protected employment (see the module).

    ``system``: the group-by answers stacked over the establishments (``wls.build_system``);
    ``plan_codes`` each establishment's plan cell (``fit_wages`` gives them all); ``groupings``: of the
    public columns, shared (the identity rows, rate groups, industries, counties).
    """
    problem, carry = _problem(answers, groupings, system, plan_codes, employment, employment_variance, psi)
    for _ in range(PASSES):  # spreads from the last fit
        carry, fit = _fit_pass(problem, carry)
    b, b_error = carry.employee_variance
    values, share_variance, county_loading = _shares(problem, fit.totals, b)
    cells = problem.cells
    noise_excess = _noise_excess(problem, fit, values)
    return WageFit(values=values, cell_codes=cells.codes, totals=fit.totals, cell_measurement=fit.combined,
                   cell_variance=fit.cell_variance, coarse_groups=cells.c, coarse_cells=cells.coarse,
                   group_answers=cells.b, group_variance=cells.w, fixed_cells=cells.fixed_cells,
                   lower=problem.cell_lower, share_variance=share_variance, county_codes=problem.county_codes,
                   county_loading=county_loading, rates=fit.rates, noise_excess=noise_excess,
                   employee_variance=b, employee_variance_se=b_error)


def fit_wages(measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]], protected: pd.DataFrame,
              psi: NeighborFunction, groupings: Groupings | None = None) -> WageFit:
    """The employment-informed wage fit of a release's answers and protected microdata: what a
    release holds, and what the margins of error recompute from a release's files. ``groupings``:
    of the public columns of ``protected``."""
    public = protected[public_columns(protected)]
    groupings = groupings or Groupings(public)
    answers = measurements_by_attribute[WAGE]
    groups = [answer for answer in answers if not answer.query.is_identity]
    system = build_system(groups, public, [answer.variance for answer in groups], groupings)
    identity_codes = groupings(IDENTITY).codes
    employment, employment_variance = protected_employment(protected, measurements_by_attribute, identity_codes, psi)
    return fit_cells(answers, groupings, system, system_structure(answers, public, groupings)[1], employment,
                     employment_variance, psi)


def protect_wages(measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]], protected: pd.DataFrame,
                  psi: NeighborFunction, groupings: Groupings | None = None, kept: dict | None = None) -> WLSResult:
    """Wages informed by protected employment, checked like any solve: the cell totals above their
    lower bounds (``WageFit.lower``) must meet the KKT conditions of their weighted least squares
    (else SolverError). ``kept``: given, its ``WAGE`` entry is set to the fit (for margins made next)."""
    start = time.perf_counter()
    try:
        fit = fit_wages(measurements_by_attribute, protected, psi, groupings)
    except RuntimeError as err:  # pivoting did not converge
        raise SolverError(f"structured solver: {err}") from None
    if kept is not None:
        kept[WAGE] = fit
    identity = sp.identity(len(fit.totals), format="csr")
    pinned = int(np.count_nonzero(fit.fixed_cells))  # exact zero rows pin these cells, as in the solve
    matrix = sp.vstack([identity, fit.groups, identity[fit.fixed_cells]], format="csr")
    answers = np.concatenate([fit.cell_measurement, fit.group_answers, np.zeros(pinned)])
    cells = LinearSystem(matrix, answers - matrix @ fit.lower,
                         np.concatenate([fit.cell_variance, fit.group_variance, np.zeros(pinned)]))
    checked = checked_result(cells, fit.totals - fit.lower, solver="structured+employment", status="optimal",
                             start=start)
    return dataclasses.replace(checked, values=fit.values,
                               fixed_zero=int(np.count_nonzero(fit.fixed_cells[fit.cell_codes])))
