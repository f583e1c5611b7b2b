"""The Python API (gedp.api): the README's example, run as written, and its contracts."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import gedp
from gedp import errors
from gedp.errors import GedpError, InputError

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The README's Python example (its one python block)."""
    return re.search(r"```python\n(.*?)```", README.read_text(), flags=re.S).group(1)


def test_the_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    release = namespace["release"]
    assert isinstance(release, gedp.Release) and (tmp_path / "my-release" / "manifest.json").is_file()
    table = release.tabulate(by=["county", "naics3"], moe=True)
    assert {"m1emp_moe", "wage_moe"} <= set(table.columns) and (table["m1emp_moe"] > 0).all()
    again = gedp.read_release(tmp_path / "my-release")
    pd.testing.assert_frame_equal(again.microdata, release.microdata)


@pytest.fixture(scope="module")
def release():
    micro = gedp.synthesize(profile="small", establishments=3_000, seed=2)
    return micro, gedp.protect(micro, config="employment")


def test_protect_gives_a_publishable_release_of_every_establishment(release):
    micro, protected = release
    assert protected.manifest["publishable"] is True and protected.manifest["config_name"] == "employment"
    assert sorted(protected.microdata["estab_id"]) == sorted(micro["estab_id"])
    assert (protected.microdata[["m1emp", "m2emp", "m3emp"]] >= 0).all().all()
    assert "wage" not in protected.microdata  # employment measures employment only


def test_tabulations_add_up_and_margins_are_the_covariance(release):
    micro, protected = release
    total = protected.tabulate("total")
    by_county = protected.tabulate(by=["county"])
    assert total["m1emp"].iloc[0] == pytest.approx(by_county["m1emp"].sum(), rel=1e-12)
    assert int(total["estabs"].iloc[0]) == len(micro)
    # margins z sqrt(Var + (z g / 2)^2) (postprocess.moe): (margin / z)^2 is linear in z^2, with
    # intercept Var > 0 and slope (g / 2)^2 >= 0; two levels fix it, a third must follow it
    from scipy import stats
    z = {level: stats.norm.ppf(0.5 + level / 2) for level in (0.5, 0.8, 0.95)}
    squared = {level: (protected.tabulate(by=["county"], moe=True, level=level)["m1emp_moe"] / z[level]) ** 2
               for level in z}
    slope = (squared[0.95] - squared[0.5]) / (z[0.95] ** 2 - z[0.5] ** 2)
    variance = squared[0.5] - slope * z[0.5] ** 2
    assert np.all(slope >= -1e-12) and np.all(variance > 0)
    np.testing.assert_allclose(squared[0.8], variance + slope * z[0.8] ** 2, rtol=1e-9)
    selected = protected.tabulate(by=["county"], where="sector == '44-45'")
    assert selected["estabs"].sum() == (protected.microdata["sector"] == "44-45").sum()


def test_configs_come_as_names_paths_or_mappings(release, tmp_path):
    import yaml

    from gedp import configs

    raw = yaml.safe_load(configs.path("employment").read_text())
    assert gedp.load(raw).plan.budget().total == pytest.approx(gedp.load("employment").plan.budget().total)
    assert gedp.load(configs.path("employment"), workflow="psi").plan.workflow == "psi"
    with pytest.raises(InputError):
        gedp.load({"attributes": {}})


def test_seeds_need_not_for_publication(release):
    micro, _ = release
    with pytest.raises(InputError, match="not-for-publication"):
        gedp.protect(micro, config="employment", seed=3)
    test = gedp.protect(micro, config="employment", seed=3, not_for_publication=True)
    again = gedp.protect(micro, config="employment", seed=3, not_for_publication=True)
    assert test.manifest["publishable"] is False
    pd.testing.assert_frame_equal(test.microdata, again.microdata)


def test_interval_matches_the_closed_form():
    table = gedp.interval([3, 36, 360], psi="sqrt", gamma=0.5)
    np.testing.assert_allclose(table["upper"], (np.sqrt([3, 36, 360]) + 0.5) ** 2)
    np.testing.assert_allclose(table["lower"], (np.sqrt([3, 36, 360]) - 0.5) ** 2)


def test_every_user_facing_error_derives_from_one_base():
    from gedp.config import ConfigError
    from gedp.evaluation.baselines.suppression import AuditError
    from gedp.measure.budget import BudgetError
    from gedp.postprocess.wls import SolverError
    from gedp.synth.schema import InputError as SchemaInputError

    for error in (ConfigError, BudgetError, AuditError, SolverError, SchemaInputError):
        assert issubclass(error, GedpError) and error.__module__ == errors.__name__
    assert SchemaInputError is InputError


def test_run_and_protect_write_one_manifest_schema(small_release, tmp_path):
    """Before: gedp run and gedp protect built manifest.json in two places with different schemas."""
    from typer.testing import CliRunner

    from gedp.cli import app
    from gedp.release.manifest import Manifest
    from gedp.release.reader import read_manifest

    run_dir, _ = small_release
    source = tmp_path / "in.parquet"
    gedp.read_release(run_dir).microdata.to_parquet(source)  # any microdata will do
    result = CliRunner().invoke(app, ["protect", str(source), "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    run, protect = read_manifest(run_dir), read_manifest(tmp_path / "p")
    assert run.keys() == protect.keys() and set(run) <= set(Manifest.__annotations__)
    assert isinstance(run["ledger"], dict) and isinstance(protect["ledger"], dict)
    assert run["mu_total"] <= run["mu_planned_total"] * (1 + 1e-9)


def test_the_manifest_states_the_guarantee_in_mu_rho_and_epsilon(release, small_release):
    """Before: no (epsilon, delta) in the manifest nor on Release. The privacy block gives the total
    and each attribute's mu (its queries' charges composed), rho = mu^2 / 2, and epsilon at three deltas."""
    from scipy import stats

    _, protected = release
    manifest, privacy = protected.manifest, protected.privacy
    assert privacy == manifest["privacy"] and privacy["mu"] == manifest["mu_total"]
    charges: dict[str, list[float]] = {}
    for by_attribute in manifest["mu"].values():
        for attribute, mu in by_attribute.items():
            charges.setdefault(attribute, []).append(mu)
    assert set(privacy["attributes"]) == set(charges) == {"m1emp", "m2emp", "m3emp"}
    for guarantee, mu in [(privacy, manifest["mu_total"])] + [
            (privacy["attributes"][a], float(np.sqrt(np.sum(np.square(m))))) for a, m in charges.items()]:
        assert guarantee["mu"] == pytest.approx(mu, rel=1e-12) and guarantee["rho"] == pytest.approx(mu**2 / 2)
        for delta, eps in guarantee["epsilon"].items():  # Dong, Roth & Su's delta(eps), evaluated here
            back = stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
            assert back == pytest.approx(float(delta), rel=1e-6)
    # the baseline plan (gedp run): mu 2.3065 is epsilon 11.93 at 1e-5 and 13.08 at 1e-6 (dp-accounting's PLD)
    baseline = gedp.read_release(small_release[0]).privacy
    assert (round(baseline["epsilon"]["1e-05"], 2), round(baseline["epsilon"]["1e-06"], 2)) == (11.93, 13.08)
    assert set(baseline["epsilon"]) == {"1e-05", "1e-06", "1e-09"}
