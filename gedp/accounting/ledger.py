"""The lifetime budget ledger: accounts per establishment, composed over every release that includes it.

A ledger is a JSON file kept by the agency (never published), with a folder of key files beside it
(``FILE.keys/``). Budget is spent per establishment: every release records the set of establishments
it includes, as the sorted 64-bit keyed hashes (SipHash-2-4 under the ledger's secret key) of their
normalized ``estab_id``: its account text (``gedp.synth.schema.account_ids``: 1002, 1002.0,
"1002.0", "+1002", "1.002e3", fullwidth "１００２" and a decimal 1002.00 are all "1002"; invisible and
non-ASCII characters refused), upper case, leading zeros removed; a normalization
that can only merge two accounts, never split one. A new release is admitted only if, for every
establishment it includes, sqrt(earlier spending^2 + this release's charge^2) stays within
that establishment's cap. An edited copy, a subset, a superset or the next quarter of the same
establishments draws on the same accounts, whatever else changed in the file.

A release records its quarters (``gedp.accounting.quarters``): its key file holds each quarter's sorted keys in
turn, and an establishment in k of them is charged sqrt(k) times the release's charge. Beside the
lifetime cap, an optional annual cap bounds every 4 consecutive quarters; a release recorded
without quarters (an input without ``year`` and ``qtr``) counts in every year.

The charge is in the account's terms. The ledger records psi and, per attribute, the gamma of the
first release that measured it; psi-neighbours differ in every attribute at once, so an
establishment's charge composes its attributes' charges, sqrt(sum over queries and attributes of
mu^2), as the release's own total does. A query of mu' under gamma' (the account's gamma is gamma):

* gamma' >= gamma: mu'. Records psi-close for gamma are psi-close for gamma'.
* gamma' < gamma, psi-mechanism (Gaussian noise on the psi scale, sd gamma'/mu'): mu' gamma/gamma'
  exactly: two records psi-close for gamma differ by at most gamma on the psi scale, so their
  outputs are mu' gamma/gamma' apart in sd units.
* gamma' < gamma, pnc: mu' ceil(gamma/gamma') by group privacy: between psi(x) and psi(x') at most
  gamma apart lie k = ceil(gamma/gamma') - 1 points splitting it into k + 1 steps of at most gamma'
  (psi is continuous and increasing on [0, inf), so every point is psi of a value), and a mechanism
  that is mu'-GDP for each step is (k + 1) mu'-GDP for the pair.

A release under another psi is refused. A cap is a finite number in (0, 100]: mu 100 already hides
nothing (budget.MAX_MU), and a cap beyond it would read as a limit while allowing exact releases.
An establishment's cap is the one recorded with the first release that included it; a release
whose establishments are all new needs ``--lifetime-cap`` (or ``--dataset-id`` of a dataset whose
cap the ledger records).

The ledger is an append-only chain of events (reserve, commit, clear), each holding the SHA-256 of
the previous event and of its own content; the file's head is the last event's hash and every key
file must belong to a release and match its digest, so an edited, reordered or deleted event, or
a deleted release, is detected when the ledger is read and the ledger is refused. (Someone who
recomputes every hash and removes a key file is not detected by the file alone: keep the head gedp
prints after each release elsewhere.) A release goes through the ledger in two steps, each under an
exclusive ``fcntl`` lock on ``FILE.lock``, created only beside a ledger path that was accepted and
removed when the lock is let go:

1. :func:`reserve`, before any noise is drawn: check the caps and record the release as pending.
2. :func:`commit`, when the release is complete in its staging directory: mark it committed, before
   the manifest is written and the folder moved into place.

A pending release keeps counting until an operator removes it with :func:`clear` (``gedp ledger
clear``). A damaged ledger is refused and never reset or rewritten.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from gedp.accounting.quarters import check_begun, quarter_index, window_name, window_spending, windows
from gedp.measure.budget import MAX_MU, compose
from gedp.measure.queries import IDENTITY
from gedp.measure.workflows import MeasurementPlan
from gedp.synth.panel import QUARTER_PATTERN
from gedp.synth.schema import InputError, account_ids, canonical_ids

LEDGER_VERSION = 3
PENDING, COMMITTED, CLEARED = "pending", "committed", "cleared"
DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LEDGER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,122}\.json")
HASH = re.compile(r"[0-9a-f]{64}")
RELEASE_ID = re.compile(r"[0-9a-f]{16}")
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
#: Relative tolerance of cap comparisons (the composed spending is a float sum).
TOLERANCE = 1e-12


def check_cap(cap: float, option: str = "--lifetime-cap") -> float:
    """A lifetime (or, with ``option``, annual) cap: a finite number in (0, MAX_MU]."""
    if not _positive(cap) or cap > MAX_MU:
        raise InputError(f"{option} ({_shown(cap)}) must be a finite number > 0 and <= {MAX_MU:g} "
                         f"(mu {MAX_MU:g} already hides nothing)")
    return float(cap)


def check_dataset_id(name: str) -> str:
    """A dataset id: 1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit."""
    if not (isinstance(name, str) and DATASET_ID.fullmatch(name)):
        raise InputError(f"--dataset-id ({_shown(name)}) must be 1-64 ASCII letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


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
    """The sorted distinct keyed 64-bit hashes of normalized estab_ids (see the module docstring)."""
    ids = pc.utf8_ltrim(account_ids(pd.Series(estab_ids)), characters="0")
    hashes = np.sort(pd.util.hash_array(ids.to_numpy(zero_copy_only=False), hash_key=key, categorize=False))
    return hashes[np.concatenate(([True], hashes[1:] != hashes[:-1]))].astype("<u8")


def _key_check(key: str) -> str:
    return f"{int(establishment_keys([KEY_CHECK_TEXT], key)[0]):016x}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive(value: object) -> bool:
    """A finite number > 0 (JSON's int or float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float
        return False


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def gamma_factor(account_gamma: float, gamma: float, gaussian_on_psi: bool) -> float:
    """How many times its mu a query under ``gamma`` costs in an account of ``account_gamma``."""
    if gamma >= account_gamma:
        return 1.0
    ratio = account_gamma / gamma
    return ratio if gaussian_on_psi else float(math.ceil(ratio * (1 - TOLERANCE)))


def plan_charges(plan: MeasurementPlan, account_gammas: dict[str, float]) -> dict[str, float]:
    """Per attribute: the plan's queries composed in the account's terms (attributes the account does
    not know yet are charged under the plan's own gamma)."""
    charges: dict[str, list[float]] = {}
    for query in plan.queries:
        gaussian_on_psi = plan.workflow == "psi" or query.by == IDENTITY
        for attribute, mu in query.mu.items():
            gamma = plan.gammas[attribute]
            factor = gamma_factor(account_gammas.get(attribute, gamma), gamma, gaussian_on_psi)
            charges.setdefault(attribute, []).append(mu * factor)
    return {attribute: compose(mus) for attribute, mus in charges.items()}


@dataclass(frozen=True)
class Reservation:
    """A pending release: its ledger, id, and for its most spent establishment (by lifetime spending
    to cap) the cap, the earlier spending and this release's charge to it (``charged``: sqrt(k) mu
    for an establishment in k of its quarters); its charge per quarter in the account's terms
    (``mu``) and what that charge is made of; its quarters (None: none), the annual cap and the
    largest spending of a rolling year after it (None without an annual cap); the release's largest
    charge to one establishment (sqrt(k) mu for one in the most quarters, k; a panel's charge)."""

    path: Path
    release_id: str
    cap: float
    spent_before: float
    mu: float
    mu_planned: float
    charges: dict[str, float]
    psi: dict
    gammas: dict[str, float]
    charged: float
    quarters: tuple[str | None, ...] = (None,)
    annual_cap: float | None = None
    annual_spent_after: float | None = None
    largest_charge: float = 0.0

    @property
    def spent_after(self) -> float:
        return compose([self.spent_before, self.charged])

    def summary(self) -> dict:
        """The lifetime figures a release manifest shows (no path, no key, no hash)."""
        return {"lifetime_cap": self.cap, "spent_before": self.spent_before, "spent_after": self.spent_after,
                "mu": self.mu, "mu_planned": self.mu_planned, "charges": self.charges,
                "account": {"psi": self.psi, "gammas": self.gammas}, "release_id": self.release_id,
                "quarters": [q for q in self.quarters if q is not None], "annual_cap": self.annual_cap,
                "annual_spent_after": self.annual_spent_after, "largest_charge": self.largest_charge}

    def pending_note(self) -> str:
        """What an operator must know when the release failed after it was reserved."""
        return (f"nothing was published; release {self.release_id} stays pending in ledger '{self.path}' and counts "
                f"against the lifetime cap until `gedp ledger clear --ledger {self.path} --release {self.release_id}`")


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
    _require(isinstance(value, dict) and len(value) > 0 and all(isinstance(k, str) and _positive(v)
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
    _require(_positive(release["lifetime_cap"]) and release["lifetime_cap"] <= MAX_MU, f"{at}.lifetime_cap",
             f"must be a finite number > 0 and <= {MAX_MU:g}")
    _require(isinstance(release["psi"], dict) and isinstance(release["psi"].get("name"), str), f"{at}.psi",
             "must be a psi's name and parameters")
    for field in ("gammas", "charges"):
        _mus(release[field], f"{at}.{field}")
    for field in ("mu", "mu_planned"):
        _require(_positive(release[field]), f"{at}.{field}", "must be a finite number > 0")
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
    _require(cap is None or (_positive(cap) and cap <= MAX_MU), f"{at}.annual_cap",
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
        _require(f"{release_id}.u64" in files and _file_sha256(folder / f"{release_id}.u64") == release["keys_sha256"],
                 f"key file of release {release_id}", "is missing or was changed")
        quarters = release.get("quarters") or [[None, release["establishments"]]]
        _require((folder / f"{release_id}.u64").stat().st_size == 8 * sum(count for _, count in quarters),
                 f"release {release_id}'s quarters", "do not hold its key file's establishments")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _unique_pairs(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in one object")
    return dict(pairs)


def _parse(path: Path) -> dict:
    book = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=_unique_pairs)
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


def _append(book: dict, event: dict) -> None:
    event = {**event, "previous": book["head"]}
    event["hash"] = _event_hash(event)
    book["events"].append(event)
    book["head"] = event["hash"]


def _write(path: Path, book: dict) -> None:
    """Replace the ledger file atomically (a complete temporary file, synced, then renamed)."""
    staging = path.with_name(f".{path.name}.partial")
    content = {key: book[key] for key in LEDGER_KEYS}
    try:
        with open(staging, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(content, indent=1, allow_nan=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def _save(path: Path, book: dict) -> None:
    try:
        _write(path, book)
    except OSError as err:
        raise InputError(f"cannot write ledger '{path}' ({err.strerror or type(err).__name__})") from None


@contextmanager
def _locked(path: Path, *, missing_ok: bool = False) -> Iterator[dict]:
    """Check the ledger, then hold its exclusive lock and yield it read again under the lock. The
    lock file ``FILE.lock`` lives only while a process holds it (removed before the lock is let
    go), so none is left beside the ledger, nor beside a ledger a refused first release never made."""
    path = check_ledger_path(path)
    read_ledger(path, missing_ok=missing_ok)  # refused before a lock file is created beside it
    lock = path.with_name(path.name + ".lock")
    handle = _lock_file(lock, path)
    with handle:
        try:
            yield read_ledger(path, missing_ok=missing_ok)
        finally:
            lock.unlink(missing_ok=True)  # still held: a process waiting for it finds it gone and retries
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_file(lock: Path, path: Path):
    """The open lock file ``lock``, exclusively locked: taken again when the file was removed (by the
    process that held it) between its opening and the lock, so that two processes never hold locks on
    two files of that name."""
    while True:
        try:
            handle = open(lock, "a")
        except OSError as err:
            raise InputError(f"cannot lock ledger '{path}' ({err.strerror or type(err).__name__})") from None
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle
        except FileNotFoundError:
            pass
        handle.close()


def live(book: dict) -> list[dict]:
    """The releases that count: pending and committed, in the order they were reserved."""
    return [r for r in book["releases"].values() if r["status"] != CLEARED]


def release_keys(path: Path, release_id: str) -> np.ndarray:
    """A release's establishment keys, from its key file: each quarter's sorted keys in turn."""
    return np.fromfile(keys_folder(path) / f"{release_id}.u64", dtype="<u8")


def release_blocks(path: Path, release: dict) -> list[tuple[str | None, np.ndarray]]:
    """A release's quarters, each with its establishments' sorted keys (one block labelled None for a
    release without quarters)."""
    keys = release_keys(path, release["id"])
    quarters = release.get("quarters") or [[None, len(keys)]]
    ends = np.cumsum([count for _, count in quarters])
    return [(label, block) for (label, _), block in zip(quarters, np.split(keys, ends[:-1]))]


def release_charge(path: Path, release: dict) -> float:
    """A release's largest charge to one establishment: sqrt(k) x its charge per quarter (``mu``) for an
    establishment in k of its quarters, k the most of any (1 for a release of one quarter or none),
    from its key file; the figure its manifest states as its charge (``lifetime.largest_charge``)."""
    blocks = [block for _, block in release_blocks(path, release)]
    if len(blocks) == 1:
        return float(release["mu"])
    _, counts = np.unique(np.concatenate(blocks), return_counts=True)
    return math.sqrt(int(counts.max(initial=1))) * float(release["mu"])


def _members(block: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are in the sorted ``block``."""
    if len(block) == 0:
        return np.zeros(len(keys), dtype=bool)
    found = np.searchsorted(block, keys).clip(max=len(block) - 1)
    return block[found] == keys


@dataclass
class Spending:
    """For each key: its squared spending per quarter over the live releases (None: releases without
    quarters), and its recorded lifetime and annual caps (NaN where none is recorded)."""

    by_quarter: dict[str | None, np.ndarray]
    caps: np.ndarray
    annual_caps: np.ndarray

    @property
    def lifetime(self) -> np.ndarray:
        """Per key: the squared spending of every quarter."""
        return sum(self.by_quarter.values(), np.zeros(len(self.caps)))


def spending(path: Path, book: dict, keys: np.ndarray) -> Spending:
    """The live releases' spending of each key's account, quarter by quarter, and its recorded caps."""
    result = Spending({}, np.full(len(keys), np.nan), np.full(len(keys), np.nan))
    for release in live(book):
        for label, block in release_blocks(path, release):
            shared = _members(block, keys)
            result.by_quarter.setdefault(label, np.zeros(len(keys)))[shared] += release["mu"] ** 2
            result.caps[shared] = np.fmin(result.caps[shared], release["lifetime_cap"])
            if release.get("annual_cap") is not None:
                result.annual_caps[shared] = np.fmin(result.annual_caps[shared], release["annual_cap"])
    return result


def _account(book: dict, plan: MeasurementPlan) -> tuple[dict, dict[str, float]]:
    """The account's psi and gammas (the plan's where the ledger records none); another psi is refused."""
    psi = plan.psi.params()
    gammas: dict[str, float] = {}
    for release in live(book):
        if release["psi"] != psi:
            raise InputError(f"release refused: the ledger's accounts are kept under psi {release['psi']}, this "
                             f"release uses psi {psi}; a release under another psi cannot be charged in the "
                             "accounts' terms (use the ledger's psi, or another ledger for other establishments)")
        for attribute, gamma in release["gammas"].items():
            gammas.setdefault(attribute, gamma)
    gammas.update({a: plan.gammas[a] for a in plan.attributes if a not in gammas})
    return psi, {a: gammas[a] for a in plan.attributes}


def _release_cap(book: dict, cap: float | None, dataset_id: str | None, caps: np.ndarray, *,
                 field: str = "lifetime_cap", option: str = "--lifetime-cap", required: bool = True) -> np.ndarray:
    """Each establishment's cap (``field``): the recorded one, else the given or the dataset's; refuses
    a cap other than the recorded one, and (``required``) new establishments without a cap. NaN: no cap."""
    what = field.replace("_", " ")
    if dataset_id is not None:
        named = {r.get(field) for r in live(book) if r["dataset_id"] == dataset_id} - {None}
        recorded = min(named) if named else None
        if recorded is not None and cap is not None and abs(cap - recorded) > TOLERANCE * recorded:
            raise InputError(f"the ledger records {what} {recorded} for dataset '{dataset_id}', not {cap}")
        cap = recorded if cap is None else cap
    known = caps[~np.isnan(caps)]
    other = known[np.abs(known - cap) > TOLERANCE * known] if cap is not None else known[:0]
    if len(other):
        raise InputError(f"the ledger records {what} {float(other[0])} for establishments of this release, not "
                         f"{cap} (a cap is kept for good once recorded)")
    if required and cap is None and len(known) < len(caps):
        who = "these establishments are" if dataset_id is None else f"dataset '{dataset_id}' is"
        raise InputError(f"{who} new to the ledger: give the dataset's {option}")
    return np.where(np.isnan(caps), np.nan if cap is None else cap, caps)


def _blocks(estab_ids: Iterable[str] | pd.Series, quarters: Iterable[str] | pd.Series | None,
            key: str) -> dict[str | None, np.ndarray]:
    """A release's establishments' sorted keys per quarter, quarters in order (None: no quarters)."""
    if quarters is None:
        return {None: establishment_keys(estab_ids, key)}
    frame = pd.DataFrame({"estab_id": canonical_ids(pd.Series(estab_ids)).to_numpy(),
                          "quarter": pd.Series(quarters).astype(str).to_numpy()})
    labels = sorted(frame["quarter"].unique(), key=quarter_index)
    return {label: establishment_keys(frame.loc[frame["quarter"] == label, "estab_id"], key) for label in labels}


@dataclass(frozen=True)
class Budget:
    """One account every establishment of a release is checked against: its lifetime, or a rolling
    year (``name``); squared spending before the release, the release's squared charge, the cap."""

    name: str
    spent2: np.ndarray
    charge2: np.ndarray
    cap: np.ndarray

    def ratios(self) -> np.ndarray:
        """Spending after the release over the cap (0 without a cap)."""
        return np.nan_to_num(np.sqrt(self.spent2 + self.charge2) / self.cap, nan=0.0)


def _budgets(spent: Spending, present: dict[str | None, np.ndarray], mu: float, caps: np.ndarray,
             annual_caps: np.ndarray) -> list[Budget]:
    """The lifetime account and every rolling year the release touches (those around every recorded
    quarter when the release, or an earlier one, has no quarters: it counts in every year)."""
    count = sum(present.values(), np.zeros(len(caps)))
    budgets = [Budget("lifetime", spent.lifetime, mu * mu * count, caps)]
    if np.isnan(annual_caps).all():
        return budgets
    labels = [label for label in present if label is not None]
    if None in present or None in spent.by_quarter:
        labels += [label for label in spent.by_quarter if label is not None]
    for window in windows(labels) or [()]:
        inside = [members for label, members in present.items() if label is None or quarter_index(label) in window]
        budgets.append(Budget(window_name(window) if window else "any year",
                              window_spending(spent.by_quarter, window, len(caps)),
                              mu * mu * sum(inside, np.zeros(len(caps))), annual_caps))
    return budgets


def _refusal(budget: Budget, at: int, releases: int) -> InputError:
    """Why a release is refused by the account that binds (what is left, what it needs)."""
    spent, cap, needs = math.sqrt(budget.spent2[at]), float(budget.cap[at]), math.sqrt(budget.charge2[at])
    left = math.sqrt(max(cap * cap - spent * spent, 0.0))
    which = "lifetime cap" if budget.name == "lifetime" else "annual cap"
    year = "" if budget.name == "lifetime" else f" in the year {budget.name}"
    return InputError(f"release refused: it would take establishments of this release over their {which} "
                      f"{cap:.4f}{year}: they have mu {left:.4f} of {cap:.4f} left (spent {spent:.4f} in {releases} "
                      f"earlier release(s) of the ledger); this release needs its charge {needs:.4f} in the "
                      f"accounts' terms (sqrt({spent:.4f}^2 + {needs:.4f}^2) = {math.hypot(spent, needs):.4f})")


def reserve(path: str | Path, estab_ids: Iterable[str] | pd.Series, plan: MeasurementPlan, *,
            quarters: Iterable[str] | pd.Series | None = None, cap: float | None = None,
            annual_cap: float | None = None, dataset_id: str | None = None, config: str = "") -> Reservation:
    """Under the lock: check that the release fits every cap of every establishment it includes and
    record it as pending (it counts from now on). Call before any noise is drawn.

    Args:
        estab_ids: the release's establishments (every row of the input).
        plan: the measurement plan of each quarter; its charge is computed in the accounts' terms.
        quarters: each row's quarter label (``YYYYQn``; None: the release has no quarter). An
            establishment in k of the release's quarters is charged sqrt(k) times the plan's charge.
        cap: the lifetime cap of establishments new to the ledger; a recorded cap cannot change.
        annual_cap: the cap of every 4 consecutive quarters (``gedp.accounting.quarters``), recorded as the
            lifetime cap is; establishments without one have none.
        dataset_id: a name that recalls the caps the ledger records (it never resets an account).

    Raises:
        InputError: over a cap, another psi, a bad cap, quarter, id or ledger path, a damaged ledger,
        or a ledger that cannot be written.
    """
    cap = None if cap is None else check_cap(cap)
    annual_cap = None if annual_cap is None else check_cap(annual_cap, "--annual-cap")
    dataset_id = None if dataset_id is None else check_dataset_id(dataset_id)
    path = check_ledger_path(path)
    with _locked(path, missing_ok=True) as book:
        blocks = _blocks(estab_ids, quarters, book["key"])
        check_begun(label for label in blocks if label is not None)
        keys = np.unique(np.concatenate(list(blocks.values())))
        psi, gammas = _account(book, plan)
        charges = plan_charges(plan, gammas)
        mu = compose(charges.values())
        spent = spending(path, book, keys)
        caps = _release_cap(book, cap, dataset_id, spent.caps)
        annual = _release_cap(book, annual_cap, dataset_id, spent.annual_caps, field="annual_cap",
                              option="--annual-cap", required=False)
        budgets = _budgets(spent, {label: _members(block, keys) for label, block in blocks.items()}, mu, caps, annual)
        worst = max(budgets, key=lambda budget: float(np.max(budget.ratios())))
        at = int(np.argmax(worst.ratios()))
        if worst.ratios()[at] > 1 + TOLERANCE:
            raise _refusal(worst, at, len(live(book)))
        most = int(np.argmax(budgets[0].ratios()))
        years = budgets[1:]
        reservation = Reservation(
            path, secrets.token_hex(8), float(caps[most]), float(np.sqrt(budgets[0].spent2[most])), mu,
            plan.budget().total, charges, psi, gammas, float(np.sqrt(budgets[0].charge2[most])), tuple(blocks),
            None if np.isnan(annual).all() else float(np.nanmin(annual)),
            max((float(np.max(np.sqrt(y.spent2 + y.charge2))) for y in years), default=None),
            float(np.sqrt(np.max(budgets[0].charge2))))
        _record(path, book, blocks, reservation, dataset_id, config, caps)
    return reservation


def _record(path: Path, book: dict, blocks: dict[str | None, np.ndarray], reservation: Reservation,
            dataset_id: str | None, config: str, caps: np.ndarray) -> None:
    """Write the release's key file (each quarter's keys in turn), then its reserve event."""
    folder = keys_folder(path)
    keys_file = folder / f"{reservation.release_id}.u64"
    try:
        folder.mkdir(exist_ok=True)
        with open(keys_file, "wb") as handle:
            for block in blocks.values():
                handle.write(block.tobytes())
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        raise InputError(f"cannot write ledger '{path}' ({err.strerror or type(err).__name__})") from None
    release = {"id": reservation.release_id, "dataset_id": dataset_id, "lifetime_cap": float(np.min(caps)),
               "psi": reservation.psi, "gammas": reservation.gammas, "charges": reservation.charges,
               "mu": reservation.mu, "mu_planned": reservation.mu_planned,
               "establishments": len(np.unique(np.concatenate(list(blocks.values())))),
               "keys_sha256": _file_sha256(keys_file), "date_utc": _now(), "config": config,
               "quarters": [[label, len(block)] for label, block in blocks.items()],
               "annual_cap": reservation.annual_cap}
    _append(book, {"event": "reserve", "release": release})
    try:
        _save(path, book)
    except InputError:
        keys_file.unlink(missing_ok=True)
        raise


def _find(book: dict, release_id: str) -> dict:
    release = book["releases"].get(release_id)
    if release is None or release["status"] == CLEARED:
        raise InputError(f"release '{_shown(release_id)}' is not in the ledger")
    return release


def commit(reservation: Reservation) -> None:
    """Under the lock: mark a pending release committed (before its manifest is written)."""
    with _locked(reservation.path) as book:
        release = _find(book, reservation.release_id)
        if release["status"] != PENDING:
            raise InputError(f"release {reservation.release_id} is not pending in the ledger")
        _append(book, {"event": "commit", "release_id": reservation.release_id, "date_utc": _now()})
        _save(reservation.path, book)


def clear(path: str | Path, release_id: str) -> dict:
    """Under the lock: clear a pending release (an operator's decision that it was never published)
    and remove its key file; returns the cleared release, with its ``charge`` (``release_charge``).
    Committed releases cannot be cleared."""
    path = check_ledger_path(path)
    with _locked(path) as book:
        release = _find(book, release_id)
        if release["status"] != PENDING:
            raise InputError(f"release {release_id} is {release['status']}: only a pending release can be cleared")
        charge = release_charge(path, release)
        _append(book, {"event": "clear", "release_id": release_id, "date_utc": _now()})
        _save(path, book)
    (keys_folder(path) / f"{release_id}.u64").unlink(missing_ok=True)
    return {**release, "charge": charge}


def largest_spending(path: str | Path, book: dict) -> tuple[float, float]:
    """The largest lifetime spending of any establishment of the ledger, and the smallest cap it meets
    (the worst spending-to-cap ratio over all accounts): (0, 0) for an empty ledger."""
    path = Path(path).resolve()
    releases = live(book)
    if not releases:
        return 0.0, 0.0
    keys = np.unique(np.concatenate([release_keys(path, r["id"]) for r in releases]))
    spent = spending(path, book, keys)
    worst = int(np.argmax(np.sqrt(spent.lifetime) / spent.caps))
    return float(np.sqrt(spent.lifetime[worst])), float(spent.caps[worst])
