"""What a command loads before it works: the privacy conversions without scipy.stats (the same
numbers), and a further tabulation of a release without the release writer, the API or the
manifest builder."""

import math
import subprocess
import sys

import pytest
from scipy import optimize, stats

from gedp.measure.conversions import gdp_delta, gdp_epsilon
from gedp.measure.mechanisms import pnc_tau


def test_conversions_give_scipy_stats_numbers_bit_for_bit():
    for mu in (0.05, 0.3, 1.0, 2.3063, 7.5):
        for eps in (0.0, 0.01, 0.7, 3.0, 13.08, 40.0):
            expected = float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2)))
            assert gdp_delta(eps, mu) == expected
        for delta in (1e-5, 1e-6, 1e-9, 1e-200):
            if gdp_delta(0.0, mu) > delta:
                upper = mu * (mu / 2 + float(stats.norm.isf(delta)) + 1)
                expected = optimize.brentq(lambda e, mu=mu, delta=delta: gdp_delta(e, mu) - delta, 0.0, upper,
                                           xtol=1e-14, rtol=1e-14)
                assert gdp_epsilon(mu, delta) == expected


@pytest.mark.parametrize("zeta, n_bounds", [(0.01, 1), (0.01, 37), (1e-6, 1_000_000), (0.5, 3)])
def test_tau_is_scipy_stats_quantile_bit_for_bit(zeta, n_bounds):
    assert pnc_tau(zeta, n_bounds) == float(stats.norm.isf(-math.expm1(math.log1p(-zeta) / n_bounds)))


def loaded(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_protect_starts_without_scipy_stats_or_the_rounding_lp_solver():
    modules = loaded("import gedp.cli, gedp.api, gedp.running.engine, gedp.running.recorded_release, "
                     "gedp.running.state_pipeline")
    assert not modules & {"scipy.stats", "highspy"}


def test_an_indexed_tabulation_loads_neither_the_api_nor_the_release_builders():
    modules = loaded("import gedp.cli\nfrom gedp.release.margins import kept_tabulation\n"
                     "from gedp.release.margins import kept_variances")
    assert not modules & {"gedp.api", "gedp.running.engine", "gedp.config", "gedp.release.manifest",
                          "gedp.release.writer", "gedp.measure.workflows", "gedp.synth.profiles", "scipy.stats"}
