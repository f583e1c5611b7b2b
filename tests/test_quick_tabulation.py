"""Further tabulations answered without pandas (``gedp.release.quick``): bit for bit the table the
kept index gives through pandas, for every grouping whose groups are consecutive in the release;
no answer (the full path answers) for every other request."""

import json
import shutil

import numpy as np
import pytest

from gedp.release.margins import kept_path, kept_tabulation, kept_variances, read_pieces, seal
from gedp.release.quick import quick_tabulation

#: Keys following the release's order (state, county, naics) and keys that do not.
CONSECUTIVE = ["county,naics4", "state", "total", "county,naics", "county,sector,naics3", "state,county,own",
               "county,naics5,naics4"]
SCATTERED = ["naics3", "sector,county", "own,supersector", "domain,year,qtr"]


@pytest.fixture
def release(small_release, tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(small_release[0], folder)
    return folder


def test_quick_tables_are_the_kept_tables_bit_for_bit(release):
    assert quick_tabulation(release, "county", moe=True) is None  # nothing kept yet
    kept_variances(release)  # the first request keeps the structure and the index
    for by in CONSECUTIVE:
        for moe, level in ((False, 0.95), (True, 0.95), (True, 0.8)):
            quick = quick_tabulation(release, by, moe=moe, level=level)
            keys, table = kept_tabulation(release, by, moe=moe, level=level)
            assert quick is not None, by
            assert quick.keys == keys and list(quick.columns) == list(table.columns)
            assert quick.n_rows == len(table) > 0
            for name, column in quick.columns.items():
                expected = table[name].tolist()
                assert [type(v) for v in column] == [type(v) for v in expected], name
                assert column == expected, (by, name)  # floats compared exactly
                if table[name].dtype.kind == "f":
                    assert np.array_equal(np.array(column).view(np.int64), table[name].to_numpy().view(np.int64))


def test_the_quick_path_answers_only_what_it_reproduces(release):
    kept_variances(release)
    for by in SCATTERED:  # pandas' compensated sums in row order: left to pandas
        assert kept_tabulation(release, by, moe=True) is not None
        assert quick_tabulation(release, by, moe=True) is None, by
    for by in ("m1emp", "estab_id", "county,nothing"):  # refused keys: the full path says why
        assert quick_tabulation(release, by) is None


def test_margins_without_per_cell_pieces_are_left_to_the_full_path(release):
    kept_variances(release)
    folder = kept_path(release)
    assert quick_tabulation(release, "county", moe=True) is not None
    pieces = read_pieces(folder)
    assert pieces is not None and "wage" in pieces
    skeleton = json.loads((folder / "pieces.json").read_text())
    (folder / "pieces.json").write_text(json.dumps(skeleton | {"wage": None}))  # as kept for a sparse model
    seal(folder, folder.name)  # and listed complete so
    assert read_pieces(folder)["wage"] is None
    assert quick_tabulation(release, "county", moe=True) is None
    assert quick_tabulation(release, "county", moe=False) is not None  # sums need no pieces


def test_a_panel_release_is_left_to_the_full_path_before_any_digest(release, margins_cache):
    manifest = json.loads((release / "manifest.json").read_text())
    (release / "manifest.json").write_text(json.dumps(manifest | {"quarters": ["2016Q1", "2016Q2"]}))
    assert quick_tabulation(release, "county", moe=True) is None
    assert not (margins_cache / "margins").exists()  # its files were not hashed
