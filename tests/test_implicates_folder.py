"""Size-class tables from implicates drawn once (``gedp tabulate RELEASE --by ...,size_class --implicates
DIR``, ``Release.tabulate(implicates=DIR)``): tables of one folder add up where they overlap, a folder
drawn with the release's seed gives the table drawn without it, and a folder that is not this release's
``gedp implicates`` output is refused in one line, nothing written."""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_page_headers import lying_header
from test_part_sizes import BOMB_FOOTER
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.release import implicates_folder
from gedp.release.implicates import tabulation_seed, write_implicates

runner = CliRunner()
SUMS = ["estabs", "m1emp", "m2emp", "m3emp", "wage"]


@pytest.fixture(scope="module")
def drawn(lone_release, tmp_path_factory):
    """Three implicates of the small release, seed 1, written once for the module (copied by tests that edit)."""
    return write_implicates(lone_release, 3, tmp_path_factory.mktemp("drawn") / "draws", seed=1)


def copied(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


def rewrite(path: Path, change) -> None:
    """An implicate file rewritten as pandas writes it, after ``change(frame) -> frame``."""
    frame = change(pq.read_table(path).to_pandas())
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def edit_summary(folder: Path, **changes) -> None:
    path = folder / "_implicates.json"
    summary = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            summary.pop(key)
        else:
            summary[key] = value
    path.write_text(json.dumps(summary))


def tabulated(release: Path, folder: Path, by: str, out: Path, *extra: str):
    return runner.invoke(app, ["tabulate", str(release), "--by", by, "--moe", "--implicates", str(folder),
                               "--out", str(out), *extra])


def by_class(table: pd.DataFrame) -> pd.DataFrame:
    return table.groupby("size_class")[SUMS].sum()


def test_tables_of_one_folder_add_up_where_they_overlap(lone_release, drawn, tmp_path):
    """County x class and sector x class tables of one folder, summed to classes, agree to rounding (the
    same draws); of two folders drawn with other seeds they do not (power: the check can fail). The
    table's summary line and JSON say how many implicates and which folder."""
    tables = {}
    for by in ("county,size_class", "sector,size_class"):
        out = tmp_path / f"{by.split(',')[0]}.csv"
        result = tabulated(lone_release, drawn, by, out)
        assert result.exit_code == 0, result.output
        assert f"combined over 3 implicates from {drawn}" in " ".join(result.output.split())
        summary = json.loads(out.with_name(out.name + ".json").read_text())
        assert summary["implicates"]["count"] == 3 and summary["implicates"]["folder"] == str(drawn)
        assert summary["implicates"]["rng"]["seed"] == 1
        tables[by] = pd.read_csv(out)
    county, sector = (by_class(table) for table in tables.values())
    assert county.index.equals(sector.index)
    np.testing.assert_allclose(county.to_numpy(), sector.to_numpy(), rtol=1e-12, atol=0)
    assert county["estabs"].sum() == pytest.approx(len(gedp.read_release(lone_release).microdata), rel=1e-12)
    other = write_implicates(lone_release, 3, tmp_path / "other", seed=2)
    result = tabulated(lone_release, other, "sector,size_class", tmp_path / "other.csv")
    assert result.exit_code == 0, result.output
    moved = by_class(pd.read_csv(tmp_path / "other.csv")).reindex(county.index, fill_value=0.0)
    assert not np.allclose(county.to_numpy(), moved.to_numpy(), rtol=1e-12, atol=0)


def test_a_folder_drawn_with_the_release_seed_gives_the_table_drawn_without_it(lone_release, tmp_path, drawn_once):
    """``gedp implicates --n 20 --seed <the release's seed>`` draws what a size-class table draws: the
    tables (both layouts) are the same, bit for bit, and so with the folder's rows shuffled (they are
    put back in the release's order by estab_id)."""
    release = gedp.read_release(lone_release)
    folder = write_implicates(lone_release, 20, tmp_path / "twenty", seed=tabulation_seed(lone_release))
    for by, layout in (("sector,size_class", "table"), ("county,size_class", "table"), ("sector,size_class", "qcew")):
        pd.testing.assert_frame_equal(release.tabulate(by, moe=True, format=layout, implicates=folder),
                                      release.tabulate(by, moe=True, format=layout), check_exact=True)
    shuffled = copied(folder, tmp_path)
    order = np.random.default_rng(3).permutation(len(release.microdata))
    rewrite(shuffled / "implicate-07.parquet", lambda frame: frame.iloc[order])
    pd.testing.assert_frame_equal(release.tabulate("size_class", moe=True, implicates=shuffled),
                                  release.tabulate("size_class", moe=True, implicates=folder), check_exact=True)
    where = "m3emp >= 20 and county != '001'"  # a filter of drawn values too: implicates differ in their rows
    pd.testing.assert_frame_equal(release.tabulate("sector,size_class", moe=True, where=where, implicates=folder),
                                  release.tabulate("sector,size_class", moe=True, where=where), check_exact=True)


def test_the_folder_is_read_one_implicate_at_a_time(lone_release, drawn, monkeypatch):
    """Memory: the sums are made of each implicate as it is read, never of the implicates stacked."""
    seen = []
    real = implicates_folder.implicate_frames

    def watched(folder):
        for frame in real(folder):
            seen.append(frame["implicate"].unique().tolist())
            yield frame

    monkeypatch.setattr(implicates_folder, "implicate_frames", watched)
    gedp.read_release(lone_release).tabulate("size_class", implicates=drawn)
    assert seen == [[1], [2], [3]]


def refused(release: Path, folder: Path, tmp_path: Path, *words: str, by: str = "sector,size_class",
            quarter: str | None = None) -> str:
    out = tmp_path / "refused.csv"
    result = tabulated(release, folder, by, out, *(["--quarter", quarter] if quarter else []))
    line = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert line.startswith("error: ") and result.output.strip().count("\n") <= 2, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in line, line
    assert not out.exists() and not out.with_name(out.name + ".json").exists()
    return line


REFUSALS = {
    "not a folder": (lambda f: f / "implicate-01.parquet", ["is not a folder of implicates"]),
    "no summary": (lambda f: (f / "_implicates.json").unlink() or f, ["no _implicates.json"]),
    "summary not json": (lambda f: (f / "_implicates.json").write_text("{not json") and f, ["no _implicates.json"]),
    "summary nested too deep": (lambda f: (f / "_implicates.json").write_text("[" * 200_000 + "]" * 200_000) and f,
                                ["no _implicates.json"]),  # json's RecursionError: a traceback before
    "not gedp's summary": (lambda f: edit_summary(f, gedp_implicates=2) or f, ["is not gedp implicates output"]),
    "identity not recorded": (lambda f: edit_summary(f, release_sha256=None) or f,
                              ["does not record which release", "draw it again"]),
    "another release's identity": (lambda f: edit_summary(f, release_sha256="0" * 64) or f,
                                   ["drawn from another release"]),
    "another quarter": (lambda f: edit_summary(f, quarter="2016Q2") or f, ["another quarter"]),
    "other establishments": (lambda f: edit_summary(f, establishments=1999) or f, ["not drawn over this release's"]),
    "one implicate": (lambda f: edit_summary(f, implicates=1, files=["implicate-01.parquet"]) or f,
                      ["2 to 1,000 implicates, not 1", "variance between implicates"]),
    "too many implicates": (lambda f: edit_summary(f, implicates=1001) or f, ["2 to 1,000 implicates"]),
    "files not listed": (lambda f: edit_summary(f, files=["a.parquet", "b.parquet", "c.parquet"]) or f,
                         ["does not list its 3 files"]),
    "an extra file": (lambda f: (f / "notes.txt").write_text("x") and f, ["holds other entries"]),
    "a missing file": (lambda f: (f / "implicate-02.parquet").unlink() or f, ["misses 1 of the files"]),
    "not parquet": (lambda f: (f / "implicate-02.parquet").write_bytes(b"PAR1 not parquet") and f,
                    ["cannot be read as Parquet"]),
    "a missing column": (lambda f: rewrite(f / "implicate-02.parquet", lambda d: d.drop(columns="naics")) or f,
                         ["does not hold the columns"]),
    "an extra column": (lambda f: rewrite(f / "implicate-02.parquet", lambda d: d.assign(extra=1.0)) or f,
                        ["does not hold the columns"]),
    "a column of another type": (lambda f: rewrite(f / "implicate-02.parquet",
                                                   lambda d: d.assign(m3emp=d["m3emp"].astype(str))) or f,
                                 ["does not hold the columns"]),
    "a row more": (lambda f: rewrite(f / "implicate-02.parquet", lambda d: pd.concat([d, d.iloc[:1]])) or f,
                   ["holds 2,001 rows", "2,000 establishments"]),
    "a repeated establishment": (lambda f: rewrite(f / "implicate-02.parquet",
                                                   lambda d: pd.concat([d.iloc[:-1], d.iloc[:1]])) or f,
                                 ["repeats establishments"]),
    "an establishment of another release": (
        lambda f: rewrite(f / "implicate-02.parquet", lambda d: d.assign(estab_id=d["estab_id"].where(
            d.index != 5, "99-9999999"))) or f, ["establishments the release does not"]),
    "another implicate's rows": (lambda f: rewrite(f / "implicate-02.parquet", lambda d: d.assign(implicate=1)) or f,
                                 ["rows of another implicate than 2"]),
}
VALUES = {"nan": np.nan, "inf": np.inf, "negative": -1.0, "beyond MAX_VALUE": 2e13}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_folder_that_is_not_this_releases_output_is_refused(lone_release, drawn, tmp_path, case):
    change, words = REFUSALS[case]
    refused(lone_release, change(copied(drawn, tmp_path)), tmp_path, *words)


@pytest.mark.parametrize("value", list(VALUES))
def test_drawn_values_that_are_not_finite_non_negative_and_bounded_are_refused(lone_release, drawn, tmp_path, value):
    def spoiled(frame):
        frame = frame.copy()
        frame.loc[frame.index[7], "wage"] = VALUES[value]
        return frame

    folder = copied(drawn, tmp_path)
    rewrite(folder / "implicate-03.parquet", spoiled)
    refused(lone_release, folder, tmp_path, "implicate-03.parquet", "1 drawn values (of wage first)", "from 0 to 1e+13")


def test_a_folder_of_a_release_with_the_same_establishments_is_refused(tmp_path):
    """Two releases of one state (noise seeds 6 and 7): the establishments' keys and public columns all
    match, the release's identity does not; each folder tabulates with its own release."""
    state = gedp.synthesize("small", establishments=300, seed=5)
    first, second = (gedp.protect(state, seed=seed, not_for_publication=True).write(tmp_path / f"release-{seed}")
                     for seed in (6, 7))
    folder = write_implicates(first, 2, tmp_path / "draws", seed=1)
    assert gedp.read_release(first).microdata["estab_id"].equals(gedp.read_release(second).microdata["estab_id"])
    refused(second, folder, tmp_path, "drawn from another release")
    assert tabulated(first, folder, "size_class", tmp_path / "first.csv").exit_code == 0


def test_an_edited_release_is_refused_with_its_own_folder(lone_release, drawn, tmp_path):
    """The release is read as every reader of its answers reads it, folder or not: a copy whose protected
    microdata moved one county's establishments into another (its manifest and answers, and so the folder's
    recorded identity, unchanged) is refused, as the same table drawn without the folder refuses it (review28:
    the folder's tables put county 001's establishments in 003, in one line of success)."""
    copy = tmp_path / "moved"
    shutil.copytree(lone_release, copy)
    for part in sorted((copy / "protected.parquet").glob("*.parquet")):
        frame = pd.read_parquet(part)
        frame.loc[frame["county"] == "001", "county"] = "003"
        frame.to_parquet(part, index=False)
    refused(copy, drawn, tmp_path, "do not match the groups of the public data", by="county,size_class")
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county,size_class", "--out", str(tmp_path / "d.csv")])
    assert result.exit_code == 2 and "do not match the groups of the public data" in result.output
    assert tabulated(lone_release, drawn, "county,size_class", tmp_path / "genuine.csv").exit_code == 0


def test_sizes_beyond_the_bounds_are_refused_before_values_are_read(lone_release, drawn, tmp_path, monkeypatch):
    """A file larger (on disk, or unpacked as its footer says) than its establishments' implicate takes is
    refused from its size and footer (the bound scaled down here so that gedp's own files are over it)."""
    read = []
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *args, **kwargs: read.append(args) or pytest.fail("values read"))
    monkeypatch.setattr(implicates_folder, "BYTES_PER_VALUE", 0)
    monkeypatch.setattr(implicates_folder, "SLACK_BYTES", 1000)
    refused(lone_release, drawn, tmp_path, "is over 1,000 bytes")
    size = (drawn / "implicate-01.parquet").stat().st_size
    monkeypatch.setattr(implicates_folder, "SLACK_BYTES", size + 1)
    refused(lone_release, drawn, tmp_path, f"unpacks to over {size + 1:,} bytes")
    assert not read


def test_a_crafted_footer_or_page_header_is_refused_before_values_are_read(lone_release, drawn, tmp_path):
    """A footer that declares a million row groups, a page header stating 1.5 GB uncompressed: refused from
    the footer and the headers (``part_sizes``), never handed to the reader."""
    folder = copied(drawn, tmp_path)
    (folder / "implicate-02.parquet").write_bytes(b"PAR1" + BOMB_FOOTER + len(BOMB_FOOTER).to_bytes(4, "little")
                                                  + b"PAR1")
    refused(lone_release, folder, tmp_path, "implicate-02.parquet cannot be read as Parquet")
    shutil.copy(drawn / "implicate-02.parquet", folder)
    lying_header(folder / "implicate-03.parquet", "m3emp")
    refused(lone_release, folder, tmp_path, "implicate-03.parquet column 'm3emp' holds page headers stating 1,50")


def test_the_option_goes_with_a_size_class_table_and_writes_outside_the_folder(lone_release, drawn, tmp_path):
    refused(lone_release, drawn, tmp_path, "--implicates goes with a table of a release by size_class", by="sector")
    result = runner.invoke(app, ["tabulate", str(lone_release), "--by", "size_class", "--implicates", str(drawn),
                                 "--out", str(drawn / "table.csv")])
    assert result.exit_code == 2 and "inside the implicates folder" in result.output
    assert sorted(p.name for p in drawn.iterdir())[0] == "_implicates.json" and not (drawn / "table.csv").exists()
    with pytest.raises(InputError, match="implicates go with a table by size_class"):
        gedp.read_release(lone_release).tabulate("sector", implicates=drawn)


def test_the_folders_text_is_never_printed_raw(lone_release, drawn, tmp_path):
    """A folder named with an escape sequence and a line break, holding a summary of such text: the line
    shows them escaped."""
    folder = tmp_path / "dir\x1b[2J\nforged"
    shutil.copytree(drawn, folder)
    edit_summary(folder, release_sha256="\x1b[31m\nforged", quarter="\x1b[31m")
    line = refused(lone_release, folder, tmp_path, "drawn from another release")
    assert "\x1b" not in line and "\\x1b" in line
    accepted = tmp_path / "draws\x1b]0;pwned\x07\x1b[2J"  # the success line names the folder escaped too (review28)
    shutil.copytree(drawn, accepted)
    result = tabulated(lone_release, accepted, "size_class", tmp_path / "table.csv")
    assert result.exit_code == 0 and "\x1b" not in result.output and "\\x1b[2J" in result.output, result.output


def test_tabulating_a_folder_takes_a_fifth_of_drawing_at_most(lone_release, tmp_path):
    """Processor time of this process: 20 implicates read from a folder against 20 drawn (the size-class
    table without the folder; no held draws), the release read in each. On a 2,000-establishment
    release the ratio measured 8.8-11.8x at load 8 (benchmarks/RESULTS.md, 2026-11-30); 5x is the floor asked
    for."""
    folder = write_implicates(lone_release, 20, tmp_path / "twenty", seed=tabulation_seed(lone_release))
    start = time.process_time()
    gedp.read_release(lone_release).tabulate("sector,size_class", moe=True)
    drawing = time.process_time() - start
    start = time.process_time()
    gedp.read_release(lone_release).tabulate("sector,size_class", moe=True, implicates=folder)
    reading = time.process_time() - start
    assert reading * 5 <= drawing, (reading, drawing)


def test_a_panel_quarters_folder_tabulates_that_quarter_only(tmp_path, drawn_once, small_panel_release):
    """A folder drawn of one quarter of a panel release (``--quarter``) gives that quarter's table, the
    one drawn with the release's seed when drawn with it; another quarter's table refuses it."""
    release = small_panel_release
    folder = write_implicates(release, 20, tmp_path / "q2", seed=tabulation_seed(release), quarter="2016Q2")
    opened = gedp.read_release(release)
    pd.testing.assert_frame_equal(opened.tabulate("size_class", moe=True, quarter="2016Q2", implicates=folder),
                                  opened.tabulate("size_class", moe=True, quarter="2016Q2"), check_exact=True)
    refused(release, folder, tmp_path, "drawn for another quarter than 2016Q1", by="size_class",
            quarter="2016Q1")


def test_an_implicate_without_a_row_matching_the_filter_counts_zero():
    """Implicate 2 has no establishment of 20+ employees: its cell counts 0 (a KeyError before), and the
    combined table is Rubin's of (1, 0) by hand: mean 0.5, margin t(0.975, 1) sqrt((1 + 1/2) var)."""
    from scipy import stats

    from gedp.postprocess.derived import tabulate_implicates

    frame = pd.DataFrame({"implicate": [1, 1, 2, 2], "m1emp": [30.0, 2, 1, 2], "m2emp": [30.0, 2, 1, 2],
                          "m3emp": [30.0, 2, 1, 2], "wage": [9e4, 5e3, 3e3, 5e3]})
    table = tabulate_implicates(frame, "size_class", where="m3emp >= 20", moe=True)
    assert table["size_class"].tolist() == [4] and table["estabs"].tolist() == [0.5]
    assert table["estabs_moe"].iloc[0] == pytest.approx(stats.t.ppf(0.975, 1) * np.sqrt(1.5 * 0.5), rel=1e-12)
    assert table["wage"].iloc[0] == pytest.approx(4.5e4, rel=1e-12)
