"""A panel release in the lifetime ledger: all its quarters reserved as one release before any noise
is drawn (refused past a cap with nothing charged or written), committed once complete, and
copies of its records drawing on the same accounts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import gedp
from gedp.accounting.ledger_file import establishment_keys, live, read_ledger
from gedp.accounting.ledger_spending import spending
from gedp.cli import app
from gedp.config import load_config
from gedp.errors import InputError
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()
ANNUAL_CAP = 2.3065
QUARTER_MU = load_config("recommended").plan.budget().total  # a quarter of the recommended plan
QUARTERS = ["2016Q1", "2016Q2", "2016Q3", "2016Q4", "2017Q1"]


@pytest.fixture(scope="module")
def panel() -> pd.DataFrame:
    first = generate_profile(load_profile("small"), n_establishments=400, rng=np.random.default_rng(3))
    return synthesize_panel(first, quarter_range("2016Q1:2017Q1"), rng=np.random.default_rng(3))


@pytest.fixture(scope="module")
def half_config(tmp_path_factory) -> str:
    """The recommended config with every mu halved: four quarters spend the recommended total; its
    cap, the five quarters' (a panel over the cap is refused)."""
    raw = yaml.safe_load(open(load_config("recommended").source))
    for query in raw["queries"]:
        query["mu"] = {attribute: mu / 2 for attribute, mu in query["mu"].items()}
    raw["mu_cap"] = math.ceil(math.sqrt(5) * QUARTER_MU / 2 * 1e3) / 1e3
    path = tmp_path_factory.mktemp("config") / "half.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def protect(data, out, ledger, *options):
    return runner.invoke(app, ["protect", str(data), "--out", str(out), "--ledger", str(ledger), *map(str, options)])


def lifetime_spending(ledger, ids) -> np.ndarray:
    """Each id's lifetime spending recomputed from the ledger's key files (0 without a ledger)."""
    if not ledger.exists():
        return np.zeros(len(ids))
    book = read_ledger(ledger)
    keys = np.concatenate([establishment_keys([estab], book["key"]) for estab in ids])
    return np.sqrt(spending(ledger, book, keys).lifetime)


def test_a_year_of_quarters_fits_the_cap_at_half_the_recommended_mu_only():
    assert math.sqrt(4) * QUARTER_MU / 2 <= ANNUAL_CAP < math.sqrt(4) * QUARTER_MU


def test_a_panel_past_the_annual_cap_is_refused_whole_with_nothing_charged_or_written(panel, tmp_path):
    data, ledger = tmp_path / "panel.parquet", tmp_path / "books" / "ledger.json"
    ledger.parent.mkdir()
    panel.to_parquet(data)
    refused = protect(data, tmp_path / "release", ledger, "--lifetime-cap", 10, "--annual-cap", ANNUAL_CAP,
                      "--allow-over-cap")
    assert refused.exit_code == 2, refused.output
    needs = 2 * QUARTER_MU  # four quarters of a year at the quarter's mu, composed
    assert f"annual cap {ANNUAL_CAP:.4f} in the year 2016Q" in refused.output
    assert f"mu {ANNUAL_CAP:.4f} of {ANNUAL_CAP:.4f} left" in refused.output and f"{needs:.4f}" in refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["books", "panel.parquet"]
    assert not ledger.exists() or live(read_ledger(ledger)) == []
    assert lifetime_spending(ledger, panel["estab_id"].unique()).max() == 0.0


def test_a_panel_at_half_the_mu_is_one_release_and_copies_draw_on_its_accounts(panel, half_config, tmp_path):
    data, ledger = tmp_path / "panel.parquet", tmp_path / "ledger.json"
    panel.to_parquet(data)
    done = protect(data, tmp_path / "release", ledger, "--config", half_config, "--lifetime-cap", 10,
                   "--annual-cap", ANNUAL_CAP)
    assert done.exit_code == 0, done.output
    releases = live(read_ledger(ledger))
    assert len(releases) == 1 and releases[0]["status"] == "committed"
    assert [q for q, _ in releases[0]["quarters"]] == QUARTERS
    assert [n for _, n in releases[0]["quarters"]] == panel.groupby(["year", "qtr"]).size().tolist()
    # an establishment in k quarters is charged sqrt(k) x the quarter's mu, recomputed by brute force
    counts = panel.groupby("estab_id").size()
    expected = np.sqrt(counts.to_numpy()) * QUARTER_MU / 2
    assert np.allclose(lifetime_spending(ledger, counts.index), expected, rtol=1e-9)
    lifetime = gedp.read_release(tmp_path / "release").manifest["lifetime"]
    assert lifetime["largest_charge"] == pytest.approx(math.sqrt(5) * QUARTER_MU / 2, rel=1e-9)
    assert f"this release charged mu {math.sqrt(5) * QUARTER_MU / 2:.4f}" in " ".join(done.output.split())

    # the last quarter again, on its own, from an edited copy (ids padded and spaced, wages dropped)
    last = panel[(panel["year"] == 2017) & (panel["qtr"] == 1)].drop(columns=["wage"])
    last = last.assign(estab_id=" 00" + last["estab_id"].astype(str).str.lower() + " ")
    last.to_csv(tmp_path / "2017q1-revised.csv", index=False)
    config = ["--config", "employment"]  # employment only, as the copy has it
    again = protect(tmp_path / "2017q1-revised.csv", tmp_path / "again", ledger, *config)
    assert again.exit_code == 2 and "annual cap 2.3065 in the year" in " ".join(again.output.split())
    # a renamed copy of the whole panel, rows shuffled
    copy = tmp_path / "renamed.parquet"
    panel.sample(frac=1.0, random_state=1).to_parquet(copy)
    twice = protect(copy, tmp_path / "twice", ledger, "--config", half_config)
    assert twice.exit_code == 2 and "release refused" in " ".join(twice.output.split())
    assert not (tmp_path / "again").exists() and not (tmp_path / "twice").exists()
    assert len(live(read_ledger(ledger))) == 1


def test_the_api_reserves_a_panel_once(panel, half_config, tmp_path):
    ledger = tmp_path / "ledger.json"
    release = gedp.protect(panel, half_config, ledger=gedp.Ledger(ledger, lifetime_cap=10, annual_cap=ANNUAL_CAP))
    assert release.manifest["lifetime"]["quarters"] == QUARTERS
    assert "lifetime" not in release.manifest["per_quarter"]["2016Q1"]
    with pytest.raises(InputError, match="over their annual cap"):
        gedp.protect(panel, half_config, ledger=gedp.Ledger(ledger))
    assert len(live(read_ledger(ledger))) == 1


def test_the_fifth_quarter_past_the_lifetime_cap_of_a_years_panel_is_refused(panel, half_config, tmp_path):
    """A year (four quarters at half the mu) spends a lifetime cap of 2.3065; the next quarter of
    the same establishments, released on its own, is refused with what is left stated."""
    year, ledger = tmp_path / "2016.parquet", tmp_path / "ledger.json"
    panel[panel["year"] == 2016].to_parquet(year)
    done = protect(year, tmp_path / "release-2016", ledger, "--config", half_config, "--lifetime-cap", ANNUAL_CAP,
                   "--annual-cap", ANNUAL_CAP)
    assert done.exit_code == 0, done.output
    fifth = tmp_path / "2017q1.parquet"
    panel[panel["year"] == 2017].to_parquet(fifth)
    refused = protect(fifth, tmp_path / "release-2017q1", ledger, "--config", half_config, "--lifetime-cap",
                      ANNUAL_CAP)  # the cap of its openings; the others' is recorded
    text = " ".join(refused.output.split())
    spent = math.sqrt(4) * QUARTER_MU / 2
    left = math.sqrt(ANNUAL_CAP**2 - spent**2)
    assert refused.exit_code == 2 and f"over their lifetime cap {ANNUAL_CAP:.4f}" in text, text
    assert f"they have mu {left:.4f} of {ANNUAL_CAP:.4f} left" in text and f"charge {QUARTER_MU / 2:.4f}" in text
    assert not (tmp_path / "release-2017q1").exists() and len(live(read_ledger(ledger))) == 1


def test_a_panel_that_fails_after_its_reservation_stays_pending_and_says_so(panel, tmp_path):
    broken = panel.copy()
    broken.loc[broken.index[-1], "wage"] = -1.0  # a row of the last quarter, checked when it is protected
    ledger = tmp_path / "ledger.json"
    with pytest.raises(InputError, match="wage.*>= 0.*stays pending in ledger"):
        gedp.protect(broken, ledger=gedp.Ledger(ledger, lifetime_cap=10), allow_over_cap=True)
    releases = live(read_ledger(ledger))
    assert len(releases) == 1 and releases[0]["status"] == "pending"


def test_a_bad_request_is_refused_before_the_ledger_is_touched(panel, tmp_path):
    from gedp.api import load
    from gedp.running.panel_protect import protect_panel
    from gedp.running.recorded_release import LedgerRequest

    ledger = tmp_path / "ledger.json"
    with pytest.raises(InputError, match="engine 'bogus' is unknown"):
        protect_panel(panel, load(), tmp_path / "release", ledger=LedgerRequest(ledger, 10.0), engine="bogus",
                      allow_over_cap=True)
    assert not ledger.exists() and not (tmp_path / "release").exists()
