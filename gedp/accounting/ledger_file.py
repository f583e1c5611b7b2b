"""The lifetime ledger's file (``gedp.accounting.ledger`` describes the ledger): its format, the checks
made whenever it is read (every event's fields, the chain of hashes, the key files beside it), its
atomic writing, the exclusive lock it is changed under, and the keyed hashes of establishments."""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.accounting.lock_wait import LockWait, open_lock_file
from gedp.accounting.quarters import quarter_index
from gedp.json_objects import unique_pairs
from gedp.measure.budget import MAX_MU
from gedp.synth.panel import QUARTER_PATTERN
from gedp.synth.schema import InputError, account_ids

LEDGER_VERSION = 3
PENDING, COMMITTED, CLEARED = "pending", "committed", "cleared"
DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LEDGER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,122}\.json")
HASH = re.compile(r"[0-9a-f]{64}")
RELEASE_ID = re.compile(r"[0-9a-f]{16}")
#: What a process holding the ledger's lock writes into the lock file.
#: A lock file's line: its holder's process, host (a ledger on a shared disk is locked from several
#: machines: a process number alone names the wrong one) and time; read back only in this form.
HOLDER = re.compile(r"process ([0-9]+)(?: on ([A-Za-z0-9.-]{1,253}))? since ([0-9T:+.-]+)")
KEY = re.compile(r"[A-Za-z0-9_-]{16}")
#: The keyed hash of this text under the ledger's key is stored with the ledger: a hash function that
#: changed (another pandas) would give every establishment a fresh account, so it is refused.
KEY_CHECK_TEXT = "gedp ledger key check"
LEDGER_KEYS = ("version", "key", "key_check", "events", "head")
RELEASE_KEYS = ("id", "dataset_id", "lifetime_cap", "psi", "gammas", "charges", "mu", "mu_planned",
                "establishments", "keys_sha256", "date_utc", "config")
#: Recorded with every release since quarters are kept (a release recorded without them is one
#: block of establishments without a quarter, and has no annual cap).
QUARTER_KEYS = ("quarters", "annual_cap")


def check_ledger_path(path: str | Path) -> Path:
    """The resolved ledger path, refused unless its folder exists and its name is ``NAME.json``."""
    path = Path(path).resolve()
    if not LEDGER_NAME.fullmatch(path.name):
        raise InputError(f"ledger '{path}': the name must be ASCII letters, digits, '.', '_' or '-' ending in .json")
    if not path.parent.is_dir():
        raise InputError(f"ledger '{path}': its folder does not exist (create it first)")
    if path.is_dir():
        raise InputError(f"ledger '{path}' is a folder, not a ledger file")
    return path


def establishment_keys(estab_ids: Iterable[str] | pd.Series, key: str) -> np.ndarray:
    """The sorted distinct keyed 64-bit hashes of normalized estab_ids (``gedp.accounting.ledger``)."""
    ids = account_ids(pd.Series(estab_ids))
    hashes = np.sort(pd.util.hash_array(ids.to_numpy(zero_copy_only=False), hash_key=key, categorize=False))
    return hashes[np.concatenate(([True], hashes[1:] != hashes[:-1]))].astype("<u8")


def _key_check(key: str) -> str:
    return f"{int(establishment_keys([KEY_CHECK_TEXT], key)[0]):016x}"


def short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def positive_number(value: object) -> bool:
    """A finite number > 0 (JSON's int or float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float
        return False


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _Damaged(Exception):
    """A ledger field that breaks a rule (turned into an InputError naming the ledger)."""


def _require(condition: bool, where: str, rule: str) -> None:
    if not condition:
        raise _Damaged(f"{where} {rule}")


def _keys(value: object, where: str, keys: Iterable[str]) -> None:
    keys = tuple(keys)
    _require(isinstance(value, dict) and set(value) == set(keys), where,
             f"must be an object with exactly the keys {', '.join(keys)}")


def _is_date(text: object) -> bool:
    try:
        dt.datetime.fromisoformat(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _mus(value: object, where: str) -> None:
    _require(isinstance(value, dict) and len(value) > 0 and all(isinstance(k, str) and positive_number(v)
                                                                 for k, v in value.items()),
             where, "must map attribute names to finite numbers > 0")


def _check_release(release: object, at: str) -> None:
    """Check every field of a reserve event's release (raises _Damaged naming the first bad one)."""
    _keys(release, at, (*RELEASE_KEYS, *QUARTER_KEYS) if isinstance(release, dict) and "quarters" in release
          else RELEASE_KEYS)
    assert isinstance(release, dict)
    if "quarters" in release:
        _check_quarters(release, at)
    _require(isinstance(release["id"], str) and bool(RELEASE_ID.fullmatch(release["id"])), f"{at}.id",
             "must be a 16-digit hex release id")
    name = release["dataset_id"]
    _require(name is None or (isinstance(name, str) and bool(DATASET_ID.fullmatch(name))), f"{at}.dataset_id",
             "must be null or a dataset id")
    _require(positive_number(release["lifetime_cap"]) and release["lifetime_cap"] <= MAX_MU, f"{at}.lifetime_cap",
             f"must be a finite number > 0 and <= {MAX_MU:g}")
    _require(isinstance(release["psi"], dict) and isinstance(release["psi"].get("name"), str), f"{at}.psi",
             "must be a psi's name and parameters")
    for field in ("gammas", "charges"):
        _mus(release[field], f"{at}.{field}")
    for field in ("mu", "mu_planned"):
        _require(positive_number(release[field]), f"{at}.{field}", "must be a finite number > 0")
    _require(type(release["establishments"]) is int and release["establishments"] > 0, f"{at}.establishments",
             "must be a whole number > 0")
    _require(isinstance(release["keys_sha256"], str) and bool(HASH.fullmatch(release["keys_sha256"])),
             f"{at}.keys_sha256", "must be a SHA-256 hex digest")
    _require(_is_date(release["date_utc"]), f"{at}.date_utc", "must be an ISO date and time")
    _require(isinstance(release["config"], str), f"{at}.config", "must be text")


def _check_quarters(release: dict, at: str) -> None:
    """A release's quarters: [label, establishments] pairs of distinct quarters in order (or one
    pair without a label), and its annual cap: null or a cap."""
    quarters = release["quarters"]
    _require(isinstance(quarters, list) and len(quarters) > 0 and all(
        isinstance(q, list) and len(q) == 2 and (q[0] is None or (isinstance(q[0], str) and bool(
            QUARTER_PATTERN.fullmatch(q[0])))) and type(q[1]) is int and q[1] > 0 for q in quarters), f"{at}.quarters",
        "must be a list of [quarter label or null, number of establishments > 0]")
    labels = [q[0] for q in quarters]
    _require(labels == [None] or (None not in labels and labels == sorted(set(labels), key=quarter_index)),
             f"{at}.quarters", "must be distinct quarters in order, or one block without a quarter")
    cap = release["annual_cap"]
    _require(cap is None or (positive_number(cap) and cap <= MAX_MU), f"{at}.annual_cap",
             f"must be null or a finite number > 0 and <= {MAX_MU:g}")


def _event_hash(event: dict) -> str:
    content = {k: v for k, v in event.items() if k != "hash"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _genesis(key: str) -> str:
    return hashlib.sha256(f"gedp ledger {LEDGER_VERSION} {key}".encode()).hexdigest()


def _replay(book: dict) -> dict[str, dict]:
    """Check the chain and every event; the releases by id, each with its status."""
    previous = _genesis(book["key"])
    releases: dict[str, dict] = {}
    _require(isinstance(book["events"], list), "events", "must be a list")
    for i, event in enumerate(book["events"]):
        at = f"events[{i}]"
        _require(isinstance(event, dict) and event.get("previous") == previous, at,
                 "does not follow the event before it (an event was removed, inserted or edited)")
        _require(event.get("hash") == _event_hash(event), f"{at}.hash",
                 "does not match the event's content (the event was edited)")
        kind = event.get("event")
        if kind == "reserve":
            _keys(event, at, ("event", "release", "previous", "hash"))
            _check_release(event["release"], f"{at}.release")
            _require(event["release"]["id"] not in releases, f"{at}.release.id", "repeats an earlier release's id")
            releases[event["release"]["id"]] = {**event["release"], "status": PENDING}
        else:
            _keys(event, at, ("event", "release_id", "date_utc", "previous", "hash"))
            _require(kind in ("commit", "clear"), f"{at}.event", "must be reserve, commit or clear")
            _require(_is_date(event["date_utc"]), f"{at}.date_utc", "must be an ISO date and time")
            release = releases.get(event["release_id"])
            _require(release is not None and release["status"] == PENDING, f"{at}.release_id",
                     "must name a pending release")
            assert release is not None
            release["status"] = COMMITTED if kind == "commit" else CLEARED
        previous = event["hash"]
    _require(book["head"] == previous, "head", "is not the last event's hash (the last events were removed)")
    return releases


def keys_folder(path: Path) -> Path:
    """The folder of a ledger's key files (one per release: its establishments' sorted keyed hashes)."""
    return path.with_name(path.name + ".keys")


def _check_key_files(path: Path, releases: dict[str, dict]) -> None:
    """Every live release's key file exists and matches its digest; every key file belongs to a release."""
    folder = keys_folder(path)
    files = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    for name in sorted(files):
        _require(name.endswith(".u64") and name[:-4] in releases, f"key file '{name}'",
                 "belongs to no release of the ledger (was a release removed from it? if a run crashed while "
                 "reserving that release, remove the file)")
    for release_id, release in releases.items():
        if release["status"] == CLEARED:
            continue
        _require(f"{release_id}.u64" in files and file_sha256(folder / f"{release_id}.u64") == release["keys_sha256"],
                 f"key file of release {release_id}", "is missing or was changed")
        quarters = release.get("quarters") or [[None, release["establishments"]]]
        _require((folder / f"{release_id}.u64").stat().st_size == 8 * sum(count for _, count in quarters),
                 f"release {release_id}'s quarters", "do not hold its key file's establishments")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _parse(path: Path) -> dict:
    book = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=unique_pairs)
    _require(isinstance(book, dict) and type(book.get("version")) is int, "the ledger", "must have a version")
    _require(book["version"] == LEDGER_VERSION, "version", f"is {book['version']}: this gedp reads ledger version "
             f"{LEDGER_VERSION} only (earlier ledgers were keyed on file digests, not establishments, and cannot be "
             "converted: start a new ledger and keep the old one as the record of earlier releases)")
    _keys(book, "the ledger", LEDGER_KEYS)
    _require(isinstance(book["key"], str) and bool(KEY.fullmatch(book["key"])), "key", "must be 16 URL-safe characters")
    _require(book["key_check"] == _key_check(book["key"]), "key_check",
             "does not match the key (the key was changed, or this gedp hashes establishments differently)")
    _require(isinstance(book["head"], str) and bool(HASH.fullmatch(book["head"])), "head",
             "must be a SHA-256 hex digest")
    book["releases"] = _replay(book)
    _check_key_files(path, book["releases"])
    return book


def read_ledger(path: str | Path, *, missing_ok: bool = False) -> dict:
    """The ledger at ``path``, its chain and key files checked, with ``releases`` (by id, with their
    status) derived from its events (``missing_ok``: an absent file is a new, empty ledger)."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            key = secrets.token_urlsafe(12)
            return {"version": LEDGER_VERSION, "key": key, "key_check": _key_check(key), "events": [],
                    "head": _genesis(key), "releases": {}}
        raise InputError(f"ledger '{path}' does not exist")
    try:
        return _parse(path)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, _Damaged) as err:
        if isinstance(err, OSError):
            reason = f"cannot be read ({err.strerror})"
        elif isinstance(err, _Damaged):
            reason = str(err)
        else:
            reason = f"not UTF-8 JSON ({type(err).__name__})"
        raise InputError(f"ledger '{path}' is damaged or not a gedp ledger: {reason}; it was not changed "
                         "(restore it from a backup: gedp never resets a ledger)") from None


def append_event(book: dict, event: dict) -> None:
    event = {**event, "previous": book["head"]}
    event["hash"] = _event_hash(event)
    book["events"].append(event)
    book["head"] = event["hash"]


def _write(path: Path, book: dict) -> None:
    """Replace the ledger file atomically (a complete temporary file, synced, then renamed). The
    temporary file is made anew (``O_EXCL``, never through a symbolic link): one left by a killed run,
    or a link planted in its place, is removed first, not written through."""
    staging = path.with_name(f".{path.name}.partial")
    content = {key: book[key] for key in LEDGER_KEYS}
    try:
        staging.unlink(missing_ok=True)
        made = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with open(made, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(content, indent=1, allow_nan=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def save_ledger(path: Path, book: dict) -> None:
    try:
        _write(path, book)
    except OSError as err:
        raise InputError(f"cannot write ledger '{path}' ({err.strerror or type(err).__name__})") from None


@contextmanager
def locked_ledger(path: Path, *, missing_ok: bool = False) -> Iterator[dict]:
    """Check the ledger, then hold its exclusive lock and yield it read again under the lock. The
    lock file ``FILE.lock`` lives only while a process holds it (removed before the lock is let
    go), so none is left beside the ledger, nor beside a ledger a refused first release never made.
    The lock is waited for with a deadline (``gedp.accounting.lock_wait``): a process that holds it and
    hangs makes the others fail with a one-line ``LockTimeout``, the ledger not changed."""
    path = check_ledger_path(path)
    read_ledger(path, missing_ok=missing_ok)  # refused before a lock file is created beside it
    lock = path.with_name(path.name + ".lock")
    handle = _lock_file(lock, path)
    try:
        os.ftruncate(handle, 0)  # who holds the lock, for a process waiting for it (LockWait's line)
        os.write(handle, f"process {os.getpid()} on {_host()} since {utc_now()}\n".encode())
        yield read_ledger(path, missing_ok=missing_ok)
    finally:
        _remove_own(lock, handle)  # still held: a process waiting for it finds it gone and retries
        os.close(handle)  # lets the lock go


def _remove_own(lock: Path, handle: int) -> None:
    """Remove the lock file ``lock`` if it is still the one open as ``handle``: one removed by hand
    while held may have been made again and locked by another process, whose lock stays."""
    try:
        if os.path.samestat(os.stat(lock, follow_symlinks=False), os.fstat(handle)):
            lock.unlink()
    except FileNotFoundError:
        pass


def _lock_file(lock: Path, path: Path) -> int:
    """The descriptor of the lock file ``lock``, exclusively locked: taken again when the file was
    removed (by the process that held it) between its opening and the lock, so that two processes never
    hold locks on two files of that name. Waited for under one deadline (``LockWait``). Only a regular
    file is opened (``open_lock_file``: a symbolic link or FIFO planted there is refused)."""
    wait = LockWait(lock, "the ledger's lock", f"if that process is hung, stop it and run again (a release it "
                    f"left pending is cleared with gedp ledger clear); ledger '{path}' was not changed",
                    lambda: _holder(lock))
    while True:
        try:
            handle = open_lock_file(lock)
        except OSError as err:
            raise InputError(f"cannot lock ledger '{path}' ({err.strerror or type(err).__name__})") from None
        try:
            wait.take(handle, fcntl.LOCK_EX)
            if os.path.samestat(os.stat(lock, follow_symlinks=False), os.fstat(handle)):
                return handle
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(handle)
            raise
        os.close(handle)


def _host() -> str:
    """This machine's name as a lock file states it (``HOLDER``'s characters; "unknown" otherwise)."""
    name = socket.gethostname()
    return name if re.fullmatch(r"[A-Za-z0-9.-]{1,253}", name) else "unknown"


def _holder(lock: Path) -> str:
    """" (held by process N on HOST since DATE)", as its holder wrote it into the lock file ("" when it
    cannot be read, or is not a regular file; HOST left out when the line has none)."""
    try:
        handle = open_lock_file(lock, os.O_RDONLY)
    except (OSError, InputError):
        return ""
    with open(handle, "rb") as file:
        found = HOLDER.fullmatch(file.read(200).decode("ascii", "replace").strip())
    if not found:
        return ""
    return f" (held by process {found[1]}{f' on {found[2]}' if found[2] else ''} since {found[3]})"


def live(book: dict) -> list[dict]:
    """The releases that count: pending and committed, in the order they were reserved."""
    return [r for r in book["releases"].values() if r["status"] != CLEARED]
