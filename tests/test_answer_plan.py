"""A release's answers are those of the plan its manifest states (red team of harden7): each query on
each attribute once per state and quarter, of its query's mechanism and the mu its ledger charged;
keys checked before they are read; levels named and shown as the caller gave them."""

from __future__ import annotations

import json
import os
import re
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.release.reader import read_answers, read_measurements
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()


@pytest.fixture(scope="module")
def two_states(tmp_path_factory) -> Path:
    """A seeded release of two states: the small profile's 300 establishments in 44 and 200 in 09."""
    first = gedp.synthesize("small", establishments=300, seed=7)
    second = first.iloc[:200].assign(state="09", estab_id=lambda f: f["estab_id"].str.replace("44-", "09-"))
    folder = tmp_path_factory.mktemp("two") / "release"
    gedp.protect(pd.concat([first, second], ignore_index=True), seed=8, not_for_publication=True).write(folder)
    return folder


@pytest.fixture(scope="module")
def panel(tmp_path_factory) -> Path:
    """A seeded panel release of 300 establishments over 2016Q1 and 2016Q2."""
    first = generate_profile(load_profile("small"), n_establishments=300, rng=np.random.default_rng(9))
    quarters = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(9))
    folder = tmp_path_factory.mktemp("panel") / "release"
    gedp.protect(quarters, seed=10, not_for_publication=True, allow_over_cap=True).write(folder)
    return folder


def copied(release: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(release, copy)
    return copy


def edit_part(part: Path, edit, **options) -> None:
    pq.write_table(pa.Table.from_pandas(edit(pd.read_parquet(part)), preserve_index=False), part, **options)


def edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def refused_in_one_line(request: list[str], message: str) -> None:
    result = runner.invoke(app, request)
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_the_valid_releases_read(two_states, panel):
    """The fixtures themselves pass every check: what the refusals below are refusals of."""
    assert set(read_measurements(two_states).query("query == 'state,county'")["state"]) == {"09", "44"}
    for quarter in ("2016Q1", "2016Q2"):
        assert len(read_measurements(panel, quarter))


def test_a_state_lacking_an_answer_the_other_holds_is_refused(two_states, tmp_path):
    """State 09's county answers dropped: the answers of 44 still name the query, so only a count per
    state finds it (at 3835307 the margins were computed without them)."""
    copy = copied(two_states, tmp_path)
    edit_part(copy / "measurements.parquet" / "part-09.parquet", lambda f: f[f["query"] != "state,county"])
    message = "lack the answers of query 'state,county' on 'm1emp' (state 09), which the manifest's plan states"
    with pytest.raises(InputError, match=re.escape(message)):
        read_answers(copy)
    refused_in_one_line(["tabulate", str(copy), "--by", "county", "--moe"], message)


def test_answers_moved_to_the_part_of_another_state_are_refused(two_states, tmp_path):
    """State 09's wage answer by state written into 44's part: each part holds its own state's plan."""
    copy = copied(two_states, tmp_path)
    moved = pd.read_parquet(copy / "measurements.parquet" / "part-09.parquet").query("query == 'state'")
    edit_part(copy / "measurements.parquet" / "part-09.parquet", lambda f: f[f["query"] != "state"])
    edit_part(copy / "measurements.parquet" / "part-44.parquet", lambda f: pd.concat([f, moved], ignore_index=True))
    with pytest.raises(InputError, match=re.escape("lack the answers of query 'state' on 'wage' (state 09)")):
        read_answers(copy)


@pytest.mark.parametrize("edit", ["mu of one query changed", "mu of one query a mapping",
                                  "query dropped from the ledger and the answers"])
def test_a_manifest_whose_mu_is_not_its_ledgers_is_refused(two_states, tmp_path, edit):
    copy = copied(two_states, tmp_path)
    if edit == "mu of one query changed":
        edit_manifest(copy, lambda m: m["mu"]["state,county"].update(m1emp=0.1))
    elif edit == "mu of one query a mapping":
        edit_manifest(copy, lambda m: m["mu"]["state,county"].update(m1emp={"x": 0.1}))
    else:
        def drop(manifest):
            for section in manifest["per_state"].values():
                section["ledger"] = [entry for entry in section["ledger"] if entry["query"] != "state,county"]
        edit_manifest(copy, drop)
        for part in (copy / "measurements.parquet").iterdir():
            edit_part(part, lambda f: f[f["query"] != "state,county"])
    message = "manifest.json's mu per query and attribute is not what its states' ledgers charged"
    with pytest.raises(InputError, match=re.escape(message)):
        read_answers(copy)
    refused_in_one_line(["tabulate", str(copy), "--by", "county", "--moe"], message)


def test_a_panel_quarter_relabelled_is_refused(panel, tmp_path):
    """2016Q2's measurements labelled 2016Q1 (at 3835307 2016Q2 read no answers at all and 2016Q1
    read both quarters')."""
    copy = copied(panel, tmp_path)
    edit_part(copy / "measurements.parquet" / "part-2016Q2-44.parquet", lambda f: f.assign(quarter="2016Q1"))
    message = "hold rows of another quarter in part-2016Q2-44.parquet, which holds those of 2016Q2"
    with pytest.raises(InputError, match=re.escape(message)):
        read_answers(copy, "2016Q2")
    refused_in_one_line(["tabulate", str(copy), "--quarter", "2016Q2", "--by", "county", "--moe"], message)
    assert len(read_answers(copy, "2016Q1"))  # 2016Q1's own part is intact: read alone, as it is


def test_a_panel_part_without_statistics_is_checked_from_its_quarter_column(panel, tmp_path):
    copy = copied(panel, tmp_path)
    part = copy / "measurements.parquet" / "part-2016Q2-44.parquet"
    edit_part(part, lambda f: f, write_statistics=False)
    assert pq.read_metadata(part).row_group(0).column(0).statistics is None
    pd.testing.assert_frame_equal(read_measurements(copy, "2016Q2"), read_measurements(panel, "2016Q2"))
    edit_part(part, lambda f: f.assign(quarter=f["quarter"].mask(f.index == 5, "2016Q1")), write_statistics=False)
    with pytest.raises(InputError, match="hold rows of another quarter in part-2016Q2-44.parquet"):
        read_answers(copy, "2016Q2")


def _never_read(*args, **kwargs):
    raise AssertionError("the measurements were read before their keys were checked")


@pytest.mark.parametrize("dictionary", [True, False])
def test_a_long_key_is_refused_before_the_rows_are_read(two_states, tmp_path, monkeypatch, dictionary):
    """A 100,000-character county on every row: refused from the part's footer (plain encoding: its
    pages' size, 1,000 times the file's, refused with any part's sizes: ``part_sizes``) or dictionary
    (one value however many rows repeat it), never read as rows (at 3835307 pandas read every row,
    then measured them)."""
    copy = copied(two_states, tmp_path)
    edit_part(copy / "measurements.parquet" / "part-44.parquet",
              lambda f: f.assign(county=f["county"].where(f["county"].isna(), "1" * 100_000)),
              use_dictionary=dictionary, compression="zstd")
    monkeypatch.setattr(pd, "read_parquet", _never_read)
    refusal = ("hold a key of 'county' longer than 64 characters .part-44.parquet" if dictionary else
               "part-44.parquet states pages of [0-9,]+ bytes uncompressed, more than 16 times its")
    with pytest.raises(InputError, match=refusal):
        read_measurements(copy)


def test_a_long_query_name_is_refused_before_the_rows_are_read(two_states, tmp_path, monkeypatch):
    copy = copied(two_states, tmp_path)
    edit_part(copy / "measurements.parquet" / "part-09.parquet", lambda f: f.assign(query="state" * 10_000))
    monkeypatch.setattr(pd, "read_parquet", _never_read)
    with pytest.raises(InputError, match="hold a label of 'query' longer than 256 characters .part-09.parquet"):
        read_measurements(copy)


def test_the_server_names_the_level_as_its_parameter(two_states):
    from test_hostile_release import asgi_get

    from gedp.serve.app import Limits, create_app
    from gedp.serve.releases import load_releases

    served = load_releases([two_states])
    status, body = asgi_get(create_app(served, Limits()), "/api/tabulate",
                            {"release": next(iter(served)), "by": "county", "moe": "1", "level": "1"})
    error = json.loads(body)["error"]
    assert status == 400 and error.startswith("level (1.0) must be a confidence level"), error
    status, body = asgi_get(create_app(served, Limits()), "/api/tabulate",
                            {"release": next(iter(served)), "by": "county", "agglvl": "74"})
    assert status == 400 and "give by or agglvl, not both" in json.loads(body)["error"], body
    result = runner.invoke(app, ["tabulate", str(two_states), "--by", "county", "--moe", "--level", "1"])
    assert result.exit_code == 2 and "--level (1.0) must be" in result.output, result.output


@pytest.mark.parametrize(("level", "shown"), [(0.95, "95%"), (0.5, "50%"), (0.9, "90%"), (0.975, "97.5%"),
                                              (0.9999999999999998, "99.99999999999998%"), (0.57, "57%")])
def test_a_level_is_shown_with_every_digit_it_was_given(level, shown):
    from gedp.postprocess.combine import level_percent

    assert level_percent(level) == shown


def test_no_level_reads_as_another():
    """Independent check: the percentage read back as a decimal and divided by 100 is the level, for
    levels drawn over [0.5, 1) and the extremes (0.5 and the largest level below 1)."""
    from gedp.postprocess.combine import level_percent

    rng = np.random.default_rng(11)
    levels = [0.5, 0.9999999999999998, np.nextafter(0.5, 1), *rng.uniform(0.5, 1, 2000)]
    for level in levels:
        text = level_percent(level)
        assert float(Decimal(text[:-1]) / 100) == level, (level, text)
        assert text not in ("100%", "50%") or level == 0.5


def test_the_footer_of_the_largest_level_is_not_100_percent(two_states, tmp_path):
    """gedp tabulate's last line, in a process of its own (it is written to standard error)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gedp", "tabulate", str(two_states), "--by", "county", "--moe",
                           "--level", "0.9999999999999998"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GEDP_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("margins of error at 99.99999999999998%"), done.stderr


def test_the_api_measurements_are_checked_as_every_reader_checks_them(two_states, panel, tmp_path):
    """``Release.measurements`` gave the stored rows unchecked at 3835307; now the checked ones, which
    for a valid release are the stored rows themselves (a panel's quarters in order)."""
    from gedp.release.reader import read_stored

    for release in (two_states, panel):
        pd.testing.assert_frame_equal(gedp.Release(release).measurements, read_stored(release, "measurements.parquet"))
    copy = copied(two_states, tmp_path)
    edit_part(copy / "measurements.parquet" / "part-44.parquet", lambda f: f[f["query"] != "state,naics5"])
    with pytest.raises(InputError, match=re.escape("lack the answers of query 'state,naics5' on 'm1emp' (state 44)")):
        _ = gedp.Release(copy).measurements
