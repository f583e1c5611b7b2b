"""A heavy-tailed prior for the cells' wages (``postprocess.wages``, option CELL_TAILS): a cell's
deviation from its prior, t_c - E_c r_c, is normal with variance s^2 vp_c / lambda_c, lambda_c ~
Gamma(nu / 2, rate nu / 2), vp_c the normal prior's variance (``wages._cell_priors``): a Student-t
of nu degrees of freedom and scale s^2 vp_c (nu = inf and s^2 = 1: the normal prior).

The cell's data on its deviation: its summed identity answers less its prior, d_c = y_c - E_c r_c,
with noise n_c = vd_c (the answers' noise variance, at the wage the fit weighs them at) + E_c^2 vr_c
(the prior rate's variance; in the first pass, where the prior rate is the rate query's NAICS-5 rate,
also the NAICS-6 and county effects' variances, which the fit carries apart). Per state, nu and s^2
are those of the largest marginal likelihood of the d_c (``rate_tails.fit_tails``: nu on its grid,
s^2 within SCALE_BOUNDS; from at most MOST cells, every k-th in the cells' order), and each cell's
prior variance becomes s^2 vp_c E[1 / lambda_c | d_c]: a cell whose answers lie far from its prior,
relative to s^2 vp_c + n_c, gets a wide prior (it is shrunk less), one near its prior a narrower one.
The weighted least squares keeps its form, and the margins (``wage_margins``) read the fit's
variances, so they are those of the fit at the new priors. Cells an exact answer fixes take no part.
"""

from __future__ import annotations

import numpy as np

from gedp.postprocess.rate_tails import tail_variances

#: Bounds of s^2, the t-prior's scale over the normal prior's variance.
SCALE_BOUNDS = (0.01, 10.0)
#: The most cells of a state the marginal likelihood is taken over (the multipliers are every cell's).
MOST = 2000


def cell_tail_variances(cell_state: np.ndarray, deviation: np.ndarray, noise: np.ndarray, prior_variance: np.ndarray,
                        fixed: np.ndarray, n_states: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell, its prior variance s^2 vp E[1 / lambda | d] (``prior_variance`` vp where ``fixed``);
    per state, s^2 and nu (module docstring)."""
    scale = np.where(fixed, 0.0, prior_variance)
    variance, spreads, nus = tail_variances(cell_state, deviation, noise, scale, n_states, SCALE_BOUNDS, most=MOST)
    return np.where(fixed, prior_variance, variance), spreads, nus
