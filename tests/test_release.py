"""The release format in one place (gedp.release), the lifetime ledger from the Python API as from
the command line, and the public names of the gedp package."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

import gedp
import gedp.accounting.ledger_file
from gedp.cli import app
from gedp.errors import InputError
from gedp.release.format import MANIFEST_FILE, REPORT_FILES, SUMMARY_FILE
from gedp.release.reader import read_manifest, release_wage_psi, wage_model

runner = CliRunner()
EMPLOYMENT_MU = math.sqrt(3 * 1.74)  # configs/employment.yaml


def releases(ledger):
    """The releases of a ledger that count (pending or committed)."""
    return gedp.accounting.ledger_file.live(gedp.accounting.ledger_file.read_ledger(ledger))


@pytest.mark.parametrize("config, expected", [("baseline", "wage prior"), ({"wages": "wls"}, "plain"),
                                              ({"solver": "osqp"}, "plain"), ("employment", None)])
def test_the_wage_model_of_the_manifest_is_the_one_the_solver_ran(small_state, config, expected):
    """The manifest records the wage model the postprocessing ran (solver.wage.model): the wage prior's
    solver (structured+employment) exactly when it says "wage prior"; a manifest without it is refused."""
    if isinstance(config, dict):
        config = dict(gedp.load("baseline").raw, **config)
    release = gedp.protect(small_state.head(400), config, seed=1, not_for_publication=True)
    manifest = release.manifest
    assert wage_model(manifest) == expected
    solver = manifest["solver"].get("wage", {}).get("solver")
    assert (solver == "structured+employment") == (expected == "wage prior")
    assert (solver is None) == (expected is None)
    assert (release_wage_psi(release.folder) is not None) == (expected == "wage prior")
    if expected is not None:
        del manifest["solver"]["wage"]["model"]
        with pytest.raises(InputError, match="does not record its wage model"):
            wage_model(manifest)


def test_a_report_folder_holds_the_report_files_of_the_format(tmp_path):
    """What ``gedp evaluate`` writes is what the writer lets it replace (the format's report names)."""
    out = tmp_path / "e4"
    result = runner.invoke(app, ["evaluate", "e4", "--out", str(out), "--trials", "1000"])
    assert result.exit_code == 0, result.output
    assert REPORT_FILES <= {p.name for p in out.iterdir()}
    assert (out / SUMMARY_FILE).is_file()
    again = runner.invoke(app, ["evaluate", "e4", "--out", str(out), "--trials", "1000"])  # replaced, not refused
    assert again.exit_code == 0, again.output


def test_the_api_keeps_the_lifetime_ledger_as_the_command_line_does(small_state, tmp_path):
    """gedp.protect(..., ledger=...) reserves, commits and refuses over the cap like `gedp protect
    --ledger`: a release that would exceed the cap is refused from either, and nothing is written."""
    records = small_state.head(300)
    ledger = tmp_path / "ledger.json"
    first = gedp.protect(records, "employment", ledger=gedp.Ledger(ledger, lifetime_cap=3.0))
    assert first.manifest["lifetime"]["spent_after"] == pytest.approx(EMPLOYMENT_MU)
    assert [r["status"] for r in releases(ledger)] == ["committed"]
    before = ledger.read_bytes()
    with pytest.raises(InputError, match="over their lifetime cap 3.0000"):
        gedp.protect(records, "employment", ledger=gedp.Ledger(ledger))
    assert ledger.read_bytes() == before  # nothing reserved, nothing pending
    source = tmp_path / "in.parquet"
    records.to_parquet(source)
    refused = runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(tmp_path / "r"),
                                  "--ledger", str(ledger)])
    assert refused.exit_code == 2 and "over their lifetime cap 3.0000" in refused.output
    assert not (tmp_path / "r").exists() and ledger.read_bytes() == before


@pytest.mark.parametrize("options, rule", [({"ledger": gedp.Ledger("x.json"), "not_for_publication": True, "seed": 1},
                                            "for publication only"),
                                           ({"ledger": gedp.Ledger("x.json", lifetime_cap=-1.0)},
                                            "must be a finite number")])
def test_the_api_refuses_ledger_options_before_reading_anything(small_state, tmp_path, monkeypatch, options, rule):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=rule):
        gedp.protect(small_state.head(50), "employment", **options)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("legacy, rule", [({"lifetime_cap": 2.0}, "go with --ledger"),
                                         ({"ledger": "x.json", "lifetime_cap": -1.0}, "must be a finite number"),
                                         ({"engine": "dask", "scheduler": "tcp://10.0.0.1:8786"}, "must be a tls://")])
def test_the_old_keywords_still_work_with_a_deprecation_warning(small_state, tmp_path, monkeypatch, legacy, rule):
    """gedp 0.x's keywords are gathered into Ledger / Engine / Input and checked the same way, warned."""
    monkeypatch.chdir(tmp_path)
    with pytest.warns(DeprecationWarning, match=", ".join(sorted(legacy))), pytest.raises(InputError, match=rule):
        gedp.protect(small_state.head(50), "employment", **legacy)
    assert not (tmp_path / "x.json").exists()


def test_the_old_keywords_give_the_release_the_new_values_give(small_state):
    """The same seeded release from gedp 0.x's keywords and from gedp.load / gedp.Engine / gedp.Input."""
    rows = small_state.head(300).rename(columns={"estab_id": "ruid"})
    with pytest.warns(DeprecationWarning, match="columns, integer, processes, workflow"):
        old = gedp.protect(rows, "employment", seed=2, not_for_publication=True, workflow="psi", integer=True,
                           processes=1, columns={"ruid": "estab_id"})
    new = gedp.protect(rows, gedp.load("employment", workflow="psi", integer=True), seed=2, not_for_publication=True,
                       engine=gedp.Engine(processes=1), input=gedp.Input(columns={"ruid": "estab_id"}))
    assert old.manifest == new.manifest and old.microdata.equals(new.microdata)
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="processes cannot be given beside engine"):
        gedp.protect(rows, "employment", engine=gedp.Engine(), processes=1)


def test_protect_takes_at_most_eight_parameters():
    """The signature a user reads (``help(gedp.protect)``) fits on two lines: the options are values."""
    import inspect

    assert len(inspect.signature(gedp.protect).parameters) <= 8


def test_dir_of_gedp_lists_the_public_api():
    names = dir(gedp)
    for name in ("protect", "load", "read_release", "Release", "interval", "synthesize", "__version__"):
        assert name in names
    assert all(callable(getattr(gedp, name)) for name in ("protect", "load", "read_release", "interval"))
    assert names == sorted(names)


def test_a_release_written_by_the_api_is_read_back_by_the_reader(small_state, tmp_path):
    out = gedp.protect(small_state.head(200), "employment", seed=3, not_for_publication=True).write(tmp_path / "r")
    assert (out / MANIFEST_FILE).is_file()
    assert read_manifest(out)["establishments"] == 200
