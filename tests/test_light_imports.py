"""What a command loads before it works: the privacy conversions without scipy.stats (the same
numbers), a further tabulation of a release without the release writer, the API or the manifest
builder; `gedp --help` and `import gedp.api` without a numerical library; a tabulation and a manager
report of a release without the config reader, the mechanisms or the release builders."""

import math
import subprocess
import sys
from pathlib import Path

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


#: The numerical libraries, and what builds a release: gedp's config reader (which loads the mechanisms,
#: the job frame's plans and the wage solver), the engine and the manifest builder.
NUMERICAL = {"numpy", "pandas", "pyarrow", "scipy", "matplotlib"}
RELEASE_BUILDERS = {"gedp.config", "gedp.running.engine", "gedp.release.manifest", "gedp.measure.mechanisms",
                    "gedp.measure.workflows", "gedp.measure.jobframe", "yaml"}


def command_loaded(*arguments: str, cwd: Path) -> set[str]:
    """The modules the ``gedp`` command with ``arguments`` imports, as a user runs it (``python -m gedp``),
    from its ``-X importtime`` report."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "gedp", *arguments], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "gedp.cli" in lines, done.stderr[-3000:]  # the report was read
    return set(lines)


@pytest.mark.parametrize("arguments", [["--help"], ["tabulate", "--help"], ["protect", "--help"]])
def test_help_loads_no_numerical_library_and_no_command(arguments, tmp_path):
    modules = command_loaded(*arguments, cwd=tmp_path)
    assert not modules & (NUMERICAL | RELEASE_BUILDERS | {"gedp.api"})


def test_the_api_loads_no_numerical_library_until_a_function_runs():
    modules = loaded("import gedp.api")
    assert not modules & (NUMERICAL | RELEASE_BUILDERS | {"gedp.release.writer", "gedp.release.reader",
                                                          "gedp.synth.schema"})


@pytest.fixture(scope="module")
def release(seeded_small_release) -> Path:
    """A release of 300 establishments (read, never changed)."""
    return seeded_small_release("light-imports", 300)


def test_tabulating_a_release_loads_no_scipy_and_no_release_builder(release, tmp_path):
    modules = command_loaded("tabulate", str(release), "--by", "county", "--out", "table.csv", cwd=tmp_path)
    assert (tmp_path / "table.csv").is_file()
    assert not modules & ({"scipy", "matplotlib", "gedp.api", "gedp.postprocess.jobframe", "gedp.postprocess.wls"}
                          | RELEASE_BUILDERS)


def test_a_manager_report_loads_no_config_and_no_release_builder(release, tmp_path):
    """Once the release's verdict is kept (the first checked read solves it again from its answers with
    its config: ``release.resolved``), a report loads no config and no release builder."""
    first = command_loaded("report", str(release), "--out", "first.html", cwd=tmp_path)
    assert "gedp.config" in first  # the first read's re-solve (the power of what follows)
    modules = command_loaded("report", str(release), "--out", "report.html", cwd=tmp_path)
    assert (tmp_path / "report.html").is_file()
    # it checks the measurements (the pnc answers' tau: gedp.measure.mechanisms) and writes its page
    assert not modules & (RELEASE_BUILDERS - {"gedp.measure.mechanisms"} | {"gedp.postprocess.jobframe"})
