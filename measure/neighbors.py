"""Neighbor functions psi and uncertainty intervals (SPEC section 3).

A neighbor function psi is strictly increasing, continuous and concave with psi(exp(x)) convex.
Records are psi-close when |psi(x) - psi(x')| <= gamma for every confidential attribute, so gamma
sets how far apart two values must be before the mechanism may tell them apart: the uncertainty
interval I(x) = [psi^-1(max(psi(0), psi(x) - gamma)), psi^-1(psi(x) + gamma)].

Each class also carries the closed forms the psi-mechanism needs on its scale: the unbiased
estimate of a total from omega = psi(x) + N(0, sd^2), the true variance of that estimate, and the
releasable variance computed at the estimate. The combined psi sqrt-linear (SPEC section 3) takes
them from its sqrt piece (``FarBranchPsi``); ``measure.combined`` builds any other combination
numerically.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from gedp.synth.schema import MAX_VALUE, InputError, shown


class NeighborFunction(ABC):
    """psi: [0, inf) -> R with its inverse; ``inverse`` clamps arguments below psi(0) to 0.

    ``releasable``: whether releases may use it (it has an estimate, unbiased or with a stated bias
    as ``FarBranchPsi`` explains, and a float error bound); ``max_noise_sd``: the largest psi-scale
    noise sd its estimates and variances stand.
    """

    name: str
    releasable = True
    max_noise_sd = math.inf

    @abstractmethod
    def __call__(self, x: np.ndarray) -> np.ndarray:
        """psi(x)."""

    @abstractmethod
    def _inverse(self, y: np.ndarray) -> np.ndarray:
        """psi^-1(y) for y >= psi(0)."""

    @property
    def at_zero(self) -> float:
        """psi(0) (-inf for log with a = 0)."""
        with np.errstate(divide="ignore"):
            return float(self(np.zeros(1))[0])

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """psi^-1(max(y, psi(0))): 0 wherever y is below psi(0)."""
        y = np.asarray(y, dtype=float)
        return self._inverse(np.maximum(y, self.at_zero))

    def interval(self, x: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
        """Uncertainty interval I(x): the values psi-close to x for distance gamma."""
        check_gamma(gamma)
        p = self(np.asarray(x, dtype=float))
        return self.inverse(p - gamma), self.inverse(p + gamma)

    def check_domain(self, values: np.ndarray, what: str) -> None:
        """Refuse values where psi is not finite (only log with a = 0 has such values: x = 0)."""

    def params(self) -> dict[str, Any]:
        """Parameters as recorded in a manifest."""
        return {"name": self.name, **{k: v for k, v in self.__dict__.items()}}

    # --- closed forms of the psi-mechanism on this scale ------------------------------------
    def unbiased_estimate(self, omega: np.ndarray, sd: float) -> np.ndarray:
        """x~ with E[x~] = x when omega = psi(x) + N(0, sd^2)."""
        raise NotImplementedError(f"psi '{self.name}' has no closed-form unbiased estimate")

    def estimate_variance(self, x: np.ndarray, sd: float) -> np.ndarray:
        """Var(x~) at true total x."""
        raise NotImplementedError(f"psi '{self.name}' has no closed-form variance")

    def releasable_variance(self, estimate: np.ndarray, sd: float) -> np.ndarray:
        """The variance formula evaluated at the estimate x~ (a function of released values only)."""
        return self.estimate_variance(estimate, sd)

    def estimand(self, y: np.ndarray) -> np.ndarray:
        """E[x~] when omega ~ N(y, sd^2), for any real y: psi^-1(y) without its clamp at 0 (so y^2 - a
        for sqrt): the analytic extension of psi^-1 that the estimate is unbiased for."""
        raise NotImplementedError(f"psi '{self.name}' has no closed-form unbiased estimate")

    def derivative(self, x: np.ndarray) -> np.ndarray:
        """psi'(x) (what combining two psi takes the minimum or maximum of)."""
        raise NotImplementedError(f"psi '{self.name}' has no closed-form derivative")

    # --- what the release grid needs (SPEC section 8) ---------------------------------------
    def clip_sensitivity(self, clip: np.ndarray, gamma: float) -> np.ndarray:
        """Delta = u - psi^-1(max(psi(0), psi(u) - gamma)): how far a value clipped at u can move
        between psi-close records. Generic form; subclasses give a form without cancellation."""
        clip = np.asarray(clip, dtype=float)
        return clip - self.inverse(self(clip) - gamma)

    def float_error(self, upper_total: np.ndarray) -> np.ndarray:
        """A bound on |fl(psi(fl(S))) - psi(S)| for any true total 0 <= S <= upper_total, when fl(S)
        is S correctly rounded (math.fsum) and psi is evaluated in float64 (within one ulp)."""
        raise NotImplementedError(f"psi '{self.name}' has no float error bound")


def check_gamma(gamma: float) -> None:
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma ({gamma}) must be a finite number >= 0")


def _check_offset(a: float) -> None:
    if not (math.isfinite(a) and 0 <= a <= MAX_VALUE):
        raise ValueError(f"psi parameter a ({a}) must be a finite number >= 0 and <= {MAX_VALUE:g}")


def _check_scale(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0 < value <= MAX_VALUE):
        raise ValueError(f"psi parameter {name} ({value}) must be a finite number > 0 and <= {MAX_VALUE:g}")


@dataclass(frozen=True)
class SqrtPsi(NeighborFunction):
    """psi(x) = sqrt(x + a): absolute uncertainty grows like sqrt(x), relative uncertainty shrinks."""

    a: float = 0.0
    name = "sqrt"

    def __post_init__(self) -> None:
        _check_offset(self.a)

    def __call__(self, x):
        return np.sqrt(np.asarray(x, dtype=float) + self.a)

    def _inverse(self, y):
        return np.maximum(y * y - self.a, 0.0)

    def unbiased_estimate(self, omega, sd):
        # E[omega^2] = (x + a) + sd^2.
        return np.asarray(omega, dtype=float) ** 2 - sd**2 - self.a

    def estimand(self, y):
        return np.asarray(y, dtype=float) ** 2 - self.a

    def derivative(self, x):
        return 0.5 / np.sqrt(np.asarray(x, dtype=float) + self.a)

    def estimate_variance(self, x, sd):
        # Var((m + Z)^2) = 4 m^2 sd^2 + 2 sd^4 with m^2 = x + a.
        return _sqrt_variance(np.asarray(x, dtype=float) + self.a, sd)

    def releasable_variance(self, estimate, sd):
        # Floor x~ + a at 0 inside the formula so the variance is >= 2 sd^4 > 0.
        return _sqrt_variance(np.maximum(np.asarray(estimate, dtype=float) + self.a, 0.0), sd)

    def clip_sensitivity(self, clip, gamma):
        # u - (sqrt(u + a) - gamma)^2 + a = 2 gamma sqrt(u + a) - gamma^2 while the lower end of
        # I(u) is above 0, else u itself: no difference of two close square roots.
        clip = np.asarray(clip, dtype=float)
        root = np.sqrt(clip + self.a)
        return np.where(root - gamma >= math.sqrt(self.a), 2 * gamma * root - gamma * gamma, clip)

    def float_error(self, upper_total):
        # Rounding S to fl(S) moves sqrt(S + a) by <= 2^-54 sqrt(S + a); sqrt is correctly rounded.
        return 2.0**-52 * np.sqrt(np.asarray(upper_total, dtype=float) + self.a) + 2.0**-1000


def _sqrt_variance(shifted: np.ndarray, sd: np.ndarray | float) -> np.ndarray:
    """2 sd^2 (2 shifted + sd^2) for a ``shifted`` of its own (overwritten), with each operation of that
    expression in its order (the same bits) but sd^2 computed once and two fresh arrays, not six."""
    sd2 = sd**2
    shifted *= 2
    variance = shifted + sd2
    variance *= 2 * sd2
    return variance


@dataclass(frozen=True)
class LogPsi(NeighborFunction):
    """psi(x) = log(x + a): multiplicative uncertainty (a = 0 needs every value > 0).

    Its estimate exp(omega - sd^2 / 2) and variance (x + a)^2 expm1(sd^2) overflow for large sd, so
    the noise sd is at most 10 (noise of a factor e^10 per standard deviation: far past any use).
    """

    a: float = 0.0
    name = "log"
    max_noise_sd = 10.0

    def __post_init__(self) -> None:
        _check_offset(self.a)

    def __call__(self, x):
        with np.errstate(divide="ignore"):
            return np.log(np.asarray(x, dtype=float) + self.a)

    def _inverse(self, y):
        return np.maximum(np.exp(y) - self.a, 0.0)

    def check_domain(self, values, what):
        # Which and how many values are 0 is confidential: the message says only that one is.
        if self.a == 0 and np.any(np.asarray(values) <= 0):
            raise InputError(f"psi log with a = 0 needs every value > 0, but a total of {what} is 0; use a > 0 "
                             "(e.g. a = 1)")

    def unbiased_estimate(self, omega, sd):
        # E[exp(omega)] = (x + a) exp(sd^2 / 2).
        return np.exp(np.asarray(omega, dtype=float) - sd**2 / 2) - self.a

    def estimand(self, y):
        return np.exp(np.asarray(y, dtype=float)) - self.a

    def derivative(self, x):
        return 1.0 / (np.asarray(x, dtype=float) + self.a)

    def estimate_variance(self, x, sd):
        return (np.asarray(x, dtype=float) + self.a) ** 2 * np.expm1(np.asarray(sd, dtype=float) ** 2)

    def clip_sensitivity(self, clip, gamma):
        # u - ((u + a) e^-gamma - a) = (u + a)(1 - e^-gamma) while the lower end is >= 0, else u.
        clip = np.asarray(clip, dtype=float)
        width = (clip + self.a) * -math.expm1(-gamma)
        return np.where((clip + self.a) * math.exp(-gamma) >= self.a, width, clip)

    def float_error(self, upper_total):
        # Rounding S moves log(S + a) by <= 2^-53; log itself is within one ulp of |log| <= 745
        # (the smallest positive double is 2^-1074) or of log(upper + a).
        logs = np.maximum(np.abs(np.log(np.asarray(upper_total, dtype=float) + self.a + 1.0)), 745.0)
        return 2.0**-52 * (logs + 1.0)


@dataclass(frozen=True)
class LinearPsi(NeighborFunction):
    """psi(x) = x / d: person-level DP, d = one person's largest possible contribution."""

    d: float = 1.0
    name = "linear"

    def __post_init__(self) -> None:
        _check_scale("d", self.d)

    def __call__(self, x):
        return np.asarray(x, dtype=float) / self.d

    def _inverse(self, y):
        return np.maximum(y * self.d, 0.0)

    def unbiased_estimate(self, omega, sd):
        return np.asarray(omega, dtype=float) * self.d

    def estimand(self, y):
        return np.asarray(y, dtype=float) * self.d

    def derivative(self, x):
        return np.full(np.shape(x), 1.0 / self.d)

    def estimate_variance(self, x, sd):
        return np.broadcast_to((self.d * np.asarray(sd, dtype=float)) ** 2, np.shape(x)).copy()

    def clip_sensitivity(self, clip, gamma):
        clip = np.asarray(clip, dtype=float)
        return np.minimum(gamma * self.d, clip)

    def float_error(self, upper_total):
        # fl(S) and the division each err by at most 2^-53 relative.
        return 2.0**-52 * np.asarray(upper_total, dtype=float) / self.d + 2.0**-1000


class FarBranchPsi(NeighborFunction):
    """A combined psi* whose last piece, x >= ``switch``, is far(x) / far_gamma + far_offset.

    Its psi-mechanism estimate is the far piece's closed form: there far_gamma (omega - far_offset)
    = far(x) + N(0, (far_gamma sd)^2), so far's unbiased estimate is exactly unbiased for every
    x >= switch. Below the switch it is unbiased for ``expected_estimate(x)`` (far's inverse
    continued analytically) instead, with the closed-form ``estimate_bias``. No estimate can be
    unbiased on both sides: x -> E[f(psi*(x) + Z)] is real-analytic in psi*(x) for any f, and
    psi*^-1 is not analytic at the switch (its second derivative jumps there).
    """

    switch: float  # where the far piece starts
    far: NeighborFunction
    far_gamma: float
    far_offset: float

    @property
    def max_noise_sd(self) -> float:
        return self.far.max_noise_sd / self.far_gamma

    def _far_scale(self, omega: np.ndarray) -> np.ndarray:
        """omega mapped onto the far piece's scale: far_gamma (omega - far_offset)."""
        return self.far_gamma * (np.asarray(omega, dtype=float) - self.far_offset)

    def unbiased_estimate(self, omega, sd):
        return self.far.unbiased_estimate(self._far_scale(omega), self.far_gamma * np.asarray(sd, dtype=float))

    def expected_estimate(self, x: np.ndarray) -> np.ndarray:
        """E[x~] at true total x: x itself from the switch on, more below it."""
        return self.far.estimand(self._far_scale(self(x)))

    def estimate_bias(self, x: np.ndarray) -> np.ndarray:
        """E[x~] - x: 0 for x >= switch."""
        x = np.asarray(x, dtype=float)
        return np.where(x >= self.switch, 0.0, self.expected_estimate(x) - x)

    def estimate_variance(self, x, sd):
        return self.far.estimate_variance(self.expected_estimate(x), self.far_gamma * np.asarray(sd, dtype=float))

    def releasable_variance(self, estimate, sd):
        # The formula at max(x~, 0): > 0 everywhere since E[x~] > 0 at x = 0.
        return self.estimate_variance(np.maximum(np.asarray(estimate, dtype=float), 0.0), sd)


@dataclass(frozen=True)
class SqrtLinearPsi(FarBranchPsi):
    """Combined psi* protecting establishments (sqrt(x), distance gamma_sqrt) and people (linear, d).

    gamma* = 1 and psi*'(x) = min(1 / (2 gamma sqrt(x)), 1 / d), so psi*(x) = x / d for
    x <= knot = d^2 / (4 gamma^2) and sqrt(x) / gamma - d / (4 gamma^2) beyond (SPEC section 3).
    Use it with gamma = 1: values within one person (d) or within gamma_sqrt on the sqrt scale,
    whichever is wider, are neighbors. The sqrt part has no offset a: a exists to bound sqrt's slope
    at 0, which the linear part already does (with a > 0 the linear piece just ends at knot - a).

    The psi-mechanism's estimate is sqrt's on the sqrt piece: x~ = gamma^2 ((omega + m_k)^2 - s^2),
    m_k = d / (4 gamma^2) = psi*(knot); exactly unbiased for x >= knot, and for x < knot biased by
    (knot - x)^2 / (4 knot) <= knot / 4 (FarBranchPsi: no estimate is unbiased on both pieces).
    """

    gamma_sqrt: float = 0.5
    d: float = 1.0
    name = "sqrt-linear"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gamma_sqrt) and self.gamma_sqrt > 0):
            raise ValueError(f"gamma_sqrt ({self.gamma_sqrt}) must be a finite number > 0")
        _check_scale("d", self.d)

    @property
    def knot(self) -> float:
        return self.d**2 / (4 * self.gamma_sqrt**2)

    @property
    def at_knot(self) -> float:
        """psi*(knot) = d / (4 gamma^2)."""
        return self.d / (4 * self.gamma_sqrt**2)

    switch = knot
    far = SqrtPsi()

    @property
    def far_gamma(self) -> float:
        return self.gamma_sqrt

    @property
    def far_offset(self) -> float:
        return -self.at_knot

    def __call__(self, x):
        x = np.asarray(x, dtype=float)
        return np.where(x <= self.knot, x / self.d, np.sqrt(x) / self.gamma_sqrt - self.at_knot)

    def _inverse(self, y):
        y = np.asarray(y, dtype=float)
        return np.where(y <= self.at_knot, np.maximum(y * self.d, 0.0), (self.gamma_sqrt * (y + self.at_knot)) ** 2)

    def derivative(self, x):
        return np.minimum(self.far.derivative(x) / self.gamma_sqrt, 1.0 / self.d)

    def clip_sensitivity(self, clip, gamma):
        # Lower end of I(u) = psi*^-1(psi*(u) - gamma), in three cases, each without cancellation:
        # both ends on the sqrt piece: 2 g gamma sqrt(u) - (g gamma)^2 (sqrt's form with distance g gamma);
        # u on the sqrt piece, lower end on the linear one: u - d (psi*(u) - gamma) = (sqrt u - sqrt knot)^2
        # + d gamma; u on the linear piece: d gamma; and u itself once psi*(u) <= gamma.
        clip = np.asarray(clip, dtype=float)
        g = self.gamma_sqrt
        root = np.sqrt(clip)
        crossing = (root - math.sqrt(self.knot)) ** 2 + self.d * gamma
        width = np.where(root > g * (gamma + 2 * self.at_knot), 2 * g * gamma * root - (g * gamma) ** 2,
                         np.where(clip > self.knot, crossing, self.d * gamma))
        return np.where(self(clip) <= gamma, clip, width)

    def float_error(self, upper_total):
        # Linear piece (S <= knot): fl(S) / d errs by <= 2^-52 knot / d = 2^-52 m_k. Sqrt piece:
        # sqrt(fl(S)) / gamma errs by <= 2^-51 sqrt(S) / gamma (three roundings), the constant and the
        # subtraction by <= 2^-51 (sqrt(S) / gamma + m_k). Doubled for the choice of piece at the knot.
        upper = np.asarray(upper_total, dtype=float)
        return 2.0**-50 * (np.sqrt(upper) / self.gamma_sqrt + 2 * self.at_knot) + 2.0**-1000


NEIGHBOR_FUNCTIONS = {"sqrt": SqrtPsi, "log": LogPsi, "linear": LinearPsi, "sqrt-linear": SqrtLinearPsi}


def make_psi(name: str, **params: float) -> NeighborFunction:
    """Build a neighbor function by name (sqrt, log, linear, sqrt-linear) and parameters."""
    if not isinstance(name, str) or name not in NEIGHBOR_FUNCTIONS:
        raise ValueError(f"psi {shown(name)} is unknown; choose one of {', '.join(NEIGHBOR_FUNCTIONS)}")
    cls = NEIGHBOR_FUNCTIONS[name]
    try:
        return cls(**params)
    except TypeError:
        raise ValueError(f"psi '{name}' takes parameters {list(cls.__dataclass_fields__)}, got "
                         f"{sorted(params)}") from None


def interval_table(psi: NeighborFunction, gamma: float, values: np.ndarray) -> list[dict[str, float]]:
    """Rows x, lower, upper, relative half-widths: the table a policy maker reads to choose gamma."""
    values = np.asarray(values, dtype=float)
    lower, upper = psi.interval(values, gamma)
    rows = []
    for x, lo, hi in zip(values, lower, upper):
        rows.append(
            {
                "x": float(x),
                "lower": float(lo),
                "upper": float(hi),
                "below_pct": float(100 * (x - lo) / x) if x > 0 else float("nan"),
                "above_pct": float(100 * (hi - x) / x) if x > 0 else float("nan"),
            }
        )
    return rows
