"""A panel spends no more than its config's cap unless the user says so, and its budget is stated
once, the same everywhere: the manifest, the command's summary and `gedp ledger show` give the
panel's charge sqrt(k) x a quarter's mu (k: the most quarters an establishment is in); a refused
release leaves no lock file beside the ledger."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.config import load_config, parse_config
from gedp.errors import BudgetError
from gedp.measure.design import INDEPENDENT
from gedp.planning import shapes
from gedp.planning.shapes import Allocation, Shape
from gedp.running.panel_protect import over_cap
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()


def yaml_total(name: str) -> float:
    """A shipped config's total mu from its YAML: sqrt of the sum of every query's mu^2."""
    raw = yaml.safe_load(open(load_config(name).source))
    return math.sqrt(sum(mu**2 for query in raw["queries"] for mu in query["mu"].values()))


RECOMMENDED = yaml_total("recommended")
RECOMMENDED_CAP = yaml.safe_load(open(load_config("recommended").source))["mu_cap"]


@pytest.fixture(scope="module")
def panel():
    first = generate_profile(load_profile("small"), n_establishments=400, rng=np.random.default_rng(4))
    return synthesize_panel(first, quarter_range("2016Q1:2016Q3"), rng=np.random.default_rng(4))


def test_a_panel_over_its_configs_cap_is_refused_before_the_ledger(panel, tmp_path):
    ledger = tmp_path / "books.json"
    panel_mu = math.sqrt(3) * RECOMMENDED
    assert panel_mu > RECOMMENDED_CAP  # three quarters of the recommended plan: over its cap
    with pytest.raises(BudgetError, match=rf"spends mu {panel_mu:.4f} .*sqrt\(3\) x {RECOMMENDED:.4f} a quarter.*"
                                          rf"over the config's mu_cap {RECOMMENDED_CAP:.4f}.*--allow-over-cap"):
        gedp.protect(panel, ledger=gedp.Ledger(ledger, lifetime_cap=10))
    assert list(tmp_path.iterdir()) == []  # no ledger, no lock file, no staging folder
    refused = runner.invoke(app, ["protect", str(_saved(panel, tmp_path)), "--out", str(tmp_path / "rel"),
                                  "--seed", "1", "--not-for-publication"])
    assert refused.exit_code == 2 and "over the config's mu_cap" in refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["panel.parquet"]


def _saved(panel, folder):
    path = folder / "panel.parquet"
    panel.to_parquet(path)
    return path


def test_allowed_over_its_cap_the_panel_states_its_total_its_cap_and_that_it_was_allowed(panel, tmp_path):
    ledger = tmp_path / "books.json"
    release = gedp.protect(panel, ledger=gedp.Ledger(ledger, lifetime_cap=10), allow_over_cap=True)
    manifest = release.manifest
    assert manifest["mu_total"] == pytest.approx(math.sqrt(3) * RECOMMENDED, rel=1e-9)
    assert manifest["mu_quarter"] == pytest.approx(RECOMMENDED, rel=1e-9)
    assert manifest["mu_cap"] == RECOMMENDED_CAP and manifest["over_cap"] == "allowed (--allow-over-cap)"
    # the ledger charges the same figure: sqrt(k) x the quarter's mu, k the most quarters of one establishment
    most = int(panel.groupby("estab_id").size().max())
    charge = math.sqrt(most) * RECOMMENDED
    assert manifest["lifetime"]["largest_charge"] == pytest.approx(charge, rel=1e-9)
    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and f"{charge:.4f} ({RECOMMENDED:.4f} a quarter)" in shown.output, shown.output


def test_a_cleared_panel_states_its_charge_too(panel, tmp_path):
    """A pending panel cleared: the message states the panel's charge, not a quarter's."""
    from gedp.accounting.ledger import reserve

    config = load_config("recommended")
    labels = panel["year"].astype(str) + "Q" + panel["qtr"].astype(str)
    reservation = reserve(tmp_path / "books.json", panel["estab_id"].astype(str), config.plan, quarters=labels,
                          cap=10)
    charge = math.sqrt(int(panel.groupby("estab_id").size().max())) * RECOMMENDED
    cleared = runner.invoke(app, ["ledger", "clear", "--ledger", str(tmp_path / "books.json"), "--release",
                                  reservation.release_id], env={"COLUMNS": "250"})
    assert cleared.exit_code == 0 and f"charge mu {charge:.4f} ({RECOMMENDED:.4f} a quarter)" in cleared.output


def test_the_cap_binds_at_its_value():
    config = load_config("recommended")
    quarters = int((RECOMMENDED_CAP / RECOMMENDED) ** 2)  # the most quarters within the cap: 1
    assert over_cap(config, config.plan, INDEPENDENT, quarters) is False
    with pytest.raises(BudgetError):
        over_cap(config, config.plan, INDEPENDENT, quarters + 1)
    assert over_cap(config, config.plan, INDEPENDENT, quarters + 1, allow_over_cap=True) is True
    raw = yaml.safe_load(open(config.source))
    del raw["mu_cap"]  # the default cap then binds, and the refusal says which cap it is
    uncapped = parse_config(raw, "<no mu_cap>")
    with pytest.raises(BudgetError, match=r"over 2\.5000, the cap of a config without mu_cap"):
        over_cap(uncapped, uncapped.plan, INDEPENDENT, 2)


def test_a_plan_over_four_quarters_caps_their_budget_so_a_panel_of_four_fits():
    shape = Shape(Allocation((shapes.STATE, shapes.CELL), 0.6, 0.12), Allocation((shapes.NAICS5,), 0.35))
    mapping = shapes.config_mapping(shape, 2.3065 / 2, 0.2, load_config("baseline").raw, quarters=4)
    assert mapping["mu_cap"] == math.ceil(2.3065 * 1e3) / 1e3  # the budget over the four quarters
    config = parse_config(mapping, "<plan>")
    total = math.sqrt(sum(mu**2 for query in mapping["queries"] for mu in query["mu"].values()))
    assert math.sqrt(4) * total <= mapping["mu_cap"] < math.sqrt(5) * total
    assert over_cap(config, config.plan, INDEPENDENT, 4) is False
    with pytest.raises(BudgetError, match="a panel of 5 quarters"):
        over_cap(config, config.plan, INDEPENDENT, 5)


def test_a_refused_first_release_leaves_no_lock_file(small_state, tmp_path):
    ledger = tmp_path / "books.json"
    refused = runner.invoke(app, ["protect", str(_saved(small_state, tmp_path)), "--out", str(tmp_path / "rel"),
                                  "--ledger", str(ledger), "--lifetime-cap", "1"])
    assert refused.exit_code == 2 and "over their lifetime cap" in refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["panel.parquet"]


COUNTER = """
import sys, time
from pathlib import Path
from gedp.accounting.ledger_file import locked_ledger
ledger, counter = Path(sys.argv[1]), Path(sys.argv[2])
for _ in range(int(sys.argv[3])):
    with locked_ledger(ledger, missing_ok=True):
        value = int(counter.read_text())
        time.sleep(0.0005)
        counter.write_text(str(value + 1))
"""


def test_the_ledger_lock_excludes_other_processes_though_its_file_is_removed(tmp_path):
    """Four processes each add 1 to a counter 150 times under the ledger's lock (read, pause,
    write): every addition counts only if no two held it at once, while each removes the lock
    file when it lets go (the others, waiting on the removed file, must take the new one)."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [subprocess.Popen([sys.executable, "-c", COUNTER, str(tmp_path / "books.json"), str(counter), "150"],
                             env=env) for _ in range(4)]
    assert [run.wait(timeout=300) for run in runs] == [0, 0, 0, 0]
    assert int(counter.read_text()) == 600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter"]
