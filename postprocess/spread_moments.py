"""Relative spreads squared by weighted moments, per state: what the wage fit's rate priors
(``postprocess.wages``) take their spreads from.

Each term i of a state has a squared deviation d_i whose expectation is its noise variance n_i plus
the spread s^2 times its scale c_i (the squared rate it is relative to). The plain moment estimate
sum (d - n) / sum c weighs every term alike, so at a small wage share the terms with most noise
decide it (a NAICS-6 industry of a few employees, whose identity answers are almost pure noise), and
it comes out negative, and far off, where the spread is not. Here the terms are weighed as the
estimating equation sum w (d - n - s^2 c) = 0 with w = c / (n + s^2 c)^2 asks (d's variance is about
2 (n + s^2 c)^2 for a normal deviation): a term counts by what it can tell of s^2, and the noisiest
ones hardly count. s^2 is found by a few fixed-point steps from ``start`` (weights at s^2 at least
``start``: a negative estimate does not make a weight infinite); the sandwich standard error
sqrt(sum w^2 (d - n - s^2 c)^2) / sum w c says what the estimate is worth.

``idle_wage_variance`` uses the same estimate (c = 1: a variance in dollars^2) for the wages of
establishments without protected employment around their prior, per class of such establishments;
``detail_spread`` for the NAICS-6 rates around their NAICS-5 rate. ``plain_squared_spread`` is the
plain moment (the cell spread's and the county offsets', ``county_spread``).
"""

from __future__ import annotations

import numpy as np

#: Fixed-point steps of the weighted estimate (it settles within a few: the weights change little).
STEPS = 5


def weighted_squared_spread(codes: np.ndarray, excess: np.ndarray, scale: np.ndarray, noise: np.ndarray,
                            n_states: int, start: float) -> tuple[np.ndarray, np.ndarray]:
    """Per state: s^2 by weighted moments (module docstring) and its standard error. ``excess``:
    d - n per term; ``scale``: c; ``noise``: n; ``codes``: each term's state. 0 (and standard error
    0) for a state without scale; the estimate may be negative."""
    spread2 = np.full(n_states, float(start))
    weights = np.zeros(len(excess))
    for _ in range(STEPS):
        weights = scale / (noise + np.maximum(spread2, start)[codes] * scale) ** 2
        summed_scale = np.bincount(codes, weights=weights * scale, minlength=n_states)
        spread2 = np.divide(np.bincount(codes, weights=weights * excess, minlength=n_states), summed_scale,
                            out=np.zeros(n_states), where=summed_scale > 0)
    residual = weights * (excess - spread2[codes] * scale)
    error = np.divide(np.sqrt(np.bincount(codes, weights=residual**2, minlength=n_states)), summed_scale,
                      out=np.zeros(n_states), where=summed_scale > 0)
    return spread2, error


def idle_wage_variance(answer: np.ndarray, prior: np.ndarray, noise: np.ndarray, weighing: np.ndarray,
                       idle: np.ndarray, classes: np.ndarray, n_classes: int) -> np.ndarray:
    """Per establishment: the variance of the wages of an ``idle`` one (no protected employment) around
    its employment ``prior``, by weighted moments per class (``classes``: each establishment's, of
    ``n_classes``; the wage fit's are a state's idle establishments in cells with and without
    protected employment) over the idle establishments' identity ``answer``s (``noise``: each
    answer's noise variance, unbiased for it; ``weighing``: that variance at the prior, for the
    weights); at least 0, and 0 for an establishment that is not idle."""
    codes = classes[idle]
    excess = (answer[idle] - prior[idle]) ** 2 - noise[idle]
    variance, _ = weighted_squared_spread(codes, excess, np.ones(len(codes)), weighing[idle], n_classes, 0.0)
    return np.where(idle, np.maximum(variance, 0.0)[classes], 0.0)


def idle_classes(idle: np.ndarray, cell_codes: np.ndarray, n_cells: int, state: np.ndarray, n_states: int
                 ) -> tuple[np.ndarray, int]:
    """Per establishment, the class its wages' variance without protected employment is estimated in
    (``idle_wage_variance``; in the wage fit), and the number of classes: per state, establishments
    ``idle`` in a cell where every establishment is idle (2 x state + 1: a cell with no employment to
    be paid in proportion to, whose wages are all the idle establishments' own) apart from the
    others (2 x state: an idle establishment among employed ones, whose wages are a small share of
    its cell's)."""
    busy = np.bincount(cell_codes, weights=(~idle).astype(float), minlength=n_cells)
    return 2 * state + (busy[cell_codes] == 0), 2 * n_states


def sibling_spread(parent: np.ndarray, rate_state: np.ndarray, totals: np.ndarray, employment: np.ndarray,
                   noise: np.ndarray, n_parents: int, n_states: int, least: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The wage fit's sibling rates (``postprocess.wages``): each rate's observed value ``totals`` /
    ``employment``, its ``parent``'s rate (the siblings' totals over their employment, at least 0), and
    per state the squared relative spread of the rates around their parent's (at least ``least``^2) by
    weighted moments of (observed - parent)^2 - noise over parent^2: unbiased where ``noise`` is the
    variance of independent noise in the totals (the rate query's answers), not where the totals are a
    fit's posterior means (there the squared deviation's expectation is s^2 c less, not plus, a
    posterior variance, and that of the deviation, not of the rate: docs/evaluation/margins-coverage.md)."""
    observed = totals / employment
    parent_rate = np.maximum(np.bincount(parent, weights=totals, minlength=n_parents)
                             / np.bincount(parent, weights=employment, minlength=n_parents), 0.0)
    scale = parent_rate[parent] ** 2
    spread2, _ = weighted_squared_spread(rate_state, (observed - parent_rate[parent]) ** 2 - noise, scale, noise,
                                         n_states, least**2)
    return observed, parent_rate, np.maximum(spread2, least**2)


def plain_squared_spread(codes: np.ndarray, excess: np.ndarray, scale: np.ndarray, n_states: int) -> np.ndarray:
    """A relative spread squared by plain moments, per state: the summed excess of squared deviations
    over their noise, divided by the summed squared scale (0 for a state without scale; may be negative)."""
    excess, scale = (np.bincount(codes, weights=values, minlength=n_states) for values in (excess, scale))
    return np.divide(excess, scale, out=np.zeros(n_states), where=scale > 0)


def detail_spread(answer: np.ndarray, employment: np.ndarray, noise: np.ndarray, establishment_detail: np.ndarray,
                  detail_group: np.ndarray, rate: np.ndarray, rate_variance: np.ndarray, rate_state: np.ndarray,
                  n_states: int, least: float) -> np.ndarray:
    """The wage fit's squared relative spread of the detail (NAICS-6) rates around their NAICS-5 rate,
    by weighted moments per state, per detail rate (at least ``least``^2): each detail industry's
    identity answers summed over its employment (noise ``noise`` summed) against the rate query's
    rate (independent noise)."""
    n_details = len(detail_group)
    if n_details == 0:
        return np.zeros(0)
    inside = establishment_detail >= 0
    codes = establishment_detail[inside]
    detail_employment = np.bincount(codes, weights=employment[inside], minlength=n_details)
    observed = np.bincount(codes, weights=answer[inside], minlength=n_details) / detail_employment
    observed_noise = np.bincount(codes, weights=noise[inside], minlength=n_details) / detail_employment**2
    detail_state = rate_state[detail_group]
    term_noise = observed_noise + rate_variance[detail_group]
    spread2, _ = weighted_squared_spread(detail_state, (observed - rate[detail_group]) ** 2 - term_noise,
                                         np.maximum(rate[detail_group], 0.0) ** 2, term_noise, n_states, least**2)
    return np.maximum(spread2, least**2)[detail_state]


def county_spread(cell_county: np.ndarray | None, county_state: np.ndarray, cell_employment: np.ndarray,
                  totals: np.ndarray, noise: np.ndarray, expected: np.ndarray, least: np.ndarray) -> np.ndarray:
    """The wage fit's variance of the county offsets (wage per employee above the industries' rates),
    by plain moments per state: counties' totals against what their industries' rates give, less the
    totals' noise, over the county's employment squared; at least ``least`` (per state)."""
    if cell_county is None:  # no county offsets
        return np.zeros(0)
    n_counties = len(county_state)

    def by_county(values):
        return np.bincount(cell_county, weights=values, minlength=n_counties)

    spread2 = plain_squared_spread(county_state, (by_county(totals) - by_county(expected)) ** 2 - by_county(noise),
                                   by_county(cell_employment) ** 2, len(least))
    return np.maximum(spread2, least)[county_state]
