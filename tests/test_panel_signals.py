"""A panel run stopped part way (SIGTERM, as `timeout`, Slurm and systemd send; SIGKILL) leaves no
release anyone could publish: SIGTERM ends it as Ctrl-C does (exit 143, nothing beside the output
but the ledger, the old release intact); after SIGKILL its staging folders hold no ``manifest.json``
(no reader takes them for a release) and the next run writing the same output removes them. The
ledger page's promise holds for panels: what is not committed is not readable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gedp
from gedp.accounting.ledger_file import live, read_ledger
from gedp.errors import InputError
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

#: Where in a run the signal is sent: the glob (beside the output ``rel``) whose appearance marks it.
POINTS = {
    "inside a quarter": ".rel.quarters-*/.2016Q2.partial-*",
    "between quarters": ".rel.quarters-*/2016Q2/quarter-manifest.json",
    "joining the panel": ".rel.partial-*",
}
#: Longest wait for a point, and for a stopped run to end (seconds).
WAIT = 120


@pytest.fixture(scope="module")
def panel_file(tmp_path_factory) -> Path:
    """Three quarters of 12,000 establishments: long enough a run to be stopped at each point."""
    first = generate_profile(load_profile("small"), n_establishments=12_000, rng=np.random.default_rng(5))
    path = tmp_path_factory.mktemp("input") / "panel.parquet"
    synthesize_panel(first, quarter_range("2016Q1:2016Q3"), rng=np.random.default_rng(5)).to_parquet(path)
    return path


def start(panel: Path, folder: Path) -> subprocess.Popen:
    """`gedp protect` of the panel into ``folder / "rel"``, recorded in ``folder / "books.json"``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.Popen([sys.executable, "-m", "gedp", "protect", str(panel), "--out", str(folder / "rel"),
                             "--ledger", str(folder / "books.json"), "--lifetime-cap", "20", "--allow-over-cap"],
                            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_at(run: subprocess.Popen, folder: Path, point: str, sig: int) -> str:
    """Send ``sig`` once ``point`` exists; returns what the run printed."""
    deadline = time.monotonic() + WAIT
    while not list(folder.glob(POINTS[point])):
        assert run.poll() is None, f"the run ended before {point}: {run.communicate(timeout=WAIT)[0]}"
        assert time.monotonic() < deadline, f"{point} not reached in {WAIT} s"
        time.sleep(0.01)
    run.send_signal(sig)
    return run.communicate(timeout=WAIT)[0]


def manifests(folder: Path) -> list[Path]:
    """Every file named manifest.json under ``folder``, hidden folders included."""
    return sorted(folder.rglob("manifest.json"))


def release_bytes(release: Path) -> dict[str, bytes]:
    return {str(p.relative_to(release)): p.read_bytes() for p in sorted(release.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def first_release(panel_file, tmp_path_factory) -> Path:
    """A folder holding a committed panel release ``rel`` and its ledger, to be copied by each test."""
    folder = tmp_path_factory.mktemp("first")
    run = start(panel_file, folder)
    assert run.wait(timeout=600) == 0, run.communicate()[0]
    return folder


def copy_of(first: Path, folder: Path) -> dict[str, bytes]:
    import shutil

    for name in ("rel", "books.json", "books.json.keys"):
        source = first / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, folder / name)
    return release_bytes(folder / "rel")


def finished_first(run: subprocess.Popen, folder: Path) -> bool:
    """Whether the run had published its release before the signal came (possible when joining, its
    last step, or under load, when the run is past the point by the time the signal arrives; exit 0,
    or the signal's status when it came after the release was moved into place): then the new
    release is the one published, complete and committed, and nothing else is left."""
    releases = live(read_ledger(folder / "books.json"))
    published = json.loads((folder / "rel" / "manifest.json").read_text())["lifetime"]["release_id"]
    if published != releases[-1]["id"]:
        return False
    assert run.returncode in (0, 128 + signal.SIGTERM, -signal.SIGKILL)
    assert [r["status"] for r in releases] == ["committed", "committed"]
    assert manifests(folder) == [folder / "rel" / "manifest.json"]  # no staging folder is a release
    if run.returncode != -signal.SIGKILL:  # a run that ends by itself removes its staging folders
        assert sorted(p.name for p in folder.iterdir()) == ["books.json", "books.json.keys", "rel"]
    return True


@pytest.mark.parametrize("point", list(POINTS))
def test_sigterm_stops_a_panel_as_ctrl_c_does(panel_file, first_release, tmp_path, point):
    before = copy_of(first_release, tmp_path)
    run = start(panel_file, tmp_path)
    output = stop_at(run, tmp_path, point, signal.SIGTERM)
    if finished_first(run, tmp_path):
        return
    assert run.returncode == 128 + signal.SIGTERM and "Traceback" not in output, output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["books.json", "books.json.keys", "rel"], output
    assert release_bytes(tmp_path / "rel") == before  # the old release intact
    assert manifests(tmp_path) == [tmp_path / "rel" / "manifest.json"]
    releases = live(read_ledger(tmp_path / "books.json"))
    if point == "joining the panel" and releases[1]["status"] == "committed":
        return  # stopped between its commit and its rename: charged, never published (the safe side)
    assert [r["status"] for r in releases] == ["committed", "pending"]  # the stopped run counts until cleared
    assert f"stopped: nothing was published; release {releases[1]['id']} stays pending" in " ".join(output.split())


def test_sigterm_before_any_release_leaves_only_the_ledger(panel_file, tmp_path):
    run = start(panel_file, tmp_path)
    stop_at(run, tmp_path, "between quarters", signal.SIGTERM)
    assert run.returncode == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["books.json", "books.json.keys"]


@pytest.mark.parametrize("point", [pytest.param(point, marks=[] if point == "between quarters" else pytest.mark.slow)
                                   for point in POINTS])
def test_a_killed_panel_leaves_nothing_readable_and_the_next_run_removes_it(panel_file, first_release, tmp_path,
                                                                            point):
    before = copy_of(first_release, tmp_path)
    run = start(panel_file, tmp_path)
    stop_at(run, tmp_path, point, signal.SIGKILL)
    if finished_first(run, tmp_path):
        return
    assert run.returncode == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".rel.")]
    assert left, "a killed run leaves its staging folders (nothing can remove them)"
    assert manifests(tmp_path) == [tmp_path / "rel" / "manifest.json"]  # no quarter is a release
    for folder in [*left, *(sub for p in left for sub in p.iterdir() if sub.is_dir())]:
        with pytest.raises(InputError, match="not a gedp release"):
            gedp.read_release(folder)
    assert release_bytes(tmp_path / "rel") == before
    # the documented recovery: clear the pending release, run again
    [pending] = [r for r in live(read_ledger(tmp_path / "books.json")) if r["status"] == "pending"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cleared = subprocess.run([sys.executable, "-m", "gedp", "ledger", "clear", "--ledger",
                              str(tmp_path / "books.json"), "--release", pending["id"]], env=env, timeout=WAIT)
    assert cleared.returncode == 0
    again = start(panel_file, tmp_path)
    assert again.wait(timeout=600) == 0, again.communicate()[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["books.json", "books.json.keys", "rel"]
    [manifest] = manifests(tmp_path)
    charged = {r["id"] for r in live(read_ledger(tmp_path / "books.json")) if r["status"] == "committed"}
    assert json.loads(manifest.read_text())["lifetime"]["release_id"] in charged


def test_a_staging_folder_held_by_a_running_process_is_left_alone(tmp_path):
    """Only folders no process holds are stale: one held (as a run in progress holds its own) stays."""
    from gedp.release.writer import held_folder, remove_stale_staging

    out = tmp_path / "rel"
    held, hold = held_folder(out, "quarters")
    try:
        stale = tmp_path / ".rel.partial-0badc0de"
        stale.mkdir()
        (stale / "manifest.json").write_text("{}")
        other = tmp_path / ".other.partial-0badc0de"  # another output's
        other.mkdir()
        assert remove_stale_staging(out) == [stale.name]
        assert held.is_dir() and other.is_dir() and not stale.exists()
    finally:
        os.close(hold)
    assert remove_stale_staging(out) == [held.name]


def test_a_release_folder_keeps_the_mode_of_any_folder_and_unnamed_leftovers_go(recommended_release, tmp_path):
    """The staging folder is made as any folder is (the umask's mode, which the published output
    keeps, not a private temporary folder's 0700); an empty ``.OUT.new-*`` folder a run killed while
    naming its staging folder left is removed once a minute old, a fresh one is left to its run."""
    from gedp.release.writer import remove_stale_staging

    plain = tmp_path / "plain"
    plain.mkdir()
    stale, fresh = tmp_path / ".rel.new-0badc0de", tmp_path / ".rel.new-5eed5eed"
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (time.time() - 120, time.time() - 120))
    assert remove_stale_staging(tmp_path / "rel") == [] and not stale.exists() and fresh.exists()
    recommended_release.write(tmp_path / "rel")
    assert (tmp_path / "rel").stat().st_mode & 0o7777 == plain.stat().st_mode & 0o7777


@pytest.fixture
def state_file(small_state, tmp_path) -> Path:
    """The small state as the Parquet input of a command, beside the outputs of the test."""
    source = tmp_path / "input" / "state.parquet"
    source.parent.mkdir()
    small_state.to_parquet(source)
    return source


def protect_command(source: Path, folder: Path, recorded: bool) -> list[str]:
    """`gedp protect` of ``source`` into ``folder / "rel"``: recorded in ``folder / "books.json"``, or a
    seeded release not for publication."""
    ledger = ["--ledger", str(folder / "books.json"), "--lifetime-cap", "20"] if recorded else \
        ["--seed", "1", "--not-for-publication"]
    return ["protect", str(source), "--out", str(folder / "rel"), *ledger]


def stop_before_the_new_release_is_renamed(monkeypatch) -> None:
    """Ctrl-C (as SIGTERM's ``Terminated``) raised between publishing's two renames: after the earlier
    release is moved away, before the new one is moved into place."""
    from gedp.release import writer

    rename = os.replace

    def stopped_at_the_second(source, target):
        if Path(source).name.startswith(".rel.partial-"):
            raise KeyboardInterrupt
        rename(source, target)

    monkeypatch.setattr(writer.os, "replace", stopped_at_the_second)


def lose_a_sigterm_during_the_run(monkeypatch, receive) -> None:
    """``receive`` (a SIGTERM received, its exception lost) called once the run has begun, as it
    starts protecting the input."""
    from gedp.running import recorded_release

    protect_input = recorded_release.protect_input

    def received_and_lost(*args, **kwargs):
        receive()
        return protect_input(*args, **kwargs)

    monkeypatch.setattr(recorded_release, "protect_input", received_and_lost)


@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "in a ledger"])
def test_a_sigterm_whose_exception_was_lost_still_commits_and_publishes_nothing(state_file, tmp_path, monkeypatch,
                                                                                recorded):
    """SIGTERM raises ``Terminated`` wherever the main thread is; raised inside a finalizer or a library
    that swallows it, the exception is lost and the run goes on. It still publishes nothing and
    commits no charge: before either, the run checks whether SIGTERM was received."""
    from typer.testing import CliRunner

    from gedp import errors
    from gedp.cli import app

    command = protect_command(state_file, tmp_path, recorded)
    assert CliRunner().invoke(app, command).exit_code == 0
    before = release_bytes(tmp_path / "rel")
    monkeypatch.setattr(errors, "terminations", [])
    lose_a_sigterm_during_the_run(monkeypatch, lambda: errors.terminations.append(signal.SIGTERM))
    stopped = CliRunner().invoke(app, command)
    assert stopped.exit_code == 130, stopped.output  # as after Ctrl-C (the CLI alone; its process exits 143)
    assert release_bytes(tmp_path / "rel") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["books.json", "books.json.keys", "input", "rel"]
                                                          if recorded else ["input", "rel"])
    if recorded:
        assert [r["status"] for r in live(read_ledger(tmp_path / "books.json"))] == ["committed", "pending"]


def test_a_stop_between_the_renames_puts_the_earlier_release_back(small_state, recommended_release, tmp_path,
                                                                  monkeypatch):
    """Publishing renames the earlier release away, then the new one into place; a stop (Ctrl-C,
    SIGTERM) between the two leaves the earlier release where it was, not a missing folder."""
    out = tmp_path / "rel"
    recommended_release.write(out)
    before = release_bytes(out)
    release = gedp.protect(small_state, seed=2, not_for_publication=True)
    stop_before_the_new_release_is_renamed(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        release.write(out)
    monkeypatch.undo()
    assert release_bytes(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel"]


def test_an_earlier_release_left_while_being_removed_is_removed_by_the_next_run(tmp_path):
    """A run stopped while it removes the release it replaced leaves it as ``.OUT.retired-*``, complete
    and readable: the next run writing the same output removes it, as any stale staging folder."""
    from gedp.release.writer import remove_stale_staging

    retired = tmp_path / ".rel.retired-0badc0de"
    retired.mkdir()
    (retired / "manifest.json").write_text("{}")
    assert remove_stale_staging(tmp_path / "rel") == [retired.name] and not retired.exists()


def test_a_stop_after_the_ledgers_commit_says_the_release_was_charged(state_file, tmp_path, monkeypatch, capfd):
    """Stopped after the ledger committed its release (here between the renames that publish it, so the
    earlier release stays), a recorded run says that the release was charged and that running again
    charges again: an operator who reads only the exit status would otherwise run it again."""
    from typer.testing import CliRunner

    from gedp.cli import app

    command = protect_command(state_file, tmp_path, recorded=True)
    assert CliRunner().invoke(app, command).exit_code == 0
    stop_before_the_new_release_is_renamed(monkeypatch)
    stopped = CliRunner().invoke(app, command)
    monkeypatch.undo()
    assert stopped.exit_code == 130
    releases = live(read_ledger(tmp_path / "books.json"))
    assert [r["status"] for r in releases] == ["committed", "committed"]
    said = " ".join((stopped.output + capfd.readouterr().err).split())
    assert f"stopped after release {releases[1]['id']} was committed" in said and "charges again" in said


@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "in a ledger"])
def test_a_process_that_survived_a_sigterm_publishes_its_next_release(state_file, tmp_path, monkeypatch, recorded):
    """A process that runs the command line in-process (or the library) and handles a SIGTERM goes on:
    the run the SIGTERM came in still commits and publishes nothing, and the next run publishes (the
    SIGTERMs received belong to the run they came in: ``gedp.errors.run_started``)."""
    from typer.testing import CliRunner

    from gedp import errors
    from gedp.cli import app
    from gedp.running.process import stop_on_sigterm

    def sigterm_handled() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises Terminated here
        except errors.Terminated:
            pass  # handled, e.g. by a library in between: the run goes on

    monkeypatch.setattr(errors, "terminations", [])
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop_on_sigterm()  # installs the command line's handlers of both stops: both restored below
    try:
        command = protect_command(state_file, tmp_path, recorded)
        with monkeypatch.context() as during:
            lose_a_sigterm_during_the_run(during, sigterm_handled)
            stopped = CliRunner().invoke(app, command)
        assert errors.terminations == [signal.SIGTERM]
        assert stopped.exit_code == 130 and not (tmp_path / "rel").exists(), stopped.output
        again = CliRunner().invoke(app, command)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    assert again.exit_code == 0, again.output
    assert errors.terminations == [signal.SIGTERM] and (tmp_path / "rel" / "manifest.json").is_file()
    if recorded:
        assert [r["status"] for r in live(read_ledger(tmp_path / "books.json"))] == ["pending", "committed"]


def stop_while_the_earlier_release_is_removed(monkeypatch) -> None:
    """Ctrl-C (as SIGTERM's ``Terminated``) raised once the new release is in place, as publishing
    removes the earlier one."""
    from gedp.release import writer

    remove = writer.shutil.rmtree

    def stopped_while_removing(path, *args, **kwargs):
        if Path(path).name.startswith(".rel.retired-"):
            raise KeyboardInterrupt
        remove(path, *args, **kwargs)

    monkeypatch.setattr(writer.shutil, "rmtree", stopped_while_removing)


@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "in a ledger"])
@pytest.mark.parametrize("published", [False, True], ids=["before the rename", "after the rename"])
def test_a_run_stopped_after_its_manifest_says_which_release_the_output_holds(state_file, tmp_path, monkeypatch,
                                                                             capfd, recorded, published):
    """Stopped after its manifest was written, a run says whether the output now holds its new release
    or the earlier one, from what it did (whether it put the new folder in place), not from a guess;
    checked against the output's bytes."""
    from typer.testing import CliRunner

    from gedp.cli import app

    command = protect_command(state_file, tmp_path, recorded)
    assert CliRunner().invoke(app, command).exit_code == 0
    before = release_bytes(tmp_path / "rel")
    (stop_while_the_earlier_release_is_removed if published else stop_before_the_new_release_is_renamed)(monkeypatch)
    again = command if recorded else [*command[:-3], "--seed", "2", "--not-for-publication"]  # another release
    stopped = CliRunner().invoke(app, again)
    monkeypatch.undo()
    assert stopped.exit_code == 130
    printed = stopped.output + capfd.readouterr().err
    said = " ".join(printed.split())
    out = (tmp_path / "rel").resolve()
    assert (release_bytes(out) != before) == published  # what the output holds
    holds = f"'{out}' holds it" if published else f"'{out}' holds the release it held before"
    if recorded:
        release_id = live(read_ledger(tmp_path / "books.json"))[1]["id"]
        when = "and published" if published else "but before it was published"
        assert f"stopped after release {release_id} was committed in ledger '{tmp_path / 'books.json'}' (charged) " \
               f"{when}: {holds}; running again charges again" in said, said
    else:
        assert (f"stopped after the new release was published: {holds}" if published
                else f"stopped: nothing was published; {holds}") in said, said
    assert len([line for line in printed.splitlines() if line.startswith("stopped")]) == 1, printed


def test_an_unrecorded_run_stopped_before_its_first_release_says_there_is_none(state_file, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gedp.cli import app

    lose_a_sigterm_during_the_run(monkeypatch, lambda: (_ for _ in ()).throw(KeyboardInterrupt))
    stopped = CliRunner().invoke(app, protect_command(state_file, tmp_path, recorded=False))
    assert stopped.exit_code == 130
    said = " ".join(stopped.output.split())
    assert f"stopped: nothing was published; there is no release at '{(tmp_path / 'rel').resolve()}'" in said, said


def test_sigterm_on_an_unrecorded_panel_says_which_release_the_output_holds(panel_file, first_release, tmp_path):
    """SIGTERM as the panel is joined (around its manifest): the run's last line says whether the
    output holds the new release or the earlier one, and the output's bytes agree."""
    import shutil

    shutil.copytree(first_release / "rel", tmp_path / "rel")
    before = release_bytes(tmp_path / "rel")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.Popen([sys.executable, "-m", "gedp", "protect", str(panel_file), "--out", str(tmp_path / "rel"),
                            "--allow-over-cap"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    output = stop_at(run, tmp_path, "joining the panel", signal.SIGTERM)
    assert "Traceback" not in output, output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel"], output
    out = (tmp_path / "rel").resolve()
    if run.returncode == 0:  # published before the signal came
        assert release_bytes(out) != before
        return
    assert run.returncode == 128 + signal.SIGTERM, output
    last = output.strip().splitlines()[-1]
    if release_bytes(out) == before:
        assert last == f"stopped: nothing was published; '{out}' holds the release it held before", output
    else:
        assert last == f"stopped after the new release was published: '{out}' holds it", output


@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "in a ledger"])
def test_a_sigterm_lost_before_the_protection_began_still_stops_the_command(state_file, tmp_path, monkeypatch,
                                                                            recorded):
    """The command's run begins with the command, not with its protection: a SIGTERM whose exception
    was lost while the input was read (before the ledger or the protection started) still stops it,
    nothing committed or published."""
    from typer.testing import CliRunner

    from gedp import errors
    from gedp.cli import app
    from gedp.synth import intake

    monkeypatch.setattr(errors, "terminations", [signal.SIGTERM])  # one an earlier command survived
    load_input = intake.load_input

    def lost_while_reading(*args, **kwargs):
        errors.terminations.append(signal.SIGTERM)  # as the handler does, its Terminated lost
        return load_input(*args, **kwargs)

    monkeypatch.setattr(intake, "load_input", lost_while_reading)
    stopped = CliRunner().invoke(app, protect_command(state_file, tmp_path, recorded))
    assert stopped.exit_code == 130, stopped.output
    assert not (tmp_path / "rel").exists()
    if recorded:
        assert [r["status"] for r in live(read_ledger(tmp_path / "books.json"))] == ["pending"]


@pytest.mark.timeout(60)
def test_a_run_in_another_thread_does_not_forget_this_runs_sigterm():
    """Each thread's run counts from its own start: a protection that begins in another thread does
    not make this run forget the SIGTERM it received."""
    import threading

    from gedp import errors

    other_ran = []

    def another_run():
        with errors.run_started():
            errors.stop_if_terminated()  # began after the SIGTERM: not stopped by it
            other_ran.append(True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(errors, "terminations", [])
        with errors.run_started():
            errors.terminations.append(signal.SIGTERM)
            thread = threading.Thread(target=another_run)
            thread.start()
            thread.join()
            with pytest.raises(errors.Terminated):
                errors.stop_if_terminated()
            with errors.run_started():  # re-entered (the library inside a command): the outer start counts
                with pytest.raises(errors.Terminated):
                    errors.stop_if_terminated()
    assert other_ran == [True]


def test_a_ctrl_c_an_earlier_command_survived_does_not_stop_a_later_call():
    """A Ctrl-C the command line's handler recorded in an earlier in-process command (a test's, or a
    notebook's) stopped every later library call outside a run with KeyboardInterrupt (a worker of the
    full suite crashed in test_state_pool: a test had left the command line's handlers installed, a later
    one sent itself Ctrl-C through an in-process command): it counts within the run that received it,
    and in none after."""
    from gedp import errors

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(errors, "interruptions", [signal.SIGINT])  # an earlier command's, survived
        errors.stop_if_terminated()  # outside a run: not this call's
        with errors.run_started():
            errors.stop_if_terminated()  # a run that began after it
            errors.interruptions.append(signal.SIGINT)  # this run's own Ctrl-C, its exception lost
            with pytest.raises(KeyboardInterrupt):
                errors.stop_if_terminated()


#: `gedp` (its entry point, so the command line's handlers) with a real Ctrl-C received as the run starts
#: protecting its input, and its KeyboardInterrupt swallowed there, as an import's callback does ("Exception
#: ignored in _get_module_lock") or a library that catches it.
LOST_CTRL_C_PROBE = """
import os, signal, sys
from gedp.running import recorded_release

protect_input = recorded_release.protect_input

def received_and_lost(*args, **kwargs):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**7):  # the handler runs here (Python's next check of signals)
            pass
    except KeyboardInterrupt:
        pass
    else:
        raise SystemExit("no Ctrl-C received")
    return protect_input(*args, **kwargs)

recorded_release.protect_input = received_and_lost
sys.argv = ["gedp", *sys.argv[1:]]
from gedp.cli import command
command()
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "in a ledger"])
def test_a_ctrl_c_whose_exception_was_lost_still_commits_and_publishes_nothing(state_file, tmp_path, recorded):
    """Red team rt20: SIGTERM had a backstop (``terminations``, checked before the manifest is written and
    the charge committed), Ctrl-C had none: its KeyboardInterrupt swallowed, the run published its
    release and committed its charge (exit 0). Now the command line records Ctrl-C as SIGTERM: exit 130,
    nothing published, the charge left pending."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", LOST_CTRL_C_PROBE, *protect_command(state_file, tmp_path, recorded)],
                          capture_output=True, text=True, timeout=240, env=env, start_new_session=True)
    assert done.returncode == 130, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines()[-1].startswith("stopped"), done.stderr
    assert not (tmp_path / "rel").exists()
    if recorded:
        assert [r["status"] for r in live(read_ledger(tmp_path / "books.json"))] == ["pending"]


@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "in a ledger"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, "Terminated"], ids=["Ctrl-C", "SIGTERM"])
def test_a_run_stopped_as_it_prints_its_summary_says_its_release_was_published(state_file, tmp_path, monkeypatch,
                                                                              recorded, stop):
    """A stop once the release is published and charged, as protect prints its summary (the moment a
    scheduler's timeout or Ctrl-C at "Release written" lands), says so, and that running again charges
    again: a bare "stopped (SIGTERM)", what a stop that published nothing says, had a script retry and
    charge the ledger twice (red team rt25 F1). Power: before the fix its last line was the bare one."""
    from typer.testing import CliRunner

    from gedp import errors
    from gedp.cli import app, release_commands

    kind = errors.Terminated if stop == "Terminated" else stop

    def stopped_while_printing(*args, **kwargs):
        raise kind()

    monkeypatch.setattr(release_commands, "_print_release_summary", stopped_while_printing)
    stopped = CliRunner().invoke(app, protect_command(state_file, tmp_path, recorded))
    monkeypatch.undo()
    assert stopped.exit_code == 130, stopped.output
    said = " ".join(stopped.output.split())
    out = (tmp_path / "rel").resolve()
    assert (out / "manifest.json").is_file()
    if recorded:
        release_id, = [r["id"] for r in live(read_ledger(tmp_path / "books.json"))]
        assert [r["status"] for r in live(read_ledger(tmp_path / "books.json"))] == ["committed"]
        assert f"stopped after release {release_id} was committed in ledger '{tmp_path / 'books.json'}' (charged) " \
               f"and published: '{out}' holds it; running again charges again" in said, said
    else:
        assert f"stopped after the new release was published: '{out}' holds it" in said, said
    assert "stopped (" not in said, said
