"""Numeric psi*: combining two neighbor functions, and a grid check of the neighbor-function rules.

SPEC section 3: protecting both A (distance gamma_A) and B (gamma_B) takes
psi*'(x) = min(psi_A'(x) / gamma_A, psi_B'(x) / gamma_B) with gamma* = 1; two publishers with
different psi compose heterogeneously with max instead of min. psi*(x) = integral_0^x psi*'.

Between the points where the two scaled derivatives cross, psi* is one part plus a constant, so
``combine`` finds the crossings numerically (a sign scan on a geometric grid refined by bisection)
and evaluates psi* piece by piece, exactly; psi*^-1 is vectorized bisection. Both rules keep the
neighbor-function properties: a minimum or maximum of nonincreasing derivatives is nonincreasing
(concave), and of nondecreasing e^t psi'(e^t) nondecreasing (psi(exp(t)) convex).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from gedp.measure.neighbors import FarBranchPsi, LinearPsi, NeighborFunction, SqrtLinearPsi, SqrtPsi, check_gamma
from gedp.synth.schema import MAX_VALUE, shown

#: Crossings are looked for on [SCAN_LOW, SCAN_HIGH]: below, the parts' derivatives are their values
#: at 0 for all a total can be; above, totals of a million records of MAX_VALUE.
SCAN_LOW, SCAN_HIGH, SCAN_POINTS = 1e-12, 1e6 * MAX_VALUE, 4001
BISECTION_STEPS = 80
RULES = ("min", "max")


class CombinedPsi(FarBranchPsi):
    """psi* of two neighbor functions with distances: rule "min" protects both (combining), "max"
    is the heterogeneous composition of two publishers. Use it with gamma = 1.

    Not releasable: its float error is not bounded, so releases use the closed form
    (``SqrtLinearPsi``); it serves intervals, checks and the closed form's tests.
    """

    name = "combined"
    releasable = False

    def __init__(self, first: NeighborFunction, first_gamma: float, second: NeighborFunction, second_gamma: float,
                 rule: Literal["min", "max"] = "min") -> None:
        _check_parts([first_gamma, second_gamma], rule)
        self.parts = ((first, float(first_gamma)), (second, float(second_gamma)))
        self.rule = rule
        self.breaks = np.concatenate([[0.0], self._crossings()])
        self.pieces = [self._active(lo, hi) for lo, hi in zip(self.breaks, [*self.breaks[1:], math.inf])]
        self.offsets = self._offsets()

    # --- construction --------------------------------------------------------------------------
    def _scaled_difference(self, x: np.ndarray) -> np.ndarray:
        (a, ga), (b, gb) = self.parts
        with np.errstate(divide="ignore", invalid="ignore"):
            return a.derivative(x) / ga - b.derivative(x) / gb

    def _crossings(self) -> np.ndarray:
        """Points where the two scaled derivatives cross (sign changes on a geometric grid, bisected)."""
        x = np.geomspace(SCAN_LOW, SCAN_HIGH, SCAN_POINTS)
        sign = np.sign(self._scaled_difference(x))
        change = np.flatnonzero((sign[:-1] != sign[1:]) & (sign[:-1] != 0) & (sign[1:] != 0))
        lo, hi = x[change], x[change + 1]
        low_sign = sign[change]
        for _ in range(BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            same = np.sign(self._scaled_difference(mid)) == low_sign
            lo, hi = np.where(same, mid, lo), np.where(same, hi, mid)
        return 0.5 * (lo + hi)

    def _active(self, lo: float, hi: float) -> int:
        """Which part the rule picks on (lo, hi): the smaller (min) or larger (max) scaled derivative."""
        middle = math.sqrt(max(lo, SCAN_LOW) * hi) if math.isfinite(hi) else 2 * max(lo, 1.0)
        difference = float(self._scaled_difference(np.array([middle]))[0])
        first_smaller = difference <= 0
        return 0 if first_smaller == (self.rule == "min") else 1

    def _part_value(self, piece: int, x: np.ndarray) -> np.ndarray:
        part, gamma = self.parts[self.pieces[piece]]
        return part(x) / gamma

    def _offsets(self) -> list[float]:
        """Constants making psi* continuous with psi*(0) = 0."""
        offsets, value = [], 0.0
        for piece, start in enumerate(self.breaks):
            offsets.append(value - float(self._part_value(piece, np.array([start]))[0]))
            if piece + 1 < len(self.breaks):
                value = float(self._part_value(piece, np.array([self.breaks[piece + 1]]))[0]) + offsets[-1]
        if not all(math.isfinite(o) for o in offsets):
            raise ValueError("the combined psi is not finite at 0 (log with a = 0 on the first piece); use a > 0")
        return offsets

    # --- FarBranchPsi: the last piece ----------------------------------------------------------
    @property
    def switch(self) -> float:
        return float(self.breaks[-1])

    @property
    def far(self) -> NeighborFunction:
        return self.parts[self.pieces[-1]][0]

    @property
    def far_gamma(self) -> float:
        return self.parts[self.pieces[-1]][1]

    @property
    def far_offset(self) -> float:
        return self.offsets[-1]

    # --- psi, its inverse and derivative -------------------------------------------------------
    def __call__(self, x):
        x = np.asarray(x, dtype=float)
        piece = np.searchsorted(self.breaks, x, side="right") - 1
        out = np.empty(x.shape)
        for k in range(len(self.breaks)):
            inside = piece == k
            out[inside] = self._part_value(k, x[inside]) + self.offsets[k]
        return out

    def _inverse(self, y):
        """Bisection for psi*(x) = y, vectorized: double an upper end until it brackets y, then halve."""
        y = np.asarray(y, dtype=float)
        hi = np.ones(y.shape)
        while np.any(short := self(hi) < y):
            hi[short] *= 2.0
        lo = np.where(hi > 1.0, hi / 2, 0.0)
        for _ in range(BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            below = self(mid) < y
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return 0.5 * (lo + hi)

    def derivative(self, x):
        (a, ga), (b, gb) = self.parts
        pick = np.minimum if self.rule == "min" else np.maximum
        return pick(a.derivative(x) / ga, b.derivative(x) / gb)

    def params(self) -> dict[str, Any]:
        (a, ga), (b, gb) = self.parts
        return {"name": self.name, "rule": self.rule, "first": a.params(), "first_gamma": ga,
                "second": b.params(), "second_gamma": gb}


def _check_parts(gammas: Sequence[float], rule: str) -> None:
    for gamma in gammas:
        check_gamma(gamma)
        if gamma == 0:
            raise ValueError("the gammas of a combined psi must be > 0")
    if rule not in RULES:
        raise ValueError(f"rule {shown(rule)} is unknown; choose min (combining) or max (heterogeneous composition)")


def combined_psi(parts: Sequence[tuple[NeighborFunction, float]], rule: str = "min") -> NeighborFunction:
    """psi* of two (psi, gamma) parts by ``rule``: "min" protects both, "max" composes two publishers.

    Min of sqrt(x) (no offset) and linear x / d is built in its closed form, ``SqrtLinearPsi``
    (gamma_sqrt, d times the linear part's gamma), which releases can use; any other combination is
    the numeric ``CombinedPsi``, which serves intervals and checks but no release.

    Raises:
        ValueError: not two parts, an unknown rule, or a gamma that is not > 0.
    """
    if len(parts) != 2:
        raise ValueError(f"a combined psi takes two parts, got {len(parts)}")
    _check_parts([gamma for _, gamma in parts], rule)
    by_kind = {type(psi): (psi, gamma) for psi, gamma in parts}
    if rule == "min" and set(by_kind) == {SqrtPsi, LinearPsi} and by_kind[SqrtPsi][0].a == 0:
        (_, gamma_sqrt), (linear, linear_gamma) = by_kind[SqrtPsi], by_kind[LinearPsi]
        return SqrtLinearPsi(gamma_sqrt=float(gamma_sqrt), d=linear.d * float(linear_gamma))
    (first, first_gamma), (second, second_gamma) = parts
    return CombinedPsi(first, first_gamma, second, second_gamma, rule)


def combine(first: NeighborFunction, first_gamma: float, second: NeighborFunction, second_gamma: float) -> CombinedPsi:
    """psi* protecting both: psi*' = min(psi_A' / gamma_A, psi_B' / gamma_B), gamma* = 1."""
    return CombinedPsi(first, first_gamma, second, second_gamma, "min")


def compose_publishers(first: NeighborFunction, first_gamma: float, second: NeighborFunction,
                       second_gamma: float) -> CombinedPsi:
    """Heterogeneous composition of two publishers: psi*' = max(psi_A' / gamma_A, psi_B' / gamma_B)."""
    return CombinedPsi(first, first_gamma, second, second_gamma, "max")


def neighbor_function_violations(psi: NeighborFunction, x: np.ndarray, *, rtol: float = 1e-9,
                                  subdivisions: int = 64) -> list[str]:
    """Which rules of SPEC section 3 psi breaks on the sorted positive grid x: "increasing",
    "continuous", "concave" (chord slopes nonincreasing), "exp-convex" (chord slopes of psi(exp(t))
    nondecreasing). Continuity: each grid interval is cut into ``subdivisions`` parts, and no part may
    change psi by more than twice its width times the previous interval's chord slope (which bounds
    psi' there when psi is concave); a jump anywhere inside an interval breaks that bound."""
    x = np.asarray(x, dtype=float)
    values = psi(x)
    tolerance = rtol * (1 + np.abs(values))
    violations = []
    if not np.all(np.diff(values) > 0):
        violations.append("increasing")
    slopes = np.diff(values) / np.diff(x)
    fine = x[:-1, None] + np.diff(x)[:, None] * np.linspace(0, 1, subdivisions + 1)[None, :]
    parts = np.abs(np.diff(psi(fine), axis=1))[1:]
    bound = 2 * np.abs(slopes[:-1, None]) * np.diff(fine, axis=1)[1:] + tolerance[1:-1, None]
    if np.any(parts > bound):
        violations.append("continuous")
    if np.any(np.diff(slopes) > rtol * np.abs(slopes[:-1]) + 1e-12):
        violations.append("concave")
    exp_slopes = np.diff(values) / np.diff(np.log(x))
    if np.any(np.diff(exp_slopes) < -(rtol * np.abs(exp_slopes[:-1]) + 1e-12)):
        violations.append("exp-convex")
    return violations
