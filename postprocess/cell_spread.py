"""The wage fit's cell spread (``postprocess.wages``, step 3) from the rate query's answers, corrected for
each cell's share of its rate: what ``wages.CELL_SPREAD_CORRECTED`` gives every pass.

A cell c of a rate's group g (its wage per employee against the NAICS-5 rate) deviates from the rate
by x_c = T_c - E_c r_g with variance V_c = s^2 P_c^2 + eta_c (P_c = E_c r_g its prior, eta_c the
variance the fit states beside the spread: its employees', its protected employment's, its idle
establishments'). The shipped moment takes the rate from the rate query's answer y_g = sum_g T + e_g
(independent noise, variance E_g^2 n_g) and treats d_c - E_c y_g / E_g as deviating by x_c alone. It
does not: the rate is taken from the cells themselves, so with w_c = E_c / E_g

    d_c - E_c y_g / E_g = (1 - w_c) x_c - w_c sum_{j != c} x_j + (d_c - T_c) - w_c e_g,

whose expectation squared is (1 - w_c)^2 V_c + w_c^2 sum_{j != c} V_j + vd_c + E_c^2 n_g. A cell that
carries most of its rate's employment says almost nothing of s (the rate is its own); counted at
P_c^2 it pulls the estimate to 0, and the largest cells decide a moment weighed by P^2 (on Rhode
Island's synthesized state 10 cells carry 80% of it). The same -1/K bias as the sibling rates'
(``spread_moments.sibling_spread``), here by employment share. Corrected, per state,

    s^2 = sum_c [(d_c - E_c y_g / E_g)^2 - vd_c - E_c^2 n_g - (1 - w_c)^2 eta_c - w_c^2 (H_g - eta_c)]
          / sum_c [(1 - w_c)^2 P_c^2 + w_c^2 (Q_g - P_c^2)]

(H_g, Q_g: eta and P^2 summed over g) is unbiased under the model (the rate in P taken as known).
Passes 2-3 keep it: their moment is of the last fit's posterior means (expectation s^2 P^2 less, not
plus, the rate's posterior variance E^2 V, which the shipped moment subtracts again), and it feeds on
itself: a larger s weighs every cell alike in the rates, which moves them off the largest cells, whose
residuals raise s (Rhode Island `baseline`: 0.011 -> 0.075 -> 0.101).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gedp.postprocess.wage_layout import ThetaLayout

#: The largest share of its rate's employment a cell of the moment has (above it, (1 - w)^2 < 1/4).
MOST_SHARE = 0.5


def corrected_cell_spread(cell_state: np.ndarray, cell_rate: np.ndarray, direct: np.ndarray, prior: np.ndarray,
                          employment: np.ndarray, direct_variance: np.ndarray, other_variance: np.ndarray,
                          rate_variance: np.ndarray, n_states: int,
                          shared: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> np.ndarray:
    """Per state, the squared relative cell spread s^2 by the corrected moment (module docstring; may be
    negative; 0 for a state without scale). Per cell: its state, its rate (``cell_rate``), its summed
    identity answers ``direct`` (noise ``direct_variance``), its ``prior`` E_c y_g / E_g, its
    ``employment`` E_c and the variance beside the spread (``other_variance``: eta_c); per rate: the
    variance n_g of its answer's rate y_g / E_g (``rate_variance``). ``shared``: effects the fit carries
    apart (a detail rate, a county offset), each as (per cell its effect, -1 for none; per effect its
    variance per employee squared), left out of the moment (``shared_variance``)."""
    n_rates = len(rate_variance)

    def by_rate(values: np.ndarray) -> np.ndarray:
        return np.bincount(cell_rate, weights=values, minlength=n_rates)[cell_rate]

    rate_employment = by_rate(employment)
    share = np.divide(employment, rate_employment, out=np.zeros(len(employment)), where=rate_employment > 0)
    own, others = (1.0 - share) ** 2, share**2
    noise = (direct_variance + employment**2 * rate_variance[cell_rate] + own * other_variance
             + others * (by_rate(other_variance) - other_variance))
    for effect, variance in shared:
        noise += shared_variance(cell_rate, effect, variance, employment, n_rates)
    scale = own * prior**2 + others * (by_rate(prior**2) - prior**2)
    counted = share <= MOST_SHARE  # a cell that makes most of its rate says little of s
    summed_scale = np.bincount(cell_state, weights=np.where(counted, scale, 0.0), minlength=n_states)
    excess = np.where(counted, (direct - prior) ** 2 - noise, 0.0)
    return np.divide(np.bincount(cell_state, weights=excess, minlength=n_states), summed_scale,
                     out=np.zeros(n_states), where=summed_scale > 0)


def shared_variance(cell_rate: np.ndarray, effect: np.ndarray, variance: np.ndarray, employment: np.ndarray,
                    n_rates: int) -> np.ndarray:
    """Per cell c, what an effect shared by cells (a_h per employee, variance D_h, cell c in effect h;
    none where ``effect`` is -1) adds to E[(T_c - E_c T_g / E_g)^2]: the effect enters as
    E_c a_h(c) - w_c sum_h E_gh a_h, so E_c^2 [D_h(c) (1 - v_h(c))^2 + sum_{h != h(c)} D_h v_h^2] with
    v_h = E_gh / E_g (E_gh: the employment of rate g's cells in effect h)."""
    rate_employment = np.bincount(cell_rate, weights=employment, minlength=n_rates)
    inside = np.flatnonzero(effect >= 0)
    pairs, pair = np.unique(np.column_stack([cell_rate[inside], effect[inside]]), axis=0, return_inverse=True)
    pair = pair.reshape(-1)
    pair_share = np.bincount(pair, weights=employment[inside], minlength=len(pairs)) / rate_employment[pairs[:, 0]]
    factor = np.bincount(pairs[:, 0], weights=variance[pairs[:, 1]] * pair_share**2, minlength=n_rates)[cell_rate]
    own_share = pair_share[pair]
    factor[inside] += variance[effect[inside]] * ((1.0 - own_share) ** 2 - own_share**2)
    return employment**2 * factor


def layout_cell_spread(theta: ThetaLayout, direct: np.ndarray, prior: np.ndarray, employment: np.ndarray,
                       direct_variance: np.ndarray, other_variance: np.ndarray, rate_variance: np.ndarray,
                       detail_variance: np.ndarray, county_variance: np.ndarray) -> np.ndarray:
    """``corrected_cell_spread`` for the wage fit's cells (``wage_layout.ThetaLayout``), the detail rates'
    and county offsets' variances (per detail rate, per county: per employee squared) left out."""
    n_rates, n_parents, n_counties, _ = theta.sizes
    first_detail = n_rates + n_parents + n_counties
    shared = [(np.where(theta.cell_node >= first_detail, theta.cell_node - first_detail, -1), detail_variance)]
    if theta.cell_county is not None:
        shared.append((theta.cell_county, county_variance))
    return corrected_cell_spread(theta.cell_state, theta.cell_rate, direct, prior, employment, direct_variance,
                                 other_variance, rate_variance, theta.n_states, shared)
