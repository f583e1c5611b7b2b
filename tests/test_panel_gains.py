"""Gross job gains and losses of a panel release: the same as between the releases of its two
quarters made alone, each establishment's noise from its quarters, the command line and the API
one way, and the raw sums a count of the protected changes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.postprocess.gains import gains_losses
from gedp.release.reader import read_quarter
from gedp.running.panel_protect import quarter_seed
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile
from gedp.tabulation.panel_gains import between_releases, change_sd, establishment_variances

SEED = 7
FROM_TO = "2016Q1:2016Q2"


@pytest.fixture(scope="module")
def panel() -> pd.DataFrame:
    first = generate_profile(load_profile("small"), n_establishments=800, rng=np.random.default_rng(8))
    return synthesize_panel(first, quarter_range("2016Q1:2016Q3"), rng=np.random.default_rng(8))


@pytest.fixture(scope="module")
def folder(panel, tmp_path_factory):
    out = tmp_path_factory.mktemp("panel") / "release"
    gedp.protect(panel, seed=SEED, not_for_publication=True, allow_over_cap=True).write(out)
    return out


def test_gains_of_a_panel_release_are_those_between_its_quarters_released_alone(panel, folder, tmp_path):
    alone = []
    for qtr in (1, 2):
        rows = panel[(panel["year"] == 2016) & (panel["qtr"] == qtr)].reset_index(drop=True)
        alone.append(tmp_path / f"q{qtr}")
        gedp.protect(rows, seed=quarter_seed(SEED, (2016, qtr)), not_for_publication=True).write(alone[-1])
    expected = between_releases(*alone, "county,sector")
    got = gedp.read_release(folder).tabulate(by="county,sector", gains_losses=FROM_TO, moe=True)
    assert list(got.columns) == list(expected.columns)
    assert {"gains_corrected", "losses_corrected", "gains_moe", "losses_moe", "net_moe"} <= set(got.columns)
    pd.testing.assert_frame_equal(got, expected, rtol=1e-9)


def test_an_establishments_change_sd_sums_its_quarters_variances(panel, folder):
    first, second = (establishment_variances(folder, "m3emp", q) for q in ("2016Q1", "2016Q2"))
    sd = change_sd(first, second)
    present = {q: set(read_quarter(folder, q)["estab_id"]) for q in ("2016Q1", "2016Q2")}
    for estab in list(sd.index[:: max(1, len(sd) // 200)]):  # every 200th establishment, by brute force
        variance = sum(float(v[estab]) if estab in present[q] else 0.0
                       for v, q in ((first, "2016Q1"), (second, "2016Q2")))
        assert sd[estab] == pytest.approx(np.sqrt(variance), rel=1e-12)
    assert set(sd.index) == present["2016Q1"] | present["2016Q2"]
    assert (first > 0).all() and (second > 0).all()


def test_raw_gains_are_a_count_of_the_protected_changes(folder):
    before, after = (read_quarter(folder, q).set_index("estab_id")["m3emp"] for q in ("2016Q1", "2016Q2"))
    change = after.reindex(after.index.union(before.index), fill_value=0.0) - before.reindex(
        after.index.union(before.index), fill_value=0.0)
    total = gedp.read_release(folder).tabulate(by="total", gains_losses=FROM_TO)
    assert total["gains"].item() == pytest.approx(change.clip(lower=0).sum(), rel=1e-9)
    assert total["losses"].item() == pytest.approx((-change).clip(lower=0).sum(), rel=1e-9)
    assert not [c for c in total.columns if c.endswith("_moe")]  # margins only when asked


def test_corrected_sums_are_nearer_the_truth_than_the_raw_ones(panel, folder):
    truth = gains_losses(*(panel[(panel["year"] == 2016) & (panel["qtr"] == q)] for q in (1, 2)), "total")
    table = gedp.read_release(folder).tabulate(by="total", gains_losses=FROM_TO, moe=True)
    for name in ("gains", "losses"):
        assert abs(table[f"{name}_corrected"].item() - truth[name].item()) < \
            abs(table[name].item() - truth[name].item()) / 2


def test_the_command_line_gives_the_apis_table(folder, tmp_path):
    out = tmp_path / "gains.csv"
    run = CliRunner().invoke(app, ["tabulate", str(folder), "--by", "county,sector", "--gains-losses", FROM_TO,
                                   "--moe", "--out", str(out)])
    assert run.exit_code == 0, run.output
    api = gedp.read_release(folder).tabulate(by="county,sector", gains_losses=FROM_TO, moe=True)
    table = pd.read_csv(out, dtype={"state": str, "county": str, "sector": str})
    assert np.allclose(table["gains_corrected"], api["gains_corrected"]) and np.allclose(table["net_moe"],
                                                                                          api["net_moe"])


@pytest.mark.parametrize(("options", "rule"), [
    ({"gains_losses": FROM_TO, "quarter": "2016Q1"}, "give one of --quarter"),
    ({"gains_losses": "2016Q2:2016Q1"}, "must come after the first"),
    ({"gains_losses": "2016Q1:2017Q1"}, "quarter 2017Q1 is not in"),
    ({"gains_losses": FROM_TO, "where": "sector == '23'"}, "no --agglvl, --format or --where"),
])
def test_a_bad_gains_request_is_refused(folder, options, rule):
    with pytest.raises(InputError, match=rule):
        gedp.read_release(folder).tabulate(by="county", **options)
