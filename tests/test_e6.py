"""E6 (evaluation/e6_jobs.py): the grid per workload against the mechanisms' own checks, the workloads'
true cells and place sizes against pandas tabulations of the job table, the accumulated L1 error
against its closed form, the findings' verdict rules, and the command line.

The closed-form check compares the summed mean absolute error with its expectation in units of its
exact standard error (|z| <= 5: false-failure rate 5.7e-7), with a power check that the same
statistic rejects the sensitivity of the other privacy notion.

gedp rows: the budget match against the closed form of the mu-GDP to (eps, delta) conversion and the
release's own ledger, the alpha-neighbor step counts against the combined psi's closed form by brute
force, and a gedp row's errors against a release made by `gedp protect` with the same seed and config,
tabulated from its files with pandas (power: another seed's release is told apart).
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from gedp import configs
from gedp.cli import app
from gedp.evaluation.baselines.earlier import check_log_laplace, check_smooth_gamma, check_smooth_laplace, is_valid
from gedp.evaluation.e5_earlier import STRATA, E5Setup, ErrorAccumulator, Setting, settings
from gedp.evaluation.e6_jobs import (
    _trend_verdict,
    _verdict,
    cell_eps,
    compute_e6,
    gedp_config,
    gedp_findings,
    gedp_seeds,
    l1_ratios,
    shape_steps,
    workload_grid,
)
from gedp.measure.conversions import gdp_epsilon, gdp_mu
from gedp.measure.neighbors import make_psi
from gedp.synth.io import write_microdata
from gedp.synth.jobs import synthesize_jobs

WORKPLACE = ["state", "county", "sector", "own"]
SMALL_GRID = E5Setup(eps=(2.0, 4.0), alphas=(0.01, 0.1), thetas=(100.0,))
GEDP_GRID = E5Setup(eps=(0.5, 4.0), alphas=(0.1,), thetas=(100.0,))
runner = CliRunner()


def phi(z):
    """Standard normal CDF, from the error function (independent of scipy's)."""
    return 0.5 * math.erfc(-z / math.sqrt(2))


def gdp_delta_closed_form(eps, mu):
    """Dong, Roth & Su (2022), Corollary 2.13."""
    return phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2)


def combined_psi(x, gamma_sqrt=0.5, d=1.0):
    """SPEC section 3's closed form of the sqrt-linear psi*."""
    knot = d**2 / (4 * gamma_sqrt**2)
    return x / d if x <= knot else math.sqrt(x) / gamma_sqrt - d / (4 * gamma_sqrt**2)


@pytest.fixture(scope="module")
def jobs(small_state):
    return synthesize_jobs(small_state, rng=np.random.default_rng(5))


@pytest.fixture(scope="module")
def result(small_state, jobs):
    return compute_e6(small_state, jobs, SMALL_GRID, replications=12, seed=3, data_label="test")


@pytest.fixture(scope="module")
def gedp_result(small_state, jobs):
    return compute_e6(small_state, jobs, GEDP_GRID, replications=2, seed=4, data_label="test", gedp_replications=1)


def test_workload_3_divides_eps_over_its_worker_cells_and_keeps_the_valid_pairs():
    setup = E5Setup()
    grid = workload_grid(setup, 10)
    assert grid["workload 1"] == grid["workload 2"] == settings(setup)
    checks = {"log-laplace": lambda e, a: is_valid(check_log_laplace, e, a),
              "smooth-laplace": lambda e, a: is_valid(check_smooth_laplace, e, a, setup.delta),
              "smooth-gamma": lambda e, a: is_valid(check_smooth_gamma, e, a)}
    expected = {Setting(m, e, alpha=a) for m, check in checks.items() for e in setup.eps for a in setup.alphas
                if check(e / 10, a)}
    alpha_settings = {s for s in grid["workload 3"] if s.alpha is not None}
    assert alpha_settings == expected and 0 < len(expected) < len([s for s in grid["workload 1"] if s.alpha])
    assert [s for s in grid["workload 3"] if s.alpha is None] == [s for s in settings(setup) if s.alpha is None]
    log_laplace = Setting("log-laplace", 4.0, alpha=0.01)
    assert cell_eps("workload 3", log_laplace, 10) == pytest.approx(0.4)
    assert cell_eps("workload 2", log_laplace, 10) == 4.0
    assert cell_eps("workload 3", Setting("truncated-laplace", 4.0, theta=100.0), 10) == 4.0


def test_error_accumulator_strata_by_place_size():
    truth = {"a": np.array([5.0, 7.0, 9.0, 50.0, 60.0, 70.0])}
    sizes = {"a": np.array([50_000.0, 50_000.0, 50_000.0, 500.0, 500.0, 500.0])}
    accumulator = ErrorAccumulator(truth, sizes)
    accumulator.add({"a": np.array([6.0, 8.0, 10.0, 70.0, 60.0, 50.0])})  # ordered / reversed within strata
    l1 = accumulator.stratum_l1()
    assert l1["10k-100k"] == pytest.approx(3.0) and l1["100-10k"] == pytest.approx(40.0)
    assert np.isnan(l1["0-100"]) and np.isnan(l1["100k+"])
    rho = accumulator.stratum_spearman_means()
    assert rho["10k-100k"] == pytest.approx(1.0) and rho["100-10k"] == pytest.approx(-1.0)
    assert np.isnan(rho["0-100"])


def test_workload_cells_and_place_sizes_match_pandas_tabulations(small_state, jobs, result):
    workplace = small_state.set_index("estab_id")[WORKPLACE]
    frame = jobs.astype(str).join(workplace, on="estab_id")
    w1 = small_state.groupby(WORKPLACE)["m1emp"].sum()  # every workplace cell, sorted by its keys
    assert np.array_equal(result.infusion["workload 1"].truth["workload 1"], w1.to_numpy())
    full = pd.MultiIndex.from_tuples([(*cell, s, e) for cell in w1.index for s in ("1", "2")
                                      for e in ("E1", "E2", "E3", "E4", "E5")])
    w2 = frame.groupby([*WORKPLACE, "sex", "education"]).size().reindex(full, fill_value=0)
    assert np.array_equal(result.infusion["workload 2"].truth["workload 2"], w2.to_numpy())
    graduates = frame[(frame["sex"] == "2") & (frame["education"] == "E4")].groupby(WORKPLACE).size()
    assert np.array_equal(result.infusion["ranking 2"].truth["ranking 2"],
                          graduates.reindex(w1.index, fill_value=0).to_numpy())
    county = small_state.groupby(["state", "county"])["m1emp"].sum()
    expected_sizes = county.reindex(w1.index.droplevel(["sector", "own"])).to_numpy()
    assert np.array_equal(result.infusion["workload 1"].sizes, expected_sizes)
    assert result.worker_cells == 10


def smooth_laplace_z(result, contributions, cells, eps, alpha):
    """z of the summed mean absolute error of Smooth Laplace: |Laplace(b)| has mean b and variance b^2,
    b = 2 max(alpha x, 1) / eps with x the largest contribution to the cell."""
    b = 2 * np.maximum(alpha * contributions.reindex(cells, fill_value=0).to_numpy(), 1.0) / eps
    accumulator = result.errors["workload 2"][Setting("smooth-laplace", eps, alpha=alpha)]
    mean_error = accumulator.absolute["workload 2"] / accumulator.replications
    return (mean_error.sum() - b.sum()) / np.sqrt(np.sum(b**2) / accumulator.replications)


def test_workload_2_error_matches_the_weak_sensitivity_in_closed_form(small_state, jobs, result):
    frame = jobs.astype(str).join(small_state.set_index("estab_id")[WORKPLACE], on="estab_id")
    cells = pd.MultiIndex.from_tuples([(*cell, s, e) for cell in small_state.groupby(WORKPLACE).size().index
                                       for s in ("1", "2") for e in ("E1", "E2", "E3", "E4", "E5")])
    in_cell = frame.groupby([*WORKPLACE, "sex", "education", "estab_id"]).size()
    weak = in_cell.groupby(level=[0, 1, 2, 3, 4, 5]).max()  # the largest establishment's jobs in the cell
    totals = frame.groupby([*WORKPLACE, "estab_id"]).size().groupby(level=[0, 1, 2, 3]).max()
    strong = pd.Series(totals.reindex(cells.droplevel([4, 5]), fill_value=0).to_numpy(), index=cells)  # whole workforce
    for eps, alpha in ((2.0, 0.1), (4.0, 0.01)):
        assert abs(smooth_laplace_z(result, weak, cells, eps, alpha)) <= 5
    assert abs(smooth_laplace_z(result, strong, cells, 2.0, 0.1)) > 5  # power: the strong sensitivity is rejected


def test_verdicts():
    assert _verdict({"a": True, "b": True}) == "holds"
    assert _verdict({"a": False, "b": False}) == "does not hold"
    assert _verdict({"a": True, "b": False, "c": False}) == "holds in part (fails: b; c)"
    assert [_trend_verdict(x) for x in (0.95, 0.7, 0.5, float("nan"))] == [
        "holds", "holds in part", "does not hold", "not testable"]


def test_evaluate_e6_reports_every_finding(tmp_path, small_state, jobs):
    estabs, table = tmp_path / "estabs.parquet", tmp_path / "jobs.parquet"
    write_microdata(small_state, estabs)
    write_microdata(jobs, table)
    out = tmp_path / "e6"
    result = runner.invoke(app, ["evaluate", "e6", "--data", str(estabs), "--jobs", str(table), "--replications", "2",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    for finding in range(1, 7):
        line = next(x for x in report.splitlines() if x.startswith(f"- **Finding {finding}: "))
        assert any(f"Finding {finding}: {v}" in line for v in ("holds", "does not hold", "not testable"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == len(jobs) and summary["replications"] == 2
    assert set(summary["workloads"]) == {"workload 1", "workload 2", "workload 3", "ranking 1", "ranking 2"}
    assert [label for label, _, _ in STRATA] == list(summary["noise_infusion"]["workload 1"]["l1"])
    gedp = summary["gedp"]  # default: min(replications, 10) releases at every eps of the grid
    assert gedp["replications"] == 2 and list(gedp["mu"]) == [f"{e:g}" for e in E5Setup().eps]
    assert all(len(rows) == len(E5Setup().eps) for rows in gedp["workloads"].values())
    assert "## gedp against the earlier mechanisms at comparable budgets" in report
    assert sum(line.startswith("| gedp | ") for line in report.splitlines()) == 3 * len(E5Setup().eps)


def test_evaluate_e6_gedp_replications_option(tmp_path, small_state, jobs):
    estabs, table = tmp_path / "estabs.parquet", tmp_path / "jobs.parquet"
    write_microdata(small_state, estabs)
    write_microdata(jobs, table)
    common = ["--data", str(estabs), "--replications", "1"]
    result = runner.invoke(app, ["evaluate", "e6", *common, "--jobs", str(table), "--gedp-replications", "0",
                                 "--out", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["gedp"] == {"replications": 0}
    assert "| gedp |" not in (tmp_path / "none" / "report.md").read_text()
    for name, value in (("e6", "-1"), ("e5", "1")):
        result = runner.invoke(app, ["evaluate", name, *common, "--gedp-replications", value,
                                     "--out", str(tmp_path / "bad")])
        assert result.exit_code == 2 and result.output == (f"error: --gedp-replications ({value}) goes with e6 and "
                                                           "must be >= 0\n")
        assert not (tmp_path / "bad").exists()


def test_evaluate_e6_refuses_a_bad_job_table_in_one_line_and_writes_nothing(tmp_path, small_state, jobs):
    estabs, table = tmp_path / "estabs.parquet", tmp_path / "jobs.csv"
    write_microdata(small_state, estabs)
    jobs.astype(str).iloc[1:].to_csv(table, index=False)  # the first establishment's first job is missing
    out = tmp_path / "e6"
    result = runner.invoke(app, ["evaluate", "e6", "--data", str(estabs), "--jobs", str(table), "--out", str(out)])
    first = small_state["estab_id"].iloc[int(np.argmax(small_state["m1emp"].to_numpy() > 0))]
    assert result.exit_code == 2 and result.output.startswith("error: column 'm1emp': every establishment needs")
    assert result.output.count("\n") == 1 and f"(estab_id {first})" in result.output
    assert not out.exists()
    result = runner.invoke(app, ["evaluate", "e5", "--data", str(estabs), "--jobs", str(table), "--out", str(out)])
    assert result.exit_code == 2 and result.output == ("error: --jobs goes with e6 and --data (the job table of that "
                                                       "establishment file)\n")
    assert not out.exists()


@pytest.mark.parametrize("eps", [0.25, 0.67, 2.0, 4.0])
def test_gdp_mu_is_the_closed_form_conversion_at_delta_1e_6(eps):
    mu = gdp_mu(eps)
    assert gdp_delta_closed_form(eps, mu) == pytest.approx(1e-6, rel=1e-9)
    assert gdp_delta_closed_form(eps, mu * 1.001) > 1.001e-6 and gdp_delta_closed_form(eps, mu * 0.999) < 0.999e-6
    assert gdp_epsilon(mu) == pytest.approx(eps, rel=1e-9)


def test_gedp_config_scales_the_shipped_plan_to_the_matched_mu_and_its_release_charges_it(small_state, jobs):
    shipped = yaml.safe_load(configs.path("jobs").read_text())
    kept = [{a: q["mu"][a] for a in ("m1emp", "worker")} for q in shipped["queries"]]
    factor = gdp_mu(2.0) / math.sqrt(sum(m**2 for q in kept for m in q.values()))
    config = gedp_config(2.0)
    assert dict(config.jobs.families) == {"worker": ("sex", "education")}
    assert [dict(q.mu) for q in config.plan.queries] == [
        {a: pytest.approx(m * factor, rel=1e-12) for a, m in q.items()} for q in kept]
    from gedp.release.manifest import state_section
    from gedp.running.state_pipeline import protect

    release = protect(small_state, config, rng=np.random.default_rng(0), jobs=jobs)
    section = state_section("44", release, config.plan.zeta)
    charged = section["mu_total"]
    assert gdp_delta_closed_form(2.0, charged) == pytest.approx(1e-6, rel=1e-9)  # the ledger's total, converted
    assert set(section["mu"]["identity"]) == {"m1emp", "worker"}  # no home family
    assert set(release.jobs["family"]) == {"worker"}


def test_shape_steps_match_the_combined_psi_by_brute_force():
    psi = make_psi("sqrt-linear", gamma_sqrt=0.5, d=1)
    assert max(combined_psi(x + 1) - combined_psi(x) for x in np.linspace(0, 50, 5001)) <= 1 + 1e-12  # one worker
    sizes = [0, 1, 3, 10, 19, 100, 1_000, 4_321]
    for alpha in (0.01, 0.1, 0.2):
        steps = shape_steps(psi, np.array(sizes, dtype=float), alpha)
        for i, x in enumerate(sizes):
            # every count y <= x may grow to max((1 + alpha) y, y + 1) (weak), or the new workers of the whole
            # establishment may all join an empty count (strong)
            weak = max(combined_psi(y + max(math.floor(alpha * y), 1)) - combined_psi(y) for y in range(x + 1))
            strong = combined_psi(max(math.floor(alpha * x), 1))
            assert steps["weak"][i] == math.ceil(weak - 1e-12) and steps["strong"][i] == math.ceil(strong - 1e-12)
    assert shape_steps(psi, np.array([10_000.0]), 0.1)["strong"][0] > shape_steps(psi, np.array([10_000.0]), 0.1)[
        "weak"][0] > 1  # power: large establishments' shape costs more than one step


def test_gedp_row_matches_a_release_of_gedp_protect_tabulated_from_its_files(tmp_path, small_state, jobs, gedp_result):
    estabs, table = tmp_path / "estabs.parquet", tmp_path / "jobs.parquet"
    write_microdata(small_state, estabs)
    write_microdata(jobs, table)
    config = gedp_result.gedp_config[4.0]
    raw = {"workflow": config.plan.workflow, "psi": config.plan.psi.params(), "zeta": config.plan.zeta,
           "variance": config.variance_mode, "attributes": {"m1emp": {"gamma": 1}},
           "jobs": {"gamma": 1, "families": {"worker": ["sex", "education"]}},
           "queries": [{"by": "identity" if q.name == "identity" else list(q.by), "mu": dict(q.mu)}
                       for q in config.plan.queries]}
    (tmp_path / "gedp.yaml").write_text(yaml.safe_dump(raw))

    def released_errors(seed):
        out = tmp_path / f"rel{seed}"
        outcome = runner.invoke(app, ["protect", str(estabs), "--jobs", str(table), "--config",
                                      str(tmp_path / "gedp.yaml"), "--seed", str(seed), "--not-for-publication",
                                      "--out", str(out)])
        assert outcome.exit_code == 0, outcome.output
        protected = pd.read_parquet(out / "protected.parquet").astype({c: str for c in WORKPLACE})
        frame = pd.read_parquet(out / "protected_jobs.parquet").astype({"estab_id": str})
        frame = frame.join(protected.set_index("estab_id")[WORKPLACE], on="estab_id")
        true_w1 = small_state.astype({c: str for c in WORKPLACE}).groupby(WORKPLACE)["m1emp"].sum()
        cells = pd.MultiIndex.from_tuples([(*c, s, e) for c in true_w1.index for s in ("1", "2")
                                           for e in ("E1", "E2", "E3", "E4", "E5")])
        true_jobs = jobs.astype(str).join(small_state.astype(str).set_index("estab_id")[WORKPLACE], on="estab_id")
        true_w2 = true_jobs.groupby([*WORKPLACE, "sex", "education"]).size().reindex(cells, fill_value=0)
        w1 = protected.groupby(WORKPLACE)["m1emp"].sum().reindex(true_w1.index, fill_value=0.0)
        w2 = frame.groupby([*WORKPLACE, "sex", "education"])["jobs"].sum().reindex(cells, fill_value=0.0)
        graduates = (cells.get_level_values(4) == "2") & (cells.get_level_values(5) == "E4")
        return {"workload 1": np.abs(w1.to_numpy() - true_w1.to_numpy()),
                "workload 2": np.abs(w2.to_numpy() - true_w2.to_numpy()),
                "ranking 2": stats.spearmanr(w2.to_numpy()[graduates], true_w2.to_numpy()[graduates]).statistic}

    seed = gedp_seeds(4, 1)[0]
    mine = released_errors(seed)
    setting = Setting("gedp", 4.0)
    for name in ("workload 1", "workload 2"):
        recorded = gedp_result.gedp[name][setting].absolute[name]
        assert mine[name].sum() > 0 and np.allclose(recorded, mine[name], rtol=1e-9, atol=1e-9)
        assert l1_ratios(gedp_result, name, setting)["all"] == pytest.approx(
            mine[name].sum() / gedp_result.infusion[name].stratum_l1()["100-10k"], rel=1e-9)
    np.testing.assert_allclose(gedp_result.gedp["workload 3"][setting].absolute["workload 3"], mine["workload 2"],
                               rtol=1e-9, atol=1e-9)
    assert gedp_result.gedp["ranking 2"][setting].spearman["ranking 2"] == [pytest.approx(mine["ranking 2"])]
    other = released_errors(seed + 1)  # power: another release's errors are told apart
    assert not np.allclose(gedp_result.gedp["workload 2"][setting].absolute["workload 2"], other["workload 2"],
                           rtol=1e-6)


def test_gedp_findings_compare_with_each_mechanisms_best_setting_valid_at_each_eps(gedp_result):
    comparisons = {c["workload"]: c for c in gedp_findings(gedp_result) if c["stratum"] == "100-10k"}
    assert set(comparisons) == {"workload 1", "workload 2", "workload 3", "ranking 1", "ranking 2"}
    for name, pick in (("workload 1", min), ("ranking 1", max)):
        rows = comparisons[name]["rows"]
        assert [r["eps"] for r in rows] == [0.5, 4.0]
        for row in rows:
            figures = {s: (l1_ratios(gedp_result, name, s) if pick is min else
                           {"100-10k": gedp_result.errors[name][s].stratum_spearman_means()["100-10k"]})["100-10k"]
                       for s in gedp_result.grid[name] if s.eps == row["eps"]}
            mechanisms = {s.mechanism for s in figures}
            assert set(row["rivals"]["any"]) == set(row["rivals"]["shown"]) == mechanisms
            assert ("smooth-laplace" in mechanisms) == (row["eps"] == 4.0)  # alpha 0.1: refused at eps 0.5
            for view, keep in (("any", lambda s: True), ("shown", lambda s: s.alpha in (None, 0.1))):
                for mechanism, rival in row["rivals"][view].items():
                    best = pick(v for s, v in figures.items() if s.mechanism == mechanism and keep(s))
                    assert rival["value"] == best and rival["gedp_better"] == ((row["gedp"] < best) if pick is min
                                                                               else (row["gedp"] > best))
            assert row["best_value"] == pick(figures.values())
        assert all(r["beats_infusion"] == (r["gedp"] < 1) for r in comparisons["workload 1"]["rows"])
    low, high = (l1_ratios(gedp_result, "workload 1", Setting("gedp", e))["all"] for e in (0.5, 4.0))
    assert high < low  # power: more budget, smaller error
