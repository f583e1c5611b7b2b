"""The lifetime budget ledger: datasets known by their records, composition across releases, caps,
damaged ledgers, pending-then-committed releases, and two processes racing for the last budget."""

import errno
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import gedp.engine
import gedp.ledger
from gedp.cli import app

runner = CliRunner()
EMPLOYMENT_MU = math.sqrt(3 * 1.74)  # configs/employment.yaml
LIFETIME_KEYS = {"lifetime_cap", "spent_before", "spent_after", "mu", "release_id"}


@pytest.fixture
def records(small_state):
    """600 establishments in two states (44 and 34)."""
    frame = small_state.head(600).copy()
    frame.loc[300:, "state"] = "34"
    return frame


@pytest.fixture
def source(tmp_path, records):
    path = tmp_path / "in.parquet"
    records.to_parquet(path)
    return path


def protect(source, out, ledger, *extra, config="employment"):
    return runner.invoke(app, ["protect", str(source), "--config", config, "--out", str(out),
                               "--ledger", str(ledger), *map(str, extra)])


def one_error_line(result, code=2):
    """The command failed with ``code`` and said why on one line, without a traceback."""
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("error:", "solver error:")), result.output
    return lines[0]


def releases(ledger):
    return [r for dataset in json.loads(ledger.read_text())["datasets"] for r in dataset["releases"]]


def copies(tmp_path, source, records):
    """The same records as other files: renamed copy, symlink, CRLF CSV with rows and columns
    reordered, a Parquet of reordered rows, and a folder of Parquet parts mixing the states."""
    folder = tmp_path / "copies"
    folder.mkdir()
    renamed = folder / "quarter-final.parquet"
    shutil.copy(source, renamed)
    link = folder / "link.parquet"
    link.symlink_to(source)
    shuffled = records.sample(frac=1.0, random_state=3)
    crlf = folder / "records.csv"
    shuffled[shuffled.columns[::-1]].to_csv(crlf, index=False, lineterminator="\r\n")
    reordered = folder / "reordered.parquet"
    shuffled.assign(note="not a gedp column").to_parquet(reordered)
    parts = folder / "parts.parquet"  # a folder of parts is named *.parquet
    parts.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(shuffled)), 3)):
        shuffled.iloc[part].to_parquet(parts / f"part-{i}.parquet")
    return {"renamed": renamed, "symlink": link, "crlf csv": crlf, "reordered": reordered, "parts": parts}


def digest(path, attributes=("m1emp",)):
    return gedp.engine.input_digest(path, gedp.engine.input_states(path), list(attributes))


def test_the_records_are_the_dataset_whatever_their_files(source, records, tmp_path):
    """Renamed, symlinked, CSV with CRLF, reordered, converted and split copies are one dataset: they
    compose with the first release and meet its cap; other records are another dataset."""
    aliases = copies(tmp_path, source, records)
    assert {name: digest(path) for name, path in aliases.items()} == {name: digest(source) for name in aliases}
    assert digest(source, ("m1emp",)) == digest(source, ("wage", "m2emp"))  # every attribute present, any config
    changed = records.copy()
    changed.loc[17, "m2emp"] += 1
    changed.to_parquet(tmp_path / "changed.parquet")
    records.drop(index=5).to_parquet(tmp_path / "fewer.parquet")
    assert len({digest(source), digest(tmp_path / "changed.parquet"), digest(tmp_path / "fewer.parquet")}) == 3

    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 4.0).exit_code == 0
    second = protect(aliases["crlf csv"], tmp_path / "r2", ledger)  # the cap is remembered
    assert second.exit_code == 0, second.output
    lifetime = json.loads((tmp_path / "r2" / "manifest.json").read_text())["lifetime"]
    assert lifetime["spent_after"] == pytest.approx(math.sqrt(2) * EMPLOYMENT_MU)
    assert protect(aliases["parts"], tmp_path / "r3", ledger).exit_code == 0  # sqrt(3) * 2.2847 = 3.957 < 4
    for name in ("renamed", "symlink", "reordered"):
        refused = one_error_line(protect(aliases[name], tmp_path / "r4", ledger))
        assert "over its lifetime cap 4.0000" in refused, name
    refused = one_error_line(protect(source, tmp_path / "r4", ledger, config="baseline"))  # wages too
    assert "over its lifetime cap 4.0000" in refused and not (tmp_path / "r4").exists()
    assert [r["status"] for r in releases(ledger)] == ["committed"] * 3
    assert len(json.loads(ledger.read_text())["datasets"]) == 1


def test_other_records_have_their_own_budget_and_a_cap_is_kept(source, records, tmp_path):
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "a", ledger, "--lifetime-cap", 2.5).exit_code == 0
    other = tmp_path / "other.parquet"
    records.assign(m1emp=records["m1emp"] + 1).to_parquet(other)
    assert "new to the ledger: give the dataset's --lifetime-cap" in one_error_line(
        protect(other, tmp_path / "b", ledger)
    )
    assert protect(other, tmp_path / "b", ledger, "--lifetime-cap", 2.5).exit_code == 0
    changed = one_error_line(protect(source, tmp_path / "c", ledger, "--lifetime-cap", 9.0))
    assert "records lifetime cap 2.5 for this dataset, not 9.0" in changed


@pytest.mark.parametrize("cap", ["nan", "inf", "-inf", "1e999", "0", "-1"])
def test_a_lifetime_cap_must_be_finite_and_positive(source, tmp_path, cap):
    ledger = tmp_path / "ledger.json"
    line = one_error_line(protect(source, tmp_path / "r", ledger, "--lifetime-cap", cap))
    assert "--lifetime-cap" in line and "must be a finite number > 0" in line
    assert not ledger.exists() and not (tmp_path / "r").exists()


def _set(node, key, value):
    """Set ``key`` to ``value`` (or delete it when value is ...) in every object of a JSON tree."""
    if isinstance(node, dict):
        if key in node:
            if value is ...:
                del node[key]
            else:
                node[key] = value
        for child in node.values():
            _set(child, key, value)
    elif isinstance(node, list):
        for child in node:
            _set(child, key, value)
    return node


def _edit(key, value):
    return lambda text: json.dumps(_set(json.loads(text), key, value)).encode()


DAMAGE = {
    "NaN cap": _edit("lifetime_cap", float("nan")),
    "infinite cap": _edit("lifetime_cap", float("inf")),
    "cap 1e999": lambda text: text.replace('"lifetime_cap": 4.0', '"lifetime_cap": 1e999').encode(),
    "boolean cap": _edit("lifetime_cap", True),
    "NaN mu": _edit("mu", float("nan")),
    "negative mu": _edit("mu", -2.0),
    "text mu": _edit("mu", "2.28"),
    "400-digit mu": _edit("mu", 10**400),
    "missing mu": _edit("mu", ...),
    "missing cap": _edit("lifetime_cap", ...),
    "releases not a list": _edit("releases", {"a": 1}),
    "unknown status": _edit("status", "maybe"),
    "UTF-16": lambda text: text.encode("utf-16"),
    "truncated": lambda text: text[: len(text) // 2].encode(),
    "empty": lambda text: b"",
    "repeated key": lambda text: text.replace('"lifetime_cap": '
                                              '4.0', '"lifetime_cap": 4.0, "lifetime_cap": 40.0').encode(),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_ledger_is_refused_and_never_rewritten(source, tmp_path, damage):
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 4.0).exit_code == 0
    ledger.write_bytes(DAMAGE[damage](ledger.read_text()))
    before = ledger.read_bytes()
    line = one_error_line(protect(source, tmp_path / "r2", ledger))
    assert "ledger" in line and "was not changed" in line
    assert ledger.read_bytes() == before and not (tmp_path / "r2").exists()
    one_error_line(runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)]))
    assert ledger.read_bytes() == before


def test_a_failed_commit_publishes_nothing_and_the_release_stays_pending(source, tmp_path, monkeypatch):
    """The ledger write that commits the release fails (disk full): no release is published, the
    error is one line, and the pending release keeps counting until an operator clears it."""
    ledger = tmp_path / "ledger.json"
    write = gedp.ledger._write
    calls = []

    def full_disk_on_commit(path, book):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, book)

    monkeypatch.setattr(gedp.ledger, "_write", full_disk_on_commit)
    line = one_error_line(protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 3.0))
    assert "cannot write ledger" in line and "No space left on device" in line and "stays pending" in line
    assert not (tmp_path / "r1").exists() and not list(tmp_path.glob(".r1*"))
    [pending] = releases(ledger)
    assert pending["status"] == "pending" and pending["id"] in line
    monkeypatch.setattr(gedp.ledger, "_write", write)

    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)])
    assert shown.exit_code == 0 and pending["id"] in shown.output and "pending" in shown.output
    assert "over its lifetime cap" in one_error_line(protect(source, tmp_path / "r2", ledger))  # pending counts
    cleared = runner.invoke(app, ["ledger", "clear", "--ledger", str(ledger), "--release", pending["id"]])
    assert cleared.exit_code == 0 and f"Cleared pending release {pending['id']}" in cleared.output
    assert releases(ledger) == []
    assert protect(source, tmp_path / "r2", ledger).exit_code == 0
    [committed] = releases(ledger)
    line = one_error_line(
        runner.invoke(app, ["ledger", "clear", "--ledger", str(ledger), "--release", committed["id"]])
    )
    assert "only a pending release can be cleared" in line and releases(ledger) == [committed]


def test_a_run_that_fails_after_its_reservation_leaves_it_pending(source, tmp_path, monkeypatch):
    """The release is pending in the ledger before any noise is drawn; a failure leaves it pending."""
    from gedp.postprocess.wls import SolverError

    ledger = tmp_path / "ledger.json"
    seen = []

    def fail(*args, **kwargs):  # stands in for measuring a state: noise would be drawn here
        seen.append([r["status"] for r in releases(ledger)])
        raise SolverError("the solver did not converge")

    monkeypatch.setattr(gedp.engine, "protect", fail)
    line = one_error_line(protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 3.0), code=1)
    [pending] = releases(ledger)
    assert seen == [["pending"]]
    assert "did not converge" in line and f"release {pending['id']} stays pending" in line
    assert pending["status"] == "pending" and not (tmp_path / "r1").exists()


@pytest.mark.parametrize("test_release", [["--seed", "1"], ["--rng", "pcg64"]])
def test_a_release_not_for_publication_never_touches_the_ledger(source, tmp_path, test_release):
    ledger = tmp_path / "ledger.json"
    line = one_error_line(protect(source, tmp_path / "r", ledger, "--lifetime-cap", 4.0, *test_release,
                                  "--not-for-publication"))
    assert "--not-for-publication release spends no lifetime budget" in line
    assert not ledger.exists() and not (tmp_path / "r").exists()


def test_the_manifest_shows_the_lifetime_figures_and_no_path_or_digest(source, tmp_path):
    ledger = tmp_path / "books" / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 4.0).exit_code == 0
    result = protect(source, tmp_path / "r2", ledger)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r2" / "manifest.json").read_text()
    lifetime = json.loads(text)["lifetime"]
    assert set(lifetime) == LIFETIME_KEYS
    assert lifetime["mu"] == pytest.approx(EMPLOYMENT_MU) and lifetime["spent_before"] == pytest.approx(EMPLOYMENT_MU)
    assert lifetime["release_id"] == releases(ledger)[1]["id"]
    [dataset] = json.loads(ledger.read_text())["datasets"]
    assert "books" not in text and "ledger.json" not in text and dataset["digests"][0] not in text


def test_a_dataset_id_shares_its_budget_and_cannot_give_records_a_fresh_one(source, records, tmp_path):
    """Revised records under the same --dataset-id compose with it; the same records under a new id
    are refused; messages never show a digest or a count of the records."""
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--dataset-id", "qcew-2016q1", "--lifetime-cap", 4.0).exit_code == 0
    revised = tmp_path / "revised.parquet"
    records.assign(m3emp=records["m3emp"] + 1).to_parquet(revised)
    second = protect(revised, tmp_path / "r2", ledger, "--dataset-id", "qcew-2016q1")
    assert second.exit_code == 0, second.output
    outputs = [one_error_line(protect(source, tmp_path / "r3", ledger, "--dataset-id", "other", "--lifetime-cap", 9.0))]
    assert "already in the ledger as dataset 'qcew-2016q1'" in outputs[0]
    outputs.append(one_error_line(protect(revised, tmp_path / "r3", ledger, "--lifetime-cap", 9.0)))
    assert "records lifetime cap 4.0" in outputs[1]
    csv = tmp_path / "in.csv"
    records.to_csv(csv, index=False)
    assert protect(csv, tmp_path / "r3", ledger).exit_code == 0  # no id given: the records' dataset
    outputs.append(one_error_line(protect(revised, tmp_path / "r4", ledger, "--dataset-id", "qcew-2016q1")))
    assert "over its lifetime cap 4.0000" in outputs[2]
    outputs.append(one_error_line(protect(source, tmp_path / "r4", ledger, "--dataset-id", "bad id!")))
    assert "--dataset-id ('bad id!') must be" in outputs[3]
    [dataset] = json.loads(ledger.read_text())["datasets"]
    assert dataset["dataset_id"] == "qcew-2016q1" and len(dataset["digests"]) == 2 and len(dataset["releases"]) == 3
    for output in outputs:
        assert not any(d[:12] in output for d in dataset["digests"]) and str(len(records)) not in output


def test_two_processes_cannot_both_spend_the_last_of_the_budget(source, tmp_path):
    """Cap 3.0 admits one release of mu 2.28 but not two (3.23): exactly one of two concurrent runs
    succeeds, whichever reserves first."""
    ledger = tmp_path / "ledger.json"
    command = [sys.executable, "-m", "gedp"]  # this interpreter's gedp, not another install on PATH
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [
        subprocess.Popen(
            [
                *command,
                "protect",
                str(source),
                "--config",
                "employment",
                "--out",
                str(tmp_path / f"r{i}"),
                "--ledger",
                str(ledger),
                "--lifetime-cap",
                "3.0",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    codes = sorted(run.wait(timeout=300) for run in runs)
    assert codes == [0, 2], [run.stderr.read() for run in runs]
    assert [r["status"] for r in releases(ledger)] == ["committed"]
    assert sum((tmp_path / f"r{i}").exists() for i in range(2)) == 1
