"""E6 (evaluation/e6_jobs.py): the grid per workload against the mechanisms' own checks, the workloads'
true cells and place sizes against pandas tabulations of the job table, the accumulated L1 error
against its closed form, the findings' verdict rules, and the command line.

The closed-form check compares the summed mean absolute error with its expectation in units of its
exact standard error (|z| <= 5: false-failure rate 5.7e-7), with a power check that the same
statistic rejects the sensitivity of the other privacy notion.
"""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.evaluation.e5_earlier import STRATA, E5Setup, ErrorAccumulator, Setting, settings
from gedp.evaluation.e6_jobs import _trend_verdict, _verdict, cell_eps, compute_e6, workload_grid
from gedp.measure.earlier import check_log_laplace, check_smooth_gamma, check_smooth_laplace, is_valid
from gedp.synth.io import write_microdata
from gedp.synth.jobs import synthesize_jobs

WORKPLACE = ["state", "county", "sector", "own"]
SMALL_GRID = E5Setup(eps=(2.0, 4.0), alphas=(0.01, 0.1), thetas=(100.0,))
runner = CliRunner()


@pytest.fixture(scope="module")
def jobs(small_state):
    return synthesize_jobs(small_state, rng=np.random.default_rng(5))


@pytest.fixture(scope="module")
def result(small_state, jobs):
    return compute_e6(small_state, jobs, SMALL_GRID, replications=12, seed=3, data_label="test")


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
