"""Experiments E1-E4: estimators against dense computations, simulations against closed forms, and
reports that contain every section and plot they name."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.config import load_config
from gedp.evaluation.e1_employment import LEVELS as E1_LEVELS
from gedp.evaluation.e1_employment import run_e1
from gedp.evaluation.e2_wages import run_e2
from gedp.evaluation.e3_bias import QUERIES, E3Setup, run_e3, simulate, tree_wls
from gedp.evaluation.e4_analytic import estimated_variance, run_e4
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
            assert (
                abs(result["mse"]["unprocessed"][query] - variances[query]) < 4 * result["mse_se"]["unprocessed"][query]
            )
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
        assert gap > 4 * np.hypot(
            summary["mse_se"][psi]["estimated"]["total"], summary["mse_se"][psi]["exact"]["total"]
        )
        assert summary["bias"][psi]["estimated"]["total"] < -4 * summary["bias_se"][psi]["estimated"]["total"]
        # pooled variances (at the mean of each query's answers): the estimated-variance bias mostly gone, the
        # MSE within 2% of exact variances (4 SE bounds: false failure < 1e-4 per check)
        pooled, estimated = summary["bias"][psi]["pooled"]["total"], summary["bias"][psi]["estimated"]["total"]
        assert abs(pooled) < 0.1 * abs(estimated) + 4 * summary["bias_se"][psi]["pooled"]["total"]
        exact_mse = summary["mse"][psi]["exact"]["total"]
        assert abs(summary["mse"][psi]["pooled"]["total"] - exact_mse) < 0.02 * exact_mse + 4 * np.hypot(
            summary["mse_se"][psi]["pooled"]["total"], summary["mse_se"][psi]["exact"]["total"])
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


def test_experiments_compute_without_writing_and_render_from_the_result(tmp_path, monkeypatch):
    """The registry's two steps are separate: compute writes nothing, render only formats its result
    (the same result rendered twice gives the same summary, and nothing is simulated again)."""
    from gedp.evaluation import e4_analytic
    from gedp.evaluation.experiments import ExperimentRequest, experiment

    monkeypatch.chdir(tmp_path)
    e4 = experiment("e4")
    result = e4.compute(ExperimentRequest(trials=2_000, seed=3))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(e4_analytic, "known_variance", lambda *a: pytest.fail("render simulated again"))
    first, second = e4.render(result, tmp_path / "a"), e4.render(result, tmp_path / "b")
    assert first == second and first["cases"] == result.rows and first["all_agree"]
    assert (tmp_path / "a" / "summary.json").read_text() == (tmp_path / "b" / "summary.json").read_text()


def test_experiment_requests_are_checked(small_state, tmp_path):
    from gedp.errors import InputError
    from gedp.evaluation.experiments import ExperimentRequest, experiment

    with pytest.raises(InputError, match="e2 compares the shipped baseline and uniform plans; it takes no --config"):
        experiment("e2").compute(ExperimentRequest(truth=small_state, config="employment"))
    wages_only = tmp_path / "wages.yaml"
    wages_only.write_text("workflow: pnc\npsi: {name: sqrt, a: 0}\nzeta: 0.01\nattributes:\n  wage: {gamma: 50}\n"
                          "queries:\n  - by: identity\n    mu: {wage: 0.5}\n")
    with pytest.raises(InputError, match="e5 compares on m1emp; the plan of --config does not measure it"):
        experiment("e5").compute(ExperimentRequest(truth=small_state, config=str(wages_only)))
    with pytest.raises(InputError, match="needs microdata"):
        experiment("coverage").compute(ExperimentRequest())


def recorded_releases(monkeypatch, module):
    """Wrap ``module.protected_copy``: the experiment runs unchanged and the test sees every
    protected copy it made, with the plan it was made under (in call order)."""
    made = []
    real = module.protected_copy

    def recording(truth, plan, *, rng):
        protected = real(truth, plan, rng=rng)
        made.append((plan, protected))
        return protected

    monkeypatch.setattr(module, "protected_copy", recording)
    return made


def group_totals(frame, by, attribute):
    """Group totals by plain pandas (not gedp's tabulate); the total when ``by`` is empty."""
    return frame.groupby(list(by), observed=True)[attribute].sum() if by else pd.Series([frame[attribute].sum()])


def differences(truth, protected, by, attribute):
    """protected - true per group, both tabulated independently of the code under test."""
    true = group_totals(truth, by, attribute)
    return group_totals(protected, by, attribute).reindex(true.index, fill_value=0.0) - true, true


def test_e1_summaries_are_the_pooled_signed_differences(tmp_path, small_state, monkeypatch):
    """Every number of the E1 summary against quartiles and means recomputed from the releases E1
    made, by plain pandas and numpy."""
    import gedp.evaluation.e1_employment as e1

    made = recorded_releases(monkeypatch, e1)
    plan = load_config("employment").plan
    truth = small_state.drop(columns=["wage"])
    summary = run_e1(tmp_path, truth, plan, replications=2, seed=4, data_label="test")
    assert [p.workflow for p, _ in made] == ["pnc", "pnc", "psi", "psi"]
    assert set(summary["summaries"]) == {"pnc", "psi"}
    for workflow in ("pnc", "psi"):
        releases = [protected for p, protected in made if p.workflow == workflow]
        assert set(summary["summaries"][workflow]) == set(E1_LEVELS)
        for level, by in E1_LEVELS.items():
            signed = np.concatenate([differences(truth, protected, by, a)[0].to_numpy()
                                     for protected in releases for a in ("m1emp", "m2emp", "m3emp")])
            got = summary["summaries"][workflow][level]
            assert got["groups"] == signed.size
            np.testing.assert_allclose([got["signed_q1"], got["signed_median"], got["signed_q3"]],
                                       np.percentile(signed, [25, 50, 75]), rtol=1e-9, atol=1e-9)
            assert got["signed_mean"] == pytest.approx(signed.mean(), rel=1e-9, abs=1e-9)
            assert got["mean_absolute"] == pytest.approx(np.abs(signed).mean(), rel=1e-9)
    assert summary["summaries"]["pnc"]["state total"]["groups"] == 2 * 3  # 2 replications x 3 months, one state
    assert summary["mu_total"] == pytest.approx(2.28, abs=0.005)  # SPEC section 6: total mu ~ 2.28
    assert_complete_report(tmp_path, ["Setup", "Signed differences per tabulation", "Findings"])
    assert set(summary["figures"]) == {"e1_scatter_pnc.png", "e1_scatter_psi.png"}


@pytest.mark.slow
def test_e2_summary_is_the_replication_average_of_group_errors(tmp_path, small_state, monkeypatch):
    """Every number of the E2 summary and budget sweep against errors recomputed from the releases
    E2 made, by plain pandas and numpy."""
    import gedp.evaluation.e2_wages as e2

    made = recorded_releases(monkeypatch, e2)
    plans = {"baseline": load_config("baseline").plan, "uniform": load_config("uniform").plan}
    summary = run_e2(tmp_path, small_state, plans, replications=2, seed=5, data_label="test")
    combos = [f"{name}/{workflow}" for name in plans for workflow in ("pnc", "psi")]
    assert set(summary["summary"]) == set(combos)
    releases = [protected for _, protected in made]
    assert len(releases) == 4 * 2 + len(e2.BUDGET_FACTORS) * 2
    detail = ["state", "county", "naics5"]
    for index, combo in enumerate(combos):
        copies = releases[2 * index:2 * index + 2]
        for attribute in ("m1emp", "wage"):
            got = summary["summary"][combo][attribute]
            for level, by in e2.LEVELS.items():
                mean_error = np.mean(
                    [np.abs(differences(small_state, p, by, attribute)[0]).to_numpy() for p in copies], 0
                )
                assert got["median_group_mean_absolute_error"][level] == pytest.approx(np.median(mean_error), rel=1e-9)
            state = [abs(float(differences(small_state, p, ["state"], attribute)[0].sum())) for p in copies]
            assert got["state_total_mean_absolute_error"] == pytest.approx(np.mean(state), rel=1e-9)
            relative = []
            for p in copies:
                signed, true = differences(small_state, p, detail, attribute)
                relative.append((np.abs(signed) / (true + 1)).to_numpy())
            assert got["median_relative_error_county_naics5"] == pytest.approx(
                np.median(np.mean(relative, 0)), rel=1e-9
            )
    sweep_plans = [plan for plan, _ in made[8:]]
    for attribute in ("m1emp", "wage"):
        points = summary["budget_sweep"][attribute]
        assert len(points) == len(e2.BUDGET_FACTORS)
        for k, (total, value) in enumerate(points.items()):
            pair = releases[8 + 2 * k:8 + 2 * k + 2]
            assert {f"{p.budget().total:.4f}" for p in sweep_plans[2 * k:2 * k + 2]} == {total}
            medians = []
            for p in pair:
                signed, true = differences(small_state, p, detail, attribute)
                medians.append(np.median(np.abs(signed) / (true + 1)))
            assert value == pytest.approx(np.mean(medians), rel=1e-9)
    # the sweep scales the first plan's total (SPEC: ~2.31) by 0.5, 1, 2 and 4
    np.testing.assert_allclose([float(t) for t in summary["budget_sweep"]["wage"]],
                               2.31 * np.array(e2.BUDGET_FACTORS), rtol=0.005 / 2.31)
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


def test_docs_experiment_example_runs(tmp_path, monkeypatch):
    """The docs' Python example of the registry (evaluation/accuracy.md), run as written."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "evaluation" / "accuracy.md").read_text()
    block = text.split("every experiment is a compute step", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["summary"]["all_agree"] and set(namespace["result"].rows) == {"known", "estimated",
                                                                                  "data_dependent"}
    assert {"report.md", "summary.json", "e4_cases.png"} <= {p.name for p in (tmp_path / "e4-report").iterdir()}


def marked_files(folder: Path) -> list[str]:
    """The files of a report folder other than report.md and summary.json."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in ("report.md", "summary.json"))


def test_evaluation_on_real_data_is_marked_confidential(tmp_path, small_state):
    """Before: gedp evaluate --data REAL wrote true values (scatter plots of true totals, errors by true
    size) under plain names. Every report folder (the comparison's plan/ and baseline/ too) is marked."""
    import json

    source = tmp_path / "real.parquet"
    small_state.head(600).to_parquet(source)
    out = tmp_path / "accuracy"
    result = CliRunner().invoke(app, ["evaluate", "accuracy", "--data", str(source), "--config", "employment",
                                      "--replications", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "CONFIDENTIAL" in result.output
    for folder in (out, out / "plan", out / "baseline"):
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["confidential"] is True, folder
        names = marked_files(folder)
        assert all(name.startswith("CONFIDENTIAL-") for name in names), names
        assert names or folder == out  # the side-by-side report has no plots; each run's report has
        assert summary["figures"] == [name for name in summary["figures"] if name in names]
        lines = (folder / "report.md").read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("> **CONFIDENTIAL: not for publication.**")
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", "\n".join(lines)):
            assert image.startswith("CONFIDENTIAL-") and (folder / image).is_file(), image


def test_evaluation_on_synthetic_data_is_not_marked(tmp_path):
    import json

    out = tmp_path / "e4"
    result = CliRunner().invoke(app, ["evaluate", "e4", "--trials", "2000", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["confidential"] is False and "CONFIDENTIAL" not in result.output
    assert marked_files(out) == sorted(summary["figures"]) and not any("CONFIDENTIAL" in f for f in summary["figures"])
    assert "CONFIDENTIAL" not in (out / "report.md").read_text()


@pytest.mark.parametrize("real", [True, False])
def test_suppression_on_real_data_is_marked_confidential(tmp_path, small_state, real):
    """gedp suppress names every file of a run on real data CONFIDENTIAL-..., and can replace it."""
    import json

    source = tmp_path / "real.parquet"
    small_state.head(400).to_parquet(source)
    data = ["--data", str(source)] if real else ["--profile", "small"]
    for _ in range(2):  # the second run replaces the first
        result = CliRunner().invoke(app, ["suppress", *data, "--no-audit", "--out", str(tmp_path / "supp")])
        assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "supp" / "summary.json").read_text())
    names = marked_files(tmp_path / "supp")
    assert summary["confidential"] is real and len(names) == 3  # cells, shares and the plot (no audit)
    assert all(name.startswith("CONFIDENTIAL-") == real for name in names), names
    assert ("CONFIDENTIAL: not for publication" in (tmp_path / "supp" / "report.md").read_text()) is real
