"""The lifetime budget ledger: accounts per establishment whatever the files, charges in the accounts'
terms of psi and gamma, caps, a tamper-evident chain, damaged ledgers, the publish order of
pending-then-committed releases, and two processes racing for the last budget."""

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

import gedp.accounting.ledger as ledger_module
import gedp.accounting.ledger_file as ledger_file
import gedp.running.engine
from gedp.cli import app

runner = CliRunner()
EMPLOYMENT_MU = math.sqrt(3 * 1.74)  # configs/employment.yaml
LIFETIME_KEYS = {"lifetime_cap", "spent_before", "spent_after", "mu", "mu_planned", "charges", "account", "release_id",
                 "quarters", "annual_cap", "annual_spent_after", "largest_charge"}


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
    """The releases that count (pending or committed)."""
    return ledger_file.live(ledger_file.read_ledger(ledger))


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


def test_the_establishments_are_the_account_whatever_their_files(source, records, tmp_path):
    """Renamed, symlinked, CSV with CRLF, reordered, converted and split copies draw on the same
    accounts: they compose with the first release and meet its cap."""
    aliases = copies(tmp_path, source, records)
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 4.0).exit_code == 0
    second = protect(aliases["crlf csv"], tmp_path / "r2", ledger)  # the cap is remembered
    assert second.exit_code == 0, second.output
    lifetime = json.loads((tmp_path / "r2" / "manifest.json").read_text())["lifetime"]
    assert lifetime["spent_after"] == pytest.approx(math.sqrt(2) * EMPLOYMENT_MU)
    assert protect(aliases["parts"], tmp_path / "r3", ledger).exit_code == 0  # sqrt(3) * 2.2847 = 3.957 < 4
    for name in ("renamed", "symlink", "reordered"):
        refused = one_error_line(protect(aliases[name], tmp_path / "r4", ledger))
        assert "over their lifetime cap 4.0000" in refused, name
    refused = one_error_line(protect(source, tmp_path / "r4", ledger, config="baseline"))  # wages too
    assert "over their lifetime cap 4.0000" in refused and not (tmp_path / "r4").exists()
    assert [r["status"] for r in releases(ledger)] == ["committed"] * 3


EDITS = {
    "year and qtr dropped": lambda f: f.drop(columns=["year", "qtr"]),
    "unmeasured wage dropped": lambda f: f.drop(columns=["wage"]),
    "$1 on an unmeasured wage": lambda f: f.assign(wage=f["wage"] + (f.index == 7)),
    "trailing space on ids": lambda f: f.assign(estab_id=f["estab_id"].astype(str) + " "),
    "leading zeros and lower case ids": lambda f: f.assign(estab_id="00" + f["estab_id"].astype(str).str.lower()),
    "one row removed": lambda f: f.drop(index=5),
    "a subset": lambda f: f.iloc[::3],
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_copy_draws_on_the_same_accounts(source, records, tmp_path, edit):
    """Cap 3.0 admits one employment release (mu 2.2847) of these establishments but not two (3.23),
    whatever else changed in the file."""
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 3.0).exit_code == 0
    copy = tmp_path / "edited.parquet"
    EDITS[edit](records).to_parquet(copy)
    refused = one_error_line(protect(copy, tmp_path / "r2", ledger))
    assert "over their lifetime cap 3.0000" in refused and not (tmp_path / "r2").exists()
    assert len(releases(ledger)) == 1


def test_a_superset_is_charged_where_it_overlaps_and_new_establishments_need_a_cap(source, records, tmp_path):
    ledger = tmp_path / "ledger.json"
    half = tmp_path / "half.parquet"
    records.iloc[:300].to_parquet(half)
    assert protect(half, tmp_path / "r1", ledger, "--lifetime-cap", 3.5).exit_code == 0
    other = tmp_path / "other.parquet"
    records.iloc[300:].to_parquet(other)
    line = one_error_line(protect(other, tmp_path / "r2", ledger))
    assert "new to the ledger: give the dataset's --lifetime-cap" in line
    assert "records lifetime cap 3.5 for establishments of this release, not 9.0" in one_error_line(
        protect(source, tmp_path / "r2", ledger, "--lifetime-cap", 9.0))
    assert protect(source, tmp_path / "r2", ledger, "--lifetime-cap", 3.5).exit_code == 0  # mu 3.23 where they overlap
    assert protect(other, tmp_path / "r3", ledger).exit_code == 0  # the other half: 3.23 as well
    assert "over their lifetime cap 3.5000" in one_error_line(protect(other, tmp_path / "r4", ledger))
    lifetime = json.loads((tmp_path / "r3" / "manifest.json").read_text())["lifetime"]
    assert lifetime["spent_before"] == pytest.approx(EMPLOYMENT_MU)


GAMMA_CONFIG = """workflow: {workflow}
psi: {{name: sqrt, a: 0}}
attributes:
  m1emp: {{gamma: {gamma}}}
queries:
  - by: identity
    mu: {{m1emp: 0.9}}
  - by: [state]
    mu: {{m1emp: 0.2}}
"""


def test_a_release_under_another_gamma_is_charged_in_the_accounts_terms(source, tmp_path):
    """baseline (gamma 0.5 for employment) under cap 2.5, then identity mu 0.9 under gamma 0.005: its
    noise sd on the psi scale, 0.005 / 0.9, is 0.5 / 90 in the account's terms, so it costs mu 90."""
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 2.5, config="baseline").exit_code == 0
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(GAMMA_CONFIG.format(workflow="psi", gamma=0.005))
    line = one_error_line(protect(source, tmp_path / "r2", ledger, config=narrow))
    expected = math.hypot(0.9 * 0.5 / 0.005, 0.2 * 0.5 / 0.005)
    assert f"charge {expected:.4f}" in line and "over their lifetime cap 2.5000" in line
    wide = tmp_path / "wide.yaml"  # a larger gamma costs its own mu: a 0.5-neighbour is a 5-neighbour
    wide.write_text(GAMMA_CONFIG.format(workflow="psi", gamma=5))
    result = protect(source, tmp_path / "r3", ledger, config=wide)
    assert result.exit_code == 0, result.output
    lifetime = json.loads((tmp_path / "r3" / "manifest.json").read_text())["lifetime"]
    assert lifetime["mu"] == pytest.approx(math.hypot(0.9, 0.2))
    assert lifetime["account"]["gammas"] == {"m1emp": 0.5}
    other_psi = tmp_path / "log.yaml"
    other_psi.write_text(GAMMA_CONFIG.format(workflow="psi", gamma=0.5).replace("sqrt, a: 0", "log, a: 1"))
    line = one_error_line(protect(source, tmp_path / "r4", ledger, config=other_psi))
    assert "'sqrt'" in line and "'log'" in line and "another psi" in line


def test_charges_follow_the_scale_argument_per_mechanism():
    """psi-mechanism queries: mu' gamma / gamma'; pnc queries: mu' ceil(gamma / gamma'); a larger
    gamma': mu'. Computed here from the plan by hand."""
    from gedp.measure.neighbors import make_psi
    from gedp.measure.workflows import MeasurementPlan, QueryPlan

    plan = MeasurementPlan(psi=make_psi("sqrt", a=0), gammas={"m1emp": 0.2, "wage": 80.0},
                           queries=(QueryPlan(("estab_id",), {"m1emp": 0.7, "wage": 0.1}),
                                    QueryPlan(("state",), {"m1emp": 0.3, "wage": 0.2})), workflow="pnc")
    charges = ledger_module.plan_charges(plan, {"m1emp": 0.5, "wage": 50.0})
    assert charges["m1emp"] == pytest.approx(math.sqrt((0.7 * 2.5) ** 2 + (0.3 * 3) ** 2))
    assert charges["wage"] == pytest.approx(math.sqrt(0.1**2 + 0.2**2))
    psi_plan = MeasurementPlan(psi=plan.psi, gammas=plan.gammas, queries=plan.queries, workflow="psi")
    assert ledger_module.plan_charges(psi_plan, {"m1emp": 0.5})["m1emp"] == pytest.approx(2.5 * math.hypot(0.7, 0.3))
    assert ledger_module.gamma_factor(0.5, 0.25, gaussian_on_psi=False) == 2.0  # an exact ratio is not rounded up


@pytest.mark.parametrize("cap", ["nan", "inf", "-inf", "1e999", "1e308", "100.5", "0", "-1"])
def test_a_lifetime_cap_must_be_finite_and_at_most_100(source, tmp_path, cap):
    ledger = tmp_path / "ledger.json"
    line = one_error_line(protect(source, tmp_path / "r", ledger, "--lifetime-cap", cap))
    assert "--lifetime-cap" in line and "must be a finite number > 0 and <= 100" in line
    assert os.listdir(tmp_path) == ["in.parquet"]


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
    "cap 1e308": _edit("lifetime_cap", 1e308),
    "boolean cap": _edit("lifetime_cap", True),
    "NaN mu": _edit("mu", float("nan")),
    "negative mu": _edit("mu", -2.0),
    "text mu": _edit("mu", "2.28"),
    "400-digit mu": _edit("mu", 10**400),
    "missing mu": _edit("mu", ...),
    "missing cap": _edit("lifetime_cap", ...),
    "events not a list": _edit("events", {"a": 1}),
    "unknown event": _edit("event", "maybe"),
    "commit removed": lambda text: json.dumps({**json.loads(text), "events": json.loads(text)["events"][:1]}).encode(),
    "old version": _edit("version", 2),
    "other key": _edit("key", "A" * 16),
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


def _without_first_release(book):
    """The ledger with its first committed release deleted by hand (whatever its format)."""
    if "datasets" in book:
        book["datasets"][0]["releases"].pop(0)
    else:
        book["events"] = book["events"][2:]  # its reserve and commit events
    return book


def test_a_ledger_with_a_committed_release_deleted_is_refused(source, tmp_path):
    ledger = tmp_path / "ledger.json"
    for i in range(2):
        assert protect(source, tmp_path / f"r{i}", ledger, "--lifetime-cap", 4.0).exit_code == 0
    ledger.write_text(json.dumps(_without_first_release(json.loads(ledger.read_text())), indent=2))
    line = one_error_line(protect(source, tmp_path / "r2", ledger))
    assert "damaged" in line and "events[0] does not follow the event before it" in line
    assert not (tmp_path / "r2").exists()


def test_the_last_release_deleted_with_the_head_mended_is_refused_by_its_key_file(source, tmp_path):
    ledger = tmp_path / "ledger.json"
    for i in range(2):
        assert protect(source, tmp_path / f"r{i}", ledger, "--lifetime-cap", 4.0).exit_code == 0
    book = json.loads(ledger.read_text())
    last = book["events"][-2]["release"]["id"]
    book["events"], book["head"] = book["events"][:2], book["events"][1]["hash"]
    ledger.write_text(json.dumps(book))
    line = one_error_line(protect(source, tmp_path / "r2", ledger))
    assert f"key file '{last}.u64' belongs to no release of the ledger" in line


@pytest.mark.parametrize("where", ["no-folder/ledger.json", "notes.txt", "folder.json", "damaged.json"])
def test_a_lock_file_is_created_only_beside_an_accepted_ledger(source, tmp_path, where):
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "damaged.json").write_text("{}")
    before = sorted(os.listdir(tmp_path))
    line = one_error_line(protect(source, tmp_path / "r", tmp_path / where, "--lifetime-cap", 4.0))
    assert "ledger" in line
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "folder.json") == []


def test_a_failed_commit_publishes_nothing_and_the_release_stays_pending(source, tmp_path, monkeypatch):
    """The ledger write that commits the release fails (disk full): no release is published, the
    error is one line, and the pending release keeps counting until an operator clears it."""
    ledger = tmp_path / "ledger.json"
    write = ledger_file._write
    calls = []

    def full_disk_on_commit(path, book):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, book)

    monkeypatch.setattr(ledger_file, "_write", full_disk_on_commit)
    line = one_error_line(protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 3.0))
    assert "cannot write ledger" in line and "No space left on device" in line and "stays pending" in line
    assert not (tmp_path / "r1").exists() and not list(tmp_path.glob(".r1*"))
    [pending] = releases(ledger)
    assert pending["status"] == "pending" and pending["id"] in line
    monkeypatch.setattr(ledger_file, "_write", write)

    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)])
    assert shown.exit_code == 0 and pending["id"] in shown.output and "pending" in shown.output
    assert "over their lifetime cap" in one_error_line(protect(source, tmp_path / "r2", ledger))  # pending counts
    cleared = runner.invoke(app, ["ledger", "clear", "--ledger", str(ledger), "--release", pending["id"]])
    assert cleared.exit_code == 0 and f"Cleared pending release {pending['id']}" in cleared.output
    assert not (tmp_path / "ledger.json.keys" / f"{pending['id']}.u64").exists()
    assert releases(ledger) == []
    assert protect(source, tmp_path / "r2", ledger, "--lifetime-cap", 3.0).exit_code == 0  # no release counts
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

    monkeypatch.setattr(gedp.running.engine, "protect", fail)  # in this process: the states one after the other
    line = one_error_line(protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 3.0, "--processes", 1), code=1)
    [pending] = releases(ledger)
    assert seen == [["pending"]]
    assert "did not converge" in line and f"release {pending['id']} stays pending" in line
    assert pending["status"] == "pending" and not (tmp_path / "r1").exists()


def test_an_input_with_several_problems_after_the_reservation_says_it_stays_pending(source, tmp_path, monkeypatch):
    """An InputProblems (one line per problem) raised after the reservation keeps its problems and adds
    the pending note as one more line (it was rebuilt from its message alone: a TypeError traceback)."""
    from gedp.errors import InputProblems

    ledger = tmp_path / "ledger.json"

    def fail(*args, **kwargs):
        raise InputProblems("input 'x.csv'", ["column 'm1emp': not numbers", "column 'wage': negative"])

    monkeypatch.setattr(gedp.running.engine, "protect", fail)
    result = protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 3.0, "--processes", 1)
    [pending] = releases(ledger)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert "not numbers" in lines[-3] and "negative" in lines[-2], lines
    assert f"release {pending['id']} stays pending" in lines[-1], lines


@pytest.mark.parametrize("test_release", [["--seed", "1"], ["--rng", "pcg64"]])
def test_a_release_not_for_publication_never_touches_the_ledger(source, tmp_path, test_release):
    ledger = tmp_path / "ledger.json"
    line = one_error_line(protect(source, tmp_path / "r", ledger, "--lifetime-cap", 4.0, *test_release,
                                  "--not-for-publication"))
    assert "--not-for-publication release spends no lifetime budget" in line
    assert not ledger.exists() and not (tmp_path / "r").exists()


def test_the_manifest_shows_the_lifetime_figures_and_no_path_or_key(source, tmp_path):
    ledger = tmp_path / "books" / "ledger.json"
    ledger.parent.mkdir()
    assert protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 4.0).exit_code == 0
    result = protect(source, tmp_path / "r2", ledger)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r2" / "manifest.json").read_text()
    lifetime = json.loads(text)["lifetime"]
    assert set(lifetime) == LIFETIME_KEYS
    assert lifetime["mu"] == pytest.approx(EMPLOYMENT_MU) and lifetime["spent_before"] == pytest.approx(EMPLOYMENT_MU)
    assert lifetime["release_id"] == releases(ledger)[1]["id"]
    book = json.loads(ledger.read_text())
    assert lifetime["charges"] == {a: pytest.approx(EMPLOYMENT_MU / math.sqrt(3)) for a in ("m1emp", "m2emp", "m3emp")}
    assert lifetime["account"] == {"psi": {"name": "sqrt", "a": 0.0}, "gammas": {"m1emp": 0.5, "m2emp": 0.5,
                                                                                "m3emp": 0.5}}
    assert "books" not in text and "ledger.json" not in text and book["key"] not in text and book["head"] not in text


def test_a_dataset_id_recalls_its_cap_and_cannot_give_establishments_a_fresh_budget(source, records, tmp_path):
    """The next quarter of the same establishments under the same --dataset-id needs no cap and
    composes with the first; another id cannot raise their cap or restart their accounts; messages
    never show a key, a hash or a count of the records."""
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "r1", ledger, "--dataset-id", "qcew-2016q1", "--lifetime-cap", 4.0).exit_code == 0
    revised = tmp_path / "revised.parquet"
    records.assign(m3emp=records["m3emp"] + 1, qtr=2).to_parquet(revised)
    second = protect(revised, tmp_path / "r2", ledger, "--dataset-id", "qcew-2016q1")
    assert second.exit_code == 0, second.output
    outputs = [one_error_line(protect(source, tmp_path / "r3", ledger, "--dataset-id", "other", "--lifetime-cap", 9.0))]
    assert "records lifetime cap 4.0 for establishments of this release, not 9.0" in outputs[0]
    outputs.append(one_error_line(protect(revised, tmp_path / "r3", ledger, "--dataset-id", "qcew-2016q1",
                                          "--lifetime-cap", 9.0)))
    assert "records lifetime cap 4.0 for dataset 'qcew-2016q1', not 9.0" in outputs[1]
    assert protect(source, tmp_path / "r3", ledger, "--dataset-id", "other", "--lifetime-cap", 4.0).exit_code == 0
    outputs.append(one_error_line(protect(revised, tmp_path / "r4", ledger, "--dataset-id", "qcew-2016q1")))
    assert "over their lifetime cap 4.0000" in outputs[2]
    outputs.append(one_error_line(protect(source, tmp_path / "r4", ledger, "--dataset-id", "bad id!")))
    assert "--dataset-id ('bad id!') must be" in outputs[3]
    assert [r["dataset_id"] for r in releases(ledger)] == ["qcew-2016q1", "qcew-2016q1", "other"]
    book = json.loads(ledger.read_text())
    for output in outputs:
        assert book["key"] not in output and book["head"][:12] not in output and str(len(records)) not in output


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


KILLED_AT_COMMIT = """
import os, signal, sys
import gedp.accounting.ledger_file as ledger_file
from gedp.cli import app

write = ledger_file._write
calls = []


def killed_at_the_second_write(path, book):  # the first write reserves, the second commits
    calls.append(path)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    write(path, book)


ledger_file._write = killed_at_the_second_write
app(sys.argv[1:])
"""


def test_a_run_killed_during_its_commit_leaves_nothing_a_reader_takes_for_a_release(source, tmp_path):
    """The process dies while the ledger commits the release: its staging folder has no manifest, so
    neither `gedp tabulate` nor gedp.read_release reads it, and clearing the pending release does not
    refund a readable release."""
    import gedp

    ledger = tmp_path / "ledger.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", KILLED_AT_COMMIT, "protect", str(source), "--config", "employment",
                          "--out", str(tmp_path / "r1"), "--ledger", str(ledger), "--lifetime-cap", "4"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == -9, run.stderr
    [staging] = tmp_path.glob(".r1.partial-*")
    assert (staging / "measurements.parquet").is_dir() and not (staging / "manifest.json").exists()
    assert not (tmp_path / "r1").exists()
    [pending] = releases(ledger)
    assert pending["status"] == "pending"
    refused = runner.invoke(app, ["tabulate", str(staging), "--by", "county"])
    one_error_line(refused)  # not a release, and not microdata either
    with pytest.raises(gedp.errors.InputError, match="not a gedp release"):
        gedp.read_release(staging)
    cleared = runner.invoke(app, ["ledger", "clear", "--ledger", str(ledger), "--release", pending["id"]])
    assert cleared.exit_code == 0 and releases(ledger) == []
