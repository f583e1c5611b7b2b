"""Hostile and malformed input on every command: a clear one-line error, exit status 2, nothing
written, no traceback (property-based, hypothesis)."""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gedp import configs
from gedp.cli import app

runner = CliRunner()
#: Derandomized: every run (and CI) tries the same examples for a given hypothesis version. For a
#: deeper search: GEDP_FUZZ_EXAMPLES=500 GEDP_FUZZ_RANDOM=1 python3 -m pytest tests/test_fuzz.py
FUZZ = settings(max_examples=int(os.environ.get("GEDP_FUZZ_EXAMPLES", "40")), deadline=None,
                derandomize=not os.environ.get("GEDP_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture])
BAD_NUMBERS = st.sampled_from([np.nan, np.inf, -np.inf, -5.0, 1e300, "abc", "", "1,5", True])
COLUMNS = ["estab_id", "state", "county", "naics", "m1emp", "m2emp", "m3emp", "wage"]


def assert_clean_outcome(result, out, marker="manifest.json"):
    """Success with a complete output (``marker`` written), or exit 2 with one line (or the input's
    first check: a first line, then one line per problem), no traceback and nothing written."""
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        lines = result.output.strip().splitlines()
        assert result.output.startswith("error:") and all(line.startswith("  - ") for line in lines[1:]), result.output
        assert not out.exists()
    else:
        assert (out / marker).is_file()


@pytest.fixture(scope="module")
def valid_rows(small_state):
    return small_state[COLUMNS].head(25).reset_index(drop=True)


@st.composite
def broken_microdata(draw, rows):
    frame = rows.copy().astype(object)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["drop", "number", "code", "duplicate", "extra"]))
        row = draw(st.integers(0, len(frame) - 1))
        if kind == "drop" and len(frame.columns) > 1:
            frame = frame.drop(columns=[draw(st.sampled_from(list(frame.columns)))])
        elif kind == "number":
            numeric = [c for c in ("m1emp", "m2emp", "m3emp", "wage") if c in frame.columns]
            if numeric:
                frame.loc[row, draw(st.sampled_from(numeric))] = draw(BAD_NUMBERS)
        elif kind == "code":
            codes = [c for c in ("state", "county", "naics", "estab_id") if c in frame.columns]
            if codes:
                frame.loc[row, draw(st.sampled_from(codes))] = draw(st.text(max_size=8))
        elif kind == "duplicate" and "estab_id" in frame.columns:
            frame.loc[row, "estab_id"] = frame.loc[0, "estab_id"]
        else:
            frame[draw(st.text(min_size=1, max_size=6))] = draw(st.integers())
    text = frame.to_csv(index=False)
    ending = draw(st.sampled_from(["whole", "truncated", "latin-1", "empty"]))
    if ending == "truncated":
        return text[: draw(st.integers(0, len(text)))].encode()
    if ending == "latin-1":
        return (text + "Ézé,\xff\n").encode("latin-1", errors="replace")
    return b"" if ending == "empty" else text.encode()


MICRODATA_COMMANDS = {
    "protect": (
        lambda source, out: [
            "protect",
            source,
            "--config",
            "employment",
            "--out",
            out,
            "--seed",
            "1",
            "--not-for-publication",
        ],
        "manifest.json",
    ),
    "suppress": (lambda source, out: ["suppress", "--out", out, "--data", source, "--no-audit"], "summary.json"),
}


@pytest.mark.parametrize("command", list(MICRODATA_COMMANDS))
@FUZZ
@given(data=st.data())
def test_commands_survive_broken_microdata(valid_rows, tmp_path, command, data):
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    source = case / "in.csv"
    source.write_bytes(data.draw(broken_microdata(valid_rows)))
    out = case / "out"
    arguments, marker = MICRODATA_COMMANDS[command]
    result = runner.invoke(app, arguments(str(source), str(out)))
    assert_clean_outcome(result, out, marker=marker)
    shutil.rmtree(case)


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def broken_config(draw):
    raw = yaml.safe_load(configs.path("baseline").read_text())
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["top", "attribute", "query", "delete", "add"]))
        if kind == "top":
            raw[draw(st.sampled_from(sorted(raw)))] = draw(VALUES)
        elif kind == "attribute" and isinstance(raw.get("attributes"), dict) and raw["attributes"]:
            raw["attributes"][draw(st.sampled_from(sorted(raw["attributes"])))] = {"gamma": draw(VALUES)}
        elif kind == "query" and isinstance(raw.get("queries"), list) and raw["queries"]:
            query = raw["queries"][draw(st.integers(0, len(raw["queries"]) - 1))]
            if isinstance(query, dict):
                query[draw(st.sampled_from(["by", "mu"]))] = draw(VALUES)
        elif kind == "delete" and raw:
            raw.pop(draw(st.sampled_from(sorted(raw))))
        else:
            raw[draw(st.text(min_size=1, max_size=5))] = draw(VALUES)
    text = yaml.safe_dump(raw, allow_unicode=True)
    return draw(st.sampled_from([text, text[: len(text) // 2], "\t: [", "- 1\n- 2\n", ""]))


@FUZZ
@given(data=st.data())
def test_run_survives_broken_configs(tmp_path, data):
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    config = case / "plan.yaml"
    config.write_text(data.draw(broken_config()))
    out = case / "release"
    result = runner.invoke(
        app, ["run", "--config", str(config), "--establishments", "60", "--seed", "2", "--out", str(out)]
    )
    assert_clean_outcome(result, out)
    shutil.rmtree(case)


@FUZZ
@given(by=st.text(max_size=20), where=st.one_of(st.none(), st.text(max_size=20)))
def test_tabulate_survives_odd_requests(released, by, where):
    arguments = ["tabulate", str(released), "--by", by, *(["--where", where] if where is not None else [])]
    result = runner.invoke(app, arguments)
    assert result.exit_code in (0, 2), (result.output, result.exception)
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def released(small_release):
    return small_release[0]


def test_huge_values_are_refused(valid_rows, tmp_path):
    frame = valid_rows.copy()
    frame.loc[3, "wage"] = 5e14
    frame.to_csv(tmp_path / "in.csv", index=False)
    result = runner.invoke(app, ["protect", str(tmp_path / "in.csv"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "column 'wage': values must be <= 1e+13; first at row 4" in result.output


def run_with_baseline_edited(tmp_path, old, new):
    """`gedp run` with the baseline config after replacing ``old`` by ``new`` in its text."""
    (tmp_path / "plan.yaml").write_text(configs.path("baseline").read_text().replace(old, new))
    result = runner.invoke(app, ["run", "--config", str(tmp_path / "plan.yaml"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and not (tmp_path / "r").exists()
    return result.output


def test_zero_gamma_is_refused_because_it_releases_exact_values(tmp_path):
    assert "gamma of m1emp (0.0) must be >= 1e-06: gamma 0 adds no noise" in run_with_baseline_edited(
        tmp_path, "m1emp: {gamma: 0.5}", "m1emp: {gamma: 0}"
    )


def test_absurd_noise_is_refused(tmp_path):
    assert "noise sd gamma / mu" in run_with_baseline_edited(tmp_path, "m1emp: {gamma: 0.5}", "m1emp: {gamma: 1.0e+76}")


def test_duplicate_config_keys_are_refused(tmp_path):
    assert "duplicate key 'zeta' at line" in run_with_baseline_edited(tmp_path, "zeta: 0.01", "zeta: 0.01\nzeta: 0.5")


@pytest.fixture(scope="module")
def published_file(tmp_path_factory, small_state):
    from test_qcew import published_layout

    path = tmp_path_factory.mktemp("qcew") / "published.csv"
    published_layout(small_state).to_csv(path, index=False)
    return path


@FUZZ
@given(data=st.data())
def test_synth_survives_broken_qcew_files(published_file, tmp_path, data):
    lines = published_file.read_text().splitlines()
    kind = data.draw(st.sampled_from(["truncate", "cell", "drop", "shuffle-header"]))
    if kind == "truncate":
        text = "\n".join(lines)[: data.draw(st.integers(0, sum(map(len, lines))))]
    elif kind == "cell":
        row = data.draw(st.integers(1, len(lines) - 1))
        cells = lines[row].split(",")
        cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(st.sampled_from(["", "-3", "x", "1e300", "N"]))
        lines[row] = ",".join(cells)
        text = "\n".join(lines)
    elif kind == "drop":
        text = "\n".join(lines[:1] + [line for i, line in enumerate(lines[1:]) if i % data.draw(st.integers(2, 9))])
    else:
        header = lines[0].split(",")
        lines[0] = ",".join(data.draw(st.permutations(header))[:-1] + ["extra"])
        text = "\n".join(lines)
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    source = case / "qcew.csv"
    source.write_text(text)
    out = case / "state.parquet"
    result = runner.invoke(app, ["synth", "--from-qcew", str(source), "--out", str(out)])
    assert result.exit_code in (0, 2), (result.output, result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert result.output.startswith("error:") and not out.exists()
    shutil.rmtree(case)


@FUZZ
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=4),
       gamma=st.floats(allow_nan=True, allow_infinity=True), psi=st.sampled_from(["sqrt", "log", "linear", "x"]))
def test_interval_survives_any_numbers(values, gamma, psi):
    result = runner.invoke(app, ["interval", "--psi", psi, "--gamma", str(gamma), "--", *map(str, values)])
    assert result.exit_code in (0, 2), (result.output, result.exception)
    assert "Traceback" not in result.output
    if not all(np.isfinite(v) and v >= 0 for v in values):
        assert result.exit_code == 2
    elif result.exit_code == 0:
        assert "nan" not in result.output.lower()


@FUZZ
@given(p=st.floats(allow_nan=True, allow_infinity=True), min_estabs=st.integers(-3, 10**6),
       attributes=st.one_of(st.text(max_size=15), st.sampled_from(["m1emp", "wage,m1emp", "m1emp,m1emp", ","])))
def test_suppress_survives_odd_options(valid_rows, tmp_path, p, min_estabs, attributes):
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    source = case / "data.csv"
    valid_rows.to_csv(source, index=False)
    out = case / "out"
    result = runner.invoke(app, ["suppress", "--out", str(out), "--data", str(source), "--p", str(p),
                                 "--min-estabs", str(min_estabs), "--attributes", attributes])
    assert_clean_outcome(result, out, marker="summary.json")
    shutil.rmtree(case)
