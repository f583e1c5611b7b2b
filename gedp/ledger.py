"""The lifetime budget ledger: every release made from a dataset, composed across releases.

A ledger is a JSON file kept by the agency (never published). A dataset is known by the SHA-256
digest of its records (:func:`records_digest`: the validated records, not the files, so renamed,
copied, reordered or converted copies are one dataset), or by a name the agency declares with
``--dataset-id``, which ties the digests of the records released under it to one budget. The same
records are never recorded under two datasets, so a new name cannot start a fresh budget for them.

Releases compose as sqrt(sum of mu^2). A release goes through the ledger in two steps, each under
an exclusive ``fcntl`` lock on ``FILE.lock``:

1. :func:`reserve`, before any noise is drawn: check that the release fits the dataset's lifetime
   cap and record it as ``pending``. A pending release counts against the cap from then on, so two
   concurrent runs cannot both spend the last of the budget.
2. :func:`commit`, when the release is complete in its staging directory and before it is moved
   into place: mark it ``committed``. If this fails, nothing is published.

A pending release keeps counting until an operator removes it with :func:`clear` (``gedp ledger
clear``): a crash never gives budget back silently. Every field of a ledger is validated when it is
read; a damaged ledger is refused and never reset or rewritten.
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
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gedp.measure.budget import compose
from gedp.synth.schema import CONFIDENTIAL, DERIVED, InputError

LEDGER_VERSION = 2
#: Version tag of the canonical encoding hashed by :func:`records_digest` (part of every digest).
DIGEST_VERSION = "gedp-records-v1"
PENDING, COMMITTED = "pending", "committed"
DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DIGEST = re.compile(r"[0-9a-f]{64}")
RELEASE_ID = re.compile(r"[0-9a-f]{16}")
DATASET_KEYS = ("dataset_id", "digests", "lifetime_cap", "releases")
RELEASE_KEYS = ("id", "status", "mu", "date_utc", "config")
#: Relative tolerance of cap comparisons (the composed spending is a float sum).
TOLERANCE = 1e-12


def records_digest(microdata: pd.DataFrame) -> str:
    """SHA-256 of validated microdata in a canonical encoding (file names, format, row and column
    order, line endings and unknown columns do not change it).

    The encoding: rows sorted by ``estab_id`` (UTF-8 byte order), derived NAICS columns left out
    (functions of ``naics``), the other columns in name order. Each column is written as its name,
    its kind and the row count (``name\\0kind\\0rows\\0``), then its values: confidential attributes
    as IEEE-754 float64 little-endian (-0 as +0), every other column as text: each value's UTF-8
    byte length as int64 little-endian, then the values' UTF-8 bytes. The whole is prefixed with
    ``DIGEST_VERSION``.
    """
    ids = pa.array(microdata["estab_id"].astype(str), type=pa.large_string())
    order = pc.sort_indices(ids)
    positions = order.to_numpy()
    digest = hashlib.sha256(f"{DIGEST_VERSION}\n".encode())
    for name in sorted(c for c in microdata.columns if c not in DERIVED):
        column = microdata[name]
        if name in CONFIDENTIAL:
            kind = "f8"
            parts = [column.to_numpy(dtype="<f8")[positions] + 0.0]  # + 0.0 turns -0 into +0
        else:
            kind = "utf8"
            text = pc.take(pa.array(column.astype(str), type=pa.large_string()), order)
            if isinstance(text, pa.ChunkedArray):  # pandas' Arrow-backed strings
                text = text.combine_chunks()
            _, offsets, data = text.buffers()
            ends = np.frombuffer(offsets, dtype="<i8", count=len(text) + 1, offset=8 * text.offset)
            parts = [np.diff(ends).astype("<i8"),
                     memoryview(data)[ends[0]:ends[-1]] if data is not None else b""]
        digest.update(f"{name}\0{kind}\0{len(microdata)}\0".encode())
        for part in parts:
            digest.update(part)
    return digest.hexdigest()


def dataset_digest(state_digests: Mapping[str, str]) -> str:
    """The digest of a whole input from its states' :func:`records_digest`, in state-code order
    (every record has one state, so this depends on the records only)."""
    lines = "".join(f"{state} {state_digests[state]}\n" for state in sorted(state_digests))
    return hashlib.sha256(f"{DIGEST_VERSION} states\n{lines}".encode()).hexdigest()


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


def check_cap(cap: float) -> float:
    """A lifetime cap: a finite number > 0."""
    if not _positive(cap):
        raise InputError(f"--lifetime-cap ({_shown(cap)}) must be a finite number > 0")
    return float(cap)


def check_dataset_id(name: str) -> str:
    """A dataset id: 1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit."""
    if not (isinstance(name, str) and DATASET_ID.fullmatch(name)):
        raise InputError(f"--dataset-id ({_shown(name)}) must be 1-64 ASCII letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


@dataclass(frozen=True)
class Reservation:
    """A pending release: its ledger, id, the dataset's cap, what was spent before it, and its mu."""

    path: Path
    release_id: str
    cap: float
    spent_before: float
    mu: float

    @property
    def spent_after(self) -> float:
        return compose([self.spent_before, self.mu])

    def summary(self) -> dict:
        """The lifetime figures a release manifest shows (no path, no digest)."""
        return {"lifetime_cap": self.cap, "spent_before": self.spent_before, "spent_after": self.spent_after,
                "mu": self.mu, "release_id": self.release_id}

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


def _validate(ledger: object) -> None:
    """Check every field of every dataset and release (raises _Damaged naming the first bad one)."""
    _keys(ledger, "the ledger", ("version", "datasets"))
    _require(type(ledger["version"]) is int and ledger["version"] == LEDGER_VERSION, "version",
             f"must be {LEDGER_VERSION} (this gedp does not read ledgers of other versions)")
    _require(isinstance(ledger["datasets"], list), "datasets", "must be a list")
    names, digests, releases = set(), set(), set()
    for i, dataset in enumerate(ledger["datasets"]):
        where = f"datasets[{i}]"
        _keys(dataset, where, DATASET_KEYS)
        name = dataset["dataset_id"]
        _require(name is None or (isinstance(name, str) and bool(DATASET_ID.fullmatch(name)) and name not in names),
                 f"{where}.dataset_id", "must be null or a unique dataset id")
        if name is not None:
            names.add(name)
        listed = dataset["digests"]
        _require(isinstance(listed, list) and len(listed) >= 1 and (name is not None or len(listed) == 1),
                 f"{where}.digests", "must list one digest (several only under a dataset_id)")
        for j, digest in enumerate(listed):
            _require(isinstance(digest, str) and bool(DIGEST.fullmatch(digest)) and digest not in digests,
                     f"{where}.digests[{j}]", "must be a SHA-256 hex digest recorded under one dataset only")
            digests.add(digest)
        _require(_positive(dataset["lifetime_cap"]), f"{where}.lifetime_cap", "must be a finite number > 0")
        _require(isinstance(dataset["releases"], list), f"{where}.releases", "must be a list")
        for j, release in enumerate(dataset["releases"]):
            at = f"{where}.releases[{j}]"
            _keys(release, at, RELEASE_KEYS)
            _require(isinstance(release["id"], str) and bool(RELEASE_ID.fullmatch(release["id"]))
                     and release["id"] not in releases, f"{at}.id", "must be a unique 16-digit hex release id")
            releases.add(release["id"])
            _require(release["status"] in (PENDING, COMMITTED), f"{at}.status", f"must be {PENDING} or {COMMITTED}")
            _require(_positive(release["mu"]), f"{at}.mu", "must be a finite number > 0")
            _require(isinstance(release["date_utc"], str) and _is_date(release["date_utc"]), f"{at}.date_utc",
                     "must be an ISO date and time")
            _require(isinstance(release["config"], str), f"{at}.config", "must be text")


def _is_date(text: str) -> bool:
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _unique_pairs(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in one object")
    return dict(pairs)


def read_ledger(path: str | Path, *, missing_ok: bool = False) -> dict:
    """The ledger at ``path`` with every field validated (``missing_ok``: an absent file is an empty
    ledger). Anything else that is not a valid ledger is refused, never reset."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return {"version": LEDGER_VERSION, "datasets": []}
        raise InputError(f"ledger '{path}' does not exist")
    try:
        ledger = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constants,
                            object_pairs_hook=_unique_pairs)
        _validate(ledger)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, _Damaged) as err:
        if isinstance(err, OSError):
            reason = f"cannot be read ({err.strerror})"
        elif isinstance(err, _Damaged):
            reason = str(err)
        else:
            reason = f"not UTF-8 JSON ({type(err).__name__})"
        raise InputError(f"ledger '{path}' is damaged or not a gedp ledger: {reason}; it was not changed "
                         "(restore it from a backup: gedp never resets a ledger)") from None
    return ledger


def _write(path: Path, ledger: dict) -> None:
    """Replace the ledger file atomically (a complete temporary file, synced, then renamed)."""
    staging = path.with_name(f".{path.name}.partial")
    try:
        with open(staging, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(ledger, indent=2, allow_nan=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def _save(path: Path, ledger: dict) -> None:
    try:
        _write(path, ledger)
    except OSError as err:
        raise InputError(f"cannot write ledger '{path}' ({err.strerror or type(err).__name__})") from None


@contextmanager
def _locked(path: Path, *, missing_ok: bool = False) -> Iterator[dict]:
    """Hold the ledger's exclusive lock; yield the validated ledger."""
    if not (missing_ok or path.exists()):
        raise InputError(f"ledger '{path}' does not exist")
    try:
        handle = open(path.with_name(path.name + ".lock"), "a")
    except OSError as err:
        raise InputError(f"cannot lock ledger '{path}' ({err.strerror or type(err).__name__})") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield read_ledger(path, missing_ok=missing_ok)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def dataset_label(dataset: dict) -> str:
    """How messages name a dataset (never by its digest)."""
    return f"dataset '{dataset['dataset_id']}'" if dataset["dataset_id"] else "a dataset without an id"


def spent(dataset: dict) -> float:
    """The dataset's lifetime spending: its pending and committed releases composed."""
    return compose(release["mu"] for release in dataset["releases"])


def _dataset(ledger: dict, digest: str, dataset_id: str | None, cap: float | None) -> dict:
    """The ledger's entry for these records (created if new); refuses records recorded under another
    dataset, a new dataset without a cap, and a cap other than the recorded one."""
    datasets = ledger["datasets"]
    holder = next((d for d in datasets if digest in d["digests"]), None)
    entry = holder if dataset_id is None else next((d for d in datasets if d["dataset_id"] == dataset_id), None)
    if holder is not None and holder is not entry:
        hint = f"--dataset-id {holder['dataset_id']}" if holder["dataset_id"] else "no --dataset-id"
        raise InputError(f"these records are already in the ledger as {dataset_label(holder)}; a new "
                         f"--dataset-id cannot give them a fresh budget (run with {hint})")
    if entry is None:
        if cap is None:
            what = "these records are" if dataset_id is None else f"dataset '{dataset_id}' is"
            raise InputError(f"{what} new to the ledger: give the dataset's --lifetime-cap")
        entry = {"dataset_id": dataset_id, "digests": [], "lifetime_cap": cap, "releases": []}
        datasets.append(entry)
    elif cap is not None and abs(cap - entry["lifetime_cap"]) > TOLERANCE * entry["lifetime_cap"]:
        raise InputError(f"the ledger records lifetime cap {entry['lifetime_cap']} for this dataset, not {cap}")
    if digest not in entry["digests"]:
        entry["digests"].append(digest)
    return entry


def reserve(path: str | Path, digest: str, mu: float, *, cap: float | None = None, dataset_id: str | None = None,
            config: str = "") -> Reservation:
    """Under the lock: check that a release of ``mu`` fits the dataset's lifetime cap and record it
    as pending (it counts from now on). Call before any noise is drawn.

    Args:
        digest: the records' digest (:func:`dataset_digest`).
        cap: the dataset's lifetime cap, needed the first time; later it must match the ledger's.
        dataset_id: a name for the dataset; records already recorded under another dataset are refused.

    Raises:
        InputError: over the cap, a bad cap or id, a damaged ledger, or a ledger that cannot be written.
    """
    path = Path(path).resolve()
    cap = None if cap is None else check_cap(cap)
    dataset_id = None if dataset_id is None else check_dataset_id(dataset_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the folder of ledger '{path}' ({err.strerror})") from None
    with _locked(path, missing_ok=True) as ledger:
        entry = _dataset(ledger, digest, dataset_id, cap)
        before = spent(entry)
        reservation = Reservation(path, secrets.token_hex(8), entry["lifetime_cap"], before, mu)
        if reservation.spent_after > reservation.cap * (1 + TOLERANCE):
            pending = sum(r["status"] == PENDING for r in entry["releases"])
            raise InputError(
                f"release refused: this dataset has spent mu {before:.4f} in {len(entry['releases'])} release(s) "
                f"({pending} pending); another {mu:.4f} makes {reservation.spent_after:.4f}, over its lifetime cap "
                f"{reservation.cap:.4f}")
        entry["releases"].append({
            "id": reservation.release_id,
            "status": PENDING,
            "mu": mu,
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "config": config,
        })
        _save(path, ledger)
    return reservation


def _find(ledger: dict, release_id: str) -> tuple[dict, dict]:
    for dataset in ledger["datasets"]:
        for release in dataset["releases"]:
            if release["id"] == release_id:
                return dataset, release
    raise InputError(f"release '{release_id}' is not in the ledger")


def commit(reservation: Reservation) -> None:
    """Under the lock: mark a pending release committed (just before it is moved into place)."""
    with _locked(reservation.path) as ledger:
        _, release = _find(ledger, reservation.release_id)
        if release["status"] != PENDING:
            raise InputError(f"release {reservation.release_id} is not pending in the ledger")
        release["status"] = COMMITTED
        _save(reservation.path, ledger)


def clear(path: str | Path, release_id: str) -> tuple[dict, dict]:
    """Under the lock: remove a pending release (an operator's decision that it was never
    published); returns its dataset and the removed entry. Committed releases cannot be removed."""
    path = Path(path).resolve()
    with _locked(path) as ledger:
        dataset, release = _find(ledger, release_id)
        if release["status"] != PENDING:
            raise InputError(f"release {release_id} is {release['status']}: only a pending release can be cleared")
        dataset["releases"].remove(release)
        _save(path, ledger)
    return dataset, release
