"""The filter language of tabulations: masks checked against plain pandas, and code never runs."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.api import read_release
from gedp.cli import app
from gedp.errors import InputError
from gedp.postprocess.filters import FilterError, select_rows
from gedp.postprocess.tabulate import tabulate

runner = CliRunner()

FRAME = pd.DataFrame({"county": ["001", "003", "005", "001"], "sector": ["23", "31-33", "23", "44-45"],
                      "m1emp": [1.0, 20.0, 5.5, -0.0], "wage": [10.0, 2e5, 30.0, 0.0]})
C, S, M = FRAME["county"], FRAME["sector"], FRAME["m1emp"]


@pytest.mark.parametrize("where, expected", [
    ("sector == '23'", S == "23"),
    ("sector != '23'", S != "23"),
    ("m1emp < 5.5", M < 5.5), ("m1emp <= 5.5", M <= 5.5), ("m1emp > 1", M > 1), ("m1emp >= 1", M >= 1),
    ("1 < m1emp <= 20", (M > 1) & (M <= 20)),
    ("county in ['001', '005']", C.isin(["001", "005"])),
    ("county not in ('001',)", ~C.isin(["001"])),
    ("sector == '23' and not m1emp < 2", (S == "23") & ~(M < 2)),
    ("(sector == '44-45' or m1emp > 10) and county == '001'", ((S == "44-45") | (M > 10)) & (C == "001")),
    ("m1emp > -1", M > -1),
    ("'23' == sector", S == "23"),
])
def test_filters_select_what_pandas_selects(where, expected):
    assert select_rows(FRAME, where).tolist() == expected.tolist()


ATTACK = "county.__class__.__init__.__globals__['sys'].modules['os'].system('touch {marker}')"


@pytest.mark.parametrize("where, construct", [
    (ATTACK, "a function call is not a condition"),
    ("county == county.__class__", "an attribute (.__class__) is not allowed"),
    ("county[0] == '0'", "a subscript is not allowed"),
    ("m1emp + 1 > 2", "arithmetic is not allowed"),
    ("(lambda: 1)() == 1", "a function call is not allowed"),
    ("m1emp == (lambda: 1)", "a lambda is not allowed"),
    ("zipcode == 3", "'zipcode' is not a column"),
    ("__import__('os') == 1", "a function call is not allowed"),
    ("county", "a bare column is not a condition"),
    ("county in county", "in needs a list of literals"),
    ("county is None", "the comparison Is is not allowed"),
    ("@x == 1", "not a filter expression"),
    ("sector == True", "the literal True is not allowed"),
])
def test_anything_else_is_refused_in_one_line(tmp_path, where, construct):
    where = where.format(marker=tmp_path / "ran")
    with pytest.raises(FilterError) as refused:
        select_rows(FRAME, where)
    assert construct in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "ran").exists()


def test_the_issue_attack_does_not_run_through_tabulate_release_and_cli(tmp_path, small_release):
    release, _ = small_release
    attack = ATTACK.format(marker=tmp_path / "ran")
    with pytest.raises(ValueError, match="a function call is not a condition"):
        tabulate(FRAME, "county", where=attack)
    with pytest.raises(InputError, match="a function call is not a condition"):
        read_release(release).tabulate(by="county", where=attack)
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--where", attack])
    assert result.exit_code == 2 and "a function call is not a condition" in result.output
    assert not (tmp_path / "ran").exists()
