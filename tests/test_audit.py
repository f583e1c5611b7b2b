"""The empirical privacy audit passes the mechanisms and catches a broken one (power check)."""

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from gedp.cli import app
from gedp.measure.audit import clopper_pearson, estab_gaussian, mu_lower_bound, run_audit


def test_clopper_pearson_matches_the_beta_quantiles():
    low, high = clopper_pearson(30, 100, 0.05)
    assert low == pytest.approx(stats.beta.ppf(0.025, 30, 71)) and high == pytest.approx(stats.beta.ppf(0.975, 31, 70))
    assert clopper_pearson(0, 50, 0.05)[0] == 0.0 and clopper_pearson(50, 50, 0.05)[1] == 1.0


def test_lower_bound_recovers_a_known_gaussian_shift():
    rng = np.random.default_rng(0)
    d1, d2 = rng.normal(0, 1, 400_000), rng.normal(1.5, 1, 400_000)
    low = mu_lower_bound(d1, d2)
    assert 1.35 < low <= 1.5


def test_estab_gaussian_noise_has_sd_sensitivity_over_mu():
    draws = estab_gaussian(np.zeros(50_000), sensitivity=2.0, mu=0.5, rng=np.random.default_rng(1)) / 4.0
    assert stats.kstest(draws, "norm").pvalue > 1e-3 and stats.kstest(draws / 0.7, "norm").pvalue < 1e-3
    with pytest.raises(ValueError, match="must be > 0"):
        estab_gaussian(np.zeros(2), sensitivity=0.0, mu=1.0, rng=np.random.default_rng(0))


def test_audit_passes_every_mechanism_and_catches_halved_noise():
    """alpha = 0.001 per case (fixed seed); the broken variants act as mu = 2 and must fail."""
    honest = run_audit(1.0, trials=100_000, seed=3)
    assert {r.mechanism for r in honest} == {"psi", "pnc", "gaussian"}
    assert all(r.passed for r in honest), [r.row() for r in honest]
    value_cases = [r for r in honest if "low bits" not in r.case]
    assert all(r.audited_mu_low > 0.7 for r in value_cases)  # the audit is tight, not vacuous
    broken = run_audit(1.0, trials=100_000, seed=3, noise_factor=0.5)
    assert not any(r.passed for r in broken), [r.row() for r in broken]


def test_low_bit_distinguisher_finds_nothing_in_gridded_bytes_and_catches_a_float64_sum():
    """The released bytes of the psi-mechanism carry no low-bit signal of x = 0; the float64 sum
    psi(x) + z (gedp before its grid) is caught at ten times the claimed mu. About 3% of x = 0 runs are
    flagged and none at x = 2,500, so 200,000 runs bound mu from below near 1.9 (1e6 runs: 2.3; the
    issue's own interval method gave 2.67)."""
    [gridded] = [r for r in run_audit(0.15, trials=200_000, seed=5) if "low bits" in r.case]
    assert gridded.audited_mu_low == 0.0 and gridded.passed
    [float_sum] = [r for r in run_audit(0.15, trials=200_000, seed=5, noise_factor=0.5) if "low bits" in r.case]
    assert float_sum.audited_mu_low > 10 * 0.15 and not float_sum.passed


def test_audit_command(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["audit", "--mechanism", "psi", "--trials", "50000", "--out", str(tmp_path / "a.json")])
    assert ok.exit_code == 0 and "pass" in ok.output and (tmp_path / "a.json").is_file()
    caught = runner.invoke(app, ["audit", "--mechanism", "pnc", "--trials", "50000", "--broken"])
    assert caught.exit_code == 1 and "FAIL" in caught.output
    assert runner.invoke(app, ["audit", "--mechanism", "laplace"]).exit_code == 2
