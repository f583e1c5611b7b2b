"""gedp report: one self-contained HTML page, its privacy statement and figures, checked in the
page's text and, when Chromium is installed, in a headless browser's screenshot."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib import image
from scipy.optimize import brentq
from scipy.stats import norm
from typer.testing import CliRunner

from gedp.cli import app
from gedp.evaluation.manager_report import level_name, within_shares

#: Cells of the stand-in published file that it withholds: county x NAICS-6 cells of fewer than 3 establishments.
WITHHELD_BELOW = 3
SCREENSHOT_SIZE = (1280, 2000)


@pytest.fixture(scope="module")
def page(small_release, tmp_path_factory):
    """`gedp report` of the small release, beside a stand-in published file: the release's own QCEW
    tables, with county x NAICS-6 cells of fewer than 3 establishments withheld as BLS does
    (disclosure_code N, employment and wages 0). Returns (html, summary, manifest, published table)."""
    release, _ = small_release
    folder = tmp_path_factory.mktemp("report")
    published = pd.read_csv(release / "qcew_tables.csv", dtype={"area_fips": str, "industry_code": str,
                                                                 "own_code": str})
    withheld = (published["agglvl_code"] == 78) & (published["qtrly_estabs"] < WITHHELD_BELOW)
    published["disclosure_code"] = np.where(withheld, "N", "")
    values = ["month1_emplvl", "month2_emplvl", "month3_emplvl", "total_qtrly_wages"]
    published.loc[withheld, values] = 0
    published.to_csv(folder / "published.csv", index=False)
    out = folder / "page.html"
    result = CliRunner().invoke(app, ["report", str(release), "--published", str(folder / "published.csv"),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((release / "manifest.json").read_text())
    return out, json.loads((folder / "page.html.json").read_text()), manifest, published


def test_one_file_without_external_references(page):
    out, _, _, _ = page
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script|<link|<iframe|@import|url\(|https?://|href=", text, re.I)
    sources = re.findall(r'<img src="([^"]+)"', text)
    assert len(sources) == 4  # cells published, margins per level, margins by size, beside the published file
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")


def test_privacy_statement_in_plain_words(page):
    out, _, manifest, _ = page
    text = out.read_text()
    mu = manifest["mu_total"]
    # epsilon at delta 1e-6, recomputed from Dong, Roth & Su's Corollary 2.13 by root finding
    epsilon = brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - 1e-6, 0, 100)
    assert f"mu = {mu:.4f}" in text and f"mu {mu:.4f}" in text  # the statement and the key figure
    assert f"epsilon = {epsilon:.2f} at delta = 1e-6" in text
    assert manifest["psi"]["name"] == "sqrt" and manifest["gammas"]["m1emp"] == 0.5
    low, high = (math.sqrt(36) - 0.5) ** 2, (math.sqrt(36) + 0.5) ** 2  # sqrt-neighbours of 36 at gamma 0.5
    assert f"36 employees cannot be told from any number between {low:.0f} and {high:.0f}" in text
    for words in ("psi-neighbours", "add-or-remove-one", "size class", "No cell is withheld"):
        assert words in text


def test_human_labels_only(page):
    out, _, _, _ = page
    readable = re.sub(r'src="data:[^"]+"', "", out.read_text())
    for internal in ("m1emp", "m3emp", "agglvl", "month1_emplvl", "total_qtrly_wages"):
        assert internal not in readable
    assert "County x 6-digit industry" in readable and "Employment, month 1" in readable


def test_cells_withheld_and_compared(page):
    _, summary, _, published = page
    finest = published[published["agglvl_code"] == 78]
    cells = {row["agglvl"]: row for row in summary["cells"]}
    assert cells[78]["agency_withheld"] == pytest.approx((finest["disclosure_code"] == "N").mean())
    assert cells[78]["released"] == len(finest)
    overall = [row for row in summary["published"]["shares"] if row["agglvl"] == 0]
    assert {row["cells"] for row in overall} == {int((published["disclosure_code"] != "N").sum())}


def test_within_shares_counts_cells_within_each_tolerance():
    comparison = pd.DataFrame({"agglvl": 78, "attribute": "m1emp", "release": [100.0, 104.0, 108.0, 0.0, 3.0],
                               "published": [100.0, 100.0, 100.0, 0.0, 0.0]})
    overall = within_shares(comparison).query("agglvl == 0").iloc[0]
    assert overall["cells"] == 5
    assert overall["within_5"] == pytest.approx(3 / 5)  # 100, 104 and 0 against 0
    assert overall["within_10"] == pytest.approx(4 / 5)  # and 108; 3 against 0 never


def test_level_names():
    assert level_name(78) == "County x 6-digit industry"
    assert level_name(51) == "State, all industries"
    assert level_name(74) == "County x sector (2-digit industry)"


def refused_report(release: Path, published: Path, page: Path):
    """``gedp report`` of ``release`` against ``published``: refused (exit 2), no page written."""
    result = CliRunner().invoke(app, ["report", str(release), "--published", str(published), "--out", str(page)])
    assert result.exit_code == 2
    assert not page.exists()
    return result


def test_published_file_of_another_state_is_refused(small_release, tmp_path):
    release, _ = small_release
    tables = pd.read_csv(release / "qcew_tables.csv", dtype={"area_fips": str, "industry_code": str, "own_code": str})
    other = "01" if tables["area_fips"].str[:2].iloc[0] != "01" else "02"
    tables.assign(area_fips=other + tables["area_fips"].str[2:]).to_csv(tmp_path / "other.csv", index=False)
    result = refused_report(release, tmp_path / "other.csv", tmp_path / "page.html")
    assert f"is of state {other}, which the release" in result.output


def test_headless_browser_screenshot(page, tmp_path):
    """The page as Chromium draws it: a PNG of the window's size that is not blank."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium when apt-get is available)")
    out, _, _, _ = page
    shot = tmp_path / "shot.png"
    width, height = SCREENSHOT_SIZE
    # a profile of its own: a browser already running on the user's profile would take the request
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", f"--screenshot={shot}",
                    f"--user-data-dir={tmp_path / 'profile'}",
                    f"--window-size={width},{height}", out.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = image.imread(shot)
    assert pixels.shape[:2] == (height, width)
    grey = pixels[..., :3].mean(axis=2)
    assert (grey < 0.5).mean() > 0.01  # text and bars drawn, not a blank page
    assert len(np.unique(pixels[..., :3].reshape(-1, 3), axis=0)) > 50  # the figures' colours, not one flat fill


def test_typical_suppression_shares_are_those_of_the_public_files(shared_data):
    from gedp.evaluation.manager_report import TYPICAL_WITHHELD
    from gedp.synth.qcew import read_qcew

    files = {"Rhode Island": "qcew_2016q1_44.csv", "New Jersey": "qcew_2016q1_34.csv"}
    for state, name in files.items():
        withheld = read_qcew(shared_data / name).aggregates.query("agglvl == 78")["suppressed"].mean()
        assert TYPICAL_WITHHELD[state] == pytest.approx(withheld, abs=5e-4), state


def _tables(release) -> pd.DataFrame:
    return pd.read_csv(release / "qcew_tables.csv", dtype={"area_fips": str, "industry_code": str, "own_code": str})


def test_published_file_of_another_quarter_is_refused(small_release, tmp_path):
    release, _ = small_release
    tables = _tables(release)
    [(year, qtr)] = tables[["year", "qtr"]].drop_duplicates().itertuples(index=False)
    other = 1 if qtr != 1 else 2
    tables.assign(qtr=other).to_csv(tmp_path / "other.csv", index=False)
    result = refused_report(release, tmp_path / "other.csv", tmp_path / "page.html")
    assert f"is of {year} Q{other}, the release of {year} Q{qtr}: give the same quarter's file" in result.output


def test_the_title_names_the_state_and_the_quarter(page, small_release):
    from gedp.synth.titles import REFERENCE

    out, summary, manifest, _ = page
    names = pd.read_csv(REFERENCE / "states.csv", dtype=str).set_index("state")["name"]
    [(year, qtr)] = _tables(small_release[0])[["year", "qtr"]].drop_duplicates().itertuples(index=False)
    [state] = manifest["states"]
    title = re.search(r"<title>(.*)</title>", out.read_text()).group(1)
    assert title == f"Protected QCEW release: {names[state]}, {year} Q{qtr}"
    assert summary["quarter"] == f"{year}Q{qtr}"


def test_cells_of_the_agency_without_establishments_are_counted_and_explained(small_release, tmp_path):
    """Cells the agency lists with no establishment (zeros) have no row in a release; the page says how
    many, so "no cell is withheld" beside fewer cells than the agency's file is explained."""
    release, _ = small_release
    tables = _tables(release)
    finest = tables[tables["agglvl_code"] == 78]
    empty = finest.head(7).assign(industry_code=[f"99999{i}" for i in range(7)], qtrly_estabs=0, month1_emplvl=0,
                                  month2_emplvl=0, month3_emplvl=0, total_qtrly_wages=0)
    pd.concat([tables, empty]).assign(disclosure_code="").to_csv(tmp_path / "published.csv", index=False)
    result = CliRunner().invoke(app, ["report", str(release), "--published", str(tmp_path / "published.csv"),
                                      "--out", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output
    cells = {row["agglvl"]: row for row in json.loads((tmp_path / "page.html.json").read_text())["cells"]}
    assert cells[78]["agency_empty"] == 7 and cells[78]["agency_cells"] - cells[78]["released"] == 7
    assert all(row["agency_empty"] == 0 for level, row in cells.items() if level != 78)
    assert "It also lists 7 cells without any establishment this quarter" in (tmp_path / "page.html").read_text()


def test_the_api_refuses_an_output_that_cannot_be_a_file_before_building_the_page(small_release, tmp_path,
                                                                                   monkeypatch):
    """``gedp.report(release, out)`` checks ``out`` first, as ``gedp report`` does: no page is built
    for an output that cannot be written."""
    import gedp
    import gedp.evaluation.manager_report as manager_report
    from gedp.errors import InputError

    release, _ = small_release
    monkeypatch.setattr(manager_report, "build_report", lambda *args: pytest.fail("page built before out was checked"))
    with pytest.raises(InputError, match="is a folder; give a file name"):
        gedp.report(release, tmp_path)
    assert list(tmp_path.iterdir()) == []
