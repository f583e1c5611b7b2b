"""The one tabulation path (``gedp.tabulation.request``): a request's checks, its answer against a direct
pandas computation on the release's protected microdata, the quick and pandas answers alike, and
``gedp tabulate`` writing exactly the library's table and summary."""

import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.errors import InputError
from gedp.tabulation.request import TabulationRequest, tabulate_request

ATTRIBUTES = ["m1emp", "m2emp", "m3emp", "wage"]


@pytest.fixture
def release(small_release, tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(small_release[0], folder)
    return folder


@pytest.mark.parametrize("options, message", [
    ({"format": "qcew"}, "--format qcew needs --agglvl"),
    ({"out": Path("t.txt")}, "the name does not tell the format"),
    ({"format": "xlsx", "by": "county"}, "--format xlsx writes QCEW levels"),
    ({"by": "county", "agglvl": 75}, "give --by or --agglvl, not both"),
    ({"level": 1.5}, "--level (1.5) must be a confidence level from 0.5 to below 1"),
    ({"level": 1e-300}, "--level (1e-300) must be a confidence level from 0.5 to below 1"),
    ({"format": "parquet"}, "--format parquet needs --out FILE"),
])
def test_a_request_whose_options_do_not_go_together_is_refused(release, options, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TabulationRequest(release, **options).checked()


def test_the_format_is_told_by_the_output_name(release, tmp_path):
    assert TabulationRequest(release, out=tmp_path / "t.parquet").checked().format == "parquet"
    assert TabulationRequest(release, out=tmp_path / "t.XLSX").checked().format == "xlsx"
    assert TabulationRequest(release).checked().format == "csv"


def test_margins_need_a_release(tmp_path):
    data = tmp_path / "micro.csv"
    data.write_text("estab_id\n1\n")
    with pytest.raises(InputError, match="--moe needs a release directory"):
        TabulationRequest(data, moe=True).checked()


def test_the_answer_is_the_protected_microdata_summed(release):
    """The sums equal a plain pandas group-by of the protected microdata (read here directly)."""
    protected = pd.read_parquet(release / "protected.parquet")
    expected = protected.groupby(["state", "county", "sector"])[ATTRIBUTES].sum().reset_index()
    counts = protected.groupby(["state", "county", "sector"]).size().to_numpy()
    for attempt in range(2):  # the first request reads the release, the second its kept index
        answer = tabulate_request(TabulationRequest(release, by="county,sector", moe=True), frame=True)
        table = answer.frame()
        assert list(table[["state", "county", "sector"]].itertuples(index=False)) == \
            list(expected[["state", "county", "sector"]].itertuples(index=False))
        assert (table["estabs"].to_numpy() == counts).all()
        for attribute in ATTRIBUTES:
            assert table[attribute].to_numpy() == pytest.approx(expected[attribute].to_numpy(), rel=1e-12, abs=1e-6)
            assert (table[f"{attribute}_moe"] > 0).all()


def test_quick_and_pandas_answers_write_the_same_bytes_as_the_command(release, tmp_path):
    """A further request answered without pandas (columns) and with it (a frame): the same CSV,
    which is what ``gedp tabulate --out`` writes, with the summary the library gives."""
    request = TabulationRequest(release, by="county,naics4", moe=True)
    tabulate_request(request)  # a first request keeps the index
    quick, full = tabulate_request(request), tabulate_request(request, frame=True)
    assert quick.columns is not None and quick.table is None and full.table is not None
    texts = []
    for answer in (quick, full):
        buffer = io.StringIO()
        answer.write_csv(buffer)
        texts.append(buffer.getvalue())
    assert texts[0] == texts[1] == full.table.to_csv(index=False)
    out = tmp_path / "t.csv"
    done = CliRunner().invoke(app, ["tabulate", str(release), "--by", "county,naics4", "--moe", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert out.read_text() == texts[0]
    summary = json.loads((tmp_path / "t.csv.json").read_text())
    assert summary == {"source": str(release), "by": ["state", "county", "naics4"], "agglvl": None, "where": None,
                       "moe_level": 0.95, "rows": quick.n_rows, "table": str(out)}


def test_a_filtered_request_reports_its_selection_warning(release):
    """A filter on protected values with margins warns; the library collects the warning for its
    caller (the command prints it, the server returns it)."""
    answer = tabulate_request(TabulationRequest(release, by="county", where="m1emp > 100", moe=True))
    assert any("selection" in said for said in answer.warnings), answer.warnings
