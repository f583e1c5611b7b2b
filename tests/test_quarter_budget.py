"""The lifetime ledger across quarters: each quarter that includes an establishment is charged to its
account, an annual cap over every 4 consecutive quarters beside the lifetime cap, refusals that say
what is left, and copies of the records drawing on the same accounts whatever their files."""

import datetime
import json
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp.accounting.ledger as ledger_module
import gedp.accounting.ledger_file as ledger_file
import gedp.accounting.ledger_spending as ledger_spending
import gedp.accounting.quarters as quarters_module
from gedp.cli import app
from gedp.config import load_config
from gedp.synth.schema import InputError

runner = CliRunner()
PLAN = load_config("employment").plan
MU = math.sqrt(3 * 1.74)  # configs/employment.yaml: three months at mu^2 1.74 each
IDS = [f"E{i:04d}" for i in range(200)]


def reserve(ledger, ids, quarters, **caps):
    labels = None if quarters is None else ([quarters] * len(ids) if isinstance(quarters, str) else quarters)
    return ledger_module.reserve(ledger, ids, PLAN, quarters=labels, **caps)


def spent(ledger, ids):
    """Each id's lifetime spending, recomputed from the ledger's releases (not from a reservation)."""
    book = ledger_file.read_ledger(ledger)
    keys = np.concatenate([ledger_file.establishment_keys([estab], book["key"]) for estab in ids])  # in ids' order
    return np.sqrt(ledger_spending.spending(ledger, book, keys).lifetime)


def test_the_plan_costs_its_stated_mu():
    assert PLAN.budget().total == pytest.approx(MU)


def test_four_quarters_at_annual_over_sqrt_4_are_accepted_and_the_fifth_is_refused_by_the_lifetime_cap(tmp_path):
    ledger = tmp_path / "ledger.json"
    annual = 2 * MU  # per-quarter mu = annual / sqrt(4)
    for quarter in ("2016Q1", "2016Q2", "2016Q3", "2016Q4"):
        reserve(ledger, IDS, quarter, cap=annual, annual_cap=annual)
    assert spent(ledger, IDS) == pytest.approx(np.full(len(IDS), annual))
    with pytest.raises(InputError) as refused:
        reserve(ledger, IDS, "2017Q1")
    assert (f"over their lifetime cap {annual:.4f}: they have mu 0.0000 of {annual:.4f} left" in str(refused.value)
            and f"this release needs its charge {MU:.4f}" in str(refused.value))
    assert len(ledger_file.live(ledger_file.read_ledger(ledger))) == 4  # nothing recorded


def test_a_rolling_year_admits_a_steady_series_and_refuses_a_fifth_quarter_inside_a_year(tmp_path):
    ledger = tmp_path / "ledger.json"
    annual = 2 * MU
    for quarter in ("2016Q1", "2016Q2", "2016Q3", "2016Q4", "2017Q1", "2017Q2"):  # every 4 in a row: 2 MU
        reserve(ledger, IDS, quarter, cap=10 * MU, annual_cap=annual)
    with pytest.raises(InputError) as refused:  # a second release of 2017Q2: 5 charges in 2016Q3-2017Q2
        reserve(ledger, IDS[:10], "2017Q2")
    message = str(refused.value)
    assert f"over their annual cap {annual:.4f} in the year 2016Q3-2017Q2" in message
    assert f"they have mu 0.0000 of {annual:.4f} left" in message and f"needs its charge {MU:.4f}" in message


def test_a_year_that_straddles_new_year_is_capped_too(tmp_path):
    ledger = tmp_path / "ledger.json"
    cap = 1.2 * MU  # two quarters cost sqrt(2) MU: over the cap in any year that holds both
    reserve(ledger, IDS, "2016Q4", cap=10 * MU, annual_cap=cap)
    with pytest.raises(InputError) as refused:  # a calendar-year rule would accept it
        reserve(ledger, IDS, "2017Q1")
    left = math.sqrt(cap**2 - MU**2)
    assert (f"annual cap {cap:.4f} in the year 2016Q2-2017Q1: they have mu {left:.4f} of {cap:.4f} left"
            in str(refused.value))
    reserve(ledger, IDS, "2017Q4")  # 2016Q4 and 2017Q4 are never in the same 4 consecutive quarters


def test_an_establishment_in_k_quarters_of_a_panel_is_charged_sqrt_k_quarters(tmp_path):
    ledger = tmp_path / "ledger.json"
    quarters = ["2016Q1", "2016Q2", "2016Q3", "2016Q4"]
    rows = pd.DataFrame([(estab, quarter) for i, estab in enumerate(IDS) for quarter in quarters[: 1 + i % 4]],
                        columns=["estab_id", "quarter"])  # establishment i is in its first 1 + i % 4 quarters
    reservation = reserve(ledger, rows["estab_id"], rows["quarter"], cap=10 * MU, annual_cap=2 * MU)
    expected = MU * np.sqrt(1 + np.arange(len(IDS)) % 4)
    assert spent(ledger, IDS) == pytest.approx(expected)
    assert reservation.quarters == tuple(quarters) and reservation.spent_after == pytest.approx(2 * MU)
    assert reservation.annual_spent_after == pytest.approx(2 * MU)
    with pytest.raises(InputError, match="annual cap 4.5695 in the year 2016Q1-2016Q4"):
        reserve(ledger, IDS[3:4], "2016Q2")  # in all four quarters already: a fifth charge in that year
    reserve(ledger, IDS[2:3], "2016Q4")  # in 2016Q1-Q3: a fourth charge reaches the cap exactly


def test_a_release_without_quarters_counts_in_every_year(tmp_path):
    ledger, other = tmp_path / "ledger.json", tmp_path / "other.json"
    panel = (IDS * 3, ["2016Q2"] * len(IDS) + ["2016Q3"] * len(IDS) + ["2016Q4"] * len(IDS))
    for book in (ledger, other):
        reserve(book, IDS, "2016Q1", cap=10 * MU, annual_cap=2 * MU)
    reserve(ledger, IDS, None)
    with pytest.raises(InputError, match="annual cap 4.5695 in the year 2016Q1-2016Q4"):
        reserve(ledger, *panel)
    reserve(other, *panel)  # the same panel without the unlabelled release: 4 charges, at the cap


def test_quarter_labels_are_checked():
    assert quarters_module.row_quarters([2016, 2016], [1, 4]).tolist() == ["2016Q1", "2016Q4"]
    with pytest.raises(InputError, match="row 1: year and qtr must be"):
        quarters_module.row_quarters([2016, 2016], [1, 5])
    with pytest.raises(InputError, match="quarter '2016-1' must be YYYYQn"):
        quarters_module.quarter_index("2016-1")
    assert quarters_module.windows(["2017Q1"])[0] == tuple(range(2016 * 4 + 1, 2016 * 4 + 5))
    assert [quarters_module.window_name(w) for w in quarters_module.windows(["2017Q1"])] == [
        "2016Q2-2017Q1", "2016Q3-2017Q2", "2016Q4-2017Q3", "2017Q1-2017Q4"]


def test_a_quarter_that_has_not_begun_is_refused_and_nothing_recorded(tmp_path):
    today = datetime.date(2026, 11, 24)  # in 2026Q4
    quarters_module.check_begun(["2016Q1", "2026Q4"], today)
    with pytest.raises(InputError, match=r"quarter 2027Q1 has not begun \(today is 2026-11-24, in 2026Q4\)"):
        quarters_module.check_begun(["2026Q4", "2028Q1", "2027Q1"], today)
    with pytest.raises(InputError, match=r"quarter 2028Q1 has not begun \(today is 2027-12-31, in 2027Q4\)"):
        quarters_module.check_begun(["2028Q1"], datetime.date(2027, 12, 31))
    quarters_module.check_begun(["2028Q1"], datetime.date(2028, 1, 1))
    # the relabelling of one year as 2016, 2020, 2024, 2028 to escape the annual cap: its last year is refused
    ledger = tmp_path / "ledger.json"
    now = datetime.datetime.now(datetime.timezone.utc).date()
    coming = quarters_module.index_label(now.year * 4 + (now.month - 1) // 3 + 1)
    reserve(ledger, IDS, "2016Q1", cap=10 * MU, annual_cap=2 * MU)
    with pytest.raises(InputError, match=f"quarter {coming} has not begun"):
        reserve(ledger, IDS, coming)
    assert len(ledger_file.live(ledger_file.read_ledger(ledger))) == 1  # nothing recorded


@pytest.fixture
def quarter_files(tmp_path, small_state):
    """One quarter's records (2016Q1), a renamed copy, and the same establishments as other quarters'
    files: 2016Q2 as CSV with employment edited and a tenth of the rows removed, 2016Q3, 2016Q4."""
    first = small_state.head(300).assign(state="44", year=2016, qtr=1)
    folder = tmp_path / "in"
    folder.mkdir()
    files = {"2016Q1": folder / "q1.parquet", "renamed": folder / "final-final.parquet"}
    first.to_parquet(files["2016Q1"])
    shutil.copy(files["2016Q1"], files["renamed"])
    second = first.assign(qtr=2, m1emp=first["m1emp"] + 1).iloc[30:]
    files["2016Q2"] = folder / "q2.csv"
    second.to_csv(files["2016Q2"], index=False)
    for qtr in (3, 4):
        files[f"2016Q{qtr}"] = folder / f"q{qtr}.parquet"
        first.assign(qtr=qtr).to_parquet(files[f"2016Q{qtr}"])
    return files


def protect(source, out, ledger, *extra):
    return runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out),
                               "--ledger", str(ledger), *map(str, extra)])


def test_copies_subsets_and_other_quarters_of_the_same_establishments_draw_on_the_same_accounts(
        quarter_files, tmp_path):
    ledger, annual = tmp_path / "ledger.json", 2 * MU
    first = protect(quarter_files["2016Q1"], tmp_path / "r1", ledger, "--lifetime-cap", 10, "--annual-cap", annual)
    assert first.exit_code == 0, first.output
    lifetime = json.loads((tmp_path / "r1" / "manifest.json").read_text())["lifetime"]
    assert lifetime["quarters"] == ["2016Q1"] and lifetime["annual_cap"] == pytest.approx(annual)
    for i, name in enumerate(("renamed", "2016Q2", "2016Q3"), start=2):  # 2, 3, 4 charges in 2016Q1-Q4
        assert protect(quarter_files[name], tmp_path / f"r{i}", ledger).exit_code == 0, name
    before = ledger.read_bytes()
    refused = protect(quarter_files["2016Q4"], tmp_path / "r5", ledger)
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert (f"over their annual cap {annual:.4f} in the year 2016Q1-2016Q4: they have mu 0.0000 of {annual:.4f} "
            f"left" in refused.output and f"needs its charge {MU:.4f}" in refused.output)
    assert ledger.read_bytes() == before and not (tmp_path / "r5").exists()
    assert spent(ledger, ["E-not-in-any"]) == pytest.approx([0.0])
    assert ledger_spending.largest_spending(ledger, ledger_file.read_ledger(ledger))[0] == pytest.approx(annual)


def _rehashed(book):
    """The ledger with every event's hash recomputed in chain (an attacker who knows the format)."""
    previous = ledger_file._genesis(book["key"])
    for event in book["events"]:
        event["previous"] = previous
        event["hash"] = previous = ledger_file._event_hash(event)
    book["head"] = previous
    return book


def _edit_quarters(quarters, rehash):
    def edit(book):
        book["events"][0]["release"]["quarters"] = quarters
        return _rehashed(book) if rehash else book
    return edit


TAMPERING = {
    "quarter moved, chain not mended": (_edit_quarters([["2015Q1", 300]], False), "was edited"),
    "fewer establishments counted": (_edit_quarters([["2016Q1", 150]], True), "do not hold its key file"),
    "an unknown quarter": (_edit_quarters([["2016Q5", 300]], True), "must be a list of [quarter label"),
    "quarters out of order": (_edit_quarters([["2016Q2", 150], ["2016Q1", 150]], True), "distinct quarters in order"),
    "annual cap raised": (lambda book: _rehashed(_set_annual(book, 1e308)), "annual_cap must be null or"),
}


def _set_annual(book, cap):
    book["events"][0]["release"]["annual_cap"] = cap
    return book


@pytest.mark.parametrize("tampering", TAMPERING)
def test_tampered_quarters_are_refused_and_the_ledger_left_as_it_is(quarter_files, tmp_path, tampering):
    ledger = tmp_path / "ledger.json"
    assert protect(quarter_files["2016Q1"], tmp_path / "r1", ledger, "--lifetime-cap", 10, "--annual-cap",
                   2 * MU).exit_code == 0
    edit, reason = TAMPERING[tampering]
    ledger.write_text(json.dumps(edit(json.loads(ledger.read_text()))))
    before = ledger.read_bytes()
    refused = protect(quarter_files["2016Q2"], tmp_path / "r2", ledger)
    assert refused.exit_code == 2 and reason in refused.output and "was not changed" in refused.output, refused.output
    assert ledger.read_bytes() == before and not (tmp_path / "r2").exists()
    assert sorted(os.listdir(tmp_path)) == ["in", "ledger.json", "ledger.json.keys", "r1"]


def test_a_plan_over_four_quarters_gives_each_quarter_the_budget_over_sqrt_4():
    from gedp.planning.output import quarters_header
    from gedp.planning.rule import Rule
    from gedp.planning.search import PlanResult

    result = PlanResult({}, None, {}, None, {}, [], mu_total=2.3065 / 2, source="x.csv", seconds=0.0, rule=Rule({}),
                        quarters=4)
    header = " ".join(quarters_header(result))
    assert "mu 2.3065 / sqrt(4) = 1.1533" in header and "--annual-cap 2.3065" in header
    assert math.sqrt(4 * 1.15325**2) == pytest.approx(2.3065)  # the composition the header states
    assert quarters_header(PlanResult({}, None, {}, None, {}, [], 2.3065, "x.csv", 0.0, Rule({}))) == []


@pytest.mark.parametrize("quarters", [0, 41, 2.5, True])
def test_a_plan_refuses_a_number_of_quarters_out_of_range_before_reading(quarters, tmp_path):
    from gedp.planning.search import make_plan

    with pytest.raises(InputError, match=rf"quarters \({quarters!r}\) must be a whole number of quarters from 1 "):
        make_plan(tmp_path / "absent.csv", quarters=quarters)


@pytest.mark.slow
def test_four_quarters_planned_with_quarters_4_fit_the_annual_cap_and_the_fifth_in_a_year_is_refused(
        small_state, quarter_files, tmp_path):
    """`gedp plan --quarters 4` from a published file (in BLS layout, of the 1,500-establishment small
    state: a plan of Rhode Island's file costs about twice its processor time, and test_planning plans that
    file), then its plan protects four quarters under the annual cap and the fifth in the year is refused."""
    from test_qcew import published_layout

    plan, published = tmp_path / "plan.yaml", tmp_path / "published.csv"
    published_layout(small_state).to_csv(published, index=False)
    made = runner.invoke(app, ["plan", "--from-qcew", str(published), "--out", str(plan), "--quarters", "4"])
    assert made.exit_code == 0, made.output
    assert load_config(plan).plan.budget().total <= 2.3065 / 2 * (1 + 1e-12)
    ledger = tmp_path / "ledger.json"
    for i, name in enumerate(("2016Q1", "2016Q2", "2016Q3", "2016Q4")):
        extra = ("--lifetime-cap", 10, "--annual-cap", 2.3065) if i == 0 else ()
        run = runner.invoke(app, ["protect", str(quarter_files[name]), "--config", str(plan), "--out",
                                  str(tmp_path / f"r{i}"), "--ledger", str(ledger), *map(str, extra)])
        assert run.exit_code == 0, run.output
    refused = runner.invoke(app, ["protect", str(quarter_files["renamed"]), "--config", str(plan), "--out",
                                  str(tmp_path / "r5"), "--ledger", str(ledger)])
    assert refused.exit_code == 2 and "annual cap 2.3065 in the year 2016Q1-2016Q4" in refused.output


def test_ledger_show_lists_each_releases_quarters_and_annual_cap(quarter_files, tmp_path):
    ledger = tmp_path / "ledger.json"
    assert protect(quarter_files["2016Q2"], tmp_path / "r1", ledger, "--lifetime-cap", 10, "--annual-cap",
                   4).exit_code == 0
    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)], terminal_width=200)
    assert shown.exit_code == 0 and "2016Q2" in shown.output and "10.0000, 4.0000 a year" in shown.output, shown.output


def test_the_api_takes_an_annual_cap_as_the_command_line_does(small_state, tmp_path):
    import gedp

    ledger, cap = tmp_path / "ledger.json", 1.2 * MU
    frame = small_state.head(200).assign(year=2016, qtr=3)
    release = gedp.protect(frame, "employment", ledger=gedp.Ledger(ledger, lifetime_cap=10, annual_cap=cap))
    assert release.manifest["lifetime"]["quarters"] == ["2016Q3"]
    with pytest.raises(InputError, match=f"over their annual cap {cap:.4f} in the year 2016Q1-2016Q4"):
        gedp.protect(frame.assign(qtr=4), "employment", ledger=gedp.Ledger(ledger))
    with pytest.raises(InputError, match="--annual-cap, --lifetime-cap|--lifetime-cap, --annual-cap"):
        with pytest.warns(DeprecationWarning, match="annual_cap"):
            gedp.protect(frame, "employment", annual_cap=cap)
