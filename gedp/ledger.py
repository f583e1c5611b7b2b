"""The lifetime budget ledger: every release made from a dataset, composed across releases.

A ledger is a JSON file kept by the agency (never published). Each release of a dataset (known by
the SHA-256 fingerprint of its input files) adds its mu; releases compose as sqrt(sum of mu^2) and
a release that would take the dataset past its lifetime cap is refused before any noise is drawn.
The ledger is locked (an exclusive ``fcntl`` lock on ``FILE.lock``) from the check until the
release is recorded, so two concurrent runs cannot both spend the last of the budget: the second
waits, then sees the first's spending.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from measure.budget import compose
from synth.schema import InputError

LEDGER_VERSION = 1


def fingerprint(path: str | Path) -> str:
    """SHA-256 of an input file, or of a folder's files in name order (names included)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass
class Reservation:
    """What the ledger allows for one release: the dataset, what it spent before, and the cap."""

    path: Path
    dataset: str
    cap: float
    spent_before: float
    mu: float

    @property
    def spent_after(self) -> float:
        return compose([self.spent_before, self.mu])

    def summary(self) -> dict:
        """The lifetime figures a release manifest may show (no fingerprint: it stays in the ledger)."""
        return {"ledger": str(self.path), "lifetime_cap": self.cap, "spent_before": self.spent_before,
                "spent_after": self.spent_after}


def _read(path: Path) -> dict:
    if not path.exists() or path.stat().st_size == 0:
        return {"version": LEDGER_VERSION, "datasets": {}}
    try:
        ledger = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"ledger '{path}' is not valid JSON ({err}); it was not changed") from None
    if ledger.get("version") != LEDGER_VERSION or not isinstance(ledger.get("datasets"), dict):
        raise InputError(f"ledger '{path}' is not a gedp ledger (version {LEDGER_VERSION})")
    return ledger


def _write(path: Path, ledger: dict) -> None:
    staging = path.with_name(f".{path.name}.partial")
    staging.write_text(json.dumps(ledger, indent=2) + "\n")
    os.replace(staging, path)


@contextmanager
def reserve(path: str | Path, input_path: str | Path, mu: float, cap: float | None, config: str) -> Iterator[Reservation]:
    """Lock the ledger, check that ``mu`` fits the dataset's lifetime cap, and record the release
    when the block completes (nothing is recorded if it fails).

    Raises:
        InputError: the release would exceed the lifetime cap, no cap is known for a new dataset, or
            the cap given differs from the one recorded.
    """
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset = fingerprint(input_path)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            ledger = _read(path)
            entry = ledger["datasets"].get(dataset)
            if entry is None:
                if cap is None:
                    raise InputError(f"dataset {input_path} is new to ledger '{path}': give its --lifetime-cap")
                entry = {"lifetime_cap": cap, "releases": []}
            elif cap is not None and abs(cap - entry["lifetime_cap"]) > 1e-12:
                raise InputError(f"ledger '{path}' records lifetime cap {entry['lifetime_cap']} for this dataset, "
                                 f"not {cap}")
            spent = compose(r["mu"] for r in entry["releases"])
            reservation = Reservation(path, dataset, entry["lifetime_cap"], spent, mu)
            if reservation.spent_after > reservation.cap * (1 + 1e-12):
                raise InputError(
                    f"release refused: this dataset has spent mu {spent:.4f} in {len(entry['releases'])} release(s); "
                    f"another {mu:.4f} makes {reservation.spent_after:.4f}, over its lifetime cap {entry['lifetime_cap']:.4f}"
                )
            yield reservation
            entry["releases"].append({
                "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "mu": mu,
                "spent_after": reservation.spent_after,
                "config": config,
                "input": str(input_path),
            })
            ledger["datasets"][dataset] = entry
            _write(path, ledger)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
