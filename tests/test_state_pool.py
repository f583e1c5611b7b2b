"""States protected in worker processes: the same release as one after the other, errors refused
with nothing published, entries and progress in state order, Ctrl-C leaves no release; workers
started early (while the input is checked and read) only for several states, and stopped, with
nothing written, when the run is refused after they started."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gedp.config import load_config
from gedp.errors import GedpError
from gedp.running import state_pool
from gedp.running.engine import protect_input
from gedp.running.state_pool import pool_size
from gedp.synth.profiles import generate_profile, load_profile

#: States of the input and their sizes: the first is the largest, so it tends to finish last.
SIZES = {"05": 4_000, "23": 600, "44": 900}


def _state(code: str, n: int, seed: int) -> pd.DataFrame:
    frame = generate_profile(load_profile("small"), n_establishments=n, rng=np.random.default_rng(seed))
    frame["state"] = code
    frame["estab_id"] = code + "-" + frame["estab_id"]
    return frame


@pytest.fixture(scope="module")
def three_states(tmp_path_factory) -> Path:
    """Three states of different sizes as a folder of Parquet parts, one per state."""
    folder = tmp_path_factory.mktemp("input") / "states.parquet"
    folder.mkdir()
    for seed, (code, n) in enumerate(SIZES.items()):
        _state(code, n, seed).to_parquet(folder / f"part-{code}.parquet", index=False)
    return folder


def _files(release: Path) -> dict[str, bytes]:
    return {str(path.relative_to(release)): path.read_bytes() for path in sorted(release.rglob("*")) if path.is_file()}


def _protected(source, out: Path, processes: int | None, **options) -> tuple[dict, list[str]]:
    done: list[str] = []
    manifest = protect_input(source, load_config("recommended"), out, on_state=done.append, processes=processes,
                             **options)
    return manifest, done


def test_a_seeded_release_is_byte_identical_whatever_the_number_of_processes(three_states, tmp_path):
    releases = {}
    for processes in (1, 2, 3, None):
        manifest, done = _protected(three_states, tmp_path / f"p{processes}", processes, seed=11)
        assert done == list(SIZES) and [entry["state"] for entry in manifest["per_state"].values()] == list(SIZES)
        releases[processes] = _files(tmp_path / f"p{processes}")
    assert set(releases[1]) >= {"manifest.json", "qcew_tables.csv"}
    assert len(releases[1]) > 3 and all(files == releases[1] for files in releases.values())
    # and a different seed changes it: the comparison can see a difference
    _protected(three_states, tmp_path / "other", 2, seed=12)
    assert _files(tmp_path / "other")["qcew_tables.csv"] != releases[1]["qcew_tables.csv"]


def test_an_input_in_memory_gives_the_same_release_in_processes(three_states, tmp_path):
    frame = pd.read_parquet(three_states).sample(frac=1.0, random_state=0).reset_index(drop=True)
    frame["state"] = frame["state"].astype(str)
    _protected(frame, tmp_path / "one", 1, seed=5)
    _protected(frame, tmp_path / "two", 2, seed=5)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_secure_releases_draw_fresh_noise_in_each_worker(three_states, tmp_path):
    _protected(three_states, tmp_path / "a", 2, seed=None)
    _protected(three_states, tmp_path / "b", 2, seed=None)
    first, second = (pd.read_parquet(tmp_path / name / "protected.parquet") for name in "ab")
    assert first["estab_id"].tolist() == second["estab_id"].tolist()
    assert (first["m1emp"] != second["m1emp"]).mean() > 0.9


@pytest.mark.parametrize("bad_state", ["05", "44"])
def test_an_error_in_one_state_is_refused_with_nothing_published(three_states, tmp_path, bad_state):
    """A state whose rows fail the microdata checks (read inside its worker) stops the release with
    the message of a run in one process, and leaves nothing beside the input."""
    bad = tmp_path / "bad.parquet"
    bad.mkdir()
    for part in three_states.iterdir():
        frame = pd.read_parquet(part)
        if part.name == f"part-{bad_state}.parquet":
            frame.loc[3, "m1emp"] = -5
        frame.to_parquet(bad / part.name, index=False)
    messages, reported = {}, {}
    for processes in (1, 2):
        out = tmp_path / "releases" / f"p{processes}"
        out.parent.mkdir()
        reported[processes] = []
        with pytest.raises(GedpError) as refused:
            protect_input(bad, load_config("recommended"), out, seed=3, processes=processes,
                          on_state=reported[processes].append)
        messages[processes] = str(refused.value)
        assert list(out.parent.iterdir()) == []  # no release, no staging folder
        (out.parent).rmdir()
    assert messages[2] == messages[1] and "m1emp" in messages[1] and f"{bad_state}-" in messages[1]
    assert bad_state not in reported[2] and reported[2] == list(SIZES)[:len(reported[2])]


def test_the_number_of_processes_is_checked_and_bounded_by_the_states():
    assert pool_size(8, 3) == 3 and pool_size(1, 37) == 1
    assert pool_size(None, 1) == 1 and pool_size(None, 100) == len(os.sched_getaffinity(0))
    assert pool_size(None, 3, rows=5_500) == 1  # a worker's start would cost more than it saves
    assert pool_size(None, 100, rows=10**9) == len(os.sched_getaffinity(0))
    assert pool_size(2, 3, rows=5_500) == 2  # asked for: started whatever the size
    for wrong in (0, -2, 1.5, True):
        with pytest.raises(GedpError, match="processes"):
            pool_size(wrong, 3)


def test_ctrl_c_leaves_no_release_and_no_worker(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the workers
    protect: the command stops, publishes nothing, removes its staging folder, and no process of
    its group is left."""
    folder = tmp_path / "large.parquet"
    folder.mkdir()
    for seed, code in enumerate(("01", "02", "04", "05")):
        _state(code, 60_000, seed).to_parquet(folder / f"part-{code}.parquet", index=False)
    out = tmp_path / "release"
    command = [sys.executable, "-m", "gedp", "protect", str(folder), "--out", str(out), "--seed", "1",
               "--not-for-publication"]
    # As a terminal's foreground command: Ctrl-C not ignored, even when this test runs in a shell's
    # background job (which starts with SIGINT ignored, and children inherit that).
    run = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".release.partial-*/protected.parquet")):  # a worker has started writing
        assert run.poll() is None and time.monotonic() < deadline, run.communicate(timeout=60)[0]
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGINT)
    output = run.communicate(timeout=60)[0].decode()
    assert run.returncode != 0, output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["large.parquet"], output
    deadline = time.monotonic() + 10
    while _group_alive(run.pid):
        assert time.monotonic() < deadline, "a process of the interrupted command is still running"
        time.sleep(0.1)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_gedp_protect_takes_the_number_of_processes(three_states, tmp_path):
    from typer.testing import CliRunner

    from gedp.cli import app

    runner = CliRunner()
    arguments = ["protect", str(three_states), "--seed", "11", "--not-for-publication", "--out"]
    assert runner.invoke(app, [*arguments, str(tmp_path / "one"), "--processes", "1"]).exit_code == 0
    assert runner.invoke(app, [*arguments, str(tmp_path / "auto")]).exit_code == 0
    assert _files(tmp_path / "one") == _files(tmp_path / "auto")
    refused = runner.invoke(app, [*arguments, str(tmp_path / "none"), "--processes", "0"])
    assert refused.exit_code == 2 and "processes 0 must be a whole number of at least 1" in refused.output
    assert not (tmp_path / "none").exists()


def test_the_python_api_takes_the_number_of_processes(three_states, tmp_path):
    """``gedp.protect(..., processes=N)`` as ``gedp protect --processes N``: two workers give the
    bytes of one process; a count below 1 is refused before anything is written."""
    import gedp

    options = dict(config="recommended", seed=11, not_for_publication=True)
    gedp.protect(three_states, engine=gedp.Engine(processes=2), **options).write(tmp_path / "two")
    gedp.protect(three_states, engine=gedp.Engine(processes=1), **options).write(tmp_path / "one")
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    with pytest.raises(GedpError, match="processes 0 must be a whole number of at least 1"):
        gedp.protect(three_states, engine=gedp.Engine(processes=0), **options)


AFFINITY_PROBE = """
import os, threading
from gedp.postprocess.months import on_threads
from gedp.running.state_pool import pool_size
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
threads = on_threads([threading.get_ident for _ in range(3)])
print(pool_size(None, 100), len(set(threads)), threads[0] == threading.get_ident())
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a system with CPU affinity and at least two usable CPUs")
def test_workers_and_threads_count_the_cpus_this_process_may_run_on():
    """Held to one CPU (as by a container or taskset) on a machine of more: one worker process, and
    the month steps on the calling thread, not on a thread per CPU of the machine."""
    probe = subprocess.run([sys.executable, "-c", AFFINITY_PROBE], capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["1", "1", "True"], probe.stderr


def test_a_worker_killed_midway_is_reported_with_nothing_published(three_states, tmp_path):
    """A worker killed (as the system kills a process short of memory) gives one gedp error that says
    what happened, and nothing is published."""
    import threading

    out, raised = tmp_path / "releases" / "r", []

    def run():
        try:
            protect_input(three_states, load_config("recommended"), out, seed=1, processes=2)
        except GedpError as err:
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)  # a run that blocks fails this test, not the worker's exit
    thread.start()
    deadline = time.monotonic() + 60
    while not multiprocessing.active_children():
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
    thread.join(120)
    assert len(raised) == 1 and "a worker process stopped before its state was protected" in str(raised[0])
    assert list(out.parent.iterdir()) == [] and multiprocessing.active_children() == []


@pytest.fixture
def pools(monkeypatch) -> list[int]:
    """The sizes of the pools started during a test, in order."""
    sizes: list[int] = []
    new_pool = state_pool._new_pool

    def recorded(processes: int):
        sizes.append(processes)
        return new_pool(processes)

    monkeypatch.setattr(state_pool, "_new_pool", recorded)
    return sizes


def _protect(source: Path, out: Path, *options: str):
    from typer.testing import CliRunner

    from gedp.cli import app

    return CliRunner().invoke(app, ["protect", str(source), "--out", str(out), *options])


def test_the_workers_started_early_protect_the_states(three_states, tmp_path, pools):
    seeded = ["--seed", "4", "--not-for-publication"]
    assert _protect(three_states, tmp_path / "one", *seeded, "--processes", "1").exit_code == 0
    assert pools == []
    assert _protect(three_states, tmp_path / "two", *seeded, "--processes", "2").exit_code == 0
    assert pools == [2]  # started before the input was read, and no second pool after it
    assert _files(tmp_path / "two") == _files(tmp_path / "one") and len(_files(tmp_path / "one")) > 3
    assert multiprocessing.active_children() == [] and state_pool._started == []


def _repeated_id(three_states: Path, folder: Path) -> Path:
    for part in three_states.iterdir():
        frame = pd.read_parquet(part)
        frame.loc[1, "estab_id"] = frame.loc[0, "estab_id"]
        frame.to_parquet(folder / part.name, index=False)
    return folder


@pytest.mark.parametrize("refusal", ["repeated estab_id", "seed without --not-for-publication", "unknown workflow",
                                     "ledger cap below the release's mu"])
def test_a_refused_run_leaves_no_worker_and_nothing_written(three_states, tmp_path, pools, refusal):
    source, options = three_states, ["--seed", "4", "--not-for-publication", "--processes", "2"]
    if refusal.startswith("ledger"):  # employment alone spends mu 2.28 > 1
        options = ["--processes", "2", "--ledger", str(tmp_path / "ledger.json"), "--lifetime-cap", "1"]
    elif refusal == "repeated estab_id":
        folder = tmp_path / "input.parquet"
        folder.mkdir()
        source = _repeated_id(three_states, folder)
    elif refusal == "unknown workflow":
        options += ["--workflow", "nope"]
    else:
        options.remove("--not-for-publication")
    out = tmp_path / "releases" / "r"
    out.parent.mkdir()
    result = _protect(source, out, *options)
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "over their lifetime cap" in result.output or not refusal.startswith("ledger")
    assert pools == [2]  # the workers had started before the refusal
    assert multiprocessing.active_children() == [] and state_pool._started == []
    assert list(out.parent.iterdir()) == []


def test_no_worker_starts_early_for_one_state_or_one_process(three_states, tmp_path):
    one_state = tmp_path / "one.parquet"
    pd.read_parquet(three_states / "part-23.parquet").to_parquet(one_state, index=False)
    mixed = tmp_path / "mixed.parquet"
    pd.concat([pd.read_parquet(part) for part in sorted(three_states.iterdir())]).to_parquet(mixed, index=False)
    csv = tmp_path / "states.csv"
    pd.read_parquet(mixed).to_csv(csv, index=False)
    assert state_pool._expected_size(one_state, 2) == 0
    assert state_pool._expected_size(csv, 2) == 0
    assert state_pool._expected_size(three_states, 1) == 1 and state_pool._expected_size(three_states, 0) == 0
    assert state_pool._expected_size(three_states, None) == 1  # 5,500 rows: one process is quicker
    assert state_pool._expected_size(three_states, 2) == 2 and state_pool._expected_size(three_states, 4) == 3
    assert state_pool._expected_size(mixed, 4) == 2  # one row group: its min 05 and max 44 show two states


@pytest.mark.timeout(120)
def test_a_stop_before_stop_workers_holds_stops_still_ends_every_worker(monkeypatch):
    """Red team rt20 (found while testing a second Ctrl-C): a Ctrl-C raised as ``stop_workers`` began,
    before its hold of stops, left the workers running (and the pool's shutdown waiting for every queued
    task: minutes). Now they are ended first, then the stop is raised."""
    import contextlib
    import time

    from gedp.running import state_pool

    pool = state_pool._new_pool(2)
    for _ in range(4):
        pool.submit(time.sleep, 60)
    processes = list(pool._processes.values())
    hold = state_pool.held_stops
    entered: list[int] = []

    @contextlib.contextmanager
    def stopped_on_entry():
        entered.append(1)
        if len(entered) == 1:
            raise KeyboardInterrupt  # a Ctrl-C before the hold began
        with hold():
            yield

    monkeypatch.setattr(state_pool, "held_stops", stopped_on_entry)
    with pytest.raises(KeyboardInterrupt):
        state_pool.stop_workers(pool)
    assert len(processes) == 2 and not any(process.is_alive() for process in processes)
