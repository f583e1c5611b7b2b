"""Experiments E1-E4: estimators against dense computations, simulations against closed forms, and
reports that contain every section and plot they name."""

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from gedp.evaluation.e1_employment import LEVELS as E1_LEVELS
from gedp.evaluation.e1_employment import run_e1
from gedp.evaluation.e2_wages import run_e2
from gedp.evaluation.e3_bias import E3Setup, QUERIES, run_e3, simulate, tree_wls
from gedp.evaluation.e4_analytic import estimated_variance, run_e4
from gedp.cli import app
from gedp.config import load_config
from gedp.measure.neighbors import LogPsi, SqrtPsi


def assert_complete_report(folder, sections):
    text = (folder / "report.md").read_text()
    for heading in sections:
        assert f"## {heading}" in text, heading
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images, "no plots"
    for image in images:
        assert (folder / image).stat().st_size > 1_000, image
    assert (folder / "summary.json").is_file()
    return text


def dense_design(counties, per_county):
    n = counties * per_county
    return np.vstack([np.eye(n), np.kron(np.eye(counties), np.ones(per_county)), np.ones(n)])


@pytest.mark.parametrize("counties, per_county", [(1, 1), (4, 3), (7, 2)])
def test_tree_estimator_is_the_weighted_least_squares_solution(counties, per_county):
    rng = np.random.default_rng(counties)
    a = rng.normal(10, 2, (1, counties, per_county))
    v = rng.uniform(0.5, 4, a.shape)
    b = rng.normal(10 * per_county, 2, (1, counties))
    w = rng.uniform(0.5, 4, b.shape)
    total, total_variance = np.array([rng.normal(10 * a.size, 3)]), np.array([2.5])
    x, county, t = tree_wls(a, v, b, w, total, total_variance)
    design = dense_design(counties, per_county)
    weights = 1 / np.sqrt(np.concatenate([v.ravel(), w.ravel(), total_variance]))
    answers = np.concatenate([a.ravel(), b.ravel(), total])
    expected = np.linalg.lstsq(design * weights[:, None], answers * weights, rcond=None)[0]
    np.testing.assert_allclose(x.ravel(), expected, rtol=1e-10)
    np.testing.assert_allclose(county.ravel(), expected.reshape(counties, per_county).sum(1), rtol=1e-10)
    np.testing.assert_allclose(t, expected.sum(), rtol=1e-10)


def test_e3_simulation_matches_closed_forms():
    """Unprocessed MSE = the psi-mechanism variance; exact-variance MSE = the GLS covariance."""
    setup = E3Setup(counties=5, per_county=2, employees=10.0, trials=40_000)
    for psi, gamma in ((SqrtPsi(), setup.gamma_sqrt), (LogPsi(), setup.gamma_log)):
        result = simulate(setup, psi, gamma, np.random.default_rng(5))
        sd = gamma / setup.mu
        sizes = {"identity": 10.0, "county": 20.0, "total": 100.0}
        variances = {q: float(psi.estimate_variance(x, sd)) for q, x in sizes.items()}
        for query in QUERIES:
            assert abs(result["mse"]["unprocessed"][query] - variances[query]) < 4 * result["mse_se"]["unprocessed"][query]
        design = dense_design(5, 2)
        weights = np.concatenate([np.full(10, 1 / variances["identity"]), np.full(5, 1 / variances["county"]),
                                  [1 / variances["total"]]])
        covariance = np.linalg.inv(design.T @ (weights[:, None] * design))
        gls = {"identity": float(np.mean(np.diag(covariance))),
               "county": float(np.mean([covariance[2 * c:2 * c + 2, 2 * c:2 * c + 2].sum() for c in range(5)])),
               "total": float(covariance.sum())}
        for query in QUERIES:
            assert abs(result["mse"]["exact"][query] - gls[query]) < 4 * result["mse_se"]["exact"][query], (psi, query)
            assert abs(result["bias"]["exact"][query]) < 4 * result["bias_se"]["exact"][query]


def test_e3_report_resolves_the_modes(tmp_path):
    summary = run_e3(tmp_path, E3Setup(trials=20_000), seed=2)
    assert set(summary["mse"]) == {"sqrt", "log"}
    for psi in ("sqrt", "log"):
        assert set(summary["mse"][psi]) >= {"estimated", "exact", "hybrid"}
        for mode in ("estimated", "exact", "hybrid"):
            assert set(summary["mse"][psi][mode]) == set(QUERIES)
            assert all(se > 0 for se in summary["mse_se"][psi][mode].values())
        gap = summary["mse"][psi]["estimated"]["total"] - summary["mse"][psi]["exact"]["total"]
        assert gap > 4 * np.hypot(summary["mse_se"][psi]["estimated"]["total"], summary["mse_se"][psi]["exact"]["total"])
        assert summary["bias"][psi]["estimated"]["total"] < -4 * summary["bias_se"][psi]["estimated"]["total"]
    text = assert_complete_report(tmp_path, ["Setup", "Mean squared error and bias, psi = sqrt",
                                             "Mean squared error and bias, psi = log", "Findings"])
    assert "goes against the expectation" in text  # sqrt at 10 employees per establishment


def test_e4_formulas_hold_and_report_says_so(tmp_path):
    summary = run_e4(tmp_path, trials=20_000, seed=3)
    assert summary["all_agree"]
    assert len(summary["cases"]["estimated"]) == 15 and len(summary["cases"]["data_dependent"]) == 15
    assert_complete_report(tmp_path, ["Setup", "Findings"])
    # one measurement: estimated variances cannot hurt (the weight cancels): MSE = sigma^2
    formula, simulated, se = estimated_variance(1, 2.0, 20_000, np.random.default_rng(0))
    assert formula == pytest.approx(1.0) and abs(simulated - 1.0) < 4 * se


def test_e1_report_and_summary(tmp_path, small_state):
    plan = load_config("employment").plan
    summary = run_e1(tmp_path, small_state.drop(columns=["wage"]), plan, replications=2, seed=4, data_label="test")
    assert set(summary["summaries"]) == {"pnc", "psi"}
    assert set(summary["summaries"]["pnc"]) == set(E1_LEVELS)
    state = summary["summaries"]["pnc"]["state total"]
    assert state["groups"] == 2 * 3  # 2 replications x 3 months, one state
    assert state["signed_q1"] <= state["signed_median"] <= state["signed_q3"]
    assert_complete_report(tmp_path, ["Setup", "Signed differences per tabulation", "Findings"])
    assert set(summary["figures"]) == {"e1_scatter_pnc.png", "e1_scatter_psi.png"}


def test_e2_report_and_summary(tmp_path, small_state):
    plans = {"baseline": load_config("baseline").plan, "uniform": load_config("uniform").plan}
    summary = run_e2(tmp_path, small_state, plans, replications=2, seed=5, data_label="test")
    assert set(summary["summary"]) == {"baseline/pnc", "baseline/psi", "uniform/pnc", "uniform/psi"}
    assert len(summary["budget_sweep"]["wage"]) == 4
    assert_complete_report(tmp_path, ["Setup", "Median over groups of the mean absolute error", "Findings"])
    assert len(summary["figures"]) == 4


def test_evaluate_command_validates_and_writes_atomically(tmp_path):
    runner = CliRunner()
    assert runner.invoke(app, ["evaluate", "e7", "--out", str(tmp_path / "x")]).exit_code == 2
    assert runner.invoke(app, ["evaluate", "e3", "--out", str(tmp_path / "y"), "--counties", "0"]).exit_code == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    occupied = tmp_path / "mine"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("keep")
    result = runner.invoke(app, ["evaluate", "e4", "--out", str(occupied), "--trials", "100"])
    assert result.exit_code == 2 and (occupied / "notes.txt").read_text() == "keep"
    done = runner.invoke(app, ["evaluate", "e4", "--out", str(tmp_path / "e4"), "--trials", "2000"])
    assert done.exit_code == 0 and (tmp_path / "e4" / "report.md").is_file()


@pytest.mark.shared_data
def test_e1_on_the_shared_rhode_island_file(tmp_path, shared_data):
    result = CliRunner().invoke(app, ["evaluate", "e1", "--out", str(tmp_path / "e1"),
                                      "--from-qcew", str(shared_data / "qcew_2016q1_44.csv")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "e1" / "report.md").read_text()
    assert "fitted to qcew_2016q1_44.csv" in text and "35,796 establishments" in text
