"""The wage fit's per-employee variance b, estimated from a release (``postprocess.wages``, knob
``wages.EMPLOYEE_VARIANCE_ESTIMATED``).

A cell c of E_c protected employees has a prior E_c r_c with variance s^2 (E_c r_c)^2 + b r_c^2 E_c
beyond what is known (its rate's uncertainty, its NAICS-6 and county effects, its employment's noise,
its idle establishments' wages: ``known``). Its summed identity answers d_c are unbiased for its
wages, with a noise variance n_c the release states exactly in expectation (each answer's variance
evaluated at the answer: unbiased for it), so

    x_c = (d_c - E_c r_c)^2 - n_c - known_c

has expectation s^2 (E_c r_c)^2 + b r_c^2 E_c. s^2 and b are the weighted least squares of x on
(E r)^2 and a = r^2 E with weights 1 / (v + s^2 (E r)^2 + b a)^2 (v the noise at the prior and the
known variance: weighing at the prior adds no bias), by a few fixed-point steps, with the sandwich
standard error; s is held within ``spread_bounds`` as the fit holds it (b then from its own moment).
This s^2 is b's companion only: the fit keeps its own plain moment for s (its information is in the
large cells), and the wage fit estimates b in pass 1 (rates from the rate query's answers,
independent of the identity answers' noise), from cells of LEAST_EMPLOYMENT or more, and keeps it.
The small and middling cells, where b / E is large against s^2, carry b's information; at a small
wage share their answers are mostly noise, and b is then not identified: where its standard error
exceeds IDENTIFIED x the estimate (or the state has no cell to estimate it from), the state keeps
``fallback`` (the fit's EMPLOYEE_VARIANCE). An identified estimate is held within BOUNDS.

Nothing here is fitted to a state: b comes from the release's own answers and protected employment
(postprocessing), and the margins of error, which recompute the fit from the release's files, get
the same b.
"""

from __future__ import annotations

import numpy as np

#: The range an estimated b is held in: a one-employee cell's wage scattering around its rate with a
#: relative sd of 0.7 to 3.2 (part-time work, a quarter not worked in full, one person's pay).
BOUNDS = (0.5, 10.0)
#: b is identified where its standard error is at most this share of the estimate.
IDENTIFIED = 0.5
#: s^2 of b's moments weighted as b's are (the cells where b is told), not the fit's plain moment.
SPREAD_WEIGHTED = True
#: b is estimated from the cells of at least this many protected employees (as the published cells' fit).
LEAST_EMPLOYMENT = 4.0
#: Alternating steps between s^2 and b (each settles within a few).
STEPS = 4


def spread_and_employee_variance(codes: np.ndarray, excess: np.ndarray, unbiased_excess: np.ndarray,
                                 prior: np.ndarray, per_employee: np.ndarray, weighing: np.ndarray,
                                 n_states: int, spread_bounds: tuple[float, float], fallback: float
                                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per state: the cell spread squared s^2 (unclipped), b (module docstring) and b's standard error
    (inf where b is not identified and ``fallback`` is kept).

    Per cell (``codes``: its state, cells to leave out already left out): ``excess`` = x_c with the
    noise as the fit weighs it (s^2's plain moment, without SPREAD_WEIGHTED), ``unbiased_excess`` = x_c
    with the answers' noise variance at the answers, ``prior`` = p_c = E_c r_c, ``per_employee`` =
    a_c = r_c^2 E_c, ``weighing`` = the noise and known variance at the prior (the weights' v).

    The two moments, sum u p^2 (x' - s^2 p^2 - b a) = 0 (u = w; without SPREAD_WEIGHTED u = 1 / p^2
    and x for x') and sum w a (x' - s^2 p^2 - b a) = 0, are solved together (w = 1 / (v + s^2 p^2 +
    b a)^2 at the last step's s^2, b); where s falls outside ``spread_bounds`` it is held at its
    bound and b solves the second alone. The standard error is the sandwich of the moments solved.
    """
    def total(values):
        return np.bincount(codes, weights=values, minlength=n_states)

    square = prior**2
    spread2, held, b = np.zeros(n_states), np.zeros(n_states), np.full(n_states, float(fallback))
    first, first_excess = np.ones(len(codes)), excess
    p_sum, a_sum, x_sum = total(square), total(per_employee), total(excess)
    weights = np.zeros(len(codes))
    for _ in range(STEPS):
        inverse = 1.0 / (weighing + held[codes] * square + np.maximum(b, BOUNDS[0])[codes] * per_employee) ** 2
        weights = per_employee * inverse
        if SPREAD_WEIGHTED:
            first, first_excess = square * inverse, unbiased_excess
            p_sum, a_sum, x_sum = total(first * square), total(first * per_employee), total(first * first_excess)
        q_sum, w_sum, y_sum = total(weights * square), total(weights * per_employee), total(weights * unbiased_excess)
        determinant = p_sum * w_sum - a_sum * q_sum
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            spread2 = (x_sum * w_sum - a_sum * y_sum) / determinant
            b = (p_sum * y_sum - q_sum * x_sum) / determinant
            held = np.clip(np.sqrt(np.maximum(spread2, 0.0)), *spread_bounds) ** 2
            alone = ~np.isclose(held, spread2, rtol=1e-12, atol=0.0) | ~np.isfinite(b)
            b = np.where(alone, (y_sum - held * q_sum) / w_sum, b)
        b = np.nan_to_num(b, nan=fallback, posinf=fallback, neginf=fallback)
    error = _sandwich(codes, first * (first_excess - spread2[codes] * square - b[codes] * per_employee),
                      weights * (unbiased_excess - held[codes] * square - b[codes] * per_employee),
                      (p_sum, a_sum, q_sum, w_sum), alone, n_states)
    identified = (error > 0) & (error <= IDENTIFIED * np.maximum(b, BOUNDS[0]))
    return spread2, np.where(identified, np.clip(b, *BOUNDS), fallback), np.where(identified, error, np.inf)


def _sandwich(codes: np.ndarray, plain: np.ndarray, weighted: np.ndarray, sums: tuple, alone: np.ndarray,
              n_states: int) -> np.ndarray:
    """Per state: b's sandwich standard error. ``plain``, ``weighted``: each cell's terms of the two
    moments at the solution; ``sums``: the moments' Jacobian's entries (P, A; Q, W: rows s^2, b);
    ``alone``: states where s^2 is held and the weighted moment alone gives b (error sqrt(sum t^2) / W)."""
    def total(values):
        return np.bincount(codes, weights=values, minlength=n_states)

    p_sum, a_sum, q_sum, w_sum = sums
    s11, s12, s22 = total(plain**2), total(plain * weighted), total(weighted**2)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        determinant = p_sum * w_sum - a_sum * q_sum
        # b's row of the Jacobian's inverse: (-Q, P) / det
        joint = (q_sum**2 * s11 - 2 * q_sum * p_sum * s12 + p_sum**2 * s22) / determinant**2
        variance = np.where(alone, s22 / w_sum**2, joint)
    return np.nan_to_num(np.sqrt(np.maximum(variance, 0.0)), nan=0.0, posinf=0.0)
