"""Noise mechanisms of Gaussian Establishment DP: the psi-mechanism and pnc (SPEC section 4).

Each mechanism is a function ``(values, grouping, *, ..., mu, rng) -> NoisyAnswer``; its privacy
cost is a separate pure function (``psi_mechanism_mu``, ``pnc_mu``) of the sensitivity and the
noise sd it draws, so tests can check that the noise drawn matches the budget charged.

Both rest on the Gaussian mechanism theorem of Gaussian DP (Dong, Roth & Su, JRSS-B 2022): adding
N(0, (Delta/mu)^2) to a statistic of L2 sensitivity Delta is mu-GDP; answers computed from earlier
released answers compose adaptively (total mu = sqrt(sum mu_k^2)).

Released values lie on a public grid (``measure.grid``): the statistic and the noise are each
rounded to the grid and added exactly in integers, and the sensitivity each mechanism calibrates
to includes one grid step and a bound on float64 evaluation error, so the guarantee holds for the
bytes written (SPEC section 8, docs/exact-noise.md).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from gedp.measure.answers import NoisyAnswer
from gedp.measure.budget import check_mu
from gedp.measure.grid import (
    VALUE_GRID,
    check_grid_range,
    exact_unit_sums,
    from_grid,
    psi_grid,
    rounded_gaussian,
    rounded_noise_sd,
    to_grid,
)
from gedp.measure.neighbors import NeighborFunction, check_gamma
from gedp.measure.queries import IDENTITY, Grouping, Query, query_name
from gedp.synth.schema import MAX_VALUE

#: zeta, the probability that some pnc upper bound fails, must lie in [MIN_ZETA, MAX_ZETA]: below,
#: tau is not finite in double precision; above, the bounds say little.
MIN_ZETA, MAX_ZETA = 1e-12, 0.5
Z95 = float(special.ndtri(0.975))  # stats.norm.ppf(0.975), without importing scipy.stats


# --- privacy maps -----------------------------------------------------------------------------
def gaussian_mu(sensitivity: np.ndarray | float, sd: np.ndarray | float) -> float:
    """Privacy cost of Gaussian noise of sd ``sd`` on a statistic of sensitivity ``sensitivity``.

    With one sensitivity and sd per group (a record is in one group), the standardized answers
    have L2 sensitivity max_g Delta_g / sd_g; groups with Delta_g = 0 cost nothing.
    """
    sensitivity = np.atleast_1d(np.asarray(sensitivity, dtype=float))
    sd = np.broadcast_to(np.asarray(sd, dtype=float), sensitivity.shape)
    costs = np.divide(sensitivity, sd, out=np.zeros_like(sensitivity), where=sensitivity > 0)
    return float(costs.max(initial=0.0))


def exact_group_sums(values: np.ndarray, grouping: Grouping) -> np.ndarray:
    """Group totals correctly rounded; identity groups need no sum.

    Whole numbers whose absolute total is below 2^53 (employees, dollars) are summed exactly by
    np.bincount: every partial sum is a whole number below 2^53, hence a float64. Otherwise each
    group is summed with math.fsum.
    """
    values = np.asarray(values, dtype=float)
    if grouping.by == IDENTITY:
        return values
    if np.all(values == np.rint(values)) and math.fsum(np.abs(values)) < 2.0**53:
        return np.bincount(grouping.codes, weights=values, minlength=grouping.n_groups)
    order = np.argsort(grouping.codes, kind="stable")
    bounds = np.searchsorted(grouping.codes[order], np.arange(grouping.n_groups + 1))
    ordered = values[order]
    return np.array([math.fsum(ordered[bounds[g]:bounds[g + 1]]) for g in range(grouping.n_groups)])


# --- psi-mechanism --------------------------------------------------------------------------
def largest_total(grouping: Grouping) -> float:
    """A public bound on every group total: (largest group size) x MAX_VALUE."""
    return float(np.bincount(grouping.codes).max(initial=1)) * MAX_VALUE


def psi_sensitivity(psi: NeighborFunction, gamma: float, grouping: Grouping) -> float:
    """Sensitivity of the gridded psi answers: gamma, one grid step, and twice the float error of
    psi(group total) for totals up to ``largest_total`` (group sizes are public)."""
    return gamma + psi_grid(gamma) + 2 * float(psi.float_error(largest_total(grouping)))


def psi_mechanism_sd(gamma: float, mu: float, sensitivity: float | None = None) -> float:
    """Noise sd on the psi scale: (gamma, widened by the grid step and float error) / mu."""
    check_gamma(gamma)
    check_mu(mu)
    return (gamma if sensitivity is None else sensitivity) / mu


def psi_mechanism_mu(gamma: float, sd: float) -> float:
    """Privacy cost of psi-scale noise of sd ``sd``: psi(group sum) has L2 sensitivity gamma."""
    return gaussian_mu(gamma, sd)


def psi_mechanism(
    values: np.ndarray,
    grouping: Grouping,
    *,
    attribute: str,
    psi: NeighborFunction,
    gamma: float,
    mu: float,
    rng: np.random.Generator,
) -> NoisyAnswer:
    """Release omega_g = g (round(psi(S_g) / g) + round(Z_g / g)), Z_g ~ N(0, s^2), on the grid g.

    S_g is the group total of the attribute (correctly rounded); s = Delta / mu with Delta =
    ``psi_sensitivity``: gamma plus one grid step plus the float error of psi(S_g).

    Privacy: mu-gedp. A psi-neighbor changes one record's value x to x' with |psi(x) - psi(x')|
    <= gamma; by concavity of psi, |psi(S + x) - psi(S + x')| <= |psi(x) - psi(x')| for any rest of
    the group S >= 0, and the record is in one group. Evaluating psi in float64 and rounding to the
    grid add at most Delta - gamma, so round(psi(S_g) / g) g has sensitivity Delta and the Gaussian
    mechanism theorem gives mu-GDP; rounding the noise draw and the estimates are post-processing.
    """
    sensitivity = psi_sensitivity(psi, gamma, grouping)
    sd = psi_mechanism_sd(gamma, mu, sensitivity)
    grid = psi_grid(gamma)
    query = Query(grouping.by, attribute)
    lowest = max(psi.at_zero, -745.0)  # log with a = 0: totals are >= 2^-1074
    check_grid_range(max(-lowest, float(psi(largest_total(grouping)))), sd, grid, f"query {query.name} on {attribute}")
    totals = exact_group_sums(values, grouping)
    psi.check_domain(totals, f"query {query.name} on {attribute}")
    units = to_grid(psi(totals), grid, f"psi of query {query.name} on {attribute}")
    omega = from_grid(units + rounded_gaussian(sd, grid, grouping.n_groups, rng), grid)
    noise_sd = float(rounded_noise_sd(sd, grid))
    estimate = psi.unbiased_estimate(omega, noise_sd)
    return NoisyAnswer(
        query=query,
        keys=grouping.keys,
        released=omega,
        estimate=estimate,
        variance=psi.releasable_variance(estimate, noise_sd),
        variance_kind="estimated",
        mechanism="psi",
        mu=gaussian_mu(sensitivity, sd),
        sd=np.full(grouping.n_groups, noise_sd),
        grid=grid,
    )


def psi_exact_variance(answer: NoisyAnswer, psi: NeighborFunction, true_totals: np.ndarray) -> np.ndarray:
    """True variance of a psi-mechanism estimate: needs confidential totals (ablation studies only)."""
    if answer.mechanism != "psi":
        raise ValueError(f"answer of query {answer.query.name} is from '{answer.mechanism}', not the psi-mechanism")
    return psi.estimate_variance(true_totals, answer.sd)


def psi_confidence_interval(
    answer: NoisyAnswer, psi: NeighborFunction, z: float = Z95
) -> tuple[np.ndarray, np.ndarray]:
    """CI [psi^-1(omega - z s), psi^-1(omega + z s)] of each group total (lower end at >= 0)."""
    return psi.inverse(answer.released - z * answer.sd), psi.inverse(answer.released + z * answer.sd)


# --- pnc ("probably no clipping") -----------------------------------------------------------
def pnc_tau(zeta: float, n_bounds: int) -> float:
    """tau = Phi^-1((1 - zeta)^(1 / n_bounds)): all n_bounds upper bounds hold with prob 1 - zeta."""
    if not (0 < zeta < 1):
        raise ValueError(f"zeta ({zeta}) must be in (0, 1)")
    if n_bounds < 1:
        raise ValueError(f"n_bounds ({n_bounds}) must be >= 1")
    # 1 - (1 - zeta)^(1/n), computed without cancellation.
    tail = -math.expm1(math.log1p(-zeta) / n_bounds)
    tau = -float(special.ndtri(tail))  # Phi^-1(1 - tail), as scipy.stats.norm.isf computes it
    if not math.isfinite(tau):
        raise ValueError(f"zeta ({zeta}) is too small: tau = Phi^-1((1 - zeta)^(1/{n_bounds})) is not finite")
    return tau


def pnc_upper_bounds(identity: NoisyAnswer, psi: NeighborFunction, *, tau: float) -> np.ndarray:
    """u_j = psi^-1(omega_j + s tau + g) from identity answers (0 below psi(0)).

    omega_j >= psi(r_j) + Z_j - g (the value and the draw are each rounded by at most g / 2), so
    u_j >= r_j whenever the draw Z_j >= -tau s: per bound with probability (1 - zeta)^(1 / n_bounds).
    """
    if not identity.query.is_identity or identity.mechanism != "psi":
        raise ValueError(f"pnc upper bounds need psi-mechanism identity answers, got {identity.query.name}")
    return psi.inverse(identity.released + identity.sd * tau + identity.grid)


def pnc_sensitivity(clip: np.ndarray, psi: NeighborFunction, gamma: float) -> np.ndarray:
    """Delta_g = u* - psi^-1(max(psi(0), psi(u*) - gamma)) of a sum clipped at u*.

    Over psi-close x, x' the clipped value min(x, u*) moves most when x = u* and x' is the lower end
    of u*'s uncertainty interval, because that lower width grows with x for concave psi. Computed
    without cancellation (``NeighborFunction.clip_sensitivity``).
    """
    check_gamma(gamma)
    return psi.clip_sensitivity(np.asarray(clip, dtype=float), gamma)


def pnc_released_sensitivity(clip: np.ndarray, psi: NeighborFunction, gamma: float) -> np.ndarray:
    """Sensitivity of pnc's gridded clipped sums: Delta_g (rounded up past float error) plus one
    grid step; 0 where u* = 0 (every clipped value is then exactly 0)."""
    clip = np.asarray(clip, dtype=float)
    widened = pnc_sensitivity(clip, psi, gamma) * (1 + 2.0**-40) + VALUE_GRID
    return np.where(clip > 0, widened, 0.0)


def pnc_mu(sensitivity: np.ndarray, sd: np.ndarray) -> float:
    """Privacy cost of pnc's noise: max_g Delta_g / sd_g (groups with Delta_g = 0 cost nothing)."""
    return gaussian_mu(sensitivity, sd)


def pnc_mechanism(
    values: np.ndarray,
    grouping: Grouping,
    upper_bounds: np.ndarray,
    *,
    attribute: str,
    psi: NeighborFunction,
    gamma: float,
    mu: float,
    rng: np.random.Generator,
) -> NoisyAnswer:
    """Release T_g + N(0, (Delta_g / mu)^2) on the value grid, T_g the group sum clipped at
    u*_g = max of u_j in g.

    Each clipped value min(r_j, u*_g) is rounded to the grid and summed exactly in integers; the
    noise draw is rounded to the grid and added exactly. The variance is exact and public. With
    probability 1 - zeta no value is clipped, and then the estimate is unbiased up to the rounding
    of the values (none for whole employees and dollars).

    Privacy: mu-gedp given the released identity answers (u* is computed from them). A psi-neighbor
    changes one group's clipped sum by at most Delta_g (``pnc_sensitivity``), and its gridded sum by
    at most Delta_g + g; scaling each group's noise to that makes the L2 sensitivity of the
    standardized answers 1 <= mu * sd, so the Gaussian mechanism theorem gives mu-GDP, composed
    adaptively with the identity query.
    """
    check_mu(mu)
    values = np.asarray(values, dtype=float)
    clip = grouping.max(np.asarray(upper_bounds, dtype=float))
    sensitivity = pnc_released_sensitivity(clip, psi, gamma)
    sd = sensitivity / mu
    what = f"clipped sums of query {query_name(grouping.by)} on {attribute}"
    sizes = np.bincount(grouping.codes, minlength=grouping.n_groups)
    # a clipped value is at most min(u*_g, MAX_VALUE) (inputs are validated up to MAX_VALUE)
    check_grid_range(min(float(np.max(clip, initial=0.0)), MAX_VALUE), sd, VALUE_GRID, what)
    clipped = to_grid(np.minimum(values, clip[grouping.codes]), VALUE_GRID, what)
    largest_sum = float(np.max(sizes * np.minimum(clip, MAX_VALUE), initial=0.0)) / VALUE_GRID
    units = exact_unit_sums(clipped, grouping.codes, grouping.n_groups, largest_sum)
    released = from_grid(units + rounded_gaussian(sd, VALUE_GRID, grouping.n_groups, rng), VALUE_GRID)
    noise_sd = np.where(sd > 0, rounded_noise_sd(sd, VALUE_GRID), 0.0)
    return NoisyAnswer(
        query=Query(grouping.by, attribute),
        keys=grouping.keys,
        released=released,
        estimate=released,
        variance=noise_sd**2,
        variance_kind="exact",
        mechanism="pnc",
        mu=pnc_mu(sensitivity, sd),
        sd=noise_sd,
        grid=VALUE_GRID,
    )
