"""The disclosure-risk report: its attacks checked against brute force and against releases whose risk is
known (an unprotected copy, a shuffled copy), its scores against closed forms, and the command end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from gedp.cli import app
from gedp.errors import InputError
from gedp.evaluation.risk import (
    PSI_WORDS,
    SIZE_CLASS_LABELS,
    Rate,
    Risk,
    inference,
    matching,
    nearest,
    sample_targets,
    size_class,
    split_by_release,
    split_halves,
)

runner = CliRunner()


def test_size_classes_are_the_qcew_ones():
    employees = np.array([0, 0.4, 1, 4, 4.6, 5, 9, 10, 19, 20, 49, 50, 99, 100, 249, 250, 499, 500, 999, 1000, 5e4])
    expected = ["0", "0", "1-4", "1-4", "5-9", "5-9", "5-9", "10-19", "10-19", "20-49", "20-49", "50-99", "50-99",
                "100-249", "100-249", "250-499", "250-499", "500-999", "500-999", "1000+", "1000+"]
    assert [SIZE_CLASS_LABELS[k] for k in size_class(employees)] == expected


def test_wilson_rate_solves_the_score_equation():
    """The Wilson interval's ends are the p with |k/n - p| = z sqrt(p (1 - p) / n): roots of a quadratic."""
    z = stats.norm.ppf(0.975)
    for successes, attempts in ((0, 10), (7, 20), (1480, 2000), (2000, 2000)):
        phat = successes / attempts
        # (1 + z^2/n) p^2 - (2 phat + z^2/n) p + phat^2 = 0
        low, high = sorted(np.roots([1 + z * z / attempts, -(2 * phat + z * z / attempts), phat * phat]).real)
        rate = Rate(successes, attempts)
        assert rate.value == pytest.approx((low + high) / 2, abs=1e-12)
        assert rate.error == pytest.approx((high - low) / 2, abs=1e-12)


def test_risk_is_excess_success_with_propagated_error():
    attack, control = Rate(1480, 2000), Rate(580, 2000)
    risk, low, high = Risk(attack, control).interval()
    p, c = attack.value, control.value
    assert risk == pytest.approx((p - c) / (1 - c))
    # first-order error by numerical derivatives of (p - c) / (1 - c)
    h = 1e-6
    d_p = ((p + h - c) / (1 - c) - (p - h - c) / (1 - c)) / (2 * h)
    d_c = ((p - c - h) / (1 - c - h) - (p - c + h) / (1 - c + h)) / (2 * h)
    error = math.hypot(d_p * attack.error, d_c * control.error)
    assert (low, high) == pytest.approx((risk - error, risk + error), rel=1e-6)
    assert Risk(Rate(100, 2000), Rate(400, 2000)).interval()[0] == 0.0  # less success than the control: no risk


def test_nearest_finds_a_closest_row_as_brute_force_does():
    rng = np.random.default_rng(3)
    candidates = rng.integers(0, 3, size=(300, 4))
    targets = rng.integers(0, 3, size=(50, 4))
    found = nearest(targets, candidates, categorical=True, rng=rng)
    mismatches = (targets[:, None, :] != candidates[None, :, :]).sum(axis=2)
    assert np.array_equal(mismatches[np.arange(50), found], mismatches.min(axis=1))
    numeric = rng.normal(size=(400, 2)) * [1.0, 100.0]
    points = rng.normal(size=(30, 2)) * [1.0, 100.0]
    found = nearest(points, numeric, categorical=False, rng=rng)
    spread = numeric.max(axis=0) - numeric.min(axis=0)
    distance = (np.abs(points[:, None, :] - numeric[None, :, :]) / spread).sum(axis=2)
    assert np.allclose(distance[np.arange(30), found], distance.min(axis=1))


def test_nearest_breaks_ties_at_random():
    """Ten identical candidates: each is picked about a tenth of the time (chi-square, p > 1e-4)."""
    picks = nearest(np.zeros((5000, 1), dtype=int), np.zeros((10, 1), dtype=int), categorical=True,
                    rng=np.random.default_rng(5), chunk=1)
    assert stats.chisquare(np.bincount(picks, minlength=10)).pvalue > 1e-4


def test_matching_counts_as_brute_force_does():
    rng = np.random.default_rng(4)
    cells, values = rng.integers(0, 5, 500), rng.integers(0, 20, 500).astype(float)
    query_cells, query_values, upward = rng.integers(0, 6, 200), rng.integers(-1, 22, 200) + 0.5, rng.random(200) < 0.5
    same = cells[None, :] == query_cells[:, None]
    expected = np.where(upward, (same & (values[None, :] >= query_values[:, None])).sum(axis=1),
                        (same & (values[None, :] <= query_values[:, None])).sum(axis=1))
    assert np.array_equal(matching(cells, values, query_cells, query_values, upward), expected)


def _size_class_rate(small_state, released_m1emp) -> tuple[Rate, float]:
    """The size-class inference rate on training records from a release showing ``released_m1emp`` (in
    training order), and the rate a guess independent of the target reaches on the same targets."""
    rng = np.random.default_rng(11)
    training, control = split_halves(small_state, rng)
    targets = sample_targets(training, control, 600, rng)
    shown = released_m1emp(training["m1emp"].to_numpy(), rng)
    result = inference(size_class(shown), targets, size_class(targets.training["m1emp"]),
                       size_class(targets.control["m1emp"]))
    shares = np.bincount(size_class(training["m1emp"]), minlength=len(SIZE_CLASS_LABELS)) / len(training)
    return result.attack, float(shares[size_class(targets.training["m1emp"])].mean())


def test_unprotected_copy_gives_every_size_class_away(small_state):
    rate, _ = _size_class_rate(small_state, lambda m1emp, rng: m1emp)
    assert rate.successes == rate.attempts


def test_shuffled_copy_gives_the_base_rate(small_state):
    """Values shuffled among the released records: the guess is a random record's class, right with the
    probability of the target's class (4 sd of a binomial: false failure about 6e-5)."""
    rate, base = _size_class_rate(small_state, lambda m1emp, rng: rng.permutation(m1emp))
    sd = math.sqrt(base * (1 - base) / rate.attempts)
    assert abs(rate.successes / rate.attempts - base) < 4 * sd
    assert base < 0.6  # the check has power: a leak would be far above the base rate


def test_a_release_of_every_record_leaves_no_control(small_state):
    with pytest.raises(InputError, match="none is left as a control"):
        split_by_release(small_state, small_state)
    with pytest.raises(InputError, match="1 establishments that --data lacks"):
        split_by_release(small_state.iloc[1:], small_state.iloc[:10])


def test_risk_report_end_to_end(small_state, tmp_path):
    data = tmp_path / "state.parquet"
    small_state.to_parquet(data)
    out = tmp_path / "risk"
    result = runner.invoke(app, ["evaluate", "risk", "--data", str(data), "--out", str(out), "--config", "baseline"])
    assert result.exit_code == 0, result.output
    assert "CONFIDENTIAL" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["confidential"] is True
    assert summary["training"] + summary["control"] == len(small_state)
    assert sorted(p.name for p in out.iterdir()) == ["CONFIDENTIAL-risks.csv", "report.md", "summary.json"]
    report = (out / "report.md").read_text()
    assert "CONFIDENTIAL: not for publication" in report and PSI_WORDS in report
    table = pd.read_csv(out / "CONFIDENTIAL-risks.csv")
    assert table["method"].nunique() == 4
    assert set(table["attack"]) == {"size class", "wage decile", "singling out", "linkability"}
    assert ((table["low"] <= table["risk"]) & (table["risk"] <= table["high"])).all()
    assert table[["rate", "control_rate", "risk", "low", "high"]].stack().between(0, 1).all()


def test_risk_of_a_given_release(small_state, tmp_path):
    """A release of a random half, given with --release: the other half is the control."""
    half = small_state.sample(frac=0.5, random_state=2)
    data, part = tmp_path / "state.parquet", tmp_path / "half.parquet"
    small_state.to_parquet(data)
    half.to_parquet(part)
    release = tmp_path / "release"
    made = runner.invoke(app, ["protect", str(part), "--config", "baseline", "--out", str(release), "--seed", "3",
                               "--not-for-publication"])
    assert made.exit_code == 0, made.output
    out = tmp_path / "risk"
    result = runner.invoke(app, ["evaluate", "risk", "--data", str(data), "--release", str(release), "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["training"], summary["control"]) == (len(half), len(small_state) - len(half))
    refused = runner.invoke(app, ["evaluate", "e1", "--release", str(release), "--out", str(tmp_path / "e1")])
    assert refused.exit_code == 2 and "--release goes with risk" in refused.output
    refused = runner.invoke(app, ["evaluate", "risk", "--data", str(data), "--release", str(release), "--config",
                                  "baseline", "--out", str(tmp_path / "again")])
    assert refused.exit_code == 2 and "--config goes with risk without --release" in refused.output
    refused = runner.invoke(app, ["evaluate", "risk", "--data", str(data), "--release", str(tmp_path), "--out",
                                  str(tmp_path / "again")])
    assert refused.exit_code == 2 and "is not a gedp release" in refused.output
