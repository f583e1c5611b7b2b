"""Config sanity: a cap always applies, a query mu above the limit is refused (unless allowed) with
what it would release, and group-by keys are checked when the config is loaded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import gedp
from gedp import configs
from gedp.accounting.mu_limits import DEFAULT_MU_CAP, MAX_QUERY_MU
from gedp.cli import app
from gedp.config import parse_config
from gedp.errors import ConfigError
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()


def baseline(**changes):
    raw = yaml.safe_load(configs.path("baseline").read_text())
    raw.update(changes)
    return raw


@pytest.fixture(scope="module")
def microdata():
    return generate_profile(load_profile("small"), n_establishments=200, rng=np.random.default_rng(5))


def test_mu_typo_is_refused_with_what_it_would_release(tmp_path, microdata):
    raw = baseline()
    raw.pop("mu_cap")
    raw["queries"][0]["mu"]["m1emp"] = 70  # meant 0.70
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(raw))
    microdata.to_csv(tmp_path / "in.csv", index=False)
    result = runner.invoke(app, ["protect", str(tmp_path / "in.csv"), "--config", str(tmp_path / "typo.yaml"),
                                 "--out", str(tmp_path / "out"), "--seed", "1", "--not-for-publication"])
    assert result.exit_code == 2, result.output
    # sqrt psi, gamma 0.5: one noise sd above 36 employees is (sqrt(36) + 0.5 / 70)^2 - 36 = 0.0857
    width = (6 + 0.5 / 70) ** 2 - 36
    assert f"{width:.2g}" == "0.086"
    assert ("mu 70 of query identity on m1emp is above 2, the most one query may spend; at mu 70 an establishment "
            "of 36 employees would be released with noise sd 0.086 employees") in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_wage_mu_refusal_is_in_dollars():
    raw = baseline()
    raw["queries"][0]["mu"]["wage"] = 3.0
    with pytest.raises(ConfigError) as refused:
        parse_config(raw)
    width = (500_000**0.5 + 50 / 3.0) ** 2 - 500_000  # sqrt psi, wage gamma 50
    assert f"an establishment of 500,000 dollars would be released with noise sd {width:,.0f} dollars" in str(
        refused.value)


def test_large_mu_passes_when_allowed(microdata):
    raw = baseline(mu_cap=10)
    raw["queries"][0]["mu"]["m1emp"] = 2.5
    with pytest.raises(ConfigError, match="mu 2.5 of query identity on m1emp is above 2"):
        gedp.load(raw)
    with pytest.raises(ConfigError, match="is above 2"):
        gedp.protect(microdata, raw, seed=1, not_for_publication=True)
    assert gedp.load(raw, allow_large_mu=True).plan.identity_plan.mu["m1emp"] == 2.5
    release = gedp.protect(microdata, gedp.load(raw, allow_large_mu=True), seed=1, not_for_publication=True)
    assert release.manifest["mu"]["identity"]["m1emp"] == pytest.approx(2.5, rel=1e-9)


def test_the_limit_itself_is_accepted():
    raw = baseline(mu_cap=5)
    raw["queries"][0]["mu"]["m1emp"] = MAX_QUERY_MU
    assert parse_config(raw).plan.identity_plan.mu["m1emp"] == MAX_QUERY_MU


def test_a_config_without_mu_cap_gets_the_default_cap():
    raw = baseline()
    raw.pop("mu_cap")
    assert parse_config(raw).plan.cap == DEFAULT_MU_CAP
    raw["queries"].append({"by": "total", "mu": {"m1emp": 0.9, "m2emp": 0.9}})
    total = math.sqrt(3 * 1.74 + 0.10 + 2 * 0.9**2)  # the baseline's 3 x 1.74 + 0.10 (its comment), and the new query
    with pytest.raises(ConfigError) as refused:
        parse_config(raw)
    assert f"planned total mu ({total:.4f}) exceeds 2.5, the cap of a config without mu_cap" in str(refused.value)


@pytest.mark.parametrize("by, column", [(["year"], "year"), (["state", "qtr"], "qtr"), ("state,year", "year")])
def test_group_by_carried_columns_is_refused_at_load(tmp_path, microdata, by, column):
    raw = baseline()
    raw["queries"][1]["by"] = by
    with pytest.raises(ConfigError, match=f"queries\\[2\\].by: '{column}' is not a public column to group by"):
        parse_config(raw)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(raw))
    microdata.assign(year=2016, qtr=1).to_csv(tmp_path / "in.csv", index=False)
    ledger = tmp_path / "ledger.json"
    result = runner.invoke(app, ["protect", str(tmp_path / "in.csv"), "--config", str(tmp_path / "plan.yaml"),
                                 "--out", str(tmp_path / "out"), "--ledger", str(ledger), "--lifetime-cap", "5"])
    assert result.exit_code == 2, result.output
    assert f"'{column}' is not a public column to group by" in result.output
    assert not ledger.exists() and not (tmp_path / "out").exists()  # refused before any budget was reserved


@pytest.mark.parametrize("line, written, key", [
    ("  m1emp: {gamma: 0.5}", "  m1emp: {gamma: 050}", "gamma"),  # YAML 1.1: octal, 40
    ("  m1emp: {gamma: 0.5}", "  m1emp: {gamma: 1:30}", "gamma"),  # base 60: 90
    ("psi: {name: sqrt, a: 0}", "psi: {name: sqrt, a: 010}", "a"),  # octal: 8
    ("mu_cap: 2.29", "mu_cap: 2_307", "mu_cap"),  # 2307
    ("mu_cap: 2.29", "mu_cap: 0b10", "mu_cap"),  # binary: 2
    ("zeta: 0.01", "zeta: 00.01", "zeta"),
    ("    mu: {m1emp: 0.7, m2emp: 0.7, m3emp: 0.7}", "    mu: {m1emp: 0.7, m2emp: 0_7, m3emp: 0.7}", "m2emp"),
])
def test_yaml_1_1_number_forms_are_refused_naming_the_key(tmp_path, line, written, key):
    """Numbers PyYAML reads by YAML 1.1 as other numbers than they show (050 as 40, 1:30 as 90) are
    refused, naming the key and its line; the shipped file itself loads (the line is really there)."""
    text = configs.path("employment").read_text()
    assert line in text
    number = next(i for i, row in enumerate(text.splitlines(), start=1) if row == line)
    path = tmp_path / "plan.yaml"
    path.write_text(text.replace(line, written, 1))
    with pytest.raises(ConfigError, match=f"key '{key}' at line {number}: .* is a YAML 1.1 number"):
        gedp.load(str(path))
    path.write_text(text)
    assert gedp.load(str(path)).raw["mu_cap"] == 2.29


def test_plain_numbers_still_load_and_a_list_s_yaml_1_1_number_is_refused(tmp_path):
    from gedp.config import load_config

    text = configs.path("employment").read_text()
    path = tmp_path / "plan.yaml"
    path.write_text(text.replace("  m1emp: {gamma: 0.5}", "  m1emp: {gamma: 0x1}").replace("zeta: 0.01", "zeta: .01"))
    loaded = load_config(path)
    assert loaded.plan.gammas["m1emp"] == 1 and loaded.raw["zeta"] == 0.01
    path.write_text(text + "extra: [1, 010]\n")
    with pytest.raises(ConfigError, match="line 2[0-9]: '010' is a YAML 1.1 number"):
        load_config(path)


#: YAML 1.1 booleans PyYAML reads as true or false and YAML 1.2 as text (red team of session 22, F8:
#: `integer: on` loaded as True), in the cases PyYAML resolves.
YAML11_BOOLEANS = ["on", "On", "ON", "off", "Off", "OFF", "yes", "Yes", "YES", "no", "No", "NO"]


@pytest.mark.parametrize("word", YAML11_BOOLEANS)
def test_yaml_1_1_booleans_are_refused_naming_the_key_and_line(tmp_path, word):
    text = configs.path("employment").read_text()
    number = len(text.splitlines()) + 1
    path = tmp_path / "plan.yaml"
    path.write_text(text + f"integer: {word}\n")
    with pytest.raises(ConfigError, match=f"key 'integer' at line {number}: '{word}' is a YAML 1.1 boolean.*"
                                          "write true or false") as refused:
        gedp.load(str(path))
    assert "\n" not in str(refused.value)
    for where in (f"extra: [1, {word}]\n", f"{word}: 1\n"):  # in a list, as a key: refused with the line
        path.write_text(text + where)
        with pytest.raises(ConfigError, match=f"line {number}: '{word}' is a YAML 1.1 boolean"):
            gedp.load(str(path))


@pytest.mark.parametrize("word, value", [("true", True), ("True", True), ("TRUE", True), ("false", False),
                                         ("False", False), ("FALSE", False)])
def test_yaml_1_2_booleans_still_load(tmp_path, word, value):
    """Power: the booleans YAML 1.2 reads as booleans load as before."""
    path = tmp_path / "plan.yaml"
    path.write_text(configs.path("employment").read_text() + f"integer: {word}\n")
    assert gedp.load(str(path)).integer is value


def test_a_shipped_name_that_is_also_a_local_file_is_refused_as_ambiguous(tmp_path, microdata, monkeypatch):
    """`--config recommended` beside a file named `recommended` (here the employment plan) read the
    file (manifest "custom", summary silent); now refused in one line, nothing written (gedp protect
    as a child process, as a user runs it); `--config ./recommended` reads the file (through the
    command line's runner, in the same working folder)."""
    import json
    import subprocess
    import sys

    (tmp_path / "recommended").write_text(configs.path("employment").read_text())
    microdata.to_parquet(tmp_path / "s.parquet")
    arguments = ["protect", "s.parquet", "--seed", "1", "--not-for-publication", "--config"]

    refused = subprocess.run([sys.executable, "-m", "gedp", *arguments, "recommended", "--out", "r1"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: config 'recommended' is both a shipped config and a file in the working folder; "
        "write ./recommended for the file, or rename it"]
    assert not (tmp_path / "r1").exists()
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, [*arguments, "./recommended", "--out", "r2"])
    assert done.exit_code == 0, done.output
    manifest = json.loads((tmp_path / "r2" / "manifest.json").read_text())
    assert manifest["config_name"] == "custom" and "wage" not in manifest["config"]["attributes"]
