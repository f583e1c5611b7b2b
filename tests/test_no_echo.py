"""No confidential value in what `gedp protect` prints about a malformed input: each input below
holds one marked value where it breaks a rule (or a file without a header line, whose first
establishment's values would be read as its column names); the command refuses it in a line that
names the column and the row, and the value appears nowhere in its output."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.errors import InputError
from gedp.synth.io import read_columns
from gedp.synth.schema import CONFIDENTIAL

runner = CliRunner()
SECRET = "987654321"
BLS_NAMES = {"estab_id": "uiacct", "m1emp": "month1_emplvl"}


@pytest.fixture
def rows(small_state):
    """60 establishments in gedp's columns, values as whole-number text, none holding SECRET."""
    frame = small_state.head(60)[["estab_id", "state", "county", "naics", "own", *CONFIDENTIAL]].copy()
    for column in CONFIDENTIAL:
        frame[column] = frame[column].round().astype(np.int64).astype(str)
    assert not frame.apply(lambda c: c.str.contains(SECRET)).to_numpy().any()
    return frame


def with_value(rows: pd.DataFrame, value: str, row: int = 6) -> pd.DataFrame:
    frame = rows.copy()
    frame.loc[frame.index[row - 1], "m1emp"] = value
    return frame


def write(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def malformed(tmp_path, rows: pd.DataFrame) -> dict:
    """Malformed inputs, each holding SECRET; the m1emp of row 6 unless said otherwise."""
    csv = {
        "non-breaking space": with_value(rows, SECRET + "\u00a0").to_csv(index=False),
        "em space inside": with_value(rows, SECRET[:3] + "\u2003" + SECRET[3:]).to_csv(index=False),
        "currency sign": with_value(rows, "$" + SECRET).to_csv(index=False),
        "unquoted thousands separator": with_value(rows, "987,654,321").to_csv(index=False).replace(
            '"987,654,321"', "987,654,321"),
        "no header line": with_value(rows, SECRET, row=1).to_csv(index=False, header=False),
        "unclosed quote": with_value(rows, SECRET).to_csv(index=False).replace(SECRET, '"' + SECRET),
        "NUL byte": with_value(rows, SECRET + "\x00").to_csv(index=False),
    }
    inputs = {name: write(tmp_path, f"{i}.csv", text) for i, (name, text) in enumerate(csv.items())}
    bls = with_value(rows, SECRET + "\u00a0").rename(columns=BLS_NAMES)
    inputs["non-breaking space, agency names"] = write(tmp_path, "bls.csv", bls.to_csv(index=False))
    latin = with_value(rows, SECRET).to_csv(index=False).replace(SECRET, SECRET + "\xe9").encode("latin-1")
    inputs["not UTF-8"] = write(tmp_path, "latin.csv", latin)
    semicolons = with_value(rows, SECRET[:5] + "," + SECRET[5:]).to_csv(index=False, sep=";")
    inputs["decimal comma"] = write(tmp_path, "semi.csv", semicolons)
    table = pa.Table.from_pandas(with_value(rows, SECRET + "\u00a0"), preserve_index=False)
    pq.write_table(table, tmp_path / "text.parquet")
    inputs["Parquet m1emp as text"] = tmp_path / "text.parquet"
    return inputs


def test_malformed_inputs_are_refused_without_their_value(tmp_path, rows):
    for name, path in malformed(tmp_path, rows).items():
        result = runner.invoke(app, ["protect", str(path), "--config", "employment", "--out", str(tmp_path / "out"),
                                     "--seed", "1", "--not-for-publication"])
        assert result.exit_code == 2, (name, result.output, result.exception)
        assert result.output.startswith("error:"), (name, result.output)
        for shown in (SECRET, SECRET[:6], SECRET[-6:]):
            assert shown not in result.output, (name, result.output)
        assert not (tmp_path / "out").exists()


def test_the_readers_refuse_without_the_value(tmp_path, rows):
    """Past the first check (the API's readers, `gedp tabulate`): the same refusals."""
    inputs = malformed(tmp_path, rows)
    for name in ("no header line", "unclosed quote"):
        with pytest.raises(InputError) as caught:
            read_columns(inputs[name])
        assert SECRET[:6] not in str(caught.value), (name, str(caught.value))


def test_a_file_without_header_names_the_fields_not_their_values(tmp_path, rows):
    path = write(tmp_path, "plain.csv", rows.to_csv(index=False, header=False))
    result = runner.invoke(app, ["protect", str(path), "--config", "employment", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "its first line looks like a row of data, not a header (fields 2, 3, 4, 5, 6 ... are numbers)" in \
        result.output
    first = rows.iloc[0]
    assert first["naics"] not in result.output and f"'{first['wage']}'" not in result.output


def test_a_non_breaking_space_is_not_a_blank_of_a_number(tmp_path, rows):
    """ASCII blanks around a number are stripped (pandas reads ' 5 ' as 5); a non-breaking space is
    not, in the first check as in the readers: refused at its row."""
    path = write(tmp_path, "a.csv", with_value(rows, " 17 ").to_csv(index=False))
    result = runner.invoke(app, ["protect", str(path), "--config", "employment", "--out", str(tmp_path / "ok"),
                                 "--seed", "1", "--not-for-publication"])
    assert result.exit_code == 0, result.output
    path = write(tmp_path, "b.csv", with_value(rows, "17\u00a0").rename(columns=BLS_NAMES).to_csv(index=False))
    result = runner.invoke(app, ["protect", str(path), "--config", "employment", "--out", str(tmp_path / "no")])
    assert result.exit_code == 2
    assert "column 'month1_emplvl' (m1emp): values that are not numbers at row 6" in result.output


@pytest.mark.parametrize("message, reason", [
    (f"CSV parse error: Expected 9 columns, got 10: 44-0000005,44,001,238321,5,{SECRET},4,4,1",
     "a row has 10 fields, the header 9"),
    (f"In CSV column #5: Row #7: CSV conversion error to double: invalid value '{SECRET}\u00a0'",
     "a value is not of its column's type, column 6, row 7"),
    ("Error tokenizing data. C error: Expected 9 fields in line 7, saw 10",
     "a row (line 7) has 10 fields, the header 9"),
    (f"could not convert string to float: '{SECRET}'", "a value is not of its column's type"),
    (f"CSV parse error: Row #3: unterminated quoted field \"{SECRET}", "malformed CSV, e.g. an unclosed quote, row 3"),
    ("CSV conversion error to string: invalid UTF8 data", "it is not UTF-8 text"),
])
def test_a_reader_error_is_told_without_its_text(message, reason):
    from gedp.synth.csv_values import read_error

    assert read_error(ValueError(message)) == reason
