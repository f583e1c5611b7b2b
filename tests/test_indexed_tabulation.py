"""Tabulations answered from a release's kept cell index: bit for bit the tables a full read of the
release gives, and no answer (the caller reads the release) for anything not a function of the
public cells."""

import hashlib
import os
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.postprocess.tabulate import tabulate
from gedp.release.cells import read_cell_index
from gedp.release.margins import DIGESTS_FOLDER, kept_path, kept_tabulation, kept_variances, release_digest
from gedp.release.reader import read_protected

BY = ["county,naics4", "state", "total", "sector", "own,supersector", "naics3,county", "domain,year,qtr"]


@pytest.fixture
def release(small_release, tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(small_release[0], folder)
    return folder


def filters(protected: pd.DataFrame) -> list[str | None]:
    """Filters on public columns only, built from the release's own codes."""
    county, sector = protected["county"].iloc[0], protected["sector"].iloc[-1]
    return [None, f"sector == '{sector}'", f"county in ['{county}'] or not own == '5'",
            f"naics3 >= '5' and county != '{county}'"]


def test_indexed_tables_are_bit_identical_to_reading_the_release(release):
    assert kept_tabulation(release, "county", moe=True) is None  # nothing kept yet
    protected = read_protected(release, without=("estab_id",))
    margins = kept_variances(release)  # the first request keeps the structure and the index
    compared = 0
    for by in BY:
        for where in filters(protected):
            for moe in (False, True):
                answered = kept_tabulation(release, by, where=where, moe=moe, level=0.9)
                assert answered is not None, (by, where)
                keys, table = answered
                full = tabulate(protected, by, where=where, moe=moe, level=0.9, margins=margins if moe else None)
                assert keys == [c for c in full.columns if c in protected.columns and c not in
                                ("m1emp", "m2emp", "m3emp", "wage")]
                pd.testing.assert_frame_equal(table, full, check_exact=True)
                assert full.to_csv(index=False) == table.to_csv(index=False)
                compared += 1
    assert compared == len(BY) * 4 * 2


def test_the_index_holds_the_release_cells_with_the_readers_types(release):
    kept_variances(release)
    index = read_cell_index(kept_path(release))
    protected = read_protected(release, without=("estab_id",))
    assert index is not None
    public = [c for c in protected.columns if c not in index.values.columns]
    assert list(index.cells.columns) == public
    assert (index.cells.dtypes == protected[public].dtypes).all()
    # each establishment's cell holds its public values; each cell is distinct
    pd.testing.assert_frame_equal(index.cells.iloc[index.codes].reset_index(drop=True), protected[public])
    assert not index.cells.duplicated().any()
    pd.testing.assert_frame_equal(index.values, protected[list(index.values.columns)], check_exact=True)


@pytest.mark.parametrize("by, where", [
    ("county", "m1emp > 10"),  # a selection on protected values
    ("estab_id", None),  # the identity
    ("m1emp", None),  # a confidential attribute as a key
    ("county", "county == 'none'"),  # an empty selection
    ("county", "no_such_column == 1"),
    ("county,sex", None),  # a worker column
])
def test_requests_not_answered_from_the_cells_are_left_to_the_full_read(release, by, where):
    kept_variances(release)
    assert kept_tabulation(release, by, where=where, moe=True) is None


def test_a_further_command_line_request_prints_the_same_table(release, tmp_path):
    runner = CliRunner()
    request = ["tabulate", str(release), "--by", "county,naics3", "--moe", "--where", "own == '5'"]
    first = runner.invoke(app, [*request, "--out", str(tmp_path / "first.csv")])  # reads the release
    assert first.exit_code == 0, first.output
    assert read_cell_index(kept_path(release)) is not None
    second = runner.invoke(app, [*request, "--out", str(tmp_path / "second.csv")])  # from the kept index
    assert second.exit_code == 0, second.output
    assert (tmp_path / "first.csv").read_bytes() == (tmp_path / "second.csv").read_bytes()
    summaries = [(tmp_path / f"{name}.csv.json").read_text().replace(name, "") for name in ("first", "second")]
    assert summaries[0] == summaries[1]
    assert np.isfinite(pd.read_csv(tmp_path / "second.csv")["m1emp_moe"]).all()


def full_digest(release) -> str:
    """The release's digest read from every byte (no remembered digest)."""
    shutil.rmtree(kept_path(release).parent / DIGESTS_FOLDER, ignore_errors=True)
    return release_digest(release)


def test_a_remembered_digest_is_the_files_digest_until_a_file_is_written(release):
    first = full_digest(release)
    assert release_digest(release) == first  # remembered
    assert (kept_path(release).parent / DIGESTS_FOLDER).is_dir()
    manifest = release / "manifest.json"
    before = manifest.stat()
    text = manifest.read_bytes()
    at = text.index(b'"config_name": "') + len(b'"config_name": "')  # a field nothing checks: still a release
    manifest.write_bytes(text[:at] + text[at:at + 1].swapcase() + text[at + 1:])  # same size, same mtime
    os.utime(manifest, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert manifest.stat().st_size == before.st_size
    changed = release_digest(release)
    assert changed != first
    assert changed == full_digest(release)
    assert hashlib.sha256(manifest.read_bytes()).digest() != hashlib.sha256(text).digest()
