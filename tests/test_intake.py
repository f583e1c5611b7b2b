"""The input's first check: agency column names, every problem of a file at once, before pandas."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError, InputProblems
from gedp.synth.input_layout import ALIASES
from gedp.synth.intake import inspect_input, parse_columns
from gedp.synth.schema import CONFIDENTIAL

runner = CliRunner()
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "input-format.md"
#: gedp's names -> BLS open-data and agency names, as an agency's file might have them.
AGENCY_NAMES = {"estab_id": "uiacct", "state": "state_fips", "county": "cnty", "naics": "industry_code",
                "own": "own_code", "m1emp": "month1_emplvl", "m2emp": "month2_emplvl", "m3emp": "month3_emplvl",
                "wage": "total_qtrly_wages"}
COLUMNS = list(AGENCY_NAMES)


@pytest.fixture(scope="module")
def microdata(small_state):
    return small_state[COLUMNS].head(400).reset_index(drop=True)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def protected(source, out, *options) -> pd.DataFrame:
    result = invoke("protect", source, "--out", out, "--seed", 3, "--not-for-publication", "--config", "employment",
                    *options)
    assert result.exit_code == 0, result.output
    return pd.read_parquet(out / "protected.parquet")


def refused(source, out, *options) -> list[str]:
    """The problem lines of a refused input; checks exit status 2 and that nothing was written."""
    result = invoke("protect", source, "--out", out, *options)
    assert result.exit_code == 2, result.output
    assert not out.exists() and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == f"error: input '{source}' has:", result.output
    assert all(line.startswith("  - ") for line in lines[1:]), result.output
    return [line[4:] for line in lines[1:]]


def test_agency_names_delimiters_and_parquet_folders_give_the_same_release(tmp_path, microdata):
    canonical = tmp_path / "canonical.csv"
    microdata.to_csv(canonical, index=False)
    expected = protected(canonical, tmp_path / "r0")
    agency = tmp_path / "agency.csv"
    microdata.rename(columns=AGENCY_NAMES).to_csv(agency, index=False, sep=";")
    pd.testing.assert_frame_equal(protected(agency, tmp_path / "r1"), expected)
    folder = tmp_path / "spark_output"  # a folder of parts of any name, with the files Spark writes beside them
    folder.mkdir()
    for i, part in enumerate((microdata.iloc[:150], microdata.iloc[150:])):
        part.rename(columns=AGENCY_NAMES).to_parquet(folder / f"part-{i:05d}-x.snappy.parquet", index=False)
    (folder / "_SUCCESS").write_text("")
    (folder / ".part-00000-x.snappy.parquet.crc").write_text("not parquet")
    pd.testing.assert_frame_equal(protected(folder, tmp_path / "r2"), expected)


def test_pad_codes_restores_the_zeros_a_spreadsheet_drops(tmp_path, microdata):
    canonical = tmp_path / "canonical.csv"
    microdata.to_csv(canonical, index=False)
    stripped = tmp_path / "excel.csv"
    microdata.assign(county=microdata["county"].astype(int)).to_csv(stripped, index=False)
    problems = refused(stripped, tmp_path / "r")
    short = (microdata["county"].str.len().gt(0) & microdata["county"].str.startswith("0")).to_numpy().nonzero()[0]
    assert len(problems) == 1 and problems[0].startswith(
        f"column 'county': codes shorter than 3 digits at rows {', '.join(str(r + 1) for r in short[:3])} and "
        f"{len(short) - 3} more; hint: leading zeros were dropped (e.g. by Excel); --pad-codes pads them")
    pd.testing.assert_frame_equal(protected(stripped, tmp_path / "r1", "--pad-codes"),
                                  protected(canonical, tmp_path / "r0"))


def test_every_problem_of_a_file_in_one_message(tmp_path, microdata):
    frame = microdata.rename(columns=AGENCY_NAMES).astype({"total_qtrly_wages": object, "month2_emplvl": object})
    thousands = [4, 17, 230, 301]
    frame.loc[thousands, "total_qtrly_wages"] = "1,234,567"
    frame.loc[[8], "month2_emplvl"] = "n/a"
    frame.loc[[12, 40], "month1_emplvl"] = -2.0
    frame.loc[33, "uiacct"] = frame.loc[5, "uiacct"]
    bad = tmp_path / "bad.csv"
    frame.drop(columns=["month3_emplvl"]).to_csv(bad, index=False)
    assert sorted(refused(bad, tmp_path / "r")) == sorted([
        "missing column 'm3emp'; hint: name it m3emp (or month3_emplvl, month3_emp, mnth3emp), or give "
        "--columns NAME=m3emp",
        "column 'month1_emplvl' (m1emp): negative values at rows 13, 41; hint: values must be >= 0 (a correction "
        "or an adjustment is not an establishment's value)",
        "column 'month2_emplvl' (m2emp): values that are not numbers at row 9; hint: plain numbers only (no "
        "currency signs, blanks or text)",
        "column 'total_qtrly_wages' (wage): numbers with thousands separators ('1,234') at rows 5, 18, 231 and 1 "
        "more; hint: write plain numbers (in Excel: Format Cells > Number, without the 1000 separator)",
        "column 'uiacct' (estab_id): ids repeating an earlier row's at row 34; hint: each establishment needs its "
        "own id (e.g. the UI account and the reporting unit number together)",
    ])


def test_missing_columns_are_named_together_with_their_look_alikes(tmp_path, microdata):
    source = tmp_path / "odd.csv"
    microdata.rename(columns={"m1emp": "mnth1_emp", "county": "cnty_code", "wage": "pay"}).to_csv(source, index=False)
    problems = refused(source, tmp_path / "r")
    assert problems[0] == "missing column 'county'; 'cnty_code' looks like it: give --columns cnty_code=county"
    assert problems[1] == "missing column 'm1emp'; 'mnth1_emp' looks like it: give --columns mnth1_emp=m1emp"
    assert problems[2].startswith("missing column 'wage'; hint: name it wage (or wages, total_qtrly_wages, totwage)")
    intake = inspect_input(source, columns=parse_columns("mnth1_emp=m1emp,cnty_code=county,pay=wage"))
    assert intake.names["m1emp"] == "mnth1_emp" and intake.names["wage"] == "pay"
    canonical = tmp_path / "canonical.csv"
    microdata.to_csv(canonical, index=False)
    pd.testing.assert_frame_equal(protected(source, tmp_path / "r1", "--columns", "mnth1_emp=m1emp,cnty_code=county,"
                                                                                  "pay=wage"),
                                  protected(canonical, tmp_path / "r0"))
    with pytest.raises(InputError, match="--columns item 'pay' must be STORED_NAME=GEDP_NAME"):
        parse_columns("mnth1_emp=m1emp,pay")


def test_evaluate_reads_agency_names_too(tmp_path, microdata):
    from gedp.synth.intake import read_input
    from gedp.synth.schema import validate_microdata

    source = tmp_path / "agency.csv"
    microdata.rename(columns=AGENCY_NAMES).to_csv(source, index=False)
    pd.testing.assert_frame_equal(read_input(source), validate_microdata(microdata))


def test_two_candidates_for_one_column_are_refused_not_guessed(tmp_path, microdata):
    source = tmp_path / "two.csv"
    microdata.assign(cnty=microdata["county"]).to_csv(source, index=False)
    problems = refused(source, tmp_path / "r")
    assert problems == ["columns 'county' and 'cnty' could each be 'county'; hint: say which, e.g. --columns "
                        "cnty=county (columns={'cnty': 'county'} in Python)"]
    assert inspect_input(source, columns={"cnty": "county"}).names["county"] == "cnty"


def test_unquoted_thousands_separators_and_other_delimiters(tmp_path, microdata):
    text = microdata.to_csv(index=False).splitlines()
    text[3] = text[3].rsplit(",", 1)[0] + ",1,234"  # data row 3: an unquoted "1,234" adds a field
    broken = tmp_path / "unquoted.csv"
    broken.write_text("\n".join(text) + "\n")
    problems = refused(broken, tmp_path / "r")
    assert problems == ["row 3 has a number of fields other than the header's 9; hint: an unquoted thousands "
                        "separator ('1,234') or a ',' inside a value: remove the separators, or quote such values"]
    for separator in ("\t", "|"):
        source = tmp_path / "sep.csv"
        microdata.to_csv(source, index=False, sep=separator)
        assert inspect_input(source).delimiter == separator
    single = tmp_path / "single.csv"
    single.write_text("estab_id:state:county\n1:44:001\n")
    assert "its header has a single column" in refused(single, tmp_path / "r")[0]


def test_area_fips_is_split_into_state_and_county(tmp_path, microdata):
    frame = microdata.assign(area_fips=microdata["state"] + microdata["county"]).drop(columns=["state", "county"])
    release = gedp.protect(frame, "employment", seed=3, not_for_publication=True)
    canonical = gedp.protect(microdata, "employment", seed=3, not_for_publication=True)
    pd.testing.assert_frame_equal(release.microdata, canonical.microdata)
    renamed = microdata.rename(columns={"estab_id": "ruid"})
    with pytest.raises(InputProblems, match="missing column 'estab_id'"):
        gedp.protect(renamed, "employment", seed=3, not_for_publication=True)
    same = gedp.protect(renamed, "employment", seed=3, not_for_publication=True,
                        input=gedp.Input(columns={"ruid": "estab_id"}))
    pd.testing.assert_frame_equal(same.microdata, canonical.microdata)


def test_parquet_text_attributes_and_empty_folders(tmp_path, microdata):
    source = tmp_path / "text.parquet"
    microdata.astype({"wage": str}).to_parquet(source, index=False)
    assert refused(source, tmp_path / "r") == ["column 'wage' is stored as text, not as numbers; hint: write it as "
                                               "a numeric column (thousands separators and blanks removed)"]
    folder = tmp_path / "empty_output"
    folder.mkdir()
    (folder / "_SUCCESS").write_text("")
    with pytest.raises(InputError, match="is a folder without Parquet parts"):
        inspect_input(folder)


def test_the_check_runs_before_the_numerical_stack(tmp_path, microdata):
    source = tmp_path / "bad.csv"
    microdata.assign(wage="1,234").to_csv(source, index=False)
    code = ("import sys\nfrom gedp.synth.intake import inspect_input\ntry:\n    inspect_input(sys.argv[1])\n"
            "except Exception as err:\n    print(type(err).__name__)\n"
            "print(sorted(m for m in ('pandas', 'scipy', 'cvxpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code, str(source)], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["InputProblems", "[]"], result.stdout + result.stderr


def test_the_docs_table_lists_every_alias():
    section = DOCS.read_text().split("## Column names as agencies have them")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)` \| (.+) \|$", section, flags=re.MULTILINE)
    documented = {column: tuple(re.findall(r"`(\w+)`", names)) for column, names in rows if column in ALIASES}
    assert documented == {column: names[1:] for column, names in ALIASES.items()}
    assert set(CONFIDENTIAL) <= set(documented)
