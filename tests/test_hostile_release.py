"""A release is untrusted input (issue 46): a hostile manifest or part is refused where the release
is read, the margin cache never builds a path from a release's content and removes only folders it
made, readers read exactly the parts the manifest lists and as many establishments as it states."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.release import margins
from gedp.release.margins import kept_path, kept_variances, write_structure
from gedp.release.reader import read_answers, read_manifest, read_quarter
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

HOSTILE = "../../../../victim/docs/e"
runner = CliRunner()


@pytest.fixture(scope="module")
def panel_release(tmp_path_factory) -> Path:
    """A seeded panel release of 400 establishments over 2016Q1 and 2016Q2."""
    first = generate_profile(load_profile("small"), n_establishments=400, rng=np.random.default_rng(3))
    panel = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(3))
    folder = tmp_path_factory.mktemp("panel") / "release"
    gedp.protect(panel, seed=4, not_for_publication=True, allow_over_cap=True).write(folder)
    return folder


@pytest.fixture(scope="module")
def one_quarter(seeded_small_release) -> Path:
    return seeded_small_release("one", 400)


def copied(release: Path, tmp_path: Path) -> Path:
    """A copy of ``release`` in ``tmp_path`` (``copy``), for a test to edit."""
    copy = tmp_path / "copy"
    shutil.copytree(release, copy)
    return copy


def edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def relabel(folder: Path, old: str, new: str) -> None:
    """The red team's release: quarter ``old`` called ``new`` in the manifest and in every part."""
    def quarters(manifest):
        manifest["quarters"] = [new if q == old else q for q in manifest["quarters"]]
        manifest["per_quarter"] = {new if q == old else q: section for q, section in manifest["per_quarter"].items()}

    edit_manifest(folder, quarters)
    for part in [*(folder / "protected.parquet").iterdir(), *(folder / "measurements.parquet").iterdir()]:
        frame = pd.read_parquet(part)
        frame["quarter"] = frame["quarter"].replace(old, new)
        frame.to_parquet(part, index=False)


@pytest.fixture
def victim(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A cache at home/cache and six folders of a user's documents at home/victim/docs, where the
    hostile label leads from the cache's margins/ folder."""
    home = tmp_path / "home"
    docs = home / "victim" / "docs"
    for name in "abcdef":
        (docs / name).mkdir(parents=True)
        (docs / name / "thesis.txt").write_text(f"chapter {name}")
    monkeypatch.setenv("GEDP_CACHE_DIR", str(home / "cache"))
    return home, docs


def documents(docs: Path) -> dict[str, str]:
    return {str(p.relative_to(docs)): p.read_text() for p in sorted(docs.rglob("*")) if p.is_file()}


def test_a_quarter_label_that_is_a_path_is_refused_on_the_command_line(panel_release, victim, tmp_path):
    """Red team item 1: exit 0, victim/docs/e replaced and all but 4 of its folders removed at 9a0ff4e."""
    home, docs = victim
    before = documents(docs)
    hostile = tmp_path / "hostile"
    shutil.copytree(panel_release, hostile)
    relabel(hostile, "2016Q2", HOSTILE)
    result = runner.invoke(app, ["tabulate", str(hostile), "--quarter", HOSTILE, "--by", "county", "--moe"])
    assert result.exit_code == 2, result.output
    assert "quarters" in result.output and "is not of the form" in result.output
    assert documents(docs) == before
    assert sorted(p.name for p in home.iterdir()) in (["victim"], ["cache", "victim"])


def test_a_quarter_label_that_is_a_path_is_refused_through_the_api(panel_release, victim, tmp_path):
    """The natural loop over the manifest's quarters: refused at the manifest, nothing written."""
    _, docs = victim
    before = documents(docs)
    hostile = tmp_path / "hostile"
    shutil.copytree(panel_release, hostile)
    relabel(hostile, "2016Q2", HOSTILE)
    release = gedp.Release(hostile)
    with pytest.raises(InputError, match="is not of the form"):
        for quarter in release.manifest["quarters"]:
            release.tabulate("county", quarter=quarter, moe=True)
    with pytest.raises(InputError, match="is not of the form"):
        gedp.read_release(hostile)
    assert documents(docs) == before


def test_a_genuine_panel_tabulates_every_quarter_in_a_loop(panel_release):
    release = gedp.read_release(panel_release)
    tables = [release.tabulate("county", quarter=quarter, moe=True) for quarter in release.manifest["quarters"]]
    assert len(tables) == 2 and all(np.isfinite(table["m1emp_moe"]).all() for table in tables)


HOSTILE_FIELDS = {
    "a state that is a path": (lambda m: m.update(states=["../44"]), "'states' holds"),
    "a state twice": (lambda m: m.update(states=["44", "44"]), "lists a value twice"),
    "no states": (lambda m: m.update(states=[]), "non-empty list"),
    "a negative count": (lambda m: m.update(establishments=-1), "whole number >= 0"),
    "a fractional count": (lambda m: m.update(establishments=399.5), "whole number >= 0"),
    "a count that is not the states' sum": (lambda m: m.update(establishments=m["establishments"] + 1),
                                             "is not the sum of its states'"),
    "per_state of another state": (lambda m: m.update(per_state={"45": m["per_state"]["44"]}),
                                   "must hold exactly the states"),
    "a file that is not gedp's": (lambda m: m["files"].update(protected_microdata="/etc/passwd"),
                                  "'files' must name gedp's files only"),
    "a job family that is a path": (lambda m: m.update(jobs={"families": {"../x": {"columns": ["sex"]}}}),
                                    "plain names"),
    "no psi": (lambda m: m.pop("psi"), "lacks 'psi'"),  # red team rt20: KeyError tracebacks in every reader
    "no gammas": (lambda m: m.pop("gammas"), "lacks 'gammas'"),
    # red team rt20 (second round): "yes" and true over seeded noise dropped the report's banner
    "publishable as text": (lambda m: m.update(publishable="yes"), "must be true or false"),
    "publishable over replayable noise": (lambda m: m.update(publishable=True), "is true but its noise"),
}


@pytest.mark.parametrize("case", list(HOSTILE_FIELDS))
def test_every_field_that_names_or_counts_is_checked_where_the_release_is_read(one_quarter, tmp_path, case):
    edit, message = HOSTILE_FIELDS[case]
    copy = copied(one_quarter, tmp_path)
    edit_manifest(copy, edit)
    with pytest.raises(InputError, match=message):
        read_manifest(copy)
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county", "--moe"])
    assert result.exit_code == 2 and message.split("'")[0] in result.output, result.output


PANEL_FIELDS = {
    "a quarter of another form": (lambda m: m.update(quarters=["2016Q1", "2016-Q2"]), "is not of the form"),
    "a fifth quarter": (lambda m: m.update(quarters=["2016Q1", "2016Q5"]), "is not of the form"),
    "per_quarter not the quarters": (lambda m: m["per_quarter"].pop("2016Q2"), "'per_quarter' must hold exactly"),
    "a quarter's count edited": (lambda m: m["per_quarter"]["2016Q2"].update(establishments=1),
                                 "is not the sum of its states'"),
    "a quarter without its psi": (lambda m: m["per_quarter"]["2016Q2"].pop("psi"), "lacks 'per_quarter.2016Q2.psi'"),
    "a quarter's unknown psi": (lambda m: m["per_quarter"]["2016Q2"]["psi"].update(name="cube"),
                                "'psi' must name one of"),
    "a quarter publishable as text": (lambda m: m["per_quarter"]["2016Q2"].update(publishable=1),
                                      "'per_quarter.2016Q2.publishable' \\(1\\) must be true or false"),
    "a quarter's negative gamma": (lambda m: m["per_quarter"]["2016Q2"]["gammas"].update(m1emp=-1.0),
                                   "'per_quarter.2016Q2.gammas.m1emp'"),
}


@pytest.mark.parametrize("case", list(PANEL_FIELDS))
def test_a_panel_manifest_is_checked_quarter_by_quarter(panel_release, tmp_path, case):
    edit, message = PANEL_FIELDS[case]
    copy = copied(panel_release, tmp_path)
    edit_manifest(copy, edit)
    with pytest.raises(InputError, match=message):
        read_manifest(copy)


# --- the parts a reader reads ------------------------------------------------------------------
def test_a_part_the_manifest_does_not_list_is_refused_by_every_reader(one_quarter, tmp_path):
    """Red team item 4: an extra protected.parquet/extra.parquet of raw records was tabulated with
    the release's (2,050 establishments, manifest 2,000) by every reader at 9a0ff4e."""
    copy = copied(one_quarter, tmp_path)
    runner.invoke(app, ["tabulate", str(copy), "--by", "county", "--moe"])  # a kept index exists
    part = next((copy / "protected.parquet").iterdir())
    pd.read_parquet(part).head(50).to_parquet(copy / "protected.parquet" / "extra.parquet", index=False)
    with pytest.raises(InputError, match="'extra.parquet', which its manifest does not list"):
        _ = gedp.Release(copy).microdata
    with pytest.raises(InputError, match="does not list"):
        gedp.Release(copy).write(tmp_path / "copied")
    assert not (tmp_path / "copied").exists()
    report = runner.invoke(app, ["report", str(copy), "--out", str(tmp_path / "report.html")])
    assert report.exit_code == 2 and "does not list" in report.output, report.output
    for request in (["--by", "county"], ["--by", "county", "--moe"], ["--by", "county", "--where", "own == '5'"]):
        result = runner.invoke(app, ["tabulate", str(copy), *request])
        assert result.exit_code == 2 and "does not list" in result.output, result.output


def test_an_unlisted_measurement_part_is_refused(one_quarter, tmp_path):
    copy = copied(one_quarter, tmp_path)
    part = next((copy / "measurements.parquet").iterdir())
    shutil.copy(part, copy / "measurements.parquet" / "part-45.parquet")
    with pytest.raises(InputError, match="'part-45.parquet', which its manifest does not list"):
        read_answers(copy)


@pytest.mark.parametrize(("column", "value", "message"), [("attribute", "../../x", "an attribute '../../x'"),
                                                         ("query", "state,nothing", "a query 'state,nothing'")])
def test_measurements_naming_what_they_do_not_hold_are_refused(one_quarter, tmp_path, column, value, message):
    copy = copied(one_quarter, tmp_path)
    part = copy / "measurements.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    frame.loc[frame["attribute"] == "wage", column] = value
    frame.to_parquet(part, index=False)
    with pytest.raises(InputError, match=message):
        read_answers(copy)


def test_a_missing_or_linked_part_is_refused(one_quarter, tmp_path):
    copy = copied(one_quarter, tmp_path)
    part = copy / "protected.parquet" / "part-44.parquet"
    moved = tmp_path / "elsewhere.parquet"
    part.rename(moved)
    with pytest.raises(InputError, match="lacks part-44.parquet, which its manifest lists"):
        _ = gedp.Release(copy).microdata
    part.symlink_to(moved)
    with pytest.raises(InputError, match="is not a regular file"):
        _ = gedp.Release(copy).microdata


def test_rows_added_to_a_part_are_refused(one_quarter, tmp_path):
    copy = copied(one_quarter, tmp_path)
    part = copy / "protected.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    pd.concat([frame, frame.tail(3)]).to_parquet(part, index=False)
    with pytest.raises(InputError, match="hold 403 rows, its manifest states 400 establishments"):
        _ = gedp.Release(copy).microdata
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county", "--moe"])
    assert result.exit_code == 2 and "its manifest states 400 establishments" in result.output, result.output


def test_a_quarter_holding_rows_of_another_is_refused(panel_release, tmp_path):
    """A panel's 2016Q2 rows relabelled 2016Q1: 2016Q2 no longer holds the count stated; 2016Q1 is
    read from its own parts only (a reader of one quarter reads no other quarter's part)."""
    copy = copied(panel_release, tmp_path)
    part = copy / "protected.parquet" / "part-2016Q2-44.parquet"
    frame = pd.read_parquet(part)
    frame.assign(quarter="2016Q1").to_parquet(part, index=False)
    with pytest.raises(InputError, match="of 2016Q2 hold 0 rows"):
        read_quarter(copy, "2016Q2")
    pd.testing.assert_frame_equal(read_quarter(copy, "2016Q1"), read_quarter(panel_release, "2016Q1"))


def _tables_replaced(text: str):
    return lambda folder: (folder / "qcew_tables.csv").write_text(text)


def _tables_folder(folder: Path) -> None:
    (folder / "qcew_tables.csv").unlink()
    (folder / "qcew_tables.csv").mkdir()


DAMAGED_TABLES = {
    "deleted": (lambda folder: (folder / "qcew_tables.csv").unlink(), "has no qcew_tables.csv, which its manifest"),
    "a folder": (_tables_folder, "qcew_tables.csv is not a regular file"),
    "empty": (_tables_replaced(""), "qcew_tables.csv cannot be read"),
    "not a CSV": (_tables_replaced('\x00\xff,"unterminated\n1,2'), "qcew_tables.csv cannot be read"),
    "no key columns": (_tables_replaced("a,b\n1,2\n"), "qcew_tables.csv lacks the column area_fips"),
    "a level as text": (_tables_replaced("area_fips,own_code,industry_code,agglvl_code\n44000,5,10,x\n"),
                        "qcew_tables.csv cannot be read"),
    "a value as text": (_tables_replaced("area_fips,own_code,industry_code,agglvl_code,m1\n44000,5,10,51,x\n"),
                        "qcew_tables.csv holds a column 'm1' not of numbers"),
}


@pytest.mark.parametrize("case", list(DAMAGED_TABLES))
def test_missing_or_damaged_tables_are_refused_in_one_line(one_quarter, tmp_path, case):
    """Red team rt20: `gedp report` of a release whose qcew_tables.csv was deleted (or damaged) printed
    a ~106-line traceback (exit 1); now one line naming the file, exit 2, and the API's reader refuses it."""
    damage, message = DAMAGED_TABLES[case]
    copy = copied(one_quarter, tmp_path)
    damage(copy)
    result = runner.invoke(app, ["report", str(copy), "--out", str(tmp_path / "report.html")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "report.html").exists()
    with pytest.raises(InputError, match=re.escape(message)):
        gedp.read_release(copy).qcew_tables


@pytest.mark.parametrize("column", ["m1emp", "wage", "county"])
def test_protected_microdata_without_a_column_of_the_release_are_refused_by_every_reader(one_quarter, tmp_path,
                                                                                          monkeypatch, column):
    """Red team rt20 (second round): with m1emp dropped from a part, `tabulate --moe` left its columns out
    silently (and its wage margins changed), `report` printed a KeyError traceback."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = copied(one_quarter, tmp_path)
    _edit_part(copy, lambda frame: frame.__delitem__(column))
    message = f"lack the column '{column}'"
    for request in (["tabulate", str(copy), "--by", "sector", "--moe"],
                    ["report", str(copy), "--out", str(tmp_path / "report.html")],
                    ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and message in result.output, (request, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "imp").exists()
    with pytest.raises(InputError, match=message):
        gedp.read_release(copy).tabulate(by=["sector"])


@pytest.mark.parametrize("edit", ["m1emp dropped", "county as int64"])
def test_the_stored_reader_refuses_wrong_columns_from_the_schema_before_any_row(one_quarter, tmp_path, monkeypatch,
                                                                                edit):
    """read_stored (Release.microdata, implicates, the margin structure's build) checked the columns after
    reading every row of every part (main: the parts' rows decoded, then refused); the parts' schemas are
    checked first, so a hostile part's rows are never read (nor their decoded size counted)."""
    from gedp.release import reader

    copy = copied(one_quarter, tmp_path)
    _edit_part(copy, {"m1emp dropped": lambda f: f.__delitem__("m1emp"),
                      "county as int64": lambda f: f.__setitem__("county", pd.to_numeric(f["county"]))}[edit])
    read: list[str] = []
    for name, step in (("read_parts", "rows"), ("check_decoded", "decoded sizes")):
        monkeypatch.setattr(reader, name, lambda *a, call=getattr(reader, name), step=step, **k:
                            read.append(step) or call(*a, **k))
    with pytest.raises(InputError, match="lack the column 'm1emp'|'county' as int64"):
        reader.read_stored(copy)
    assert read == []
    reader.read_stored(one_quarter)  # power: the release without the edit reads its rows through them
    assert read == ["decoded sizes", "rows"]


#: Protected microdata columns stored as another type than the release writer's (red team of harden20:
#: a county of int64 tabulated as "44,1", a key no answer has), and the type each is refused as.
RETYPED = {
    "county as int64": (lambda f: f.assign(county=pd.to_numeric(f["county"])), "'county' as int64, not as text"),
    "state as double": (lambda f: f.assign(state=pd.to_numeric(f["state"]).astype(float)), "'state' as double"),
    "naics as int64": (lambda f: f.assign(naics=pd.to_numeric(f["naics"])), "'naics' as int64, not as text"),
    "estab_id as int64": (lambda f: f.assign(estab_id=np.arange(len(f))), "'estab_id' as int64, not as text"),
    "county categorical": (lambda f: f.assign(county=f["county"].astype("category")), "'county' as dictionary"),
    "year as double": (lambda f: f.assign(year=f["year"].astype(float)), "'year' as double, not as int64"),
    "wage as text": (lambda f: f.assign(wage=f["wage"].map(repr).astype(object)), "'wage' as"),
}


@pytest.mark.parametrize("case", list(RETYPED))
def test_protected_columns_of_another_type_are_refused_by_every_reader(one_quarter, tmp_path, monkeypatch, case):
    """A key column stored as numbers (main: `tabulate --by county` answered counties "1", "3", ...,
    and its margins came from the validated, re-padded codes) or an attribute as text: refused in one
    line by tabulate (with and without margins), implicates, report and the API, nothing written."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = RETYPED[case]
    copy = copied(one_quarter, tmp_path)
    part = copy / "protected.parquet" / "part-44.parquet"
    edit(pd.read_parquet(part)).to_parquet(part, index=False)
    for request in (["tabulate", str(copy), "--by", "county"], ["tabulate", str(copy), "--by", "county", "--moe"],
                    ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"],
                    ["report", str(copy), "--out", str(tmp_path / "report.html")]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and message in result.output, (request, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "imp").exists() and not (tmp_path / "report.html").exists()
    with pytest.raises(InputError, match=re.escape(message)):
        _ = gedp.read_release(copy).microdata


@pytest.mark.parametrize("edit", ["an attribute the ledgers never charged", "no mu", "no gamma for wage"])
def test_the_report_checks_the_manifest_against_the_answers_before_it_states_it(one_quarter, tmp_path, edit):
    """Red team rt20: the report read the manifest's mu and gammas before any check (KeyError tracebacks);
    now the answers are checked against them first, as tabulate checks them: one line, exit 2."""
    edits = {"an attribute the ledgers never charged": lambda m: m["mu"]["identity"].update(foo=0.1),
             "no mu": lambda m: m.pop("mu"), "no gamma for wage": lambda m: m["gammas"].pop("wage")}
    copy = copied(one_quarter, tmp_path)
    edit_manifest(copy, edits[edit])
    result = runner.invoke(app, ["report", str(copy), "--out", str(tmp_path / "report.html")])
    assert result.exit_code == 2 and result.output.startswith("error: release "), result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("folder", ["empty", "manifest only", "parts only"])
def test_a_folder_without_a_release_gets_a_clear_error(one_quarter, tmp_path, folder):
    """Newcomer: a raw pyarrow error at 9a0ff4e."""
    path = tmp_path / "folder"
    path.mkdir()
    if folder == "manifest only":
        shutil.copy(one_quarter / "manifest.json", path)
    if folder == "parts only":
        shutil.copytree(one_quarter / "protected.parquet", path / "protected.parquet")
    with pytest.raises(InputError, match="is not a gedp release|has no measurements.parquet|has no protected"):
        gedp.Release(path).tabulate("county", moe=True)
    with pytest.raises(InputError, match="is not a gedp release|has no protected"):
        _ = gedp.Release(path).microdata


def test_moe_by_a_column_the_user_added_names_it(one_quarter):
    """Newcomer: a bare pandas KeyError at 9a0ff4e."""
    release = gedp.read_release(one_quarter)
    release.microdata["big"] = np.where(release.microdata["county"] < "005", "yes", "no")
    assert len(release.tabulate("big")) == 2  # sums: any column
    with pytest.raises(InputError, match=r"margins of error by 'big'.*public columns only \(.*county"):
        release.tabulate("big", moe=True)


# --- the margin cache --------------------------------------------------------------------------
def test_the_cache_names_nothing_from_a_release(one_quarter, margins_cache):
    root = margins_cache / "margins"
    for quarter in (None, "2016Q1", HOSTILE, "/etc"):
        path = kept_path(one_quarter, quarter)
        assert path.parent == root and margins.STRUCTURE_NAME.fullmatch(path.name), path


def test_pruning_removes_only_the_cache_own_folders(one_quarter, margins_cache, tmp_path, monkeypatch):
    """Only folders named as structures, directly in margins/ and not links, are ever removed."""
    monkeypatch.setattr(margins, "KEPT_STRUCTURES", 1)
    kept_variances(one_quarter)
    root = margins_cache / "margins"
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (root / "photos").mkdir()
    (root / ("f" * 64)).symlink_to(outside, target_is_directory=True)
    (root / ("e" * 64)).write_text("a file, not a folder")
    stale = root / ("0" * 64)
    earlier = root / f"{'2' * 64}-2016Q1"  # as the format before named a quarter's
    left = root / ".partial-abc123"  # a stopped request's
    fresh_left = root / ".partial-def456"
    for folder in (stale, earlier, left, fresh_left):
        folder.mkdir()
    for folder in (stale, earlier, left):
        os.utime(folder, (1, 1))
    write_structure({}, root / ("1" * 64))
    assert not stale.exists() and not kept_path(one_quarter).exists()  # older than the newest
    assert not earlier.exists() and not left.exists() and fresh_left.is_dir()
    assert (root / "photos").is_dir() and (outside / "keep").is_dir() and (root / ("e" * 64)).is_file()
    assert (root / ("f" * 64)).is_symlink()


def test_a_deleted_values_file_is_detected_and_rebuilt(one_quarter, tmp_path):
    """Red team item 8: without values-wage.npy later --moe requests had no wage columns, exit 0."""
    request = ["tabulate", str(one_quarter), "--by", "county", "--moe", "--out"]
    first = runner.invoke(app, [*request, str(tmp_path / "first.csv")])
    assert first.exit_code == 0, first.output
    folder = kept_path(one_quarter)
    (folder / "values-wage.npy").unlink()
    assert not margins.is_complete(folder)
    for name in ("second", "third"):  # the second rebuilds the structure, the third reads it
        result = runner.invoke(app, [*request, str(tmp_path / f"{name}.csv")])
        assert result.exit_code == 0, result.output
        assert (tmp_path / f"{name}.csv").read_bytes() == (tmp_path / "first.csv").read_bytes()
    assert (folder / "values-wage.npy").is_file() and margins.is_complete(folder)
    assert "wage_moe" in pd.read_csv(tmp_path / "third.csv").columns


@pytest.mark.parametrize("damage", ["cut short", "pieces.json deleted", "complete.json deleted"])
def test_any_damaged_kept_file_is_rebuilt(one_quarter, tmp_path, damage):
    from gedp.release.margins import kept_tabulation

    fresh = gedp.read_release(one_quarter).tabulate("county,own", moe=True)
    folder = kept_path(one_quarter)
    if damage == "cut short":
        target = folder / "values-m1emp.npy"
        target.write_bytes(target.read_bytes()[:-8])
    else:
        (folder / damage.split()[0]).unlink()
    assert kept_tabulation(one_quarter, "county,own", moe=True) is None
    again = gedp.read_release(one_quarter).tabulate("county,own", moe=True)
    pd.testing.assert_frame_equal(again, fresh)
    assert margins.is_complete(folder)


def test_a_structure_of_another_release_copied_into_this_ones_folder_is_rebuilt(one_quarter, seeded_small_release,
                                                                                 tmp_path, monkeypatch):
    """Red team of harden20: release A's kept structure copied into the cache folder named by release B's
    digest was used for B (its margins and, with the kept index, its sums were A's, exit 0). A structure
    states the digest of the files it was computed from: B's first request and every later one (the
    quick path, the kept index, the full path) give B's bytes, those of a cache that never held A's."""
    other = seeded_small_release("other", 300)
    request = ["-m", "gedp", "tabulate", str(other), "--by", "county", "--moe"]
    command = [sys.executable, *request]
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "fresh"))
    fresh = subprocess.run(command, capture_output=True, check=True).stdout
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    gedp.read_release(one_quarter).tabulate("county", moe=True)
    shutil.copytree(kept_path(one_quarter), kept_path(other))
    # power: A's structure differs from B's, and the copy is what B's folder holds
    assert fresh != subprocess.run([sys.executable, *request[:3], str(one_quarter), *request[4:]],
                                   capture_output=True, check=True).stdout
    for _ in range(2):  # the first rebuilds B's structure, the second reads it
        assert subprocess.run(command, capture_output=True, check=True).stdout == fresh
    assert json.loads((kept_path(other) / "complete.json").read_text())["digest"] == kept_path(other).name
    plain = gedp.read_release(other).tabulate("county")
    assert plain.equals(gedp.read_release(other).tabulate("county", moe=True)[plain.columns])


# --- numbers, psi, links and non-ASCII digits (second red team) --------------------------------
HOSTILE_NUMBERS = {
    "a huge mu_total": (lambda m: m.update(mu_total=1e300), "'mu_total'"),
    "an infinite mu_total": (lambda m: m.update(mu_total=float("inf")), "'mu_total'"),
    "a negative mu_total": (lambda m: m.update(mu_total=-1.0), "'mu_total'"),
    "a mu_total as text": (lambda m: m.update(mu_total="2.3"), "'mu_total'"),
    "a huge query mu": (lambda m: m["mu"]["identity"].update(wage=1e12), "'mu.identity.wage'"),
    "a psi with an extra key": (lambda m: m["psi"].update(b=1.0), "not a parameter of psi"),
    "a psi parameter as text": (lambda m: m["psi"].update(a="0"), "'psi.a'"),
    "an unknown psi": (lambda m: m["psi"].update(name="cube"), "'psi' must name one of"),
    "a negative gamma": (lambda m: m["gammas"].update(wage=-1.0), "'gammas.wage'"),
    "a state of Arabic-Indic digits": (lambda m: m.update(states=["\u0664\u0664"],
                                                          per_state={"\u0664\u0664": m["per_state"]["44"]}),
                                       "'states' holds"),
}


@pytest.mark.parametrize("case", list(HOSTILE_NUMBERS))
def test_every_number_and_the_psi_of_a_manifest_are_checked(one_quarter, tmp_path, case):
    edit, message = HOSTILE_NUMBERS[case]
    copy = copied(one_quarter, tmp_path)
    edit_manifest(copy, edit)
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        read_manifest(copy)


def test_the_readers_psi_rules_are_the_neighbor_functions_own():
    """The reader checks psi without importing the neighbor functions (a further request stays light):
    its table names each function's parameters, and a psi passes it exactly when make_psi accepts it."""
    import dataclasses

    from gedp.measure.neighbors import NEIGHBOR_FUNCTIONS, make_psi
    from gedp.release.validation import PSI_PARAMETERS, _check_psi

    assert set(PSI_PARAMETERS) == set(NEIGHBOR_FUNCTIONS)
    for name, function in NEIGHBOR_FUNCTIONS.items():
        assert set(PSI_PARAMETERS[name]) == {field.name for field in dataclasses.fields(function) if field.init}
        for key in PSI_PARAMETERS[name]:
            for value in (-1.0, 0.0, 0.5, 1e13, 2e13):
                psi = {"name": name, key: value}
                try:
                    make_psi(**psi)
                    made = True
                except ValueError:
                    made = False
                try:
                    _check_psi("r", psi)
                    passed = True
                except InputError:
                    passed = False
                assert passed == made, (psi, passed, made)


def test_a_config_stating_a_mu_beyond_the_limit_is_refused():
    import yaml

    from gedp import configs
    from gedp.accounting.mu_limits import MAX_STATED_MU
    from gedp.config import parse_config
    from gedp.errors import ConfigError

    raw = yaml.safe_load(configs.path("employment").read_text()) | {"mu_cap": MAX_STATED_MU * 10}
    with pytest.raises(ConfigError, match="the most a release may state"):
        parse_config(raw, allow_large_mu=True)


@pytest.mark.parametrize("linked", ["manifest.json", "protected.parquet", "measurements.parquet"])
def test_a_linked_manifest_or_output_folder_is_refused(one_quarter, tmp_path, linked):
    copy = copied(one_quarter, tmp_path)
    moved = tmp_path / f"elsewhere-{linked}"
    (copy / linked).rename(moved)
    (copy / linked).symlink_to(moved)
    with pytest.raises(InputError, match="symbolic link"):
        read_manifest(copy) if linked == "manifest.json" else (read_answers(copy) if linked.startswith("meas")
                                                               else gedp.Release(copy).microdata)
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county", "--moe"])
    assert result.exit_code == 2 and "symbolic link" in result.output, result.output


# --- a cache others can write (second red team, M1) ---------------------------------------------
@pytest.mark.parametrize("loose", ["cache folder", "margins folder"])
def test_a_cache_others_can_write_is_refused(one_quarter, tmp_path, monkeypatch, loose):
    """Whoever can write the cache could scale every kept value: a cache folder or its margins/
    writable by group or others is refused in one line, before anything is read from it."""
    cache = tmp_path / "shared"
    monkeypatch.setenv("GEDP_CACHE_DIR", str(cache))
    assert runner.invoke(app, ["tabulate", str(one_quarter), "--by", "county", "--moe"]).exit_code == 0
    assert (cache.stat().st_mode & 0o777, (cache / "margins").stat().st_mode & 0o777) == (0o700, 0o700)
    (cache if loose == "cache folder" else cache / "margins").chmod(0o777)
    for request in (["--by", "county"], ["--by", "county", "--moe"]):
        result = runner.invoke(app, ["tabulate", str(one_quarter), *request])
        assert result.exit_code == 2 and "is not private" in result.output, result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_of_another_user_is_refused(one_quarter, tmp_path, monkeypatch):
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o700)
    os.chown(cache, 54321, 54321)
    monkeypatch.setenv("GEDP_CACHE_DIR", str(cache))
    result = runner.invoke(app, ["tabulate", str(one_quarter), "--by", "county", "--moe"])
    assert result.exit_code == 2 and "owned by you" in result.output, result.output


# --- implicates and size classes read the protected data as tabulate does (L1/L2) ---------------
def _edit_part(copy: Path, edit) -> None:
    part = copy / "protected.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    edit(frame)
    frame.to_parquet(part, index=False)


EDITED_PARTS = {
    "a repeated estab_id": (lambda f: f.__setitem__("estab_id", [f["estab_id"].iloc[0]] * 2
                                                    + list(f["estab_id"].iloc[2:])), "must be unique"),
    "markup in county": (lambda f: f.__setitem__("county", ["<b>x</b>"] + list(f["county"].iloc[1:])),
                         "codes must be 3 ASCII digits"),
    "a value that is not finite": (lambda f: f.__setitem__("m1emp", [np.inf] + list(f["m1emp"].iloc[1:])),
                                   "values must be finite numbers"),
}


@pytest.mark.parametrize("case", list(EDITED_PARTS))
def test_implicates_and_size_classes_refuse_protected_data_that_tabulate_refuses(one_quarter, tmp_path,
                                                                                 monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = EDITED_PARTS[case]
    copy = copied(one_quarter, tmp_path)
    _edit_part(copy, edit)
    for request in (["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"],
                    ["tabulate", str(copy), "--by", "sector,size_class"],
                    ["tabulate", str(copy), "--by", "county", "--moe"]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and message in result.output, (request, result.output)
        assert "<b>" not in result.output
    assert not (tmp_path / "imp").exists()


# --- the noisy answers are checked where they are read (red team F5) -----------------------------
def _rows(frame: pd.DataFrame, query: str | None = None, count: int = 50) -> pd.Index:
    rows = frame.index if query is None else frame.index[frame["query"] == query]
    return rows[:count]


def _set(column: str, value: float, query: str | None = None, count: int = 50):
    def edit(frame: pd.DataFrame) -> pd.DataFrame:
        frame.loc[_rows(frame, query, count), column] = value
        return frame
    return edit


def _consistent_sd(sd: float):
    """Every psi answer's sd set to ``sd`` with the estimate and variance the mechanism gives from it."""
    def edit(frame: pd.DataFrame) -> pd.DataFrame:
        from gedp.measure.neighbors import make_psi

        psi = make_psi(name="sqrt", a=0)
        rows = frame["mechanism"] == "psi"
        frame.loc[rows, "sd"] = sd
        frame.loc[rows, "estimate"] = psi.unbiased_estimate(frame.loc[rows, "released"].to_numpy(), sd)
        frame.loc[rows, "variance"] = psi.releasable_variance(frame.loc[rows, "estimate"].to_numpy(), sd)
        return frame
    return edit


def _one_sd_nudged(frame: pd.DataFrame) -> pd.DataFrame:
    """One identity answer's sd moved by 5e-10 of itself (inside the tolerance of the mechanism's least and
    most sd), its estimate and variance as the mechanism gives them from it: the answer then has two sds."""
    from gedp.measure.neighbors import make_psi

    psi = make_psi(name="sqrt", a=0)
    row = _rows(frame, "identity", 1)
    sd = frame.loc[row, "sd"].to_numpy() * (1 + 5e-10)
    frame.loc[row, "sd"] = sd
    frame.loc[row, "estimate"] = psi.unbiased_estimate(frame.loc[row, "released"].to_numpy(), sd)
    frame.loc[row, "variance"] = psi.releasable_variance(frame.loc[row, "estimate"].to_numpy(), sd)
    return frame


def _as_pnc(frame: pd.DataFrame) -> pd.DataFrame:
    """Three identity answers of m1emp made pnc answers, each number as pnc's would be (on its grid,
    its estimate the released value, its variance sd^2)."""
    rows = _rows(frame[frame["attribute"] == "m1emp"], "identity", 3)
    grid = 2.0**-10
    released = np.round(frame.loc[rows, "released"] / grid) * grid
    return frame.assign(mechanism=frame["mechanism"].mask(frame.index.isin(rows), "pnc")).assign(
        variance_kind=frame["variance_kind"].mask(frame.index.isin(rows), "exact")).pipe(
        lambda f: f.assign(grid=f["grid"].mask(f.index.isin(rows), grid),
                           released=f["released"].mask(f.index.isin(rows), released),
                           estimate=f["estimate"].mask(f.index.isin(rows), released),
                           variance=f["variance"].mask(f.index.isin(rows), f["sd"] ** 2)))


#: The red team's edits of measurements.parquet (each ended in a traceback, an overflow or silently
#: changed numbers at 3e97528), with the rule each breaks.
HOSTILE_MEASUREMENTS = {
    "variance NaN": (_set("variance", np.nan), "variance is not a finite number"),
    "variance NaN in a county answer": (_set("variance", np.nan, "state,county"), "variance is not a finite number"),
    "variance negative": (_set("variance", -5.0), "psi estimate or variance is not the one"),
    "variance 1e308": (_set("variance", 1e308), "psi estimate or variance is not the one"),
    "variance inf everywhere": (_set("variance", np.inf, count=10**9), "variance is not a finite number"),
    "sd 0 everywhere": (_set("sd", 0.0, count=10**9), "sd is not between the grid's rounding"),
    "sd NaN": (_set("sd", np.nan), "hold 50 rows whose sd is not a finite number"),
    "sd negative": (_set("sd", -1.0, count=3), "sd is not between the grid's rounding"),
    "sd 1e300 everywhere": (_set("sd", 1e300, count=10**9), "sd is not between the grid's rounding"),
    "sd 1e-300 everywhere": (_set("sd", 1e-300, count=10**9), "sd is not between the grid's rounding"),
    "sd 1e50, estimates and variances to match": (_consistent_sd(1e50), "2^55 grid steps"),
    "sd below gamma / mu, estimates and variances to match": (_consistent_sd(0.01), "below the psi mechanism's gamma"),
    "estimate NaN": (_set("estimate", np.nan), "estimate is not a finite number"),
    "estimate inf": (_set("estimate", np.inf), "estimate is not a finite number"),
    "one estimate NaN": (_set("estimate", np.nan, count=1), "hold 1 row whose estimate is not a finite number"),
    "released NaN": (_set("released", np.nan), "released is not a finite number"),
    "released 1e200": (_set("released", 1e200), "not a multiple of its grid step within the grid's range"),
    "a pnc answer's estimate moved": (_set("estimate", 1.0, "state,county"), "pnc estimate or variance"),
    "mu 0": (_set("mu", 0.0, "identity"), "mu is not in (0, 1e+06]"),
    "grid 2^40": (_set("grid", 2.0**40), "grid is not the step its mechanism and gamma release on"),
    "identity rows dropped": (lambda f: f.drop(f.index[5:40]), "hold 365 identity answers of 'm1emp', the "
                                                               "manifest states 400 establishments"),
    "rows repeated": (lambda f: pd.concat([f, f.iloc[:30]]), "keys repeat those of another row of the same answer"),
    "a county answer repeated": (lambda f: pd.concat([f, f[f["query"] == "state,county"].iloc[:1]]),
                                 "keys repeat those of another row"),
    "identity answers of m2emp given to other establishments": (
        lambda f: f.assign(estab_id=np.where((f["query"] == "identity") & (f["attribute"] == "m2emp"),
                                             np.roll(f["estab_id"].to_numpy(dtype=object), 1), f["estab_id"])),
        "hold identity answers of 'm2emp' for other establishments"),
    "mechanism renamed": (lambda f: f.assign(mechanism="<b>x</b>"), "mechanism is not psi or pnc"),
    # red team of int7: types and columns checked from each part's schema, before any key work
    "estab_id stored as numbers": (lambda f: f.assign(estab_id=pd.factorize(f["estab_id"])[0].astype(float)),
                                   "hold a key column 'estab_id' as double, not as text"),
    "a state stored as a number": (lambda f: f.assign(state=pd.to_numeric(f["state"])),
                                   "hold a key column 'state' as"),
    "released stored as text": (lambda f: f.assign(released=f["released"].map(repr).astype(object)),
                                "hold the column released as string, not as numbers"),
    "variance_kind dropped": (lambda f: f.drop(columns="variance_kind"), "lack the column variance_kind"),
    "mu dropped": (lambda f: f.drop(columns="mu"), "lack the column mu"),
    "grid dropped": (lambda f: f.drop(columns="grid"), "lack the column grid"),
    "a county key of 1,000 characters": (lambda f: f.assign(county=f["county"].where(f["county"].isna(), "1" * 1000)),
                                         "hold a key of 'county' longer than 64 characters"),
    "pnc sd 0 on a released value not 0": (
        lambda f: f.assign(sd=f["sd"].where(f["mechanism"] == "psi", 0.0),
                           variance=f["variance"].where(f["mechanism"] == "psi", 0.0)),
        "pnc sd is 0 (no noise) but the released value is not 0"),
    "sd 1e6, below 2^55 grid steps, estimates and variances to match": (
        _consistent_sd(1e6), "sd is above the psi mechanism's (gamma + grid + float error) / mu"),
    # red team rt24 F1: an identity sd other than its answer's (a bound psi^-1(omega + sd tau + grid) set at will)
    "one identity sd nudged inside the mechanism's tolerance": (
        _one_sd_nudged, "sd is not its psi answer's one sd (the mechanism draws one per answer)"),
    # red team of harden7: answers that are not the plan's, mixed within an answer, keys forged
    "a query dropped": (lambda f: f[f["query"] != "state,naics5"],
                        "lack the answers of query 'state,naics5' on 'm1emp' (state 44), which the manifest's plan"),
    "an attribute dropped": (lambda f: f[f["attribute"] != "wage"], "lack the answers of query 'identity' on 'wage'"),
    "every answer dropped": (lambda f: f.iloc[:0], "lack the answers of query 'identity' on 'm1emp' (state 44)"),
    "a query renamed to one the plan lacks": (
        lambda f: f.assign(query=f["query"].replace("state,county", "county,state")),
        "name a query 'county,state' on 'm1emp' (state 44) that the manifest's plan does not state"),
    "a county answer of mixed mu": (_set("mu", 0.3, "state,county", 2),
                                    "mu is not the one the manifest's ledger charged its answer"),
    "an identity answer of mixed mechanisms": (_as_pnc, "mechanism is not its query's (identity: psi"),
    "a pnc answer's variance estimated": (lambda f: f.assign(variance_kind="estimated"),
                                          "variance_kind is not its mechanism's (psi: estimated; pnc: exact)"),
    "a county key categorical": (lambda f: f.assign(county=f["county"].astype("category")),
                                 "holds the column 'county' as dictionary<values=string"),
}


def _edit_measurements(copy: Path, edit) -> None:
    part = copy / "measurements.parquet" / "part-44.parquet"
    edit(pd.read_parquet(part)).to_parquet(part, index=False)


@pytest.mark.parametrize("case", list(HOSTILE_MEASUREMENTS))
def test_hostile_measurements_are_refused_in_one_line_by_every_reader(one_quarter, tmp_path, monkeypatch, case):
    """Each edit is refused where the answers are read: the API's reader, gedp tabulate --moe and
    gedp implicates in one line and exit 2, the server at load or per request (400, its id only)."""
    from gedp.serve.app import Limits, create_app
    from gedp.serve.releases import load_releases

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = HOSTILE_MEASUREMENTS[case]
    copy = copied(one_quarter, tmp_path)
    _edit_measurements(copy, edit)
    with pytest.raises(InputError, match=re.escape(message)):
        read_answers(copy)
    for request in (["tabulate", str(copy), "--by", "county", "--moe"],
                    ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and message in result.output, (request, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "<b>" not in result.output, result.output
    assert not (tmp_path / "imp").exists()
    try:
        served = load_releases([copy])
    except InputError as err:
        assert message in str(err)
        return
    status, body = asgi_get(create_app(served, Limits()), "/api/tabulate",
                            {"release": next(iter(served)), "by": "county", "moe": "1"})
    assert status == 400 and message in json.loads(body)["error"], body
    assert str(tmp_path).encode() not in body


def asgi_get(application, path: str, params: dict) -> tuple[int, bytes]:
    """The status and body of a GET of ``application`` (ASGI), called in this process."""
    import urllib.parse

    import anyio

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": urllib.parse.urlencode(params).encode(), "headers": [], "scheme": "http",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "http_version": "1.1", "asgi": {"version": "3.0"}}
    anyio.run(application, scope, receive, send)
    return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:])


def _first_county_row(frame: pd.DataFrame) -> int:
    return frame.index[(frame["query"] == "state,county") & (frame["attribute"] == "m1emp")][0]


def _permuted_ids(frame: pd.DataFrame) -> pd.DataFrame:
    """The identity answers of every attribute given to the establishments in another (the same) order."""
    identity = frame["query"] == "identity"
    ids = frame.loc[identity & (frame["attribute"] == "m1emp"), "estab_id"].to_numpy()
    order = np.random.default_rng(0).permutation(len(ids))
    for attribute in frame.loc[identity, "attribute"].unique():
        frame.loc[identity & (frame["attribute"] == attribute), "estab_id"] = ids[order]
    return frame


#: Answers whose keys are well formed but not the public groups (red team of int7): refused where they
#: meet the protected microdata (``wls.build_system``).
UNMATCHED_KEYS = {
    "a county answer dropped": (lambda f: f.drop(index=_first_county_row(f)),
                                "answers of query state,county do not match the groups"),
    "a county key null": (lambda f: f.assign(county=f["county"].mask(f.index == _first_county_row(f))),
                          "answers of query state,county do not match the groups"),
    "identity answers permuted": (_permuted_ids, "answers of query identity do not match the groups"),
    "identity answers of other establishments": (
        lambda f: f.assign(estab_id="X" + f["estab_id"]),
        "the months' identity answers hold establishments that the public microdata does not"),
}


@pytest.mark.parametrize("case", list(UNMATCHED_KEYS))
def test_answers_not_of_the_public_groups_are_refused_in_one_line(one_quarter, tmp_path, monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = UNMATCHED_KEYS[case]
    copy = copied(one_quarter, tmp_path)
    _edit_measurements(copy, edit)
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county", "--moe"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    # implicates refuse them too (the red team of int8: they wrote files for the first three cases)
    drawn = runner.invoke(app, ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"])
    assert drawn.exit_code == 2 and message in drawn.output, drawn.output  # tabulate's refusal (the re-solve's)
    assert len(drawn.output.strip().splitlines()) == 1 and not (tmp_path / "imp").exists(), drawn.output


def test_a_column_no_query_groups_by_is_not_read(one_quarter, tmp_path):
    """An extra column (the red team's 'zz', a long string on every row) is left unread: the answers
    read are those of the release without it."""
    from gedp.release.reader import read_measurements

    copy = copied(one_quarter, tmp_path)
    _edit_measurements(copy, lambda f: f.assign(zz="z" * 100_000))
    pd.testing.assert_frame_equal(read_measurements(copy), read_measurements(one_quarter))


def test_a_panel_part_without_its_quarter_column_is_refused(panel_release, tmp_path):
    copy = copied(panel_release, tmp_path)
    part = copy / "measurements.parquet" / "part-2016Q1-44.parquet"
    pd.read_parquet(part).drop(columns="quarter").to_parquet(part, index=False)
    with pytest.raises(InputError, match="lack the column quarter .part-2016Q1-44.parquet."):
        read_answers(copy, "2016Q1")
    result = runner.invoke(app, ["serve", str(panel_release), str(copy)])
    assert result.exit_code == 2 and "lack the column quarter" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def _not_parquet(part: Path) -> None:
    part.write_bytes(b"estab_id,m1emp\n44-1,12\n")


def _garbled_footer(part: Path) -> None:
    """The magic bytes kept, the footer's metadata overwritten: Arrow cannot decode it."""
    content = bytearray(part.read_bytes())
    content[-200:-8] = b"\x07" * 192
    part.write_bytes(bytes(content))


@pytest.mark.parametrize("damage", [_not_parquet, _garbled_footer], ids=["not_parquet", "garbled_footer"])
@pytest.mark.parametrize("output", ["protected.parquet", "measurements.parquet"])
def test_a_damaged_part_is_refused_in_one_line_by_every_reader(one_quarter, tmp_path, monkeypatch, output, damage):
    """A part that is not the Parquet gedp wrote (text, or a footer that does not decode) gave Arrow's
    traceback (exit 1) in `gedp tabulate --moe`, `gedp implicates` and the server's start: now one line naming
    the release and the output, exit 2, and the server refuses to start naming its release only."""
    from gedp.serve.releases import load_releases

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = copied(one_quarter, tmp_path)
    damage(copy / output / "part-44.parquet")
    expected = "is not a Parquet file" if damage is _not_parquet else f"{output}/part-44.parquet cannot be read"
    for request in (["tabulate", str(copy), "--by", "county", "--moe"],
                    ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and expected in result.output, (request, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "imp").exists()
    with pytest.raises(InputError, match=re.escape(expected)):
        read_answers(copy) if output == "measurements.parquet" else gedp.Release(copy).microdata
    with pytest.raises(InputError, match=re.escape(expected)) as refused:
        load_releases([copy])
    assert str(tmp_path) not in str(refused.value).replace(str(copy), "")


def test_labels_the_plan_does_not_state_are_refused_in_memory_their_rows_bound(one_quarter, tmp_path):
    """Red team (int8, F2): 41,000 pnc rows each naming its own query and attribute made the plan
    check allocate parts x queries x attributes (12.6 GiB) before refusing them. The check is now sized
    by the answers held: 20,000 such rows are refused with at most 200 MB allocated (the product would
    be 3.2 GB)."""
    import tracemalloc

    copy = copied(one_quarter, tmp_path)

    def unique_labels(frame: pd.DataFrame) -> pd.DataFrame:
        pnc = frame[frame["mechanism"] == "pnc"]
        pnc = pd.concat([pnc] * (1 + 20_000 // len(pnc)), ignore_index=True)
        pnc["query"] = [f"state,q{k}" for k in range(len(pnc))]
        pnc["attribute"] = [f"a{k}" for k in range(len(pnc))]
        return pd.concat([frame[frame["mechanism"] != "pnc"], pnc], ignore_index=True)

    _edit_measurements(copy, unique_labels)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="that the manifest's plan does not state"):
            read_answers(copy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200e6, peak
