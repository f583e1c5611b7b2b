"""State-by-state protection: local and dask engines agree, states compose in parallel, streaming."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from gedp import configs
from gedp.cli import app
from gedp.engine import input_states, read_state
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()


@pytest.fixture(scope="module")
def two_states(tmp_path_factory):
    """Two small states as a folder of Parquet parts (one per state) and as one CSV file."""
    folder = tmp_path_factory.mktemp("input")
    parts = []
    for state, seed in (("09", 1), ("44", 2)):
        frame = generate_profile(load_profile("small"), n_establishments=1_200, rng=np.random.default_rng(seed))
        frame["state"] = state
        frame["estab_id"] = state + "-" + frame["estab_id"]
        parts.append(frame)
    (folder / "states.parquet").mkdir()
    for frame in parts:
        frame.to_parquet(folder / "states.parquet" / f"part-{frame['state'].iloc[0]}.parquet", index=False)
    pd.concat(parts).to_csv(folder / "states.csv", index=False)
    parts[1].to_parquet(folder / "alone.parquet", index=False)
    return folder


def protect(source, out, *extra):
    result = runner.invoke(
        app, ["protect", str(source), "--out", str(out), "--seed", "7", "--not-for-publication", *map(str, extra)]
    )
    assert result.exit_code == 0, result.output
    return json.loads((out / "manifest.json").read_text()), pd.read_parquet(out / "protected.parquet")


def test_reading_one_state_at_a_time(two_states):
    assert input_states(two_states / "states.parquet") == ({"09": ["09"], "44": ["44"]}, 2_400)
    assert input_states(two_states / "states.csv") == ({"09": ["09"], "44": ["44"]}, 2_400)
    one = read_state(two_states / "states.parquet", "44", ("m1emp", "wage"), ["44"])
    assert len(one) == 1_200 and set(one["state"]) == {"44"}


def test_states_are_protected_separately_and_compose_in_parallel(two_states, tmp_path):
    manifest, protected = protect(two_states / "states.parquet", tmp_path / "both")
    assert manifest["states"] == ["09", "44"] and manifest["establishments"] == 2_400
    planned = yaml.safe_load(configs.path("baseline").read_text())
    total = np.sqrt(sum(mu * mu for q in planned["queries"] for mu in q["mu"].values()))
    assert manifest["mu_total"] == pytest.approx(total)  # parallel composition: spent once
    assert set(manifest["per_state"]) == {"09", "44"}
    # SPEC section 4: tau = Phi^-1((1 - zeta)^(1 / (kc n))) with kc attributes measured and n the
    # state's establishments, at the state's share of zeta; evaluated in 50-digit arithmetic (mpmath)
    import mpmath

    kc = len(planned["attributes"])
    for state, tau in manifest["tau"].items():
        n = int((protected["state"] == state).sum())
        with mpmath.workdps(50):
            power = mpmath.power(1 - mpmath.mpf(manifest["zeta_per_state"]), mpmath.mpf(1) / (kc * n))
            closed_form = float(mpmath.sqrt(2) * mpmath.erfinv(2 * power - 1))
        assert tau == pytest.approx(closed_form, rel=1e-9), state
    tables = pd.read_csv(tmp_path / "both" / "qcew_tables.csv", dtype={"area_fips": str})
    assert set(tables.loc[tables["agglvl_code"] == 51, "area_fips"]) == {"09000", "44000"}
    # zeta is split so that both states' bounds hold together with probability 1 - zeta
    assert (1 - manifest["zeta_per_state"]) ** 2 == pytest.approx(1 - manifest["zeta"], rel=1e-14)
    # a state's noise depends only on the seed and its code: protecting it alone gives the same
    # psi answers (the pnc answers differ only through the wider zeta share of a lone state)
    alone_manifest, _ = protect(two_states / "alone.parquet", tmp_path / "alone")
    assert alone_manifest["zeta_per_state"] == manifest["zeta"]
    psi_answers = [
        pd.read_parquet(out / "measurements.parquet")
        .query("query == 'identity' and state == '44'")
        .sort_values(["attribute", "estab_id"])["released"]
        .to_numpy()
        for out in (tmp_path / "both", tmp_path / "alone")
    ]
    np.testing.assert_array_equal(*psi_answers)
    # CSV input: the same release
    _, from_csv = protect(two_states / "states.csv", tmp_path / "csv")
    np.testing.assert_array_equal(np.sort(from_csv["m1emp"].to_numpy()), np.sort(protected["m1emp"].to_numpy()))


def test_dask_engine_gives_the_local_release(two_states, tmp_path):
    _, local = protect(two_states / "states.parquet", tmp_path / "local")
    manifest, distributed = protect(two_states / "states.parquet", tmp_path / "dask", "--engine", "dask")
    assert manifest["engine"] == "dask"
    local, distributed = (frame.sort_values("estab_id").reset_index(drop=True) for frame in (local, distributed))
    pd.testing.assert_frame_equal(local.drop(columns="wage"), distributed.drop(columns="wage"), check_exact=False,
                                  rtol=1e-12)
    # Wages are fitted from the protected employment, whose round-off differences between the
    # engines (<= 1e-11) the fit's cell-level steps amplify: known, recorded in issue 13's note.
    np.testing.assert_allclose(local["wage"], distributed["wage"], rtol=1e-6, atol=1e-3)


def test_queries_spanning_states_are_refused(two_states, tmp_path):
    raw = yaml.safe_load(configs.path("employment").read_text())
    raw["queries"].append({"by": "total", "mu": {"m1emp": 0.1}})
    raw["mu_cap"] = 5
    config = tmp_path / "national.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["protect", str(two_states / "states.parquet"), "--config", str(config),
                                 "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "query total spans states" in result.output
    assert not (tmp_path / "r").exists()
    bad_engine = runner.invoke(app, ["protect", str(two_states / "alone.parquet"), "--engine", "spark",
                                     "--out", str(tmp_path / "s")])
    assert bad_engine.exit_code == 2 and "engine 'spark' is unknown" in bad_engine.output


def test_a_state_that_fails_to_write_stops_the_release(two_states, tmp_path, monkeypatch):
    """States are written while the next one is protected: a failed write of the first state is
    raised (not lost in the writing thread), the second state is not reported done, nothing is
    published and the staging folder is removed."""
    import gedp.engine
    from gedp.config import load_config

    write_parts, done = gedp.engine.write_parts, []

    def failing(release, staging, part, tables):
        if part == "09":
            raise OSError("disk full")
        write_parts(release, staging, part, tables)

    monkeypatch.setattr(gedp.engine, "write_parts", failing)
    with pytest.raises(OSError, match="disk full"):
        gedp.engine.protect_input(two_states / "states.parquet", load_config("baseline"), tmp_path / "out", seed=1,
                                  on_state=done.append)
    assert done == []
    assert list(tmp_path.iterdir()) == []
