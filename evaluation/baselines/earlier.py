"""Earlier formal mechanisms for employer data and today's noise infusion.

These are the comparison baselines of experiment E5, not part of a gedp release. They answer one
group-by sum per call with noisy cell totals and no variance for postprocessing, so they return a
:class:`CellRelease` rather than a :class:`~measure.answers.NoisyAnswer`.

The epsilon-style mechanisms protect establishments in the sense of (alpha, eps)-ER privacy of
Haney, Machanavajjhala, Abowd, Graham, Kutzbach & Vilhuber, "Utility cost of formal privacy for
releasing national employer-employee statistics", SIGMOD 2017 (HMAGKV17 below): no one can tell an
establishment's employment x from any value within a factor (1 + alpha) of it, with eps-DP-style
likelihood ratios. Each mechanism refuses parameter pairs outside its validity condition with a
message that states the condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gedp.measure.queries import Grouping, Query

#: Cells with a true value in (0, SMALL_CELL) are redrawn by noise infusion (the QWI small-cell rule).
SMALL_CELL = 2.5


@dataclass(frozen=True, eq=False)
class CellRelease:
    """Noisy totals of one group-by query from a comparison mechanism.

    Attributes:
        query: the group-by spec and attribute.
        keys: one row of public group keys per cell.
        released: the published noisy cell totals.
        mechanism: the mechanism's name.
        parameters: its parameters (eps, alpha, delta, theta, ...).
    """

    query: Query
    keys: pd.DataFrame
    released: np.ndarray
    mechanism: str
    parameters: dict = field(default_factory=dict)


def _release(grouping: Grouping, attribute: str, released: np.ndarray, mechanism: str, **parameters) -> CellRelease:
    return CellRelease(Query(grouping.by, attribute), grouping.keys, released, mechanism, parameters)


def _check_positive(value: float, name: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} ({value}) must be a finite number > 0")


# --- validity conditions --------------------------------------------------------------------
def log_laplace_lambda(eps: float, alpha: float) -> float:
    """lambda = 2 ln(1 + alpha) / eps, the Laplace scale of Log-Laplace on the log scale."""
    _check_positive(eps, "eps")
    _check_positive(alpha, "alpha")
    return 2 * math.log1p(alpha) / eps


def check_log_laplace(eps: float, alpha: float) -> None:
    """Log-Laplace has a finite expectation only when lambda = 2 ln(1 + alpha) / eps < 1."""
    lam = log_laplace_lambda(eps, alpha)
    if lam >= 1:
        raise ValueError(
            f"Log-Laplace needs 2 ln(1 + alpha) / eps < 1 (its expectation is unbounded otherwise); "
            f"alpha {alpha:g} and eps {eps:g} give {lam:.4g}"
        )


def check_smooth_laplace(eps: float, alpha: float, delta: float) -> None:
    """Smooth Laplace needs alpha + 1 <= exp(eps / (2 ln(1 / delta)))."""
    _check_positive(eps, "eps")
    _check_positive(alpha, "alpha")
    if not (0 < delta < 1):
        raise ValueError(f"delta ({delta}) must be in (0, 1)")
    bound = math.exp(eps / (2 * math.log(1 / delta)))
    if alpha + 1 > bound:
        raise ValueError(
            f"Smooth Laplace needs alpha + 1 <= exp(eps / (2 ln(1/delta))); alpha {alpha:g}, eps {eps:g} and "
            f"delta {delta:g} give {alpha + 1:.4g} > {bound:.4g}"
        )


def check_smooth_gamma(eps: float, alpha: float) -> None:
    """Smooth Gamma needs alpha + 1 < exp(eps / 5) (so that eps1 = eps - 5 ln(alpha + 1) > 0)."""
    _check_positive(eps, "eps")
    _check_positive(alpha, "alpha")
    bound = math.exp(eps / 5)
    if not alpha + 1 < bound:
        raise ValueError(
            f"Smooth Gamma needs alpha + 1 < exp(eps / 5); alpha {alpha:g} and eps {eps:g} give "
            f"{alpha + 1:.4g} >= {bound:.4g}"
        )


def is_valid(check, *args: float) -> bool:
    """Whether a parameter check passes (for parameter grids that keep only valid pairs)."""
    try:
        check(*args)
    except ValueError:
        return False
    return True


# --- mechanisms -----------------------------------------------------------------------------
def smooth_sensitivity(values: np.ndarray, grouping: Grouping, alpha: float) -> np.ndarray:
    """S* = max(alpha x_v, 1) per cell, x_v the largest single-establishment contribution.

    ``values`` are the units' possible contributions to their cells: the establishments' values, or
    for job marginals (measure/erer.py) one entry per establishment x worker cell.
    """
    _check_positive(alpha, "alpha")
    return np.maximum(alpha * grouping.max(np.asarray(values, dtype=float)), 1.0)


def log_laplace(values: np.ndarray, grouping: Grouping, *, attribute: str, eps: float, alpha: float,
                rng: np.random.Generator) -> CellRelease:
    """n~ = exp(ln(n + gamma') + eta) - gamma', gamma' = 1 / alpha, eta ~ Laplace(2 ln(1 + alpha) / eps).

    Privacy: (alpha, eps)-ER privacy (HMAGKV17, Log-Laplace mechanism): a (1 + alpha) change of one
    establishment moves ln(n + gamma') by at most ln(1 + alpha) with the offset gamma' = Delta / alpha,
    Delta = 1. Biased: E[n~] + gamma' = (n + gamma') / (1 - lambda^2).
    """
    check_log_laplace(eps, alpha)
    lam = log_laplace_lambda(eps, alpha)
    offset = 1.0 / alpha
    totals = grouping.sum(np.asarray(values, dtype=float))
    eta = rng.laplace(0.0, lam, size=grouping.n_groups)
    released = np.exp(np.log(totals + offset) + eta) - offset
    return _release(grouping, attribute, released, "log-laplace", eps=eps, alpha=alpha)


def smooth_laplace(values: np.ndarray, grouping: Grouping, *, attribute: str, eps: float, alpha: float,
                   delta: float, rng: np.random.Generator, worker_eps: float | None = None,
                   contributions: np.ndarray | None = None) -> CellRelease:
    """n~ = n + S* / (eps / 2) * eta, eta ~ Laplace(1); S* the smooth sensitivity of the cell.

    With ``worker_eps`` (the LODES variant), an extra eta' ~ Laplace(1 / worker_eps) protects
    individual workers as well. ``contributions`` (default ``values``) are what S* is computed from.

    Privacy: (alpha, eps, delta)-ER privacy (HMAGKV17, Smooth Laplace; the smooth sensitivity
    framework of Nissim, Raskhodnikova & Smith, STOC 2007) when alpha + 1 <= exp(eps / (2 ln(1/delta))).
    """
    check_smooth_laplace(eps, alpha, delta)
    totals = grouping.sum(np.asarray(values, dtype=float))
    sensitivity = smooth_sensitivity(values if contributions is None else contributions, grouping, alpha)
    noise = sensitivity / (eps / 2) * rng.laplace(0.0, 1.0, size=grouping.n_groups)
    if worker_eps is not None:
        _check_positive(worker_eps, "worker eps")
        noise += rng.laplace(0.0, 1.0 / worker_eps, size=grouping.n_groups)
    name = "smooth-laplace" if worker_eps is None else "smooth-laplace-lodes"
    return _release(grouping, attribute, totals + noise, name, eps=eps, alpha=alpha, delta=delta,
                    worker_eps=worker_eps)


def quartic_cdf(z: np.ndarray) -> np.ndarray:
    """CDF of the density (sqrt(2) / pi) / (1 + z^4) (mean 0, variance 1), in closed form."""
    z = np.asarray(z, dtype=float)
    r2 = math.sqrt(2.0)
    # Antiderivative of 1/(1+z^4); the log term is written with log1p for accuracy near 0.
    log_term = np.log1p(2 * r2 * z / (z * z - r2 * z + 1))
    antiderivative = (log_term + 2 * np.arctan(r2 * z + 1) + 2 * np.arctan(r2 * z - 1)) / (4 * r2)
    return np.clip(0.5 + antiderivative * r2 / math.pi, 0.0, 1.0)


def sample_quartic(size: int, rng: np.random.Generator) -> np.ndarray:
    """Exact draws from the density proportional to 1 / (1 + |z|^4), by rejection from a Cauchy.

    The ratio of the target (sqrt 2 / pi) / (1 + z^4) to the Cauchy density 1 / (pi (1 + z^2)) is
    sqrt(2) (1 + z^2) / (1 + z^4) <= sqrt(2) (1 + sqrt 2) / 2 = M, so a Cauchy draw z is kept with
    probability (1 + z^2) / ((1 + z^4) (1 + sqrt 2) / 2); 1 / M = 59% of proposals are kept.
    """
    bound = (1 + math.sqrt(2.0)) / 2
    out = np.empty(size)
    filled = 0
    while filled < size:
        need = size - filled
        z = rng.standard_cauchy(int(need * 1.8) + 16)
        z2 = z * z
        kept = z[rng.random(z.size) * bound * (1 + z2 * z2) <= 1 + z2][:need]
        out[filled:filled + kept.size] = kept
        filled += kept.size
    return out


def smooth_gamma(values: np.ndarray, grouping: Grouping, *, attribute: str, eps: float, alpha: float,
                 rng: np.random.Generator, contributions: np.ndarray | None = None) -> CellRelease:
    """n~ = n + S* / (eps1 / 5) * eta, eta with density proportional to 1 / (1 + |z|^4).

    ``contributions`` (default ``values``) are what S* is computed from.

    eps2 = 5 ln(alpha + 1) pays for the smooth sensitivity's change between neighbors and
    eps1 = eps - eps2 for the noise. Privacy: pure (alpha, eps)-ER privacy (HMAGKV17, Smooth Gamma;
    admissible noise of Nissim, Raskhodnikova & Smith 2007) when alpha + 1 < exp(eps / 5).
    """
    check_smooth_gamma(eps, alpha)
    eps1 = eps - 5 * math.log1p(alpha)
    totals = grouping.sum(np.asarray(values, dtype=float))
    sensitivity = smooth_sensitivity(values if contributions is None else contributions, grouping, alpha)
    noise = sensitivity / (eps1 / 5) * sample_quartic(grouping.n_groups, rng)
    return _release(grouping, attribute, totals + noise, "smooth-gamma", eps=eps, alpha=alpha)


def truncated_laplace(values: np.ndarray, grouping: Grouping, *, attribute: str, eps: float, theta: float,
                      rng: np.random.Generator, employment: np.ndarray | None = None) -> CellRelease:
    """Drop establishments with employment >= theta, then add Laplace(theta / eps) to each cell.

    ``employment`` decides the truncation (default: the values themselves). Privacy: eps-DP for
    adding or removing one establishment of employment < theta (node-DP baseline; the truncation is
    a fixed public rule, so one establishment moves a cell by less than theta).
    """
    _check_positive(eps, "eps")
    _check_positive(theta, "theta")
    values = np.asarray(values, dtype=float)
    employment = values if employment is None else np.asarray(employment, dtype=float)
    kept = np.where(employment < theta, values, 0.0)
    released = grouping.sum(kept) + rng.laplace(0.0, theta / eps, size=grouping.n_groups)
    return _release(grouping, attribute, released, "truncated-laplace", eps=eps, theta=theta)


# --- input noise infusion (current SDL for LODES / QWI) -------------------------------------
def check_infusion(s: float, t: float) -> None:
    """Distortion bounds: 0 <= s < t < 1."""
    if not (math.isfinite(s) and math.isfinite(t) and 0 <= s < t < 1):
        raise ValueError(f"noise infusion needs 0 <= s < t < 1; got s {s} and t {t}")


def infusion_factors(n: int, *, s: float, t: float, rng: np.random.Generator) -> np.ndarray:
    """One secret factor per establishment in [1 - t, 1 - s] U [1 + s, 1 + t].

    The distance |f - 1| follows the QWI "ramp": density 2 (t - d) / (t - s)^2 on [s, t], largest
    near s, zero at t (Abowd, Stephens & Vilhuber, "Confidentiality protection in the Census Bureau's
    QWI", 2006); the side (down or up) is a fair coin.
    """
    check_infusion(s, t)
    # Inverse CDF of the ramp: P(d <= x) = 1 - ((t - x) / (t - s))^2.
    distance = t - (t - s) * np.sqrt(rng.random(n))
    return 1.0 + np.where(rng.random(n) < 0.5, -distance, distance)


def infusion_distance_cdf(distance: np.ndarray, s: float, t: float) -> np.ndarray:
    """CDF of |f - 1| under the ramp: 1 - ((t - d) / (t - s))^2 on [s, t]."""
    d = np.clip(np.asarray(distance, dtype=float), s, t)
    return 1.0 - ((t - d) / (t - s)) ** 2


def noise_infusion(values: np.ndarray, grouping: Grouping, factors: np.ndarray, *, attribute: str,
                   rng: np.random.Generator, small_cell: float = SMALL_CELL) -> CellRelease:
    """Cell = sum of f_j x_j with each establishment's fixed factor f_j; small cells redrawn.

    A cell whose true total is in (0, small_cell) is replaced by a uniform draw from
    {1, ..., floor(small_cell)}; zeros stay zero. Not a formal guarantee: protection rests on the
    secrecy of s, t and the factors (statistical disclosure limitation as in the QWI and LODES).
    """
    if not (math.isfinite(small_cell) and small_cell >= 1):
        raise ValueError(f"small-cell threshold ({small_cell}) must be a finite number >= 1")
    values = np.asarray(values, dtype=float)
    factors = np.asarray(factors, dtype=float)
    if factors.shape != values.shape:
        raise ValueError(f"{factors.size} factors for {values.size} establishments")
    totals = grouping.sum(values)
    released = grouping.sum(factors * values)
    small = (totals > 0) & (totals < small_cell)
    released[small] = rng.integers(1, math.floor(small_cell) + 1, size=int(small.sum()))
    released[totals == 0] = 0.0
    return _release(grouping, attribute, released, "noise-infusion", small_cell=small_cell)
