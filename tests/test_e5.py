"""E5 and the suppression command: the grid, the (eps, delta) conversion, the error bookkeeping, and
the reports the commands write."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, stats
from typer.testing import CliRunner

from gedp.cli import app
from gedp.evaluation.baselines.earlier import (
    check_log_laplace,
    check_smooth_gamma,
    check_smooth_laplace,
    is_valid,
)
from gedp.evaluation.e5_earlier import (
    STRATA,
    E5Setup,
    ErrorAccumulator,
    settings,
)
from gedp.measure.conversions import gdp_epsilon

runner = CliRunner()


def test_grid_keeps_exactly_the_valid_pairs():
    setup = E5Setup()
    grid = settings(setup)
    expected = sum(is_valid(check_log_laplace, e, a) + is_valid(check_smooth_laplace, e, a, setup.delta)
                   + is_valid(check_smooth_gamma, e, a) for e in setup.eps for a in setup.alphas)
    assert len(grid) == expected + len(setup.eps) * len(setup.thetas)
    assert not any(s.mechanism == "smooth-gamma" and s.eps == 0.25 and s.alpha == 0.1 for s in grid)
    assert any(s.mechanism == "smooth-gamma" and s.eps == 0.25 and s.alpha == 0.05 for s in grid)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.64])
def test_gdp_epsilon_against_the_hockey_stick_divergence(mu):
    eps = gdp_epsilon(mu, 1e-6)
    # delta(eps) = integral of max(p_mu - e^eps p_0, 0) for p_mu = N(mu, 1), p_0 = N(0, 1), numerically
    crossing = eps / mu + mu / 2  # p_mu > e^eps p_0 beyond this point
    delta, _ = integrate.quad(lambda z: stats.norm.pdf(z, mu) - math.exp(eps) * stats.norm.pdf(z), crossing, np.inf,
                              epsabs=1e-13)
    assert delta == pytest.approx(1e-6, rel=1e-4)


def test_error_accumulator_strata_and_spearman():
    truth = {"a": np.array([50.0, 500.0, 20_000.0]), "b": np.array([5.0, 200_000.0])}
    accumulator = ErrorAccumulator(truth)
    accumulator.add({"a": np.array([52.0, 490.0, 20_000.0]), "b": np.array([4.0, 200_100.0])})
    accumulator.add({"a": np.array([48.0, 510.0, 19_000.0]), "b": np.array([8.0, 200_100.0])})
    l1 = accumulator.stratum_l1()
    assert [label for label, _, _ in STRATA] == list(l1)
    assert l1["0-100"] == pytest.approx((2 + 2) / 2 + (1 + 3) / 2)
    assert l1["100-10k"] == pytest.approx(10.0)
    assert l1["10k-100k"] == pytest.approx(500.0)
    assert l1["100k+"] == pytest.approx(100.0)
    assert accumulator.spearman_means() == pytest.approx({"a": 1.0, "b": 1.0})
    reversed_order = ErrorAccumulator({"a": np.array([1.0, 2.0, 3.0])})
    reversed_order.add({"a": np.array([3.0, 2.0, 1.0])})
    reversed_order.add({"a": np.array([1.0, 3.0, 2.0])})
    assert reversed_order.spearman_means()["a"] == pytest.approx((-1.0 + 0.5) / 2)
    empty = ErrorAccumulator({"a": np.array([5.0])})
    empty.add({"a": np.array([6.0])})
    assert math.isnan(empty.stratum_l1()["100k+"])


def state_file(tmp_path_factory, establishments: int):
    """A small-profile state of ``establishments`` (seed 3) written to parquet: (path, state)."""
    from gedp.synth.profiles import generate_profile, load_profile

    state = generate_profile(load_profile("small"), n_establishments=establishments, rng=np.random.default_rng(3))
    path = tmp_path_factory.mktemp("e5") / "state.parquet"
    state.to_parquet(path)
    return path, state


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    return state_file(tmp_path_factory, 400)


@pytest.fixture(scope="module")
def suppression_file(tmp_path_factory):
    """150 establishments: the suppress command's audit has 1,562 intervals to decide (1,447 of them
    without their LPs by default), 2,914 (2,634) at 400, at a third of the processor time."""
    return state_file(tmp_path_factory, 150)


def test_evaluate_e5_writes_the_report(tmp_path, small_file):
    path, state = small_file
    out = tmp_path / "e5"
    result = runner.invoke(app, ["evaluate", "e5", "--out", str(out), "--data", str(path), "--replications", "3"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    for heading in ("Setup", "gedp at comparable settings", "Cell suppression on the same tabulations", "Findings"):
        assert f"## {heading}" in text
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["grid"]) == len(settings(E5Setup()))
    assert len(summary["gedp"]) == 2 * len(E5Setup().budget_factors)
    assert summary["establishments"] == len(state) and len(summary["figures"]) == 3
    for figure in summary["figures"]:
        assert (out / figure).stat().st_size > 1_000
    # more budget, less error: the largest eps beats the smallest for every mechanism in the middle stratum
    by = {}
    for row in summary["grid"]:
        by.setdefault((row["mechanism"], row["alpha"], row["theta"]), {})[row["eps"]] = row["l1_ratio"]["100-10k"]
    for ratios in by.values():
        if len(ratios) > 1 and all(math.isfinite(r) for r in ratios.values()):
            assert ratios[max(ratios)] < ratios[min(ratios)]


def test_suppress_command_publishes_an_audited_table(tmp_path, suppression_file):
    path, state = suppression_file
    out = tmp_path / "supp"
    result = runner.invoke(app, ["suppress", "--out", str(out), "--data", str(path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    cells = pd.read_csv(out / "CONFIDENTIAL-cells.csv",
                        dtype={"area_fips": str, "industry_code": str, "disclosure_code": str})
    hidden = cells["disclosure_code"].fillna("") == "N"
    assert hidden.sum() == summary["suppressed"] and summary["failing_cells"] == 0
    assert (cells.loc[hidden, ["month1_emplvl", "total_qtrly_wages"]] == 0).all().all()
    assert cells.loc[~hidden, "month1_emplvl"].sum() > 0
    assert cells["qtrly_estabs"].sum() == 16 * len(state)  # counts stay published at all 16 levels
    audit = pd.read_csv(out / "CONFIDENTIAL-audit_confidential.csv")  # a run on --data: every file marked
    assert len(audit) == summary["audited_intervals"] and not (audit["exact"] | audit["under_protected"]).any()
    assert "## Shares withheld per aggregation level" in (out / "report.md").read_text()
    # --every-lp solves every final interval to its ends: same published table, same verdicts
    slow = tmp_path / "slow"
    result = runner.invoke(app, ["suppress", "--out", str(slow), "--data", str(path), "--every-lp"])
    assert result.exit_code == 0, result.output
    assert (slow / "CONFIDENTIAL-cells.csv").read_bytes() == (out / "CONFIDENTIAL-cells.csv").read_bytes()
    solved = pd.read_csv(slow / "CONFIDENTIAL-audit_confidential.csv")
    assert solved["solved"].all() and not audit["solved"].all()
    verdicts = ["attribute", "sensitive", "true", "need", "exact", "under_protected", "agglvl", "county", "industry"]
    pd.testing.assert_frame_equal(solved[verdicts], audit[verdicts])


@pytest.mark.parametrize("args, message", [
    (["--p", "150"], "p (150.0) must be a percentage in (0, 100)"),
    (["--min-estabs", "0"], "min_estabs (0) must be a whole number >= 1"),
    (["--attributes", "m1emp,payroll"], "the microdata has no column payroll"),
])
def test_suppress_command_refuses_bad_options(tmp_path, small_file, args, message):
    out = tmp_path / "supp"
    result = runner.invoke(app, ["suppress", "--out", str(out), "--data", str(small_file[0]), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.shared_data
def test_suppress_command_compares_with_the_published_shares(tmp_path, shared_data):
    out = tmp_path / "ri"
    result = runner.invoke(app, ["suppress", "--out", str(out), "--no-audit",
                                 "--from-qcew", str(shared_data / "qcew_2016q1_44.csv")])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["published_county_naics6_share"] == pytest.approx(0.644, abs=5e-4)
    assert "withheld by BLS" in (out / "report.md").read_text()


def test_evaluate_e5_refuses_data_without_its_columns(tmp_path, small_file):
    _, state = small_file
    source = tmp_path / "no-wage.parquet"
    state.drop(columns=["wage"]).to_parquet(source)
    out = tmp_path / "e5"
    result = runner.invoke(app, ["evaluate", "e5", "--out", str(out), "--data", str(source)])
    assert result.exit_code == 2 and "missing column 'wage'" in result.output, result.output
    lines = result.output.strip().splitlines()  # the input's first check: a first line, then the problem
    assert len(lines) == 2 and lines[1].startswith("  - missing column 'wage'") and not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--infusion-s", "0.2", "--infusion-t", "0.1"], "noise infusion needs 0 <= s < t < 1"),
    (["--delta", "1.5"], "delta (1.5) must be in (0, 1)"),
])
def test_evaluate_e5_refuses_bad_parameters(tmp_path, small_file, args, message):
    out = tmp_path / "e5"
    result = runner.invoke(app, ["evaluate", "e5", "--out", str(out), "--data", str(small_file[0]), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()


def test_suppress_command_refuses_two_quarters(tmp_path, small_file):
    _, state = small_file
    two = pd.concat([state.assign(year=2016, qtr=1), state.assign(year=2016, qtr=2,
                                                                   estab_id=state["estab_id"] + "-q2")])
    source = tmp_path / "two.parquet"
    two.to_parquet(source)
    out = tmp_path / "supp"
    result = runner.invoke(app, ["suppress", "--out", str(out), "--data", str(source)])
    assert result.exit_code == 2 and "holds 2 quarters" in result.output, result.output
    assert not out.exists()
