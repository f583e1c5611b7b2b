"""Weighted least squares with nonnegativity: KKT, agreement with an independent solver, modes."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy.optimize import lsq_linear

from gedp.config import load_config
from gedp.errors import ConfigError
from gedp.measure.mechanisms import psi_exact_variance
from gedp.measure.queries import Groupings, group_establishments
from gedp.measure.workflows import measure
from gedp.postprocess.months import pool_month_variances
from gedp.postprocess.structured import unbounded_cell_totals
from gedp.postprocess.wls import (
    LinearSystem,
    answer_variances,
    attribute_system,
    build_system,
    kkt_residual,
    protect_attribute,
    solve_structured,
    solve_wls,
    structured_parts,
)
from gedp.synth.schema import public_columns


def nested_instance(seed: int, n: int = 400, zero_share: float = 0.5, *, counties: int = 5, industries: int = 9,
                    queries=(("estab_id",), (), ("county",), ("naics",), ("county", "naics")), noise: float = 30.0):
    """Noisy answers of nested queries over n establishments, many of them 0.

    Returns the stacked system, each establishment's county x naics cell and the public data.
    """
    rng = np.random.default_rng(seed)
    public = pd.DataFrame({
        "estab_id": [f"E{i}" for i in range(n)],
        "county": rng.choice([f"{c:03d}" for c in range(counties)], n),
        "naics": rng.choice([f"{c:06d}" for c in range(industries)], n),
    })
    truth = np.where(rng.random(n) < zero_share, 0.0, rng.gamma(0.6, 40, n))
    rows, b, v = [], [], []
    for by in queries:
        grouping = group_establishments(public, by)
        rows.append(sp.csr_matrix((np.ones(n), (grouping.codes, np.arange(n))), shape=(grouping.n_groups, n)))
        variance = rng.uniform(1, noise, grouping.n_groups) * (1 + grouping.sum(truth) / 20)
        b.append(grouping.sum(truth) + rng.normal(0, np.sqrt(variance)))
        v.append(variance)
    system = LinearSystem(sp.vstack(rows, format="csr"), np.concatenate(b), np.concatenate(v))
    return system, group_establishments(public, ("county", "naics")).codes, public


def random_system(seed: int, n: int = 300, zero_share: float = 0.4) -> LinearSystem:
    """Identity, total, 7 counties and the county x industry cells, with many zeros."""
    return nested_instance(seed, n, zero_share, counties=7, industries=6, noise=50.0,
                           queries=(("estab_id",), (), ("county",), ("county", "naics")))[0]


def reference_solution(system: LinearSystem) -> np.ndarray:
    """Independent solver: scipy's bounded-variable least squares (active set) on the whitened system."""
    w = 1 / np.sqrt(system.v)
    result = lsq_linear((sp.diags(w) @ system.matrix).toarray(), w * system.b, bounds=(0, np.inf), method="bvls",
                        tol=1e-13, max_iter=10_000)
    return result.x


def objective(system: LinearSystem, x: np.ndarray) -> float:
    return float(np.sum((system.matrix @ x - system.b) ** 2 / system.v))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("solver", ["osqp", "clarabel"])
def test_solution_satisfies_kkt_and_matches_an_independent_solver(seed, solver):
    system = random_system(seed)
    result = solve_wls(system, solver=solver)
    reference = reference_solution(system)
    assert result.status == "optimal"
    assert np.all(result.values >= 0)
    binding = reference < 1e-8
    assert binding.sum() > 10  # nonnegativity binds on this instance
    assert np.all(result.values[binding] == 0)
    assert result.objective == pytest.approx(objective(system, reference), rel=1e-6)
    assert result.objective <= objective(system, reference) * (1 + 1e-6)
    assert result.kkt_residual < 1e-3
    assert kkt_residual(system, result.values) == pytest.approx(result.kkt_residual)


def test_attributes_over_the_same_queries_share_the_structured_solvers_rows(small_state):
    """The months' systems (same queries) are solved over one ``NestedRows`` made once in their
    Groupings, and each solve has the bits of the same system solved with nothing shared."""
    plan = load_config("baseline").plan
    measurements = measure(small_state, plan, rng=np.random.default_rng(7))
    public = small_state[public_columns(small_state)]
    groupings = Groupings(public)
    made = []
    for month in ("m1emp", "m2emp", "m3emp"):
        system, identity_rows, cells = attribute_system(measurements.for_attribute(month), public, "estimated",
                                                        groupings=groupings)
        shared = solve_structured(system, identity_rows, cells)
        alone = solve_structured(LinearSystem(system.matrix, system.b, system.v), identity_rows, cells)
        assert shared.values.tobytes() == alone.values.tobytes() and shared.objective == alone.objective
        made.append(groupings.made_once(("nested rows", system.rows_of[1]), lambda: pytest.fail("made again")))
    assert made[0] is made[1] is made[2] and made[0].cells_inside.shape[1] == cells.max() + 1


def test_kkt_residual_is_the_newton_step_bound_computed_densely():
    """kkt_residual against the formula on dense arrays: max over free x_j of |min(x_j, g_j / H_jj)|,
    g = 2 A^T W (A x - b), H_jj = 2 sum_i A_ij^2 W_i; a column no row touches has step 0, and pinned
    establishments are left out (here the one with the largest residual). Also for rows that are not
    0/1 (A_ij^2 then differs from A_ij)."""
    rng = np.random.default_rng(12)
    for scale in (1.0, 1.5):
        system = random_system(5)
        matrix = system.matrix.tolil()
        matrix[:, 7] = 0.0  # a column no row touches
        matrix = (matrix * scale).tocsr()
        system = LinearSystem(matrix, system.b, system.v)
        x = rng.uniform(-5.0, 50.0, matrix.shape[1])
        dense, w = matrix.toarray(), 1.0 / system.v
        gradient = 2 * dense.T @ (w * (dense @ x - system.b))
        curvature = 2 * (dense**2).T @ w
        step = np.where(curvature > 0, gradient / np.where(curvature > 0, curvature, 1.0), 0.0)
        residual = np.abs(np.minimum(x, step))
        assert residual[7] == abs(min(x[7], 0.0))
        np.testing.assert_allclose(kkt_residual(system, x), residual.max(), rtol=1e-12)
        pinned = residual == residual.max()
        np.testing.assert_allclose(kkt_residual(system, x, pinned=pinned), residual[~pinned].max(), rtol=1e-12)


def test_kkt_residual_of_integer_rows_and_values_is_a_float():
    """Rows and values of whole numbers (int64) give the residual of the same system in floats."""
    system = random_system(6)
    x = np.random.default_rng(2).integers(0, 40, system.matrix.shape[1])
    as_integers = LinearSystem(system.matrix.astype(np.int64), system.b, system.v)
    assert kkt_residual(as_integers, x) == kkt_residual(system, x.astype(float))


def test_kkt_residual_detects_a_non_optimal_point():
    system = random_system(4)
    optimum = solve_wls(system).values
    assert kkt_residual(system, optimum * 1.05 + 0.5) > 100 * kkt_residual(system, optimum)


def test_osqp_and_clarabel_agree_on_a_release(small_state):
    plan = load_config("baseline").plan
    measurements = measure(small_state, plan, rng=np.random.default_rng(5))
    public = small_state.drop(columns=["m1emp", "m2emp", "m3emp", "wage"])
    for attribute in ("m1emp", "wage"):
        answers = measurements.for_attribute(attribute)
        osqp = protect_attribute(answers, public, solver="osqp")
        clarabel = protect_attribute(answers, public, solver="clarabel")
        assert osqp.objective == pytest.approx(clarabel.objective, rel=1e-6)
        scale = np.sqrt(np.median(answers[0].variance))
        np.testing.assert_allclose(osqp.values, clarabel.values, atol=1e-3 * scale)


def test_zero_variance_groups_pin_their_establishments_at_zero():
    system = random_system(6, n=60)
    matrix = sp.vstack([system.matrix, sp.csr_matrix(([1.0, 1.0], ([0, 0], [3, 17])), shape=(1, 60))], format="csr")
    pinned = LinearSystem(matrix, np.append(system.b, 0.0), np.append(system.v, 0.0))
    result = solve_wls(pinned)
    assert result.values[3] == 0 and result.values[17] == 0 and result.fixed_zero == 2
    bad = LinearSystem(matrix, np.append(system.b, 5.0), np.append(system.v, 0.0))
    with pytest.raises(ValueError, match="variance 0 is not 0"):
        solve_wls(bad)


def test_variance_modes_choose_released_or_true_variances(small_state):
    plan = load_config("employment").plan
    measurements = measure(small_state, dataclasses.replace(plan, workflow="psi"), rng=np.random.default_rng(8))
    answers = measurements.for_attribute("m1emp")
    exact = {}
    for answer in answers:
        totals = group_establishments(small_state, answer.query.by).sum(small_state["m1emp"].to_numpy())
        exact[answer.query.name] = psi_exact_variance(answer, plan.psi, totals)
    identity, county = answers[0], answers[3]
    assert answer_variances(identity, "estimated", None) is identity.variance
    np.testing.assert_array_equal(answer_variances(identity, "exact", exact), exact["identity"])
    assert answer_variances(identity, "hybrid", exact) is identity.variance
    np.testing.assert_array_equal(answer_variances(county, "hybrid", exact), exact[county.query.name])
    with pytest.raises(ValueError, match="needs the true variances of query identity"):
        answer_variances(identity, "exact", None)
    with pytest.raises(ValueError, match="variance mode 'oracle' is unknown"):
        answer_variances(identity, "oracle", None)


def test_pooled_variances_weigh_each_month_at_the_other_months(small_state):
    """pool_month_variances against a plain per-establishment computation: month m's identity variance is
    the releasable variance at the mean of the other months' identity estimates (floored at 0), so it
    does not move with month m's own answers; other answers and attributes are untouched."""
    plan = load_config("baseline").plan
    answers = {a: measure(small_state, plan, rng=np.random.default_rng(8)).for_attribute(a) for a in plan.attributes}
    pooled = pool_month_variances(answers, plan.psi)
    estimates = {m: next(a for a in answers[m] if a.query.is_identity).estimate for m in ("m1emp", "m2emp", "m3emp")}
    for month in estimates:
        [identity] = [a for a in pooled[month] if a.query.is_identity]
        others = [estimates[o] for o in estimates if o != month]
        at = np.maximum((others[0] + others[1]) / 2, 0.0)
        s = identity.sd
        np.testing.assert_allclose(identity.variance, 2 * s**2 * (2 * at + s**2), rtol=1e-12)  # sqrt, a = 0
        assert not np.allclose(identity.variance, next(a for a in answers[month] if a.query.is_identity).variance)
        assert all(p is a for p, a in zip(pooled[month], answers[month]) if not a.query.is_identity)
    assert pooled["wage"] == answers["wage"]
    # month 1's own answers do not enter its weights
    shifted = {**answers, "m1emp": [dataclasses.replace(a, estimate=a.estimate + 50.0) if a.query.is_identity else a
                                    for a in answers["m1emp"]]}
    np.testing.assert_array_equal(next(a for a in pool_month_variances(shifted, plan.psi)["m1emp"]
                                       if a.query.is_identity).variance,
                                  next(a for a in pooled["m1emp"] if a.query.is_identity).variance)
    only_one = {"m1emp": answers["m1emp"], "wage": answers["wage"]}
    assert pool_month_variances(only_one, plan.psi)["m1emp"] == answers["m1emp"]


@pytest.mark.parametrize("mode", ["smoothed", "pooled"])
def test_month_modes_reach_the_release_and_its_margins(small_state, tmp_path, mode):
    """A release turns the months' identity answers by its variance mode (smoothed, the default, or
    pooled; the manifest says which), and its margins of error are the ones of those answers: tabulate
    --moe equals the covariance of that system. Power: the estimated mode gives other employment."""
    import gedp
    from gedp.postprocess.variances import answers_structure
    from gedp.release.reader import read_release, release_answers

    config = "baseline" if mode == "smoothed" else dict(gedp.load("baseline").raw, variance=mode)
    release = gedp.protect(small_state, config=config, seed=3, not_for_publication=True)
    assert release.manifest["variance_mode"] == mode
    protected, answers = read_release(release.folder)
    weighed = release_answers(release.folder)
    assert weighed["m2emp"] != answers["m2emp"]
    codes = pd.factorize(protected["county"], sort=True)[0]
    # the identity variances shrunk where the bound holds the protected values, as every release's margins
    structure = answers_structure(weighed["m2emp"], protected[public_columns(protected)],
                                  values=protected["m2emp"].to_numpy(dtype=float))
    expected = structure(codes, codes.max() + 1).half_width(1.959963984540054)
    np.testing.assert_allclose(release.tabulate(by=["county"], moe=True)["m2emp_moe"], expected, rtol=1e-9)
    plain = gedp.protect(small_state, config=dict(gedp.load("baseline").raw, variance="estimated"), seed=3,
                         not_for_publication=True)
    assert plain.manifest["variance_mode"] == "estimated"
    assert not np.allclose(plain.microdata["m2emp"], release.microdata["m2emp"])


def test_answers_that_do_not_match_the_public_data_are_refused(small_state):
    measurements = measure(small_state, load_config("employment").plan, rng=np.random.default_rng(9))
    answers = measurements.for_attribute("m1emp")
    with pytest.raises(ValueError, match="do not match the groups of the public data"):
        build_system(answers, small_state.iloc[:-1], [a.variance for a in answers])


# --- the exact structured solver ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_structured_solver_reaches_the_reference_optimum(seed):
    system, cells, _ = nested_instance(seed, zero_share=0.3 + 0.1 * seed)
    structured = solve_structured(system, np.arange(400), cells)
    reference = solve_wls(system, solver="clarabel")
    independent = reference_solution(system)
    assert structured.status == "optimal" and structured.solver == "structured"
    assert structured.objective == pytest.approx(reference.objective, rel=1e-6)
    assert structured.objective <= objective(system, independent) * (1 + 1e-9)
    assert np.sum(structured.values == 0) > 40  # many establishments at the bound
    assert structured.kkt_residual < 1e-6
    # strong convexity (the identity rows): sum (x - x*)^2 / v <= f(x) - f(x*) for any feasible x
    identity_v = system.v[:400]
    for other in (independent, reference.values):
        distance = np.sum((other - structured.values) ** 2 / identity_v)
        assert distance <= objective(system, other) - structured.objective + 1e-9 * structured.objective


@pytest.mark.parametrize("seed", [0, 3])
def test_unbounded_cell_totals_are_the_cell_sums_of_the_dense_least_squares(seed):
    """structured.unbounded_cell_totals against numpy's dense weighted least squares without bounds,
    summed per cell; power: the bounded solution's cell sums differ."""
    system, cells, _ = nested_instance(seed, zero_share=0.6)
    a, v, groups, b, w = structured_parts(system, np.arange(400))
    totals = unbounded_cell_totals(a, v, cells, groups, b, w)
    whitened = 1 / np.sqrt(system.v)
    dense = np.linalg.lstsq((sp.diags(whitened) @ system.matrix).toarray(), whitened * system.b, rcond=None)[0]
    expected = np.bincount(cells, weights=dense)
    np.testing.assert_allclose(totals, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    bounded = np.bincount(cells, weights=solve_structured(system, np.arange(400), cells).values)
    assert np.abs(bounded - expected).max() > 1e-3 * np.abs(expected).max()


def test_structured_solver_with_negative_estimates_everywhere_terminates():
    """Adversarial: most identity answers negative, so most establishments start infeasible."""
    system, cells, _ = nested_instance(11, zero_share=0.9)
    shifted = LinearSystem(system.matrix, system.b - np.where(np.arange(len(system.b)) < 400, 30.0, 0.0), system.v)
    structured = solve_structured(shifted, np.arange(400), cells)
    assert structured.objective == pytest.approx(objective(shifted, reference_solution(shifted)), rel=1e-6)
    assert structured.kkt_residual < 1e-6


def test_auto_uses_the_structured_solver_and_falls_back_to_clarabel_when_it_refuses(small_state, monkeypatch):
    """auto: structured when there is an identity answer, Clarabel without one, and Clarabel when the
    structured solver refuses the system (NotNested). protect_attribute builds its cells from every
    query's columns, so its own groups never split a cell: the refusal is induced here, which is the
    only way to reach the fallback."""
    import gedp.postprocess.wls as wls
    from gedp.postprocess.structured import NotNested

    plan = load_config("baseline").plan
    measurements = measure(small_state, plan, rng=np.random.default_rng(12))
    public = small_state.drop(columns=["m1emp", "m2emp", "m3emp", "wage"])
    answers = measurements.for_attribute("m1emp")
    auto = protect_attribute(answers, public)
    assert auto.solver == "structured" and auto.iterations >= 1
    reference = protect_attribute(answers, public, solver="osqp").objective
    assert auto.objective == pytest.approx(reference, rel=1e-6)
    # without the identity query there is no per-establishment term: cvxpy with Clarabel is used
    assert protect_attribute(answers[1:], public).solver == "clarabel"
    with pytest.raises(ConfigError, match="needs exactly one identity answer per attribute; use solver: auto"):
        protect_attribute(answers[1:], public, solver="structured")

    def refuse(*args, **kwargs):
        raise NotNested("a query group splits a cell; use a generic solver")

    monkeypatch.setattr(wls, "solve_structured", refuse)
    fallback = protect_attribute(answers, public)
    assert fallback.solver == "clarabel" and fallback.objective == pytest.approx(reference, rel=1e-6)
    with pytest.raises(ConfigError, match=r"solver: structured cannot postprocess this plan \(a query group splits a "
                       r"cell; use a generic solver\); use solver: auto"):
        protect_attribute(answers, public, solver="structured")


def test_cell_to_group_matrix_refuses_groups_that_split_cells():
    from gedp.postprocess.structured import NotNested, cell_to_group_matrix

    groups = sp.csr_matrix(np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]]))
    with pytest.raises(NotNested):
        cell_to_group_matrix(groups, np.array([0, 0, 1, 1]), 2)
    nested = cell_to_group_matrix(groups[:1], np.array([0, 0, 1, 1]), 2)
    np.testing.assert_array_equal(nested.toarray(), [[1.0, 0.0]])


def test_structured_solver_pins_zero_variance_groups():
    system, cells, _ = nested_instance(13, n=200)
    n_rows = system.matrix.shape[0]
    last = system.matrix[n_rows - 1]  # a county x naics cell: pin it as an empty clipped sum
    pinned = LinearSystem(system.matrix, np.append(system.b[:-1], 0.0), np.append(system.v[:-1], 0.0))
    result = solve_structured(pinned, np.arange(200), cells)
    assert np.all(result.values[last.indices] == 0) and result.fixed_zero == last.nnz


@pytest.mark.parametrize("mode", ["smoothed", "pooled"])
def test_tiny_states_without_employees_are_protected_cleanly(small_state, mode):
    """A release of 1, 3 or 20 establishments, all without employees or wages, finishes with finite
    values and no numpy warning on stderr (before: the smoothed months' slope fit through one size
    failed in numpy's least squares, and the wage priors, scaled by a state rate of 0, divided by
    zero and stopped on infinite precisions). Power: the same inputs with warnings as errors is how
    both failures showed."""
    import warnings

    import gedp

    config = dict(gedp.load("baseline").raw, variance=mode)
    for n, seed in [(1, 1), (3, 5), (5, 3), (20, 1)]:
        tiny = small_state.sample(n, random_state=seed).copy()
        tiny[["m1emp", "m2emp", "m3emp", "wage"]] = 0
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            released = gedp.protect(tiny, config=config, seed=seed, not_for_publication=True).microdata
        assert np.isfinite(released[["m1emp", "m2emp", "m3emp", "wage"]].to_numpy()).all()


def test_one_blas_thread_is_scoped_and_overlapping_scopes_restore_the_count_found_before():
    """Inside the scope BLAS runs on one thread; scopes that overlap and leave out of order (two threads
    of a dask worker) keep the limit until the last leaves, which restores the original count."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from gedp.postprocess.structured import one_blas_thread

    def blas_threads():
        return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}

    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()  # 2 where a library takes it (a library built for fewer threads keeps its own)
        one_blas_thread.__enter__()  # first worker thread
        one_blas_thread.__enter__()  # second worker thread
        assert set(blas_threads().values()) == {1}
        one_blas_thread.__exit__(None, None, None)  # the first leaves while the second still solves
        assert set(blas_threads().values()) == {1}
        one_blas_thread.__exit__(None, None, None)
        assert blas_threads() == before

        @one_blas_thread
        def solve():
            return set(blas_threads().values())

        assert solve() == {1} and blas_threads() == before
        with pytest.raises(ZeroDivisionError), one_blas_thread:
            1 / 0
        assert blas_threads() == before


def test_one_blas_thread_limits_blas_from_any_thread():
    """threadpoolctl lets only the first thread that set OpenBLAS's count set it again (while it lives); a
    scope entered in another thread after the main thread's (a server's request, a dask worker's thread)
    must still limit BLAS for the whole process, and its end restore the count. Before, it did nothing: a
    solve in the main thread overlapping it skipped its own limit (a scope was open) and ran on every
    thread, with other low bits (the server's answers then differed from gedp tabulate's in the last bits).
    Fails before on any machine where BLAS may use 2 threads."""
    import threading

    from threadpoolctl import threadpool_info, threadpool_limits

    from gedp.postprocess.structured import one_blas_thread

    def blas_threads():
        return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}

    with threadpool_limits(limits=2, user_api="blas"):  # the main thread sets the count first
        before = blas_threads()
        if max(before.values(), default=1) < 2:
            pytest.skip("BLAS runs on one thread here: nothing to limit")
        with one_blas_thread:
            pass
        entered, leave, seen = threading.Event(), threading.Event(), {}

        def request():
            with one_blas_thread:
                seen["request"] = set(blas_threads().values())
                entered.set()
                leave.wait(30)

        worker = threading.Thread(target=request)
        worker.start()
        assert entered.wait(30)
        seen["main"] = set(blas_threads().values())
        with one_blas_thread:  # overlapping: the limit holds here too
            seen["nested"] = set(blas_threads().values())
        leave.set()
        worker.join(30)
        assert seen == {"request": {1}, "main": {1}, "nested": {1}}
        assert blas_threads() == before
