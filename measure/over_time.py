"""Noise designs across quarters: linear Gaussian strategies over an establishment's panel record.

A panel record is the vector y = (psi(x_1), ..., psi(x_T)) of one establishment's (or one group
total's) psi-scale values over T quarters. Two panel records are psi-close when every quarter is
within gamma: y' - y lies in the box [-gamma, gamma]^T. A *design* is a matrix W (k rows, T
columns); it releases W y + N(0, sd^2 I_k). Its privacy cost is that of the Gaussian mechanism
(Dong, Roth & Su, JRSS-B 2022, Theorem 2.7) with the L2 sensitivity over the box,

    mu = max over d in [-gamma, gamma]^T of ||W d||_2 / sd = gamma * max over s in {-1, 1}^T ||W s||_2 / sd,

because ||W d|| is convex in d, so its maximum over the box sits at a corner (exact by enumerating
the 2^(T-1) corners up to sign). Independent quarters are W = I (mu^2 = T mu_q^2). The estimates
of y are generalized least squares, (W'W)^-1 W' answers, with covariance sd^2 (W'W)^-1; every
contrast (a level, an over-the-quarter or over-the-year change) is read from them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gedp.errors import InputError, SolverError
from gedp.measure.budget import check_mu
from gedp.measure.neighbors import check_gamma

#: Most quarters a design may span: its exact cost enumerates 2^(T-1) corners of the box.
MAX_QUARTERS = 16
#: Quarters apart of an over-the-year change.
YEAR = 4
#: Contrast families a design is judged on.
CONTRAST_KINDS = ("level", "quarter", "year")


@dataclass(frozen=True)
class Design:
    """A linear strategy over quarters: each row is one released combination of psi-scale values.

    Attributes:
        name: a short label for tables.
        rows: (k, T) matrix W; every row is answered with the same noise sd.
    """

    name: str
    rows: np.ndarray

    @property
    def quarters(self) -> int:
        """T, the number of quarters the design spans."""
        return int(self.rows.shape[1])


def check_quarters(quarters: int, largest: int | None = None) -> None:
    """Refuse a number of quarters that is not a whole number >= 1 (or above ``largest``)."""
    if not (isinstance(quarters, int) and 1 <= quarters <= (largest or quarters)):
        bound = f"from 1 to {largest}" if largest else ">= 1"
        raise InputError(f"quarters ({quarters}) must be a whole number {bound}")


def sign_corners(quarters: int) -> np.ndarray:
    """The 2^(T-1) corners of the box {-1, 1}^T with first coordinate +1 (the rest are their negatives)."""
    check_quarters(quarters, MAX_QUARTERS)
    rest = np.array(list(itertools.product((1.0, -1.0), repeat=quarters - 1))).reshape(-1, quarters - 1)
    return np.hstack([np.ones((rest.shape[0], 1)), rest])


def box_sensitivity(rows: np.ndarray) -> float:
    """max over s in {-1, 1}^T of ||W s||_2: the L2 sensitivity of W y when each quarter moves by <= 1."""
    rows = np.asarray(rows, dtype=float)
    if rows.ndim != 2 or not np.isfinite(rows).all():
        raise InputError(f"design rows (shape {rows.shape}) must be a finite 2-d matrix")
    images = sign_corners(rows.shape[1]) @ rows.T
    return float(np.sqrt((images * images).sum(axis=1).max()))


def design_mu(design: Design, gamma: float, sd: float) -> float:
    """Privacy cost of releasing W y + N(0, sd^2 I) under the box neighbour of half-width gamma."""
    check_gamma(gamma)
    if not (math.isfinite(sd) and sd > 0):
        raise InputError(f"sd ({sd}) must be a finite number > 0")
    return gamma * box_sensitivity(design.rows) / sd


def presence_mu(design: Design, present: np.ndarray, gamma: float, sd: float) -> float:
    """What an establishment present only in the quarters ``present`` (T booleans) spends: presence is
    public, so its values move in those quarters alone and the box shrinks to them (W_P s, s over P)."""
    present = np.asarray(present, dtype=bool)
    if present.shape != (design.quarters,) or not present.any():
        raise InputError(f"present (shape {present.shape}) must mark at least one of the design's "
                         f"{design.quarters} quarters")
    return design_mu(Design(design.name, design.rows[:, present]), gamma, sd)


def design_sd(design: Design, gamma: float, mu: float) -> float:
    """The noise sd at which ``design`` costs ``mu`` under the box neighbour of half-width gamma."""
    check_gamma(gamma)
    check_mu(mu)
    return gamma * box_sensitivity(design.rows) / mu


def _precision(rows: np.ndarray) -> np.ndarray:
    precision = rows.T @ rows
    if np.linalg.matrix_rank(precision) < rows.shape[1]:
        raise InputError(f"design rows (rank {np.linalg.matrix_rank(precision)}) must determine all "
                         f"{rows.shape[1]} quarters' levels")
    return precision


def estimate_covariance(design: Design, sd: float) -> np.ndarray:
    """Covariance sd^2 (W'W)^-1 of the least-squares estimates of the T quarters' psi values."""
    return sd * sd * np.linalg.inv(_precision(design.rows))


def gls_estimates(design: Design, answers: np.ndarray) -> np.ndarray:
    """Least-squares estimates (W'W)^-1 W' z of the psi values, one row per group of ``answers`` (n, k)."""
    rows = design.rows
    answers = np.atleast_2d(np.asarray(answers, dtype=float))
    if answers.shape[1] != rows.shape[0]:
        raise InputError(f"answers ({answers.shape[1]} per group) must have one value per design row "
                         f"({rows.shape[0]})")
    return np.linalg.solve(_precision(rows), rows.T @ answers.T).T


def release_answers(design: Design, values: np.ndarray, sd: float, *, rng: np.random.Generator) -> np.ndarray:
    """W y + N(0, sd^2 I) for every group's psi values ``values`` (n, T): the noisy design answers.

    For studies of designs: the draws are ideal floats, not the grid values a release writes
    (``gedp.measure.grid``). Costs ``design_mu(design, gamma, sd)`` under the box neighbour.
    """
    values = np.atleast_2d(np.asarray(values, dtype=float))
    exact = values @ design.rows.T
    return exact + rng.normal(0.0, sd, size=exact.shape)


def contrasts(quarters: int, kind: str) -> np.ndarray:
    """Rows c of the contrasts c'y of one kind: ``level`` (each quarter), ``quarter`` (y_t - y_t-1)
    or ``year`` (y_t - y_t-4); a kind with no contrast in T quarters has zero rows."""
    check_quarters(quarters)
    if kind not in CONTRAST_KINDS:
        raise InputError(f"contrast kind ({kind!r}) must be one of {', '.join(CONTRAST_KINDS)}")
    identity = np.eye(quarters)
    if kind == "level":
        return identity
    lag = 1 if kind == "quarter" else YEAR
    return identity[lag:] - identity[:-lag] if quarters > lag else np.zeros((0, quarters))


def contrast_variances(design: Design, sd: float, kind: str) -> np.ndarray:
    """Variance of each contrast of ``kind`` estimated by least squares from the design's answers."""
    rows = contrasts(design.quarters, kind)
    return np.einsum("ij,jk,ik->i", rows, estimate_covariance(design, sd), rows)


# --- designs --------------------------------------------------------------------------------------
def independent_design(quarters: int) -> Design:
    """Each quarter measured on its own: W = I."""
    check_quarters(quarters)
    return Design("independent", np.eye(quarters))


def change_design(quarters: int, *, level: float, quarter: float = 0.0, year: float = 0.0) -> Design:
    """Levels with weight ``level`` plus over-the-quarter and over-the-year change rows with their weights."""
    for name, weight in (("level", level), ("quarter", quarter), ("year", year)):
        if not (math.isfinite(weight) and weight >= 0):
            raise InputError(f"{name} weight ({weight}) must be a finite number >= 0")
    blocks = [weight * contrasts(quarters, kind) for kind, weight in
              (("level", level), ("quarter", quarter), ("year", year)) if weight > 0]
    if not blocks:
        raise InputError("a change design needs at least one weight > 0")
    return Design(f"changes {level:g}/{quarter:g}/{year:g}", np.vstack(blocks))


def shared_component_design(quarters: int, rho: float) -> Design:
    """Noise with covariance rho 11' + (1 - rho) I across quarters (a component shared by every quarter,
    as permanent establishment noise factors are): W = Sigma^(-1/2), so that W y + N(0, I) carries it."""
    check_quarters(quarters)
    if not (0 <= rho < 1):
        raise InputError(f"rho ({rho}) must be in [0, 1)")
    covariance = rho * np.ones((quarters, quarters)) + (1 - rho) * np.eye(quarters)
    values, vectors = np.linalg.eigh(covariance)
    return Design(f"shared rho={rho:g}", (vectors / np.sqrt(values)) @ vectors.T)


def binary_tree_design(quarters: int) -> Design:
    """The binary-tree counter over the quarter-to-quarter increments u_t = y_t - y_t-1 (y_0 = 0): one row
    per dyadic interval [i, j] inside the T quarters, measuring sum of u over it = y_j - y_i-1."""
    check_quarters(quarters)
    rows = []
    length = 1
    while length <= quarters:
        for start in range(0, quarters - length + 1, length):
            row = np.zeros(quarters)
            row[start + length - 1] = 1.0
            if start > 0:
                row[start - 1] = -1.0
            rows.append(row)
        length *= 2
    return Design("binary tree", np.array(rows))


def optimal_design(quarters: int, weights: Mapping[str, float], *, solver: str = "CLARABEL") -> Design:
    """The design of box sensitivity 1 minimizing sum over kinds of weight x mean contrast variance.

    Over the precision M = W'W the problem is convex: minimize sum_k w_k mean_c c'M^-1 c subject to
    s'Ms <= 1 at every corner s and M positive semidefinite (a semidefinite program; the optimum is
    global). The design returned is W = M^(1/2); scale its noise with ``design_sd``.
    """
    import cvxpy as cp

    check_quarters(quarters)
    unknown = sorted(set(weights) - set(CONTRAST_KINDS))
    if unknown or not any(weight > 0 for weight in weights.values()):
        raise InputError(f"weights ({dict(weights)}) must give kinds among {', '.join(CONTRAST_KINDS)} "
                         "and at least one weight > 0")
    if any(not (math.isfinite(weight) and weight >= 0) for weight in weights.values()):
        raise InputError(f"weights ({dict(weights)}) must be finite numbers >= 0")
    precision = cp.Variable((quarters, quarters), PSD=True)
    terms = [weight / len(rows) * cp.matrix_frac(row, precision)
             for kind, weight in weights.items() if weight > 0
             for rows in [contrasts(quarters, kind)] if len(rows) for row in rows]
    corners = sign_corners(quarters)
    outer = np.einsum("ns,nt->nst", corners, corners).reshape(len(corners), -1)  # s'Ms = vec(ss') . vec(M)
    problem = cp.Problem(cp.Minimize(cp.sum(terms)), [outer @ cp.vec(precision, order="C") <= 1])
    problem.solve(solver=solver)
    if problem.status != cp.OPTIMAL:
        raise SolverError(f"design optimization ended with status {problem.status!r}, not optimal")
    values, vectors = np.linalg.eigh((precision.value + precision.value.T) / 2)
    rows = (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T
    label = "/".join(f"{weights.get(kind, 0):g}" for kind in CONTRAST_KINDS)
    return Design(f"optimal {label}", rows / box_sensitivity(rows))


# --- back to counts (psi = sqrt(x + a)) ----------------------------------------------------------
def sqrt_levels(estimates: np.ndarray, covariance: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """Unbiased levels x~_t = yhat_t^2 - var(yhat_t) - a from least-squares psi values (psi = sqrt(x + a))."""
    return np.asarray(estimates, dtype=float) ** 2 - np.diag(covariance) - offset


def sqrt_contrast_variances(estimates: np.ndarray, covariance: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Releasable variance of each contrast c'x~ of the levels ``sqrt_levels``, per group (n, contrasts).

    For yhat ~ N(m, C): Var(sum_t c_t yhat_t^2) = 2 c'(C o C)c + 4 (c o m)'C(c o m). Replacing m_s m_t by
    its unbiased estimate yhat_s yhat_t - C_st gives 4 (c o yhat)'C(c o yhat) - 2 c'(C o C)c, floored at
    2 c'(C o C)c, the least the true variance can be.
    """
    estimates = np.atleast_2d(np.asarray(estimates, dtype=float))
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    floor = 2 * np.einsum("cs,st,ct->c", rows, covariance * covariance, rows)
    weighted = estimates[:, None, :] * rows[None, :, :]
    quadratic = np.einsum("ncs,st,nct->nc", weighted, covariance, weighted)
    return np.maximum(4 * quadratic - floor, floor)
