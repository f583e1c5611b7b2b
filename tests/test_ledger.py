"""The lifetime budget ledger: composition across releases, refusal over the cap, two processes."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.ledger import fingerprint

runner = CliRunner()
EMPLOYMENT_MU = math.sqrt(3 * 1.74)  # configs/employment.yaml


@pytest.fixture
def source(tmp_path, small_state):
    path = tmp_path / "in.parquet"
    small_state.head(600).to_parquet(path)
    return path


def protect(source, out, ledger, *extra):
    return runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out),
                               "--ledger", str(ledger), *map(str, extra)])


def test_releases_compose_and_the_cap_is_enforced_before_any_noise(source, tmp_path):
    ledger = tmp_path / "ledger.json"
    first = protect(source, tmp_path / "r1", ledger, "--lifetime-cap", 4.0)
    assert first.exit_code == 0, first.output
    second = protect(source, tmp_path / "r2", ledger)  # the cap is remembered
    assert second.exit_code == 0, second.output
    manifest = json.loads((tmp_path / "r2" / "manifest.json").read_text())
    assert manifest["lifetime"]["spent_after"] == pytest.approx(math.sqrt(2) * EMPLOYMENT_MU)
    assert "fingerprint" not in json.dumps(manifest) and fingerprint(source) not in json.dumps(manifest)
    third = protect(source, tmp_path / "r3", ledger)  # sqrt(3) * 2.2847 = 3.957 fits under 4
    assert third.exit_code == 0
    fourth = protect(source, tmp_path / "r4", ledger)
    assert fourth.exit_code == 2 and "over its lifetime cap 4.0000" in fourth.output
    assert not (tmp_path / "r4").exists()
    recorded = json.loads(ledger.read_text())["datasets"][fingerprint(source)]
    assert len(recorded["releases"]) == 3 and recorded["lifetime_cap"] == 4.0


def test_other_data_has_its_own_budget_and_bad_requests_are_refused(source, tmp_path, small_state):
    ledger = tmp_path / "ledger.json"
    assert protect(source, tmp_path / "a", ledger, "--lifetime-cap", 2.5).exit_code == 0
    other = tmp_path / "other.parquet"
    small_state.tail(600).to_parquet(other)
    new = protect(other, tmp_path / "b", ledger)
    assert new.exit_code == 2 and "is new to ledger" in new.output
    assert protect(other, tmp_path / "b", ledger, "--lifetime-cap", 2.5).exit_code == 0
    changed = protect(source, tmp_path / "c", ledger, "--lifetime-cap", 9.0)
    assert changed.exit_code == 2 and "records lifetime cap 2.5" in changed.output
    ledger.write_text("{not json")
    broken = protect(source, tmp_path / "d", ledger)
    assert broken.exit_code == 2 and "is not valid JSON" in broken.output and ledger.read_text() == "{not json"


def test_two_processes_cannot_both_spend_the_last_of_the_budget(source, tmp_path):
    """Cap 3.0 admits one release of mu 2.28 but not two (3.23): exactly one of two concurrent runs
    succeeds, whichever takes the lock first."""
    ledger = tmp_path / "ledger.json"
    command = [shutil.which("gedp")] if shutil.which("gedp") else [sys.executable, "-m", "gedp"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [subprocess.Popen([*command, "protect", str(source), "--config", "employment", "--out", str(tmp_path / f"r{i}"),
                              "--ledger", str(ledger), "--lifetime-cap", "3.0"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    codes = sorted(run.wait(timeout=300) for run in runs)
    assert codes == [0, 2], [run.stderr.read() for run in runs]
    assert len(json.loads(ledger.read_text())["datasets"][fingerprint(source)]["releases"]) == 1
    assert sum((tmp_path / f"r{i}").exists() for i in range(2)) == 1
