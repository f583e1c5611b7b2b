"""Noise mechanisms of Gaussian Establishment DP: the psi-mechanism and pnc (SPEC section 4).

Each mechanism is a function ``(values, grouping, *, ..., mu, rng) -> NoisyAnswer``; its privacy
cost is a separate pure function (``psi_mechanism_mu``, ``pnc_mu``) of the sensitivity and the
noise sd it draws, so tests can check that the noise drawn matches the budget charged.

Both rest on the Gaussian mechanism theorem of Gaussian DP (Dong, Roth & Su, JRSS-B 2022): adding
N(0, (Delta/mu)^2) to a statistic of L2 sensitivity Delta is mu-GDP; answers computed from earlier
released answers compose adaptively (total mu = sqrt(sum mu_k^2)).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from measure.answers import NoisyAnswer
from measure.budget import check_mu
from measure.neighbors import NeighborFunction, check_gamma
from measure.queries import Grouping, Query

Z95 = float(stats.norm.ppf(0.975))


# --- psi-mechanism --------------------------------------------------------------------------
def psi_mechanism_sd(gamma: float, mu: float) -> float:
    """Noise sd s = gamma / mu of the psi-mechanism on the psi scale."""
    check_gamma(gamma)
    check_mu(mu)
    return gamma / mu


def psi_mechanism_mu(gamma: float, sd: float) -> float:
    """Privacy cost of psi-scale noise of sd ``sd``: psi(group sum) has L2 sensitivity gamma."""
    return gamma / sd


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
    """Release omega_g = psi(sum of the attribute in group g) + N(0, s^2), s = gamma / mu.

    Privacy: mu-gedp. A psi-neighbor changes one record's value x to x' with |psi(x) - psi(x')|
    <= gamma; by concavity of psi, |psi(S + x) - psi(S + x')| <= |psi(x) - psi(x')| for any rest of
    the group S >= 0, and the record is in one group, so the L2 sensitivity is gamma and the
    Gaussian mechanism theorem gives mu-GDP. The estimates and variances are post-processing.
    """
    sd = psi_mechanism_sd(gamma, mu)
    query = Query(grouping.by, attribute)
    totals = grouping.sum(np.asarray(values, dtype=float))
    psi.check_domain(totals, f"group totals of query {query.name} on {attribute}")
    omega = psi(totals) + rng.normal(0.0, sd, size=grouping.n_groups)
    estimate = psi.unbiased_estimate(omega, sd)
    return NoisyAnswer(
        query=query,
        keys=grouping.keys,
        released=omega,
        estimate=estimate,
        variance=psi.releasable_variance(estimate, sd),
        variance_kind="estimated",
        mechanism="psi",
        mu=mu,
        sd=np.full(grouping.n_groups, sd),
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
    return float(stats.norm.isf(tail))


def pnc_upper_bounds(identity: NoisyAnswer, psi: NeighborFunction, *, tau: float) -> np.ndarray:
    """u_j = psi^-1(omega_j + gamma tau / mu_a) from identity answers (0 below psi(0)).

    gamma / mu_a is the identity answers' noise sd, so u_j >= r_j whenever omega_j's noise is
    >= -tau sd: per bound with probability (1 - zeta)^(1 / n_bounds).
    """
    if not identity.query.is_identity or identity.mechanism != "psi":
        raise ValueError(f"pnc upper bounds need psi-mechanism identity answers, got {identity.query.name}")
    return psi.inverse(identity.released + identity.sd * tau)


def pnc_sensitivity(clip: np.ndarray, psi: NeighborFunction, gamma: float) -> np.ndarray:
    """Delta_g = u* - psi^-1(max(psi(0), psi(u*) - gamma)) of a sum clipped at u*.

    Over psi-close x, x' the clipped value min(x, u*) moves most when x = u* and x' is the lower end
    of u*'s uncertainty interval, because that lower width grows with x for concave psi.
    """
    check_gamma(gamma)
    clip = np.asarray(clip, dtype=float)
    return clip - psi.inverse(psi(clip) - gamma)


def pnc_mu(sensitivity: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Privacy cost of each group's noise: Delta_g / sd_g (groups with Delta_g = 0 cost nothing)."""
    sensitivity = np.asarray(sensitivity, dtype=float)
    sd = np.asarray(sd, dtype=float)
    return np.divide(sensitivity, sd, out=np.zeros_like(sensitivity), where=sensitivity > 0)


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
    """Release T_g + N(0, (Delta_g / mu)^2), T_g the group sum clipped at u*_g = max of u_j in g.

    The variance (Delta_g / mu)^2 is exact and public. With probability 1 - zeta no value is
    clipped, and then T_g is the true group total, so the estimate is unbiased.

    Privacy: mu-gedp given the released identity answers (u* is computed from them). A psi-neighbor
    changes one group's clipped sum by at most Delta_g (``pnc_sensitivity``); scaling each group's
    noise to its own Delta_g makes the L2 sensitivity of the standardized answers 1 <= mu * sd, so the
    Gaussian mechanism theorem gives mu-GDP, composed adaptively with the identity query.
    """
    check_mu(mu)
    values = np.asarray(values, dtype=float)
    clip = grouping.max(np.asarray(upper_bounds, dtype=float))
    sensitivity = pnc_sensitivity(clip, psi, gamma)
    sd = sensitivity / mu
    clipped_sum = grouping.sum(np.minimum(values, clip[grouping.codes]))
    released = clipped_sum + sd * rng.standard_normal(grouping.n_groups)
    return NoisyAnswer(
        query=Query(grouping.by, attribute),
        keys=grouping.keys,
        released=released,
        estimate=released,
        variance=sd**2,
        variance_kind="exact",
        mechanism="pnc",
        mu=mu,
        sd=sd,
    )
