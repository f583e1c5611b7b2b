"""Integer releases: controlled rounding keeps every establishment and every QCEW cell within its floor
and ceiling, checked with plain pandas group-bys; `gedp protect --integer` end to end."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.config import load_config
from gedp.errors import ConfigError
from gedp.postprocess.rounding import CellFamily, round_attribute
from gedp.synth.hierarchy import INDUSTRY_OF_STATE_LEVEL

ATTRIBUTES = ["m1emp", "m2emp", "m3emp", "wage"]


def qcew_cells(frame, attribute):
    """Every QCEW cell total (levels 51-58, 71-78) by plain pandas, keyed by level and group."""
    out = []
    for level, industry in INDUSTRY_OF_STATE_LEVEL.items():
        for county in (False, True):
            by = ["state", *(["county"] if county else []), *([industry] if industry else [])]
            sums = frame.groupby(by, observed=True)[attribute].sum()
            out.append(sums.set_axis([f"{level + 20 * county}:{'/'.join(map(str, k))}" for k in sums.index]))
    return pd.concat(out)


def outside_floor_and_ceiling(rounded, unrounded):
    return (rounded < np.floor(unrounded)) | (rounded > np.ceil(unrounded))


@pytest.fixture(scope="module")
def fractional(small_state):
    """The small state with every value made fractional (multiplied by random factors)."""
    rng = np.random.default_rng(11)
    frame = small_state.copy()
    for attribute in ATTRIBUTES:
        frame[attribute] = frame[attribute] * rng.uniform(0.5, 1.5, len(frame)) + rng.uniform(0, 1, len(frame))
    return frame


@pytest.mark.parametrize("attribute", ["m1emp", "wage"])
def test_every_establishment_and_qcew_cell_goes_to_its_floor_or_ceiling(fractional, attribute):
    family = CellFamily.of(fractional.drop(columns=ATTRIBUTES))
    values = fractional[attribute].to_numpy()
    rounded = round_attribute(values, family)
    assert np.array_equal(rounded, np.round(rounded))
    assert not outside_floor_and_ceiling(rounded, values).any()
    before, after = qcew_cells(fractional, attribute), qcew_cells(fractional.assign(**{attribute: rounded}), attribute)
    assert len(before) > 1_000 and not outside_floor_and_ceiling(after, before).any()
    # power: rounding each establishment to its nearest whole number breaks some cells
    naive = qcew_cells(fractional.assign(**{attribute: np.round(values)}), attribute)
    assert outside_floor_and_ceiling(naive, before).sum() > 10


def test_whole_values_stay_and_zero_stays_zero(small_state):
    family = CellFamily.of(small_state.drop(columns=ATTRIBUTES))
    values = small_state["m1emp"].to_numpy().copy()
    assert np.array_equal(round_attribute(values, family), values)  # already whole: unchanged
    values[::7] += 0.25
    rounded = round_attribute(values, family)
    assert np.array_equal(rounded[values == 0], values[values == 0])
    changed = np.flatnonzero(values != np.round(values))
    assert set(np.unique(rounded[changed] - np.floor(values[changed]))) <= {0.0, 1.0}


def test_config_key_and_override(tmp_path):
    assert load_config("baseline").integer is False
    assert load_config("baseline").with_integer(True).integer is True
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(load_config("baseline").source).read() + "integer: 1\n")
    with pytest.raises(ConfigError, match="integer must be true or false, got 1"):
        load_config(bad)


def test_protect_integer_rounds_the_release_of_the_same_noise(tmp_path, small_state):
    """Same seed, same noise: the integer release's employment is the plain release's rounded, and its
    wages are fitted on that rounded employment (what `tabulate --moe` recomputes) and rounded; tables
    agree with its microdata; the manifest reports the establishments moved; margins are still given."""
    data = tmp_path / "in.parquet"
    small_state.to_parquet(data)
    for name, flag in (("plain", "--no-integer"), ("whole", "--integer")):
        run = CliRunner().invoke(app, ["protect", str(data), "--out", str(tmp_path / name), "--seed", "3",
                                       "--not-for-publication", flag])
        assert run.exit_code == 0, run.output
    plain = pd.read_parquet(tmp_path / "plain" / "protected.parquet")
    whole = pd.read_parquet(tmp_path / "whole" / "protected.parquet")
    manifest = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert manifest["integer"] is True and json.loads((tmp_path / "plain" / "manifest.json").read_text())[
        "integer"] is False
    report = manifest["per_state"]["44"]["rounding"]
    tables = pd.read_csv(tmp_path / "whole" / "qcew_tables.csv", dtype={"area_fips": str, "industry_code": str})
    from gedp.postprocess.wages import fit_wages
    from gedp.release.reader import read_release

    _, answers = read_release(tmp_path / "whole")
    plain = plain.assign(wage=fit_wages(answers, whole.astype({a: float for a in ATTRIBUTES}),
                                        load_config("baseline").plan.psi).values)  # the unrounded wages it rounded
    for attribute in ATTRIBUTES:
        assert whole[attribute].dtype == np.int64
        assert not outside_floor_and_ceiling(whole[attribute], plain[attribute]).any()
        assert not outside_floor_and_ceiling(qcew_cells(whole, attribute), qcew_cells(plain, attribute)).any()
        assert report[attribute]["establishments_rounded_up"] == int((whole[attribute] > plain[attribute]).sum())
        assert report[attribute]["establishments_rounded_down"] == int((whole[attribute] < plain[attribute]).sum())
        assert report[attribute]["state_total_change"] == pytest.approx(
            whole[attribute].sum() - plain[attribute].sum(), abs=1e-6)
    state = tables[tables["agglvl_code"] == 51].iloc[0]
    assert state["month1_emplvl"] == whole["m1emp"].sum() and state["total_qtrly_wages"] == whole["wage"].sum()
    margins = CliRunner().invoke(app, ["tabulate", str(tmp_path / "whole"), "--by", "county", "--moe"])
    assert margins.exit_code == 0, margins.output
    table = pd.read_csv(pd.io.common.StringIO(margins.stdout.split("\n\n")[0]))
    assert (table["wage_moe"] > 0).all() and (table["m1emp_moe"] > 0).all()
    assert "whole numbers by controlled rounding" in CliRunner().invoke(
        app, ["protect", str(data), "--out", str(tmp_path / "again"), "--seed", "3", "--not-for-publication",
              "--integer"]).output
