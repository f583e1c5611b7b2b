"""Findings of the attacker review of what gedp trusts (inputs, configs, output paths), one test each.

Every command must end in success or in one line ``error: ...`` with exit status 2, quickly, with
nothing written; ``--out`` replaces only what gedp wrote; codes are ASCII digits; messages never
show confidential values or counts derived from them.
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from gedp import configs
from gedp.cli import app
from gedp.config import load_config
from gedp.measure.neighbors import LogPsi
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.schema import InputError, validate_microdata

runner = CliRunner()
COLUMNS = ["estab_id", "state", "county", "naics", "m1emp", "m2emp", "m3emp", "wage"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_refused(result, out, message):
    """Exit 2, one line 'error: ...' (or the input's first check: a first line, then one line per
    problem) holding ``message``, no traceback, nothing at ``out``."""
    output = result.output if hasattr(result, "output") else result.stdout + result.stderr
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code == 2, (code, output, getattr(result, "exception", None))
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert output.startswith("error: ") and all(line.startswith("  - ") for line in lines[1:]), output
    assert message in output, output
    if out is not None:
        assert not os.path.lexists(out)


def gedp_process(*args, timeout=60, memory_gb=3):
    """The command line of this interpreter's gedp in a child process with a memory limit (hostile
    inputs must not take the machine down, even on code that reads them whole)."""
    command = [sys.executable, "-m", "gedp"]

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory_gb << 30, memory_gb << 30))

    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit)


@pytest.fixture(scope="module")
def rows():
    """300 valid establishments of one state (fixed seed), as a DataFrame of the input columns."""
    frame = generate_profile(load_profile("small"), n_establishments=300, rng=np.random.default_rng(3))
    return frame[COLUMNS].reset_index(drop=True)


def protect_args(source, out, config="employment"):
    return ["protect", source, "--config", config, "--out", out, "--seed", 1, "--not-for-publication"]


# --- 1. --out replaces only a gedp release -----------------------------------------------------------

def test_out_folder_with_a_stray_manifest_is_not_deleted(tmp_path):
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name": "my web app", "icons": []}')
    (webapp / "src" / "important.py").write_text("print('precious')")
    result = invoke("run", "--establishments", 100, "--out", webapp)
    assert result.exit_code == 2 and "is not a gedp release" in result.output, result.output
    assert (webapp / "src" / "important.py").read_text() == "print('precious')"


def test_out_release_holding_foreign_files_is_not_replaced(small_release, tmp_path):
    out = tmp_path / "release"
    shutil.copytree(small_release[0], out)
    (out / "notes.txt").write_text("mine")
    result = invoke("run", "--establishments", 100, "--out", out)
    assert result.exit_code == 2 and "'notes.txt' is not part of a gedp release" in result.output, result.output
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("manifest", ["not json {", '["a list"]', '{"name": "no gedp keys"}'])
def test_out_with_a_manifest_that_is_not_gedps_is_not_replaced(tmp_path, manifest):
    out = tmp_path / "release"
    out.mkdir()
    (out / "manifest.json").write_text(manifest)
    result = invoke("run", "--establishments", 100, "--out", out)
    assert result.exit_code == 2 and "is not a gedp release" in result.output, result.output
    assert (out / "manifest.json").read_text() == manifest


def test_empty_out_folder_may_be_used(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    result = invoke("run", "--establishments", 100, "--seed", 1, "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["establishments"] == 100


def test_summary_output_with_foreign_files_is_not_replaced(rows, tmp_path):
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.json").write_text('{"figures": ["suppression_shares.png"]}')
    (out / "thesis.tex").write_text("precious")
    result = invoke("suppress", "--out", out, "--data", source, "--no-audit")
    assert result.exit_code == 2 and "'thesis.tex' is not part of a gedp output" in result.output, result.output
    assert (out / "thesis.tex").read_text() == "precious"


def test_earlier_outputs_of_gedp_are_replaced(rows, tmp_path):
    """A release of Parquet part folders and a report with its plots are gedp's: a rerun replaces them."""
    folder = tmp_path / "in.parquet"
    folder.mkdir()
    rows.head(150).assign(state="09").to_parquet(folder / "part-a.parquet", index=False)
    rows.tail(150).to_parquet(folder / "part-b.parquet", index=False)
    for _ in range(2):
        result = invoke(*protect_args(folder, tmp_path / "release"))
        assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "release" / "manifest.json").read_text())["states"] == ["09", "44"]
    rows.to_csv(tmp_path / "in.csv", index=False)
    for _ in range(2):
        result = invoke("suppress", "--out", tmp_path / "report", "--data", tmp_path / "in.csv", "--no-audit")
        assert result.exit_code == 0, result.output


# --- 2. state codes are read by their normalized value; rows read == rows protected -------------------

def test_parquet_state_codes_with_spaces_are_all_released(rows, tmp_path):
    frame = pd.concat([rows.head(100).assign(state=" 44"), rows.tail(200).assign(state="44")], ignore_index=True)
    frame.to_parquet(tmp_path / "in.parquet", index=False)
    result = invoke(*protect_args(tmp_path / "in.parquet", tmp_path / "out"))
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["states"] == ["44"] and manifest["establishments"] == 300
    assert len(pd.read_parquet(tmp_path / "out" / "protected.parquet")) == 300


def test_rows_protected_must_add_up_to_rows_read(rows, tmp_path, monkeypatch):
    import gedp.running.engine

    rows.to_parquet(tmp_path / "in.parquet", index=False)
    reader = gedp.running.engine.read_state
    monkeypatch.setattr(gedp.running.engine, "read_state", lambda *a: reader(*a).head(250))
    result = invoke(*protect_args(tmp_path / "in.parquet", tmp_path / "out"))
    assert_refused(result, tmp_path / "out", "250 establishments were read state by state, but the input has 300 rows")


# --- 3. estab_id unique across all states and parts, before any noise -------------------------------

def test_estab_id_repeated_in_parts_of_different_states_is_refused_before_noise(rows, tmp_path, monkeypatch):
    import gedp.running.engine

    folder = tmp_path / "in.parquet"
    folder.mkdir()
    rows.head(150).assign(state="09").to_parquet(folder / "part-09.parquet", index=False)
    other = rows.tail(150).assign(state="44").reset_index(drop=True)
    other.loc[5, "estab_id"] = rows.loc[0, "estab_id"]
    other.to_parquet(folder / "part-44.parquet", index=False)
    monkeypatch.setattr(gedp.running.engine, "protect", lambda *a, **k: pytest.fail("noise drawn before the id check"))
    result = invoke(*protect_args(folder, tmp_path / "out"))
    assert_refused(result, tmp_path / "out",
                   "column 'estab_id': ids must be unique, compared as the ledger's accounts (blanks trimmed, "
                   "upper case, leading zeros dropped, numbers by value); row 156 is the establishment of row 1")


def test_an_estab_id_longer_than_a_release_key_is_refused_and_one_as_long_is_read_with_margins(rows, tmp_path):
    """A release's readers refuse keys longer than MAX_KEY_CHARS (an edited copy's); the input refuses
    such an id before any noise, so no release is written that its own readers then refuse. An id of
    exactly that length protects and tabulates with margins."""
    from gedp.release.measurement_checks import MAX_KEY_CHARS

    longest = rows.astype({"estab_id": str})
    longest.loc[7, "estab_id"] = "7" * MAX_KEY_CHARS
    longest.to_parquet(tmp_path / "ok.parquet", index=False)
    done = invoke(*protect_args(tmp_path / "ok.parquet", tmp_path / "ok"))
    assert done.exit_code == 0, done.output
    table = invoke("tabulate", tmp_path / "ok", "--by", "county", "--moe")
    assert table.exit_code == 0 and "m1emp_moe" in table.output, table.output
    longer = longest.copy()
    longer.loc[7, "estab_id"] = "7" * (MAX_KEY_CHARS + 1)
    longer.to_parquet(tmp_path / "in.parquet", index=False)
    assert_refused(invoke(*protect_args(tmp_path / "in.parquet", tmp_path / "out")), tmp_path / "out",
                   f"column 'estab_id': ids must be at most {MAX_KEY_CHARS} characters")


# --- 4. codes are ASCII digits ------------------------------------------------------------------------

@pytest.mark.parametrize("column, code, message", [
    ("state", "\u0664\u0664", "column 'state': codes must be 2 ASCII digits; first at row 1"),  # Arabic-Indic 44
    ("county", "\u0660\u0660\u0661", "column 'county': codes must be 3 ASCII digits; first at row 1"),
    ("naics", "\uff15\uff14\uff11\uff15\uff11\uff11", "column 'naics': codes must be 6 ASCII digits; first at row 1"),
    ("own", "\u0665", "column 'own': codes must be 1 ASCII digit; first at row 1"),
])
def test_codes_must_be_ascii_digits(rows, column, code, message):
    with pytest.raises(InputError) as err:
        validate_microdata(rows.assign(**{column: code}))
    assert message in str(err.value)


def test_arabic_indic_state_is_not_a_second_state(rows, tmp_path):
    frame = rows.copy()
    frame.loc[:99, "state"] = "\u0664\u0664"
    frame.to_parquet(tmp_path / "in.parquet", index=False)
    result = invoke(*protect_args(tmp_path / "in.parquet", tmp_path / "out"))
    assert_refused(result, tmp_path / "out", "column 'state': codes must be 2 ASCII digits; first at row 1")


def test_published_area_codes_must_be_ascii_digits():
    from gedp.synth.qcew import published_state

    raw = pd.DataFrame({"area_fips": ["\u0664\u0664000"], "own_code": ["5"], "industry_code": ["10"],
                        "agglvl_code": [51], "year": [2024], "qtr": [1], "disclosure_code": [""],
                        "qtrly_estabs_count": [1], "month1_emplvl": [1], "month2_emplvl": [1], "month3_emplvl": [1],
                        "total_qtrly_wages": [1]})
    with pytest.raises(InputError, match="area_fips that is not 5 digits"):
        published_state(raw)


# --- 5. numbers in configs that overflow or underflow ------------------------------------------------

def _baseline_without_cap():
    raw = yaml.safe_load(configs.path("baseline").read_text())
    raw.pop("mu_cap")
    return raw


def _set(path, value):
    def edit(raw):
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


NUMERIC_CONFIGS = {
    "400-digit mu": (_set(("queries", 0, "mu", "m1emp"), 10**400),
                     "queries[1].mu.m1emp must be a finite number, got 1000000000000000000000000000000000000..."),
    "mu 1e200": (_set(("queries", 0, "mu", "m1emp"), 1e200),
                 "mu of query 'identity' on 'm1emp' (1e+200) must be a finite number > 0 and <= 100"),
    "gamma 1e-300": (_set(("attributes", "m1emp", "gamma"), 1e-300), "gamma of m1emp (1e-300) must be >= 1e-06"),
    "zeta 5e-324": (_set(("zeta",), 5e-324), "zeta (5e-324) must be in [1e-12, 0.5]"),
    "linear d 1e300": (_set(("psi",), {"name": "linear", "d": 1e300}),
                       "psi parameter d (1e+300) must be a finite number > 0 and <= 1e+13"),
    "log gamma/mu 1000": (lambda raw: (_set(("psi",), {"name": "log", "a": 1})(raw),
                                       _set(("attributes", "m1emp", "gamma"), 700.0)(raw)),
                          "query identity on m1emp: noise sd gamma / mu (1e+03) exceeds 10, the most psi log allows"),
    "sqrt a 1e300": (_set(("psi",), {"name": "sqrt", "a": 1e300}),
                     "psi parameter a (1e+300) must be a finite number >= 0 and <= 1e+13"),
}


@pytest.mark.parametrize("case", list(NUMERIC_CONFIGS))
def test_config_numbers_that_overflow_are_refused(tmp_path, case):
    edit, message = NUMERIC_CONFIGS[case]
    raw = _baseline_without_cap()
    edit(raw)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(raw))
    start = time.process_time()  # processor time: a busy neighbour (a parallel test run) stretches wall time
    result = invoke("run", "--config", tmp_path / "plan.yaml", "--establishments", 100, "--out", tmp_path / "r")
    assert_refused(result, tmp_path / "r", message)
    assert time.process_time() - start < 5


# --- 6. config structure ----------------------------------------------------------------------------

BASELINE_TEXT = configs.path("baseline").read_text()
#: Billion laughs as the value of zeta: 9^12 references in a few lines; the old loader built it and
#: the "must be a finite number, got ..." message then ran out of memory printing it.
BOMB = BASELINE_TEXT.replace("zeta: 0.01", "zeta: [&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1],\n" + "".join(
    f"  &a{i} [{', '.join([f'*a{i - 1}'] * 9)}],\n" for i in range(1, 12)) + "  *a11]")
STRUCTURE_CONFIGS = {
    "unhashable key": (BASELINE_TEXT + "? [a, b]\n: 1\n",
                       "a key at line 26, column 3 is a list; keys must be plain text"),
    "psi name a list": (BASELINE_TEXT.replace("psi: {name: sqrt, a: 0}", "psi: {name: [sqrt]}"),
                        "psi ['sqrt'] is unknown; choose one of sqrt, log, linear, sqrt-linear"),
    "5000-deep nesting": ("queries: " + "[" * 5000 + "]" * 5000 + "\n", "line 1 is nested more than 20 levels deep"),
    "alias bomb": (BOMB, "YAML aliases (*a0 at line 7) are not allowed in configs"),
    "duplicate by column": (BASELINE_TEXT.replace("by: [state, naics5]", "by: [state, state]"),
                            "queries[3].by: column 'state' appears twice in query state,state"),
    "sqrt-linear with an offset": (BASELINE_TEXT.replace("psi: {name: sqrt, a: 0}", "psi: {name: sqrt-linear, a: 0}"),
                                   "psi 'sqrt-linear' takes parameters ['gamma_sqrt', 'd'], got ['a']"),
}


@pytest.mark.parametrize("case", list(STRUCTURE_CONFIGS))
def test_config_structure_errors_are_one_line(tmp_path, case):
    """In a child process with a memory limit: the old loader expanded the alias bomb until memory ran out."""
    text, message = STRUCTURE_CONFIGS[case]
    (tmp_path / "plan.yaml").write_text(text)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = gedp_process("run", "--config", tmp_path / "plan.yaml", "--establishments", 100, "--out", tmp_path / "r",
                          timeout=30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert_refused(result, tmp_path / "r", message)
    # the child's processor time, its imports included (wall time: at most the 30 s timeout)
    assert after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime < 10


def test_query_by_a_carried_column_is_refused(rows, tmp_path):
    raw = yaml.safe_load(configs.path("employment").read_text())
    raw["queries"][1]["by"] = ["state", "year"]
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(raw))
    rows.to_csv(tmp_path / "in.csv", index=False)
    result = invoke(*protect_args(tmp_path / "in.csv", tmp_path / "out", config=tmp_path / "plan.yaml"))
    assert_refused(result, tmp_path / "out", "queries[2].by: 'year' is not a public column to group by")


# --- 7. input files ----------------------------------------------------------------------------------

def test_list_typed_year_in_parquet_is_refused(rows, tmp_path):
    rows.assign(year=[[2020]] * len(rows), qtr=1).to_parquet(tmp_path / "in.parquet", index=False)
    result = invoke(*protect_args(tmp_path / "in.parquet", tmp_path / "out"))
    assert_refused(result, tmp_path / "out", "column 'year': values must be years 1900-2100; first at row 1")


@pytest.mark.parametrize("column, value, message", [
    ("year", "", "column 'year': values must be years 1900-2100; first at row 7"),
    ("year", '=HYPERLINK("http://x")', "column 'year': values must be years 1900-2100; first at row 7"),
    ("year", "\u0662\u0660\u0662\u0664", "column 'year': values must be years 1900-2100; first at row 7"),
    ("year", "20240", "column 'year': values must be years 1900-2100; first at row 7"),
    ("qtr", "5", "column 'qtr': values must be quarters 1-4; first at row 7"),
    ("qtr", "1.5", "column 'qtr': values must be quarters 1-4; first at row 7"),
    ("qtr", "", "column 'qtr': values must be quarters 1-4; first at row 7"),
])
def test_year_and_qtr_must_be_whole_numbers(rows, tmp_path, column, value, message):
    frame = rows.assign(year="2024", qtr="2")
    frame.loc[6, column] = value
    frame.to_csv(tmp_path / "in.csv", index=False)
    result = invoke(*protect_args(tmp_path / "in.csv", tmp_path / "out"))
    assert_refused(result, tmp_path / "out", message)


def test_valid_year_and_qtr_reach_the_tables(rows, tmp_path):
    rows.assign(year=" 2024", qtr=3).to_csv(tmp_path / "in.csv", index=False)
    result = invoke(*protect_args(tmp_path / "in.csv", tmp_path / "out"))
    assert result.exit_code == 0, result.output
    tables = pd.read_csv(tmp_path / "out" / "qcew_tables.csv")
    assert set(tables["year"]) == {2024} and set(tables["qtr"]) == {3}


def test_duplicate_csv_column_names_are_refused(rows, tmp_path):
    text = rows.to_csv(index=False)
    header, body = text.split("\n", 1)
    (tmp_path / "in.csv").write_text(header + ",wage\n" + body.replace("\n", ",0\n"))
    result = invoke(*protect_args(tmp_path / "in.csv", tmp_path / "out"))
    assert_refused(result, tmp_path / "out", "column 'wage' appears more than once")


def test_fifo_input_is_refused_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "in.csv")
    result = gedp_process(*protect_args(tmp_path / "in.csv", tmp_path / "out"), timeout=30)
    assert_refused(result, tmp_path / "out", "is not a regular file (a FIFO)")


def test_device_input_is_refused_without_reading_it(tmp_path):
    result = gedp_process(*protect_args("/dev/zero", tmp_path / "out"), timeout=30)
    assert_refused(result, tmp_path / "out", "input '/dev/zero' is not a regular file (a character device)")


def test_parquet_folder_with_other_files_is_refused(rows, tmp_path):
    folder = tmp_path / "in.parquet"
    folder.mkdir()
    rows.to_parquet(folder / "part-0.parquet", index=False)
    os.mkfifo(folder / "part-1.parquet")
    result = gedp_process(*protect_args(folder, tmp_path / "out"), timeout=30)
    assert_refused(result, tmp_path / "out", "part-1.parquet' is not a regular file (a FIFO)")


# --- 8. output paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("where, message", [
    ("under a file", "cannot be created: 'afile' is not a folder"),
    ("proc", "cannot be created"),
    ("long name", "output name is 300 bytes long; use at most 200"),
])
def test_output_paths_that_cannot_be_created_are_refused(tmp_path, where, message):
    (tmp_path / "afile").write_text("a file")
    out = {"under a file": tmp_path / "afile" / "rel", "proc": "/proc/gedp-out",
           "long name": tmp_path / ("r" * 300)}[where]
    result = invoke("run", "--establishments", 100, "--out", out)
    assert_refused(result, None, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert not os.path.lexists("/proc/gedp-out")


# --- 9. sizes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "synth"])
def test_establishments_beyond_the_maximum_are_refused(tmp_path, command):
    out = tmp_path / ("out" if command == "run" else "out.parquet")
    extra = ["--profile", "small"] if command == "synth" else []
    result = gedp_process(command, *extra, "--establishments", 100_000_000_000, "--out", out, timeout=60)
    assert_refused(result, out, "number of establishments (100000000000) must be >= 1 and <= 20,000,000")


def test_usage_errors_are_one_line(tmp_path):
    result = gedp_process("run", "--establishments", "1e11", "--out", tmp_path / "out")
    assert_refused(result, tmp_path / "out", "error: Invalid value for '--establishments'")
    assert_refused(gedp_process("nosuch"), None, "No such command 'nosuch'")


@pytest.mark.parametrize("command", [
    ["synth", "--profile", "small", "--establishments", 50, "--out", "{afile}/x.parquet"],
    ["tabulate", "{data}", "--by", "county", "--out", "{afile}/t.csv"],
    ["audit", "--pipeline", "--runs", 20, "--out", "{afile}/audit.json"],
])
def test_file_outputs_that_cannot_be_created_are_refused(rows, tmp_path, command):
    (tmp_path / "afile").write_text("a file")
    rows.to_csv(tmp_path / "in.csv", index=False)
    arguments = [str(a).format(afile=tmp_path / "afile", data=tmp_path / "in.csv") for a in command]
    result = invoke(*arguments)
    assert result.exit_code == 2 and "Traceback" not in result.output, (result.output, result.exception)
    assert "cannot be created: 'afile' is not a folder" in result.output.splitlines()[-1], result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "in.csv"]


# --- 10. dask: one line, no worker traceback ---------------------------------------------------------

def test_dask_input_errors_are_one_line(rows, tmp_path):
    frame = rows.copy()
    frame.loc[4, "m1emp"] = -1.0
    frame.to_parquet(tmp_path / "in.parquet", index=False)
    result = gedp_process(*protect_args(tmp_path / "in.parquet", tmp_path / "out"), "--engine", "dask",
                          timeout=120, memory_gb=8)
    assert_refused(result, tmp_path / "out", "column 'm1emp': values must be >= 0; first at row 5")


# --- 11. messages never show confidential values or counts -------------------------------------------

@pytest.mark.parametrize("value, rule", [
    (-123457.25, "values must be >= 0"),
    (np.nan, "values must be finite numbers"),
    (9.87654e14, "values must be <= 1e+13"),
])
def test_confidential_messages_show_no_value_and_no_count(rows, value, rule):
    frame = rows.copy()
    frame.loc[[6, 11, 12], "wage"] = value
    with pytest.raises(InputError) as err:
        validate_microdata(frame)
    message = str(err.value)
    assert message == f"column 'wage': {rule}; first at row 7 (estab_id {frame.loc[6, 'estab_id']})"
    for leak in ("123457", "98765", "nan", "3 rows", " 3 "):
        assert leak not in message


def test_log_psi_zero_total_message_has_no_count():
    with pytest.raises(InputError) as err:
        LogPsi(a=0).check_domain(np.array([0.0, 4.0, 0.0, 0.0]), "query state on wage")
    assert str(err.value) == ("psi log with a = 0 needs every value > 0, but a total of query state on wage is 0;"
                              " use a > 0 (e.g. a = 1)")


def test_config_messages_are_bounded(tmp_path):
    raw = yaml.safe_load(configs.path("baseline").read_text())
    raw["zeta"] = "z" * 5000
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(InputError) as err:
        load_config(tmp_path / "plan.yaml")
    assert "zeta must be a finite number" in str(err.value) and len(str(err.value)) < 300
