"""The ledger's lock and the margin cache's lock are waited for with a deadline: a process that holds
one and hangs makes the others say, once, what they wait for, then fail with one line naming the
lock's file and what to do, having changed nothing (the ledger's events and key files as they were);
a lock let go before the deadline is taken.

Each test holds a lock through an open file of its own (``flock`` locks belong to an open file, so a
holder in this process blocks a waiter in it as another process would). On a gedp whose waits have no
deadline, these tests would wait for ever: their timeouts make them fail instead."""

import os
import re
import socket
import threading
import time

import pytest
from typer.testing import CliRunner

import gedp.accounting.ledger_file as ledger_file
import gedp.accounting.lock_wait as lock_wait
from gedp.accounting.ledger import reserve
from gedp.cli import app
from gedp.config import resolve_config
from gedp.errors import InputError, LockTimeout

runner = CliRunner()


@pytest.fixture
def source(tmp_path, small_state):
    path = tmp_path / "in.parquet"
    small_state.head(400).to_parquet(path)
    return path


def protect(source, out, ledger, *extra):
    return runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out),
                               "--ledger", str(ledger), *map(str, extra)])


def ledger_state(ledger):
    """Every byte of the ledger and its key files, and the names of the files beside it."""
    files = [ledger, *sorted(ledger_file.keys_folder(ledger).iterdir())]
    return {str(path): path.read_bytes() for path in files}, sorted(os.listdir(ledger.parent))


@pytest.fixture
def ledger(tmp_path, source):
    """A ledger holding one committed release."""
    books = tmp_path / "books.json"
    assert protect(source, tmp_path / "first", books, "--lifetime-cap", 20).exit_code == 0
    return books


def reserve_again(ledger, small_state):
    return reserve(ledger, small_state.head(400)["estab_id"], resolve_config("employment").plan)


@pytest.mark.timeout(60)
def test_a_waiter_gives_up_at_its_deadline_and_leaves_the_ledger_as_it_was(ledger, small_state, monkeypatch, capfd):
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "0.6")
    monkeypatch.setattr(lock_wait, "NOTICE_SECONDS", 0.2)
    before = ledger_state(ledger)
    lock = ledger.with_name("books.json.lock")
    started = time.monotonic()
    with ledger_file.locked_ledger(ledger):  # held (as by a hung process) while another reservation waits
        with pytest.raises(LockTimeout) as refused:
            reserve_again(ledger, small_state)
    waited = time.monotonic() - started
    message = str(refused.value)
    assert "\n" not in message and f"the ledger's lock at '{lock}'" in message
    host = re.escape(socket.gethostname())
    assert re.search(rf"held by process {os.getpid()} on {host} since 20\d\d-\d\d-\d\dT", message)
    assert "was not let go within 0.6 s (GEDP_LOCK_TIMEOUT)" in message and "stop it" in message
    assert 0.6 <= waited < 5
    said = capfd.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(f"waiting for the ledger's lock at '{lock}' (held by process ")
    assert ledger_state(ledger) == before  # nothing written, no key file, no lock file left


@pytest.mark.timeout(60)
def test_a_lock_let_go_before_the_deadline_is_taken(ledger, small_state, monkeypatch, capfd):
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "30")
    held, done = threading.Event(), threading.Event()

    def hold_for_a_while():
        with ledger_file.locked_ledger(ledger):
            held.set()
            done.wait(0.5)

    holder = threading.Thread(target=hold_for_a_while)
    holder.start()
    held.wait()
    reservation = reserve_again(ledger, small_state)
    holder.join()
    assert [r["id"] for r in ledger_file.live(ledger_file.read_ledger(ledger))][-1] == reservation.release_id
    assert capfd.readouterr().err == ""  # under NOTICE_SECONDS: nothing said
    assert sorted(os.listdir(ledger.parent)) == ["books.json", "books.json.keys", "first", "in.parquet"]


@pytest.mark.timeout(120)
def test_a_commit_that_times_out_publishes_nothing_and_leaves_the_release_pending(ledger, source, tmp_path,
                                                                                 monkeypatch):
    """The lock is held when the complete release is to be committed: one line naming the lock and
    the pending release; nothing published; the ledger holds the reservation and nothing more."""
    from gedp.running import recorded_release

    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "0.3")
    commit = recorded_release.commit

    def commit_while_held(reservation):
        with ledger_file.locked_ledger(reservation.path):
            commit(reservation)

    monkeypatch.setattr(recorded_release, "commit", commit_while_held)
    result = protect(source, tmp_path / "second", ledger)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    book = ledger_file.read_ledger(ledger)
    pending = ledger_file.live(book)[-1]
    assert lines[0].startswith(f"error: the ledger's lock at '{ledger.with_name('books.json.lock')}'")
    assert f"release {pending['id']} stays pending" in lines[0] and pending["status"] == "pending"
    assert [event["event"] for event in book["events"]] == ["reserve", "commit", "reserve"]
    assert sorted(os.listdir(tmp_path)) == ["books.json", "books.json.keys", "first", "in.parquet"]


@pytest.mark.timeout(60)
def test_the_margin_caches_lock_has_a_deadline_too(tmp_path, monkeypatch):
    from gedp.release import margins

    monkeypatch.setenv(margins.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "0.3")
    with margins.exclusive_cache():  # held while a structure is put into place, here by a hung process
        for kind in (margins.shared_cache, margins.exclusive_cache):
            with pytest.raises(LockTimeout, match=f"the margin cache's lock at '{tmp_path / 'cache' / 'margins'}/"
                                                  rf"\.lock' was not let go within 0\.3 s .*GEDP_CACHE_DIR"):
                with kind():
                    pass
    with margins.shared_cache(), margins.shared_cache():  # let go: readers share it
        pass


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_deadline_that_is_not_a_number_of_seconds_is_refused(monkeypatch, value):
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, value)
    with pytest.raises(InputError, match=f"GEDP_LOCK_TIMEOUT \\('{value}'\\) must be a number of seconds >= 0"):
        lock_wait.lock_timeout()


def test_the_deadline_defaults_to_ten_minutes(monkeypatch):
    monkeypatch.delenv(lock_wait.TIMEOUT_ENV, raising=False)
    assert lock_wait.lock_timeout() == 600
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "2.5")
    assert lock_wait.lock_timeout() == 2.5


def _plant(kind, path, target):
    if kind == "symlink":
        os.symlink(target, path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.mkdir(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_and_nothing_is_written_through_it(
        ledger, source, tmp_path, monkeypatch, kind):
    """A symbolic link planted at the lock's path would have its target overwritten by the holder's
    line; a FIFO would hang the open for ever: both refused in one line naming the lock, nothing
    changed, the target intact."""
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "5")
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    lock = ledger.with_name("books.json.lock")
    _plant(kind, lock, precious)
    before = ledger_state(ledger)
    result = protect(source, tmp_path / "second", ledger)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"lock file '{lock}' must be a regular file" in lines[0]
    assert precious.read_text() == "keep me\n" and ledger_state(ledger) == before
    assert not (tmp_path / "second").exists()
    assert ledger_file._holder(lock) == ""  # read without following or hanging either


@pytest.mark.timeout(60)
def test_the_margin_caches_lock_file_must_be_a_regular_file(tmp_path, monkeypatch):
    from gedp.release import margins

    monkeypatch.setenv(margins.CACHE_ENV, str(tmp_path / "cache"))
    with margins.exclusive_cache():  # makes the cache's folder
        pass
    lock = margins.margins_folder() / margins.LOCK_FILE
    lock.unlink()
    os.mkfifo(lock)
    with pytest.raises(InputError, match="must be a regular file"):
        with margins.shared_cache():
            pass


@pytest.mark.timeout(60)
def test_the_ledgers_temporary_file_is_not_written_through_a_planted_link(ledger, source, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    os.symlink(precious, ledger.with_name(".books.json.partial"))
    assert protect(source, tmp_path / "second", ledger).exit_code == 0
    assert precious.read_text() == "keep me\n"
    assert [event["event"] for event in ledger_file.read_ledger(ledger)["events"]][-2:] == ["reserve", "commit"]
    assert not ledger.with_name(".books.json.partial").exists()


@pytest.mark.timeout(60)
def test_a_holder_does_not_remove_a_lock_file_another_process_holds(ledger, monkeypatch):
    """The lock file removed by hand while held, made again and taken by another: the first holder,
    letting its lock go, leaves the other's file (removing it would let a third process in beside the
    second)."""
    monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "20")
    lock = ledger.with_name("books.json.lock")
    taken, let_go = threading.Event(), threading.Event()

    def second_holder():
        with ledger_file.locked_ledger(ledger):
            taken.set()
            let_go.wait(20)

    with ledger_file.locked_ledger(ledger):
        lock.unlink()  # by hand
        second = threading.Thread(target=second_holder)
        second.start()
        assert taken.wait(20)
    try:
        assert lock.exists()  # the second holder's file stays while it holds it
        with pytest.raises(LockTimeout):
            monkeypatch.setenv(lock_wait.TIMEOUT_ENV, "0.3")
            with ledger_file.locked_ledger(ledger):  # a third waits for the second
                pass
    finally:
        let_go.set()
        second.join()
    assert not lock.exists()


@pytest.mark.parametrize(("line", "said"), [
    ("process 12 on node-7.agency.gov since 2026-11-29T10:00:00+00:00", " (held by process 12 on node-7.agency.gov "
                                                                     "since 2026-11-29T10:00:00+00:00)"),
    ("process 12 since 2026-11-29T10:00:00+00:00", " (held by process 12 since 2026-11-29T10:00:00+00:00)"),
    ("process 12 on \x1b[2Jnode since 2026-11-29T10:00:00+00:00", ""),
    ("process 12 on " + "a" * 300 + " since 2026-11-29T10:00:00+00:00", ""),
])
def test_the_holder_line_names_its_host_and_nothing_else(tmp_path, line, said):
    """A waiting process names the lock's holder by process and host (on a shared disk a process number
    alone names the wrong machine); a line of an earlier gedp (no host) still reads; a line someone else
    wrote with other characters (a terminal escape) or a name too long is not repeated."""
    lock = tmp_path / "books.json.lock"
    lock.write_text(line + "\n")
    assert ledger_file._holder(lock) == said
