"""Margins of error: against dense covariance, measured cells, precision bound, coverage, CLI."""

import io

import numpy as np
import pandas as pd
import pytest
from test_postprocess import nested_instance
from typer.testing import CliRunner

from gedp.cli import app
from gedp.config import load_config
from gedp.evaluation.coverage import run_coverage
from gedp.measure.queries import group_establishments
from gedp.measure.workflows import MeasurementPlan, QueryPlan, measure
from gedp.postprocess import structured
from gedp.postprocess.tabulate import tabulate
from gedp.postprocess.variances import CellVariances, answers_variances, tabulation_variances
from gedp.postprocess.wls import LinearSystem

runner = CliRunner()


def dense_variances(system, codes, n_groups):
    """c' (A' W A)^+ c by a dense pseudo-inverse: the independent reference."""
    matrix = system.matrix.toarray()
    covariance = np.linalg.pinv(matrix.T @ (matrix / system.v[:, None]))
    return np.array([covariance[np.ix_(codes == k, codes == k)].sum() for k in range(n_groups)])


@pytest.mark.parametrize("by", [("county",), ("naics",), ("county", "naics"), (), ("estab_id",)])
def test_variances_equal_the_dense_covariance(by):
    system, cells, public = nested_instance(3, n=120)
    grouping = group_establishments(public, by)
    variances = tabulation_variances(system, np.arange(120), cells, grouping.codes, grouping.n_groups).variance
    np.testing.assert_allclose(variances, dense_variances(system, grouping.codes, grouping.n_groups), rtol=1e-9)


@pytest.mark.parametrize("dense_groups, form_entries", [(structured.DENSE_GROUPS, structured.FORM_ENTRIES),
                                                       (0, structured.FORM_ENTRIES), (structured.DENSE_GROUPS, 1)])
@pytest.mark.parametrize("queries", [(("estab_id",), (), ("county",), ("naics",), ("county", "naics")),
                                     (("estab_id",), ("county",), ("county", "naics")),
                                     (("county",), ("county", "naics"))])
def test_variances_by_blocks_of_groups_equal_the_dense_covariance(monkeypatch, queries, dense_groups, form_entries):
    """Several diagonal blocks of G (county groups only: one per county), the sparse LU path and
    one tabulation cell per step all give the dense covariance's variances."""
    monkeypatch.setattr(structured, "DENSE_GROUPS", dense_groups)
    monkeypatch.setattr(structured, "FORM_ENTRIES", form_entries)
    system, cells, public = nested_instance(6, n=150, queries=queries)
    identity = np.arange(150) if queries[0] == ("estab_id",) else None
    for by in (("county",), ("county", "naics"), ()):
        grouping = group_establishments(public, by)
        variances = tabulation_variances(system, identity, cells, grouping.codes, grouping.n_groups).variance
        np.testing.assert_allclose(variances, dense_variances(system, grouping.codes, grouping.n_groups), rtol=1e-9)


def test_margins_are_the_score_intervals_half_width():
    """Identity answers only: Var(T) = sum v_j, rho = 1, so the slope is sum v_j s_j / sum v_j, and
    the margin is half the length of the score interval {d : d^2 <= z^2 (Var + g d)}, found here by
    root finding. With the nested queries, the slope is rho^2 times that mean, rho = Var(T) / sum v_j
    from the dense covariance. Slopes None give z sqrt(Var)."""
    from scipy.optimize import brentq

    system, cells, public = nested_instance(3, n=120)
    slopes = np.random.default_rng(5).uniform(0, 3, 120)
    identity_only = LinearSystem(system.matrix[:120], system.b[:120], system.v[:120])
    grouping = group_establishments(public, ("county", "naics"))
    mean_slope = (np.bincount(grouping.codes, system.v[:120] * slopes) / np.bincount(grouping.codes, system.v[:120]))
    alone = tabulation_variances(identity_only, np.arange(120), cells, grouping.codes, grouping.n_groups,
                                 variance_slopes=slopes)
    np.testing.assert_allclose(alone.slope, mean_slope, rtol=1e-12)
    z = 1.959963984540054
    for variance, slope, margin in zip(alone.variance, alone.slope, alone.half_width(z)):
        gap = lambda d, v=variance, g=slope: d * d - z * z * (v + g * d)  # noqa: E731
        low, high = brentq(gap, -1e6, 0.0), brentq(gap, 0.0, 1e6)
        np.testing.assert_allclose(margin, (high - low) / 2, rtol=1e-9)
    assert np.all(alone.half_width(z) > z * np.sqrt(alone.variance))
    nested = tabulation_variances(system, np.arange(120), cells, grouping.codes, grouping.n_groups,
                                  variance_slopes=slopes)
    rho = dense_variances(system, grouping.codes, grouping.n_groups) / np.bincount(grouping.codes, system.v[:120])
    np.testing.assert_allclose(nested.slope, rho**2 * mean_slope, rtol=1e-9)
    assert np.all(rho < 1)
    plain = tabulation_variances(system, np.arange(120), cells, grouping.codes, grouping.n_groups)
    np.testing.assert_array_equal(plain.half_width(z), z * np.sqrt(plain.variance))


def test_without_identity_only_unions_of_measured_cells_are_estimable():
    system, cells, public = nested_instance(4, n=120)
    rows = np.arange(120, system.matrix.shape[0])
    groups_only = LinearSystem(system.matrix[rows], system.b[rows], system.v[rows])
    for by in (("county",), ("county", "naics")):
        grouping = group_establishments(public, by)
        variances = tabulation_variances(groups_only, None, cells, grouping.codes, grouping.n_groups).variance
        np.testing.assert_allclose(
            variances, dense_variances(groups_only, grouping.codes, grouping.n_groups), rtol=1e-9
        )
    single = group_establishments(public, ("estab_id",))
    variances = tabulation_variances(groups_only, None, cells, single.codes, single.n_groups).variance
    alone = np.bincount(cells)[cells] == 1
    assert np.all(np.isnan(variances[~alone])) and np.all(np.isfinite(variances[alone]))


def test_a_measured_cell_that_no_other_query_overlaps_has_its_measured_variance(small_state):
    plan = MeasurementPlan(psi=load_config("baseline").plan.psi, gammas={"m1emp": 0.5},
                           queries=(QueryPlan(("state", "county"), {"m1emp": 0.8}),), workflow="psi")
    answer = measure(small_state, plan, rng=np.random.default_rng(1)).answers[0]
    grouping = group_establishments(small_state, ("state", "county"))
    variances = answers_variances([answer], small_state, grouping.codes, grouping.n_groups).variance
    np.testing.assert_allclose(variances, answer.variance, rtol=1e-12)


def test_tabulations_of_pnc_measured_cells_are_at_least_as_precise(small_state):
    measurements = measure(small_state, load_config("baseline").plan, rng=np.random.default_rng(2))
    for attribute in ("m1emp", "wage"):
        answers = measurements.for_attribute(attribute)
        for answer in answers[1:]:
            grouping = group_establishments(small_state, answer.query.by)
            variances = answers_variances(answers, small_state, grouping.codes, grouping.n_groups).variance
            assert answer.mechanism == "pnc"
            assert np.all(variances <= answer.variance * (1 + 1e-9)), answer.query.name
            assert np.all(variances > 0)


def scaled(cell_variances, factor):
    return CellVariances(factor * cell_variances.variance, cell_variances.slope)


def coverage_deviations(summary):
    """(level, band, z) for the 95% intervals of cells with 100+ employees: z = (coverage - 0.95) / SE."""
    out = []
    for level in ("county x NAICS-5 (measured)", "county x NAICS-6 (not measured)"):
        for band in ("[100, 1k)", "[1k, inf)"):
            cell = summary["coverage"]["m1emp"][level][band]
            out.append((level, band, (cell["coverage_95"] - 0.95) / np.sqrt(0.95 * 0.05 / cell["cells"])))
    return out


def kept_releases(monkeypatch, coverage) -> None:
    """``compute_coverage``'s releases and their variance functions kept by their random stream's
    state: a release (``measure``, ``protect_microdata``) and its cells' variances are functions of its
    stream, its truth and its cells only, so a run over streams another run drew already (the same
    seed, as many or fewer replications) reads them back, bit for bit, instead of computing them again.
    What a run does with the variances (``scaled`` below) still applies to what is read back."""
    import hashlib
    import json

    measure, protect, variance_function = coverage.measure, coverage.protect_microdata, coverage.variance_function
    kept: dict = {}

    def keep(key, compute):
        if key not in kept:
            kept[key] = compute()
        return kept[key]

    def kept_measure(truth, plan, *, rng):
        state = json.dumps(rng.bit_generator.state, sort_keys=True)
        return keep(("measure", id(truth), id(plan), state), lambda: measure(truth, plan, rng=rng))

    def kept_protect(answers, public, options):
        key = ("protect", *(id(a) for attribute in sorted(answers) for a in answers[attribute]),
               int(pd.util.hash_pandas_object(public).sum()), repr(options))
        return keep(key, lambda: protect(answers, public, options))

    def kept_variance_function(attribute, answers, protected, psi):
        real = keep(("variances", attribute, id(protected)), lambda: variance_function(attribute, answers,
                                                                                       protected, psi))

        def cells(codes, n_groups):
            digest = hashlib.sha256(np.ascontiguousarray(codes).tobytes()).hexdigest()
            return keep(("cells", attribute, id(protected), digest, n_groups), lambda: real(codes, n_groups))

        return cells

    monkeypatch.setattr(coverage, "measure", kept_measure)
    monkeypatch.setattr(coverage, "protect_microdata", kept_protect)
    monkeypatch.setattr(coverage, "variance_function", kept_variance_function)


@pytest.mark.slow
def test_coverage_of_large_cells_is_nominal_and_a_wrong_variance_is_caught(tmp_path, monkeypatch):
    """95% intervals of cells with 100+ employees cover within 4 binomial SE of 0.95 (cells of one
    release share noise, so the SE is a guide; 8 releases of the small profile). Power: the same
    check rejects margins from variances x0.7 and x1.3 (4 releases each; coverage moves to about
    0.90 and 0.975, 5 to 15 SE away). The power runs' releases (seed 3, 4 streams) are the first 4 of
    the 8 (``kept_releases``: computed once, the same bits)."""
    import gedp.evaluation.coverage as coverage
    from gedp.synth.profiles import generate_profile, load_profile

    kept_releases(monkeypatch, coverage)
    truth = generate_profile(load_profile("small"), rng=np.random.default_rng(2016))
    plan = load_config("baseline").plan
    summary = run_coverage(tmp_path / "right", truth, plan, replications=8, seed=3, data_label="test")
    for level, band, z in coverage_deviations(summary):
        assert abs(z) < 4, (level, band, z)
    assert (tmp_path / "right" / "coverage.png").is_file() and "## Findings" in (
        tmp_path / "right" / "report.md"
    ).read_text()
    real = coverage.variance_function
    for factor in (0.7, 1.3):
        monkeypatch.setattr(coverage, "variance_function",
                            lambda *a, f=factor, **k: lambda *t, g=real(*a, **k): scaled(g(*t), f))
        wrong = run_coverage(tmp_path / f"x{factor}", truth, plan, replications=4, seed=3, data_label="test")
        assert max(abs(z) for _, _, z in coverage_deviations(wrong)) > 4, factor


@pytest.fixture
def release(small_release):
    return small_release[0]


def test_tabulate_with_margins_of_error(release, tmp_path):
    out = tmp_path / "t.csv"
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county,naics3", "--moe", "--level", "0.9",
                                 "--where", "domain == '102'", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out, dtype={"county": str, "naics3": str})
    assert {"m1emp_moe", "wage_moe"} <= set(table.columns) and (table["m1emp_moe"] > 0).all()
    assert not table["naics3"].str.startswith(("23", "31", "32", "33", "11", "21")).any()
    wider = runner.invoke(app, ["tabulate", str(release), "--by", "county,naics3", "--moe", "--level", "0.99",
                                "--where", "domain == '102'", "--out", str(tmp_path / "w.csv")])
    assert wider.exit_code == 0
    wide = pd.read_csv(tmp_path / "w.csv")
    # z sqrt(Var + (z g / 2)^2): wages (slope 0) scale with z; smoothed months' margins faster
    np.testing.assert_allclose(wide["wage_moe"] / table["wage_moe"], 2.5758293 / 1.6448536, rtol=1e-6)
    ratio = wide["m1emp_moe"] / table["m1emp_moe"]
    assert np.all(ratio > 2.5758293 / 1.6448536 * (1 - 1e-9)) and np.any(ratio > 1.01 * 2.5758293 / 1.6448536)
    qcew = runner.invoke(app, ["tabulate", str(release), "--agglvl", "75", "--moe", "--format", "qcew",
                               "--out", str(tmp_path / "q.csv")])
    assert qcew.exit_code == 0 and "month1_emplvl_moe" in pd.read_csv(tmp_path / "q.csv").columns


@pytest.mark.parametrize("arguments, message", [
    (["--moe", "--level", "1.5"], "--level (1.5) must be a confidence level from 0.5 to below 1"),
    (["--moe", "--level", "1e-300"], "--level (1e-300) must be a confidence level from 0.5 to below 1"),
    (["--moe", "--level", "0.49"], "--level (0.49) must be a confidence level from 0.5 to below 1"),
    (["--format", "qcew"], "--format qcew needs --agglvl"),
    (["--where", "zipcode == 3"], "where 'zipcode == 3': 'zipcode' is not a column"),
    (["--where", "sector == 'nope'"], "no establishments to tabulate match"),
])
def test_tabulate_refuses_bad_requests(release, arguments, message):
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", *arguments])
    assert result.exit_code == 2 and message in result.output, result.output


def test_margins_need_a_release(release, tmp_path):
    result = runner.invoke(app, ["tabulate", str(release / "protected.parquet"), "--by", "county", "--moe"])
    assert result.exit_code == 2 and "--moe needs a release directory" in result.output


# --- the tabulate command as a new user meets it (issue 15) -------------------------------------------

def test_tabulate_pipes_csv_when_stdout_is_not_a_terminal(release):
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county,naics3"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(io.StringIO(result.stdout), dtype={"state": str, "county": str, "naics3": str})
    expected = tabulate(pd.read_parquet(release / "protected.parquet"), ["county", "naics3"])
    assert len(table) == len(expected) > 25 and list(table.columns[:3]) == ["state", "county", "naics3"]
    np.testing.assert_allclose(table["wage"], expected["wage"])
    assert f"{len(expected):,} rows written as CSV to standard output" in result.stderr


@pytest.mark.parametrize("arguments, message", [
    (["--by", "m1emp"], "cannot tabulate by m1emp: confidential attributes are summed, not grouped by; "
                        "group by public columns (estab_id, state, county"),
    (["--agglvl", "74", "--by", "county"], "give --by or --agglvl, not both"),
    (["--by", "county", "--out", "{tmp}"], "--out '{tmp}' is a folder; give a file name, e.g. {tmp}/tabulation.csv"),
    (["--by", "county", "--out", "{tmp}/table"],
     "--out '{tmp}/table': the name does not tell the format; end it in .csv, .parquet or .xlsx, or give --format "
     "(csv, parquet, qcew, xlsx)"),
])
def test_tabulate_refuses_unclear_requests_in_one_line(release, tmp_path, arguments, message):
    arguments = [a.format(tmp=tmp_path) for a in arguments]
    result = runner.invoke(app, ["tabulate", str(release), *arguments])
    lines = result.output.splitlines()
    assert (
        result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message.format(tmp=tmp_path)}")
    ), result.output
    assert list(tmp_path.iterdir()) == []


def test_selecting_on_protected_values_warns_about_the_margins(release, tmp_path):
    out = tmp_path / "t.csv"
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--where", "m1emp > 10", "--moe",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: where selects on protected values (m1emp): the margins of error treat "
                                    "the selection as fixed, as for a selection on public columns only\n")
    public = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--where", "sector == '23'", "--moe",
                                 "--out", str(out)])
    assert public.exit_code == 0 and "warning" not in public.output


def test_one_row_is_one_row(release, tmp_path):
    result = runner.invoke(app, ["tabulate", str(release), "--by", "total", "--out", str(tmp_path / "t.csv")])
    assert result.exit_code == 0 and f"1 row written to {tmp_path / 't.csv'}" in " ".join(result.output.split())


def test_errors_shared_within_cells_are_the_dense_covariance():
    """Identity answers only (the estimate of T is the sum of T's answers): with errors of sd a_j
    shared by the answers of one pattern cell (covariance a_i a_j), Var(T) is 1_T' Sigma 1_T of the
    dense covariance Sigma = diag(v) + those covariances, for cells that cut across pattern cells;
    no loadings (or one establishment per pattern cell) add nothing. With group answers the shared
    part is scaled by rho^2 (rho = Var(T) / sum v_j, the identity answers' share of T^)."""
    system, cells, public = nested_instance(3, n=120)
    identity_only = LinearSystem(system.matrix[:120], system.b[:120], system.v[:120])
    loading = np.random.default_rng(6).uniform(0, 3, 120)
    pattern = group_establishments(public, ("county", "naics")).codes
    shared = np.outer(loading, loading) * (pattern[:, None] == pattern[None, :])
    covariance = np.diag(system.v[:120]) + shared - np.diag(np.diag(shared))
    for by in (("county", "naics"), ("county",), ("naics",), ()):
        grouping = group_establishments(public, by)
        stated = tabulation_variances(identity_only, np.arange(120), cells, grouping.codes, grouping.n_groups,
                                      pattern_loadings=loading, pattern_cells=pattern).variance
        dense = np.array([covariance[np.ix_(grouping.codes == k, grouping.codes == k)].sum()
                          for k in range(grouping.n_groups)])
        np.testing.assert_allclose(stated, dense, rtol=1e-12)
        plain = tabulation_variances(system, np.arange(120), cells, grouping.codes, grouping.n_groups)
        nested = tabulation_variances(system, np.arange(120), cells, grouping.codes, grouping.n_groups,
                                      pattern_loadings=loading, pattern_cells=pattern)
        rho = plain.variance / np.bincount(grouping.codes, system.v[:120])
        together = dense - np.bincount(grouping.codes, system.v[:120])
        np.testing.assert_allclose(nested.variance - plain.variance, rho**2 * together, rtol=1e-9, atol=1e-12)
    alone = np.arange(120)  # every establishment its own pattern cell: nothing shared
    grouping = group_establishments(public, ("county",))
    np.testing.assert_array_equal(
        tabulation_variances(identity_only, np.arange(120), cells, grouping.codes, grouping.n_groups,
                             pattern_loadings=loading, pattern_cells=alone).variance,
        tabulation_variances(identity_only, np.arange(120), cells, grouping.codes, grouping.n_groups).variance)


def test_a_margin_solve_that_does_not_finish_is_one_solver_error_line(release, monkeypatch, unresolved):
    """Block principal pivoting that does not finish (its iteration cap set to 0 here; a hostile
    release's answers far past any real one did it at 10,000) is a solver error: one line, exit 1, not
    a RuntimeError's traceback (the margins' solve: the readers' re-solve, which meets it first, is off
    here; test_resolved_check holds its line)."""
    monkeypatch.setattr(structured, "MAX_ITERATIONS", 0)
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--moe"])
    assert result.exit_code == 1, result.output
    said = result.output.strip().splitlines()
    assert said == ["solver error: block principal pivoting did not finish in 0 iterations"], result.output
