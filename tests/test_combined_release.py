"""Releases under the combined psi (configs/establishment-and-worker.yaml) and its intervals on the
command line."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from gedp import configs
from gedp.cli import app
from gedp.config import load_config
from gedp.errors import ConfigError
from gedp.measure.neighbors import SqrtLinearPsi
from gedp.measure.queries import query_name

runner = CliRunner()


def run_cli(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def state_file(tmp_path_factory, small_state):
    path = tmp_path_factory.mktemp("state") / "state.parquet"
    small_state.to_parquet(path, index=False)
    return path


@pytest.mark.parametrize("workflow", ["pnc", "psi"])
def test_release_with_the_combined_psi(tmp_path, state_file, workflow):
    """`gedp protect --config establishment-and-worker`: byte-identical reruns with one seed, the psi in
    the manifest, the same charges as the employment plan it adapts, and margins of error."""
    releases = []
    for name in ("a", "b"):
        out = tmp_path / name
        run_cli("protect", state_file, "--config", "establishment-and-worker", "--workflow", workflow, "--seed", 5,
                "--not-for-publication", "--out", out)
        releases.append(out)
    files = [sorted((p.relative_to(out).as_posix(), p.read_bytes()) for p in out.rglob("*")
                    if p.is_file() and p.name != "manifest.json") for out in releases]
    assert len(files[0]) >= 3 and files[0] == files[1]
    manifest = json.loads((releases[0] / "manifest.json").read_text())
    assert manifest["psi"] == {"name": "sqrt-linear", "gamma_sqrt": 0.5, "d": 1.0}
    assert manifest["gammas"] == {"m1emp": 1.0, "m2emp": 1.0, "m3emp": 1.0}
    assert {r["status"] for r in manifest["solver"].values()} == {"optimal"}
    employment = yaml.safe_load(configs.path("employment").read_text())
    planned = {query_name(load_config("employment").plan.queries[i].by): q["mu"]
               for i, q in enumerate(employment["queries"])}
    assert set(manifest["mu"]) == set(planned)
    for query, mus in planned.items():  # charged as planned (pnc's charge max Delta_g / sd_g is within rounding)
        assert manifest["mu"][query] == pytest.approx(mus, rel=1e-12)
    assert manifest["mu_total"] == pytest.approx(math.sqrt(sum(m * m for q in planned.values() for m in q.values())))
    protected = pd.read_parquet(releases[0] / "protected.parquet")
    assert (protected[["m1emp", "m2emp", "m3emp"]].to_numpy() >= 0).all()
    table = tmp_path / "county.csv"
    run_cli("tabulate", releases[0], "--by", "county", "--moe", "--out", table)
    margins = pd.read_csv(table)
    moe = margins.filter(like="moe")
    assert moe.shape[1] == 3 and np.isfinite(moe.to_numpy()).all() and (moe.to_numpy() > 0).all()


def test_interval_command_takes_the_combined_psi():
    """gamma defaults to 1 for sqrt-linear; I(0) = [0, d]: one worker hidden even at size 0."""
    result = run_cli("interval", "--psi", "sqrt-linear", "--gamma-sqrt", 0.25, "--d", 1, "--json", 0, 4, 36)
    rows = json.loads(result.output)["intervals"]
    assert json.loads(result.output)["gamma"] == 1.0
    psi = SqrtLinearPsi(0.25, 1.0)
    lower, upper = psi.interval(np.array([0.0, 4.0, 36.0]), 1.0)
    assert [r["lower"] for r in rows] == pytest.approx(lower) and [r["upper"] for r in rows] == pytest.approx(upper)
    assert (rows[0]["lower"], rows[0]["upper"]) == (0.0, 1.0)  # the linear piece: x / d moves by gamma = 1
    # 36 on the sqrt piece: (sqrt 36 -/+ 0.25)^2, the sqrt interval with gamma_sqrt
    assert (rows[2]["lower"], rows[2]["upper"]) == pytest.approx((5.75**2, 6.25**2))


def _combined_config(tmp_path, psi):
    """The establishment-and-worker plan with its psi written as ``psi``."""
    raw = yaml.safe_load(configs.path("establishment-and-worker").read_text())
    path = tmp_path / "combined.yaml"
    path.write_text(yaml.safe_dump({**raw, "psi": psi}))
    return path


COMBINED = {"name": "combined", "parts": [{"name": "sqrt", "gamma": 0.5}, {"name": "linear", "d": 1}], "rule": "min"}


def test_release_with_a_combined_psi_config_is_the_closed_form_release(tmp_path, state_file):
    """`psi: {name: combined, parts: [sqrt gamma 0.5, linear d 1], rule: min}` releases exactly what
    sqrt-linear (gamma_sqrt 0.5, d 1) releases with the same seed: every file byte for byte."""
    outs = {}
    for name, config in (("combined", _combined_config(tmp_path, COMBINED)), ("closed", "establishment-and-worker")):
        outs[name] = tmp_path / name
        run_cli("protect", state_file, "--config", config, "--seed", 5, "--not-for-publication", "--out", outs[name])
    files = {name: sorted((p.relative_to(out).as_posix(), p.read_bytes()) for p in out.rglob("*")
                          if p.is_file() and p.name != "manifest.json") for name, out in outs.items()}
    assert len(files["closed"]) >= 3 and files["combined"] == files["closed"]
    manifest = json.loads((outs["combined"] / "manifest.json").read_text())
    assert manifest["psi"] == {"name": "sqrt-linear", "gamma_sqrt": 0.5, "d": 1.0}


@pytest.mark.parametrize("gamma_sqrt, d, linear_gamma", [(0.5, 1.0, 1.0), (0.25, 2.0, 1.5), (2.0, 0.5, 3.0)])
def test_combined_psi_config_intervals_match_the_closed_form(tmp_path, gamma_sqrt, d, linear_gamma):
    """Min of sqrt (distance g) and linear (d, distance h) is psi*(x) = x / (d h) up to the knot
    (d h)^2 / (4 g^2), sqrt(x) / g - d h / (4 g^2) beyond; with gamma* = 1 the interval is x -/+ d h
    while both ends stay on the linear piece and (sqrt(x) -/+ g)^2 while both stay on the sqrt piece.
    The parts' order does not matter."""
    parts = [{"name": "linear", "d": d, "gamma": linear_gamma}, {"name": "sqrt", "gamma": gamma_sqrt}]
    psi = load_config(_combined_config(tmp_path, {"name": "combined", "parts": parts})).plan.psi
    width = d * linear_gamma
    knot = width**2 / (4 * gamma_sqrt**2)
    linear = np.array([1.5 * width, 0.5 * (knot - width) + width]) if knot > 2 * width else np.array([])
    lower, upper = psi.interval(linear, 1.0)
    np.testing.assert_allclose(lower, linear - width, rtol=1e-12)
    np.testing.assert_allclose(upper, linear + width, rtol=1e-12)
    far = np.array([4.0, 100.0, 1e6]) * (math.sqrt(knot) + 2 * gamma_sqrt) ** 2
    lower, upper = psi.interval(far, 1.0)
    np.testing.assert_allclose(lower, (np.sqrt(far) - gamma_sqrt) ** 2, rtol=1e-12)
    np.testing.assert_allclose(upper, (np.sqrt(far) + gamma_sqrt) ** 2, rtol=1e-12)


@pytest.mark.parametrize("psi, message", [
    ({**COMBINED, "rule": "max"}, "psi combined cannot be used in a release"),
    ({"name": "combined", "parts": [{"name": "sqrt", "gamma": 0.5}, {"name": "log", "a": 1}]},
     "psi combined cannot be used in a release"),
    ({"name": "combined", "parts": [{"name": "sqrt", "a": 1}, {"name": "linear"}]},
     "psi combined cannot be used in a release"),
    ({**COMBINED, "rule": "mean"}, "psi: rule 'mean' is unknown; choose min"),
    ({"name": "combined", "parts": [{"name": "sqrt"}]}, "psi.parts must be a list of two psi mappings"),
    ({"name": "combined"}, "psi: missing key 'parts'"),
    ({**COMBINED, "weight": 2}, "psi: unknown key 'weight'"),
    ({"name": "combined", "parts": [{"name": "sqrt", "gamma": 0}, {"name": "linear"}]},
     "the gammas of a combined psi must be > 0"),
    ({"name": "combined", "parts": [{"name": "sqrt"}, COMBINED]}, r"psi.parts\[2\] must be a mapping with the 'name'"),
    ({"name": "combined", "parts": [{"name": "sqrt"}, {"name": "linear", "e": 2}]},
     r"psi.parts\[2\]: psi 'linear' takes parameters \['d'\]"),
    ({"name": "combined", "parts": [{"name": "sqrt", "gamma": "x"}, {"name": "linear"}]},
     r"psi.parts\[1\].gamma must be a finite number"),
])
def test_combined_psi_configs_are_checked(tmp_path, psi, message):
    """Numeric combinations (no closed form: a float error bound is missing) and malformed ones are
    refused with the rule they break."""
    with pytest.raises(ConfigError, match=message):
        load_config(_combined_config(tmp_path, psi))
