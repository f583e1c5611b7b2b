"""Combining a statistic over implicates: Rubin's (1987) rules for multiple imputation.

gedp's implicates are draws of the confidential values from their posterior given the release (the
release is the observed data, the confidential values the missing data), which is Rubin's setting
of multiple imputation, not the fully synthetic one of Raghunathan, Reiter and Rubin (2003) (there,
new populations are drawn from a model fitted to the confidential data, and T = (1 + 1/M) B - U_bar).
For M implicates with estimates q_m and complete-data variances u_m:

    q_bar = mean q_m,  B = sample variance of q_m,  U_bar = mean u_m,  T = U_bar + (1 + 1/M) B,
    nu = (M - 1) (1 + U_bar / ((1 + 1/M) B))^2,  interval q_bar -+ t_nu(1 - alpha/2) sqrt(T).

A statistic of the establishments themselves (a total, a rate, a decile of the QCEW, a census) has
u_m = 0: T = (1 + 1/M) B with M - 1 degrees of freedom. A model parameter of a superpopulation (a
regression coefficient read as a behavioural parameter) takes each implicate's usual variance as u_m.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The lowest confidence level of a margin of error: an interval that covers the truth less often than
#: not is no margin of error (a level of 1e-300 gave margins of 0, read as exact values).
LOWEST_LEVEL = 0.5


def is_confidence_level(level: float) -> bool:
    """Whether ``level`` is a confidence level of a margin of error: LOWEST_LEVEL <= level < 1, with
    0.5 + level / 2 below 1 in floating point so that the two-sided quantile is finite
    (0.9999999999999999 rounds it to 1)."""
    return LOWEST_LEVEL <= level < 1 and 0.5 + level / 2 < 1


def level_percent(level: float) -> str:
    """A confidence level as a percentage with every digit it was given (the shortest decimal that is
    the float: 0.95 -> "95%", 0.975 -> "97.5%", 0.9999999999999998 -> "99.99999999999998%"), so that
    no level below 1 reads 100% and none above 0.5 reads 50%."""
    from decimal import Decimal

    return f"{(Decimal(repr(float(level))) * 100).normalize():f}%"


def checked_level(level: float, name: str = "level") -> float:
    """``level`` when ``is_confidence_level``; InputError naming it (as ``name``) and the range otherwise
    (a level that is not a real number, text or a bool say, too)."""
    from numbers import Real

    from gedp.errors import InputError

    if isinstance(level, bool) or not isinstance(level, Real) or not is_confidence_level(float(level)):
        raise InputError(f"{name} ({level}) must be a confidence level from {LOWEST_LEVEL:g} to below 1 "
                         "(0.5 <= level <= 0.9999999999999998)")
    return level


@dataclass(frozen=True)
class Combined:
    """A statistic combined over implicates (arrays of the statistics' shape)."""

    estimate: np.ndarray
    variance: np.ndarray  # T
    between: np.ndarray  # B
    within: np.ndarray  # U_bar
    df: np.ndarray  # nu
    m: int

    def margin(self, level: float = 0.95) -> np.ndarray:
        """Half-width of the interval at ``level``: t_nu((1 + level) / 2) sqrt(T)."""
        checked_level(level)
        from scipy import stats  # scipy.stats takes a while to import: loaded when a margin is asked for

        return stats.t.ppf((1 + level) / 2, self.df) * np.sqrt(self.variance)

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """The interval estimate -+ margin at ``level``."""
        half = self.margin(level)
        return self.estimate - half, self.estimate + half


def real_array(values, name: str) -> np.ndarray:
    """``values`` as an array of floats; ValueError naming them if they are not real numbers (complex
    numbers, text, a mapping, booleans: True is no estimate of 1)."""
    from numbers import Real

    array = np.asarray(values)
    real = array.dtype.kind in "iuf" or (array.dtype.kind == "O" and array.ndim > 0
                                         and all(isinstance(value, Real) and not isinstance(value, (bool, np.bool_))
                                                 for value in array.flat))
    if not real:
        raise ValueError(f"{name} must be real numbers (an array or a list of them), got {array.dtype} values")
    return array.astype(float)


def combine(estimates, variances=None) -> Combined:
    """Rubin's rules over the first axis of ``estimates`` (one row per implicate; any further axes
    are statistics combined separately); ``variances`` the complete-data variances of the same
    shape, or None for statistics of the establishments themselves (u = 0).

    Raises:
        ValueError: values that are not real numbers, fewer than 2 implicates, shapes that differ, non-finite
            values or negative variances, or values whose mean or variance overflows.
    """
    q = real_array(estimates, "estimates")
    if q.ndim == 0 or q.shape[0] < 2:
        raise ValueError(f"combining needs estimates of at least 2 implicates along the first axis, got shape "
                         f"{q.shape}")
    u = np.zeros_like(q) if variances is None else real_array(variances, "variances")
    if u.shape != q.shape:
        raise ValueError(f"variances' shape {u.shape} must be the estimates' {q.shape}")
    if not (np.isfinite(q).all() and np.isfinite(u).all()):
        raise ValueError("estimates and variances must be finite")
    if (u < 0).any():
        raise ValueError("variances must be >= 0")
    m = q.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        between = q.var(axis=0, ddof=1)
        within = u.mean(axis=0)
        inflated = (1 + 1 / m) * between
        total = within + inflated
        estimate = q.mean(axis=0)
    if not (np.isfinite(total).all() and np.isfinite(estimate).all()):
        raise ValueError("estimates or variances too large to combine in floating point (their mean or "
                         "variance overflows): rescale them, e.g. to thousands")
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(inflated > 0, (m - 1) * (1 + within / inflated) ** 2, np.inf)[()]  # a scalar's: a number
    return Combined(estimate, total, between, within, df, m)
