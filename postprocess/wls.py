"""Inverse-variance weighted least squares with nonnegativity: noisy answers -> microdata.

Per confidential attribute, with one variable per establishment,

    x^ = argmin_{x >= 0} sum_i (q_i(x) - a_i)^2 / v_i,

where each query row q_i sums the establishments of one group: an exact structured solver when the
answers include the identity query, cvxpy otherwise (the reference). The solver is generic: it knows
no attribute, and the attribute models (``postprocess.models``) plug their answers and priors into
it. This module reads only public attributes and noisy answers, never confidential values.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gedp.errors import ConfigError, InputError, SolverError
from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import Groupings
from gedp.postprocess.structured import (
    NotNested,
    cell_to_group_matrix,
    pinned_at_zero,
    solve_structured_wls,
    unbounded_cell_totals,
)

VARIANCE_MODES = ("smoothed", "pooled", "estimated", "exact", "hybrid")
#: Variance modes a release may use: computed from released values only.
RELEASE_VARIANCE_MODES = ("smoothed", "pooled", "estimated")
#: cvxpy reference solvers; "structured" is the exact nested solver, "auto" picks it when it applies.
CVXPY_SOLVERS = {"osqp": "OSQP", "clarabel": "CLARABEL"}  # cvxpy imported when used: it takes ~1 s
SOLVERS = ("auto", "structured", *CVXPY_SOLVERS)
#: Solver settings tight enough that KKT residuals stay far below one unit of the attribute.
SOLVER_OPTIONS = {
    "osqp": dict(eps_abs=1e-9, eps_rel=1e-9, max_iter=400_000, polishing=True),
    "clarabel": dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10),
}
#: A value within this of 0 (relative to the answers' scale) is solver round-off and set to 0.
ROUNDOFF = 1e-6
#: A solution is accepted only when its KKT residual is below this, relative to the answers' scale.
KKT_TOLERANCE = 1e-4


@dataclass(frozen=True, eq=False)
class LinearSystem:
    """Stacked query rows ``matrix`` (groups x establishments), answers ``b`` and variances ``v``."""

    matrix: sp.csr_matrix
    b: np.ndarray
    v: np.ndarray
    #: the ``Groupings`` whose query rows ``matrix`` is and those queries (``build_system``): the solves
    #: of several attributes over the same queries then share their structure (``NestedRows``)
    rows_of: tuple[Groupings, tuple[tuple[str, ...], ...]] | None = None


@dataclass(frozen=True)
class WLSResult:
    """Protected values of one attribute and how the solver got them."""

    values: np.ndarray
    solver: str
    status: str
    objective: float
    kkt_residual: float
    seconds: float
    fixed_zero: int
    clipped_negative: float
    iterations: int | None = None
    model: str = "plain"  # the attribute model that solved it (postprocess.models: plain, months, wage prior)

    def report(self) -> dict:
        """What a manifest records: no values, and no timing."""
        return {k: v for k, v in self.__dict__.items() if k not in ("values", "seconds")}


def combined_report(reports: Sequence[Mapping]) -> dict:
    """One summary of several solves' reports (a release's states, a job family's categories): the
    solvers and models used, their one status or "mixed: ...", the largest KKT residual and iteration
    count."""
    statuses = sorted({r["status"] for r in reports})
    return {"solver": ",".join(sorted({r["solver"] for r in reports})),
            "model": ",".join(sorted({r.get("model", "plain") for r in reports})),
            "status": statuses[0] if len(statuses) == 1 else "mixed: " + ",".join(statuses),
            "kkt_residual": max(r["kkt_residual"] for r in reports),
            "iterations": max((r["iterations"] or 0) for r in reports)}


def answer_variances(
    answer: NoisyAnswer, mode: str, exact_variances: Mapping[str, np.ndarray] | None
) -> np.ndarray:
    """The variances postprocessing weights ``answer`` by, under a variance mode.

    ``smoothed``, ``pooled`` and ``estimated`` use the answer's variances (released, or turned by
    ``month_answers`` before); ``exact`` replaces every
    psi-mechanism variance by its true value and ``hybrid`` all but the identity query's. True
    values come from ``exact_variances`` keyed by query name: confidential, ablation studies only.
    """
    if mode not in VARIANCE_MODES:
        raise ValueError(f"variance mode '{mode}' is unknown; choose one of {', '.join(VARIANCE_MODES)}")
    use_exact = answer.variance_kind == "estimated" and (
        mode == "exact" or (mode == "hybrid" and not answer.query.is_identity)
    )
    if not use_exact:
        return answer.variance
    if exact_variances is None or answer.query.name not in exact_variances:
        raise ValueError(f"variance mode '{mode}' needs the true variances of query {answer.query.name}")
    return np.asarray(exact_variances[answer.query.name], dtype=float)


def build_system(
    answers: Sequence[NoisyAnswer],
    public: pd.DataFrame,
    variances: Sequence[np.ndarray],
    groupings: Groupings | None = None,
) -> LinearSystem:
    """Stack the answers of one attribute into sparse query rows over the establishments of ``public``
    (``groupings``: of ``public``, shared with other calls)."""
    groupings = check_answer_groups(answers, public, groupings)
    queries = tuple(answer.query.by for answer in answers)
    return LinearSystem(groupings.rows(queries), np.concatenate([answer.estimate for answer in answers]),
                        np.concatenate(variances), rows_of=(groupings, queries))


def check_answer_groups(answers: Sequence[NoisyAnswer], public: pd.DataFrame,
                        groupings: Groupings | None = None) -> Groupings:
    """The ``groupings`` of ``public`` (made when None), after checking that each answer's keys are the
    groups of the public columns it groups by, in their order: a release's answers are untrusted input
    (a dropped, null or permuted key refused, naming the query)."""
    groupings = groupings or Groupings(public)
    for answer in answers:
        grouping = groupings(answer.query.by)
        if grouping.n_groups != len(answer) or not grouping.keys.equals(answer.keys.reset_index(drop=True)):
            raise InputError(
                f"answers of query {answer.query.name} do not match the groups of the public data "
                f"({len(answer)} answers, {grouping.n_groups} groups)"
            )
    return groupings


def system_structure(answers: Sequence[NoisyAnswer], public: pd.DataFrame,
                     groupings: Groupings | None = None) -> tuple[np.ndarray | None, np.ndarray]:
    """The rows of the (one) identity answer in ``build_system``'s stacking (None without exactly
    one), and each establishment's cell of the grouping by every group-by column (its own cell when
    there is none): what the structured solver and the margins of error work on."""
    identity = [i for i, answer in enumerate(answers) if answer.query.is_identity]
    offsets = np.cumsum([0, *[len(answer) for answer in answers]])
    rows = np.arange(offsets[identity[0]], offsets[identity[0] + 1]) if len(identity) == 1 else None
    columns = list(dict.fromkeys(c for answer in answers if not answer.query.is_identity for c in answer.query.by))
    return rows, (groupings or Groupings(public))(columns or ["estab_id"]).codes


def kkt_residual(system: LinearSystem, x: np.ndarray, pinned: np.ndarray | None = None) -> float:
    """max_j |min(x_j, g_j / H_jj)|: the KKT residual of x >= 0 in units of the attribute.

    g is the objective's gradient and H_jj its curvature along x_j, so g_j / H_jj is the Newton step
    on x_j; at the optimum every x_j > 0 has g_j = 0 and every x_j = 0 has g_j >= 0. Establishments
    ``pinned`` at 0 by an exact answer are not free variables and are left out.
    """
    a, w = system.matrix, 1.0 / system.v
    weighted = np.asarray(a @ x, dtype=float)  # its own array (a product), float even for integer rows
    weighted -= system.b
    weighted *= w
    gradient = a.T @ weighted
    gradient *= 2
    squares = a if a.has_canonical_format and np.all(a.data == 1.0) else a.multiply(a)  # 0/1 rows: a itself
    curvature = squares.T @ w
    curvature *= 2
    # the Newton step, then min(x, step) and its size, each in the gradient's array (no fresh memory)
    positive = curvature > 0
    residual = np.divide(gradient, curvature, out=gradient, where=positive)
    residual[~positive] = 0.0
    np.minimum(x, residual, out=residual)
    np.abs(residual, out=residual)
    if pinned is not None:
        residual[pinned] = 0.0  # not free variables: left out (every residual is >= 0, or NaN)
    return float(np.max(residual, initial=0.0))


def checked_result(system: LinearSystem, values: np.ndarray, *, solver: str, status: str, start: float,
            iterations: int | None = None) -> WLSResult:
    """Check a solution (round-off below 0 only), set round-off to 0, and measure it."""
    exact_rows, fixed = pinned_at_zero(system.matrix, system.b, system.v)
    keep = ~exact_rows
    scale = float(np.sqrt(np.median(system.v[keep]))) if keep.any() else 1.0
    clipped = float(max(0.0, -values.min(initial=0.0)))
    if clipped > ROUNDOFF * max(scale, 1.0):
        raise SolverError(f"{solver} returned a value of {-clipped:.3g}, below 0 beyond round-off")
    values = values.copy()
    values[values < ROUNDOFF * max(scale, 1.0)] = 0.0  # interior-point solvers stop just above 0
    kept = system if keep.all() else LinearSystem(system.matrix[keep], system.b[keep], system.v[keep])
    misfit = kept.matrix @ values
    misfit -= kept.b
    np.square(misfit, out=misfit)
    misfit /= kept.v
    objective = float(np.sum(misfit))
    residual = kkt_residual(kept, values, pinned=fixed)
    if not (np.all(np.isfinite(values)) and np.isfinite(objective)):
        raise SolverError(f"{solver} returned a non-finite solution or objective")
    if not residual <= KKT_TOLERANCE * max(scale, 1.0):
        raise SolverError(f"{solver} stopped at KKT residual {residual:.3g}, above the tolerance "
                          f"{KKT_TOLERANCE * max(scale, 1.0):.3g}: not optimal")
    return WLSResult(
        values=values,
        solver=solver,
        status=status,
        objective=objective,
        kkt_residual=residual,
        seconds=time.perf_counter() - start,
        fixed_zero=int(fixed.sum()),
        clipped_negative=clipped,
        iterations=iterations,
    )


def solve_wls(system: LinearSystem, *, solver: str = "osqp") -> WLSResult:
    """Solve min_{x >= 0} sum (A x - b)^2 / v with cvxpy; zero-variance rows fix their groups at 0.

    Raises:
        SolverError: the solver's status is not optimal.
    """
    if solver not in CVXPY_SOLVERS:
        raise ValueError(f"solver '{solver}' is not a cvxpy solver; choose one of {', '.join(CVXPY_SOLVERS)}")
    start = time.perf_counter()
    exact_rows, fixed = pinned_at_zero(system.matrix, system.b, system.v)
    free = np.flatnonzero(~fixed)
    keep = ~exact_rows
    a_free, b_free, v_free = system.matrix[keep][:, free], system.b[keep], system.v[keep]

    # Rescale x = c z with c^2 ~ typical variance, so weights are of order 1 (solver numerics only).
    scale = float(np.sqrt(np.median(v_free))) if len(v_free) else 1.0
    weight_sqrt = scale / np.sqrt(v_free)
    import cvxpy as cp

    z = cp.Variable(len(free), nonneg=True)
    residual = cp.multiply(weight_sqrt, a_free @ z - b_free / scale)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(residual)))
    try:
        problem.solve(solver=CVXPY_SOLVERS[solver], **SOLVER_OPTIONS[solver])
    except cp.error.SolverError as err:
        raise SolverError(f"{solver} failed: {err}") from None
    if problem.status != cp.OPTIMAL:
        raise SolverError(f"{solver} stopped with status '{problem.status}', not optimal")
    values = np.zeros(system.matrix.shape[1])
    values[free] = scale * z.value
    return checked_result(system, values, solver=solver, status=str(problem.status), start=start)


@dataclass(eq=False)
class NestedRows:
    """What the structured solver takes of a stacked system's rows alone: the establishment of each
    identity row, which rows are group rows, those rows, and (made when first needed) the cells x
    groups matrix of ``cell_codes``: the same for every attribute answered by the same queries."""

    establishment: np.ndarray
    groups: np.ndarray
    group_rows: sp.csr_matrix
    cell_codes: np.ndarray

    @classmethod
    def of(cls, matrix: sp.csr_matrix, identity_rows: np.ndarray, cell_codes: np.ndarray) -> NestedRows:
        groups = np.ones(matrix.shape[0], dtype=bool)
        groups[identity_rows] = False
        return cls(matrix.indices[matrix.indptr[identity_rows]], groups, matrix[groups], cell_codes)

    @functools.cached_property
    def cells_inside(self) -> sp.csr_matrix:
        """``structured.cell_to_group_matrix`` of the group rows and cells."""
        n_cells = int(self.cell_codes.max()) + 1 if len(self.cell_codes) else 0
        return cell_to_group_matrix(self.group_rows, self.cell_codes, n_cells)


def nested_rows(system: LinearSystem, identity_rows: np.ndarray, cell_codes: np.ndarray) -> NestedRows:
    """``NestedRows`` of a stacked system (``system_structure``'s identity rows and cells), made once
    per queries when the system says whose rows it holds (``LinearSystem.rows_of``)."""
    if system.rows_of is None:
        return NestedRows.of(system.matrix, identity_rows, cell_codes)
    groupings, queries = system.rows_of
    return groupings.made_once(("nested rows", queries),
                               lambda: NestedRows.of(system.matrix, identity_rows, cell_codes))


def structured_parts(system: LinearSystem, identity_rows: np.ndarray,
                     nested: NestedRows | None = None) -> tuple[np.ndarray, ...]:
    """The structured solver's inputs from a stacked system: identity answers and variances per
    establishment (a, v), then the group rows, their answers and variances (``nested``: the rows'
    structure, made already)."""
    nested = nested or NestedRows.of(system.matrix, identity_rows, np.zeros(0, dtype=np.int64))
    a = np.empty(system.matrix.shape[1])
    v = np.empty(system.matrix.shape[1])
    a[nested.establishment], v[nested.establishment] = system.b[identity_rows], system.v[identity_rows]
    return a, v, nested.group_rows, system.b[nested.groups], system.v[nested.groups]


def solve_structured(system: LinearSystem, identity_rows: np.ndarray, cell_codes: np.ndarray) -> WLSResult:
    """Exact structured solve (see postprocess.structured): identity rows and nested group rows."""
    start = time.perf_counter()
    nested = nested_rows(system, identity_rows, cell_codes)
    a, v, groups, b, w = structured_parts(system, identity_rows, nested)
    try:
        values, iterations, _ = solve_structured_wls(a, v, cell_codes, groups, b, w,
                                                     cells_inside=lambda: nested.cells_inside)
    except RuntimeError as err:  # pivoting did not converge
        raise SolverError(f"structured solver: {err}") from None
    # "optimal" only once checked_result has checked the KKT conditions.
    return checked_result(system, values, solver="structured", status="optimal", start=start, iterations=iterations)


def protect_attribute(
    answers: Sequence[NoisyAnswer],
    public: pd.DataFrame,
    *,
    variance_mode: str = "estimated",
    exact_variances: Mapping[str, np.ndarray] | None = None,
    solver: str = "auto",
    groupings: Groupings | None = None,
) -> WLSResult:
    """Protected establishment values of one attribute from all its noisy answers (``groupings``: of
    ``public``, shared with other attributes).

    ``solver="auto"`` uses the exact structured solver when the answers include the identity query
    (every group-by query is then nested in the cells of all query columns) and cvxpy with Clarabel
    otherwise (OSQP reports some log-scale problems infeasible that Clarabel solves); "structured",
    "osqp" and "clarabel" force a solver.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver '{solver}' is unknown; choose one of {', '.join(SOLVERS)}")
    return solve_attribute(*attribute_system(answers, public, variance_mode, exact_variances, groupings), solver)


def solve_attribute(system: LinearSystem, identity_rows: np.ndarray | None, cell_codes: np.ndarray,
                    solver: str = "auto") -> WLSResult:
    """``protect_attribute`` on an attribute's stacked system and structure (``attribute_system``)."""
    if solver in ("auto", "structured") and identity_rows is not None:
        try:
            return solve_structured(system, identity_rows, cell_codes)
        except NotNested as err:
            if solver == "structured":
                raise NotNested(f"solver: structured cannot postprocess this plan ({err}); use solver: auto") from None
    elif solver == "structured":
        raise ConfigError("solver: structured needs exactly one identity answer per attribute; use solver: auto")
    return solve_wls(system, solver="clarabel" if solver in ("auto", "structured") else solver)


def attribute_system(answers: Sequence[NoisyAnswer], public: pd.DataFrame, variance_mode: str,
                     exact_variances: Mapping[str, np.ndarray] | None = None, groupings: Groupings | None = None,
                     ) -> tuple[LinearSystem, np.ndarray | None, np.ndarray]:
    """One attribute's stacked system (``build_system``) and its structure (``system_structure``)."""
    if not answers:
        raise ValueError("no answers to postprocess")
    attributes = {answer.query.attribute for answer in answers}
    if len(attributes) > 1:
        raise ValueError(f"answers of several attributes ({', '.join(sorted(attributes))}) given together")
    variances = [answer_variances(answer, variance_mode, exact_variances) for answer in answers]
    groupings = groupings or Groupings(public)
    return build_system(answers, public, variances, groupings), *system_structure(answers, public, groupings)


def unbounded_totals(system: LinearSystem, identity_rows: np.ndarray | None, cell_codes: np.ndarray) -> np.ndarray:
    """Per cell of an attribute's system (``attribute_system``): its weighted least squares total
    without the bounds x >= 0 (``structured.unbounded_cell_totals``), linear in the answers. Needs
    the identity answer and nested groups (the structured solver's case)."""
    if identity_rows is None:
        raise ConfigError("unbounded cell totals need exactly one identity answer per attribute")
    a, v, groups, b, w = structured_parts(system, identity_rows)
    return unbounded_cell_totals(a, v, cell_codes, groups, b, w)
