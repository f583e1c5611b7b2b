"""What a newcomer tripped on: a table ready to publish from confidential microdata, a decimal comma
in a config, YAML errors without a place, and an unquoted code in --where."""

import openpyxl
import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.config import load_config
from gedp.errors import ConfigError
from gedp.postprocess.filters import FilterError, select_rows
from gedp.postprocess.publication import UNPROTECTED

runner = CliRunner()


@pytest.fixture
def confidential(small_state, tmp_path):
    path = tmp_path / "good.csv"
    small_state.head(500).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("name, format", [("conf.csv", "qcew"), ("conf.xlsx", "xlsx")])
def test_a_table_ready_to_publish_needs_a_release(confidential, tmp_path, name, format):
    out = tmp_path / name
    agglvl = ["--agglvl", "75"] if format == "qcew" else []
    refused = runner.invoke(app, ["tabulate", str(confidential), *agglvl, "--format", format, "--out", str(out)])
    assert refused.exit_code == 2, refused.output
    assert f"--format {format} writes a table ready to publish, but this input is not a gedp release" in refused.output
    assert not out.exists()
    written = runner.invoke(app, ["tabulate", str(confidential), *agglvl, "--format", format, "--out", str(out),
                                  "--unprotected"])
    assert written.exit_code == 0, written.output
    assert "warning: NOT PROTECTED" in written.output  # on the terminal, not only in the sidecar
    if format == "qcew":
        codes = pd.read_csv(out, dtype=str)["disclosure_code"]
    else:
        book = openpyxl.load_workbook(out)
        codes = []
        for sheet in (sheet for sheet in book.worksheets if sheet.title != "notes"):
            header, *rows = sheet.values
            codes += [row[header.index("disclosure_code")] for row in rows]
        codes = pd.Series(codes)
    assert len(codes) > 0 and (codes == UNPROTECTED).all()


def test_unprotected_does_not_go_with_a_release(small_release, tmp_path):
    result = runner.invoke(app, ["tabulate", str(small_release[0]), "--agglvl", "75", "--format", "qcew",
                                 "--out", str(tmp_path / "t.csv"), "--unprotected"])
    assert result.exit_code == 2 and "--unprotected goes with a confidential microdata file" in result.output


def test_a_release_table_has_no_mark(small_release, tmp_path):
    out = tmp_path / "t.csv"
    result = runner.invoke(app, ["tabulate", str(small_release[0]), "--agglvl", "75", "--format", "qcew",
                                 "--out", str(out)])
    assert result.exit_code == 0 and "NOT PROTECTED" not in result.output
    assert pd.read_csv(out, dtype=str, keep_default_na=False)["disclosure_code"].eq("").all()


def config_text(tmp_path, old, new):
    text = load_config.__globals__["configs"].path("employment").read_text()
    assert old in text
    path = tmp_path / "plan.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("old, new, message", [
    ("{m1emp: 0.7, m2emp: 0.7, m3emp: 0.7}", "{m1emp: 0,7, m2emp: 0,7, m3emp: 0,7}",
     "a key at line 16, column 19 is the number 7; keys must be plain text; a decimal comma? In {m1emp: 0,7} the "
     "comma ends the value 0 and 7 becomes a key: write 0.7"),
    ("zeta: 0.01", "zeta: 0,01", "zeta must be a finite number, got '0,01'; a decimal comma? write a decimal point"),
    ("mu_cap: 2.29", "mu_cap: [2.29",
     "not valid YAML at line 8, column 9: expected ',' or ']', but got ':' (while parsing a flow sequence started "
     "at line 7, column 9)"),
    ("zeta: 0.01", "\tzeta: 0.01", "not valid YAML at line 6, column 1: found character '\\t' that cannot start any "
                                   "token"),
])
def test_config_messages_say_where_and_why(tmp_path, old, new, message):
    with pytest.raises(ConfigError) as caught:
        load_config(config_text(tmp_path, old, new))
    assert message in str(caught.value)


@pytest.fixture
def codes():
    return pd.DataFrame({"naics3": ["236", "238", "236"], "county": ["001", "003", "001"], "year": [2016] * 3,
                         "m1emp": [1.0, 2.0, 3.0]})


@pytest.mark.parametrize("where, hint", [
    ("naics3 == 236", "hint: quote it, naics3 == '236'"),
    ("236 <= naics3", "hint: quote it, '236' <= naics3"),
    ("county in [1, 3]", "hint: quote it, county in ['001']"),
    ("county != 1", "hint: quote it, county != '001'"),
    ("year == '2016'", "hint: write it unquoted, year == 2016"),
    ("m1emp > '2'", "hint: write it unquoted, m1emp > 2"),
])
def test_a_code_compared_with_a_number_gets_a_hint(codes, where, hint):
    with pytest.raises(FilterError, match="holds") as caught:
        select_rows(codes, where)
    assert str(caught.value).endswith(hint)


def test_quoted_codes_and_numbers_still_select(codes):
    assert select_rows(codes, "naics3 == '236' and year == 2016 and m1emp > 1").tolist() == [False, False, True]
    assert select_rows(codes, "county in ['003']").tolist() == [False, True, False]
    assert select_rows(codes.astype({"naics3": "category"}), "naics3 != '236'").tolist() == [False, True, False]
    with pytest.raises(FilterError, match="hint: quote it"):
        select_rows(codes.astype({"naics3": "category"}), "naics3 == 236")


def test_the_command_line_shows_the_hint(small_release):
    result = runner.invoke(app, ["tabulate", str(small_release[0]), "--by", "county", "--where", "naics3 == 236"])
    assert result.exit_code == 2
    assert "hint: quote it, naics3 == '236'" in result.output
