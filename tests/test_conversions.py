"""mu-GDP in epsilon(delta) and rho, against an independent high-precision computation (mpmath)."""

from __future__ import annotations

import json
import math

import mpmath
import numpy as np
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.measure.conversions import gdp_epsilon, gdp_rho, privacy_statement
from gedp.synth.profiles import generate_profile, load_profile

mpmath.mp.dps = 60


def delta_mp(eps, mu):
    """delta(eps) of mu-GDP at 60 digits (Dong, Roth & Su 2022, Corollary 2.13)."""
    eps, mu = mpmath.mpf(eps), mpmath.mpf(mu)
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def epsilon_mp(mu, delta):
    """eps at which delta(eps) = delta: 200 bisections at 60 digits (delta(eps) falls with eps)."""
    low, high = mpmath.mpf(0), mpmath.mpf(mu * (mu / 2 + 40) + 5)
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_mp(middle, mu) > delta else (low, middle)
    return float(low)


@pytest.mark.parametrize("mu", [0.05, 0.3, 0.7, 1.0, 2.3065, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6, 1e-9])
def test_epsilon_matches_high_precision(mu, delta):
    if delta_mp(0, mu) <= delta:
        assert gdp_epsilon(mu, delta) == 0.0
    else:
        assert gdp_epsilon(mu, delta) == pytest.approx(epsilon_mp(mu, delta), rel=1e-9)


def test_default_plan_figures():
    """The shipped baseline plan's total mu 2.3065 (sqrt(3 x 1.74 + 0.10))."""
    mu = math.sqrt(3 * 1.74 + 0.10)
    assert round(gdp_epsilon(mu, 1e-5), 2) == 11.93
    assert round(gdp_epsilon(mu, 1e-6), 2) == 13.08


def test_monotone_in_mu_and_delta():
    mus = [0.01, 0.1, 0.5, 1, 2, 4, 8, 16]
    for delta in (1e-5, 1e-9):
        eps = [gdp_epsilon(mu, delta) for mu in mus]
        assert all(a <= b for a, b in zip(eps, eps[1:])) and eps[-1] > eps[0]
    deltas = [1e-3, 1e-5, 1e-7, 1e-9, 1e-12, 1e-20, 1e-100]
    eps = [gdp_epsilon(2.0, d) for d in deltas]
    assert all(a < b for a, b in zip(eps, eps[1:]))


def test_edges():
    # mu -> 0: delta(0) = Phi(mu/2) - Phi(-mu/2) ~ mu / sqrt(2 pi) falls below delta, so eps = 0
    assert gdp_epsilon(1e-7, 1e-5) == 0.0
    assert gdp_epsilon(1e-4, 1e-5) > 0  # delta(0) = 4e-5 > 1e-5
    # large mu: eps grows like mu^2 / 2 + mu z_delta; still found and finite
    big = gdp_epsilon(50.0, 1e-9)
    assert big == pytest.approx(epsilon_mp(50.0, 1e-9), rel=1e-9) and 50**2 / 2 < big < 50**2 / 2 + 50 * 7
    assert gdp_epsilon(1.0, 1e-300) == pytest.approx(epsilon_mp(1.0, 1e-300), rel=1e-8)


@pytest.mark.parametrize("mu, delta, message", [
    (0.0, 1e-5, r"mu \(0.0\) must be a finite number > 0"),
    (math.inf, 1e-5, r"mu \(inf\) must be a finite number > 0"),
    (1.0, 0.0, r"delta \(0.0\) must be in \[1e-300, 1\)"),
    (1.0, 1.0, r"delta \(1.0\) must be in \[1e-300, 1\)"),
    (1.0, math.nan, r"delta \(nan\) must be in"),
])
def test_bad_arguments_are_refused(mu, delta, message):
    with pytest.raises(ValueError, match=message):
        gdp_epsilon(mu, delta)


def test_privacy_statement():
    statement = privacy_statement(2.3065, {"m1emp": 1.3191, "wage": 0.3317})
    assert statement["mu"] == 2.3065 and statement["rho"] == pytest.approx(2.3065**2 / 2, rel=1e-15)
    assert set(statement["epsilon"]) == {"1e-05", "1e-06", "1e-09"}
    assert statement["epsilon"]["1e-05"] == pytest.approx(epsilon_mp(2.3065, 1e-5), rel=1e-9)
    wage = statement["attributes"]["wage"]
    assert wage["rho"] == pytest.approx(0.3317**2 / 2, rel=1e-15) and gdp_rho(0.3317) == wage["rho"]
    assert wage["epsilon"]["1e-09"] == pytest.approx(epsilon_mp(0.3317, 1e-9), rel=1e-9)


def test_protect_summary_states_epsilon(tmp_path):
    generate_profile(load_profile("small"), n_establishments=150, rng=np.random.default_rng(4)).to_csv(
        tmp_path / "in.csv", index=False)
    result = CliRunner().invoke(app, ["protect", str(tmp_path / "in.csv"), "--config", "employment", "--out",
                                      str(tmp_path / "out"), "--seed", "1", "--not-for-publication"])
    assert result.exit_code == 0, result.output
    mu = json.loads((tmp_path / "out" / "manifest.json").read_text())["mu_total"]
    line = next(line for line in result.output.splitlines() if "privacy budget" in line)
    assert f"total mu {mu:.4f} (epsilon {epsilon_mp(mu, 1e-6):.2f} at delta 1e-6) for psi-neighbours" in line
