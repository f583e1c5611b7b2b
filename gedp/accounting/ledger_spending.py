"""What the lifetime ledger's accounts have spent (``gedp.accounting.ledger``): a release's
establishments' keys per quarter, the live releases' spending of each account quarter by quarter and
the caps they recorded, the accounts (lifetime and rolling years) a new release is checked against,
and the refusal naming the one that binds."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.accounting.ledger_file import establishment_keys, keys_folder, live
from gedp.accounting.quarters import quarter_index, window_name, window_spending, windows
from gedp.synth.schema import InputError, canonical_ids

#: Relative tolerance of cap comparisons (the composed spending is a float sum).
TOLERANCE = 1e-12


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


def in_block(block: np.ndarray, keys: np.ndarray) -> np.ndarray:
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
            shared = in_block(block, keys)
            result.by_quarter.setdefault(label, np.zeros(len(keys)))[shared] += release["mu"] ** 2
            result.caps[shared] = np.fmin(result.caps[shared], release["lifetime_cap"])
            if release.get("annual_cap") is not None:
                result.annual_caps[shared] = np.fmin(result.annual_caps[shared], release["annual_cap"])
    return result


def release_caps(book: dict, cap: float | None, dataset_id: str | None, caps: np.ndarray, *,
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


def keys_by_quarter(estab_ids: Iterable[str] | pd.Series, quarters: Iterable[str] | pd.Series | None,
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


def release_budgets(spent: Spending, present: dict[str | None, np.ndarray], mu: float, caps: np.ndarray,
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


def cap_refusal(budget: Budget, at: int, releases: int) -> InputError:
    """Why a release is refused by the account that binds (what is left, what it needs)."""
    spent, cap, needs = math.sqrt(budget.spent2[at]), float(budget.cap[at]), math.sqrt(budget.charge2[at])
    left = math.sqrt(max(cap * cap - spent * spent, 0.0))
    which = "lifetime cap" if budget.name == "lifetime" else "annual cap"
    year = "" if budget.name == "lifetime" else f" in the year {budget.name}"
    return InputError(f"release refused: it would take establishments of this release over their {which} "
                      f"{cap:.4f}{year}: they have mu {left:.4f} of {cap:.4f} left (spent {spent:.4f} in {releases} "
                      f"earlier release(s) of the ledger); this release needs its charge {needs:.4f} in the "
                      f"accounts' terms (sqrt({spent:.4f}^2 + {needs:.4f}^2) = {math.hypot(spent, needs):.4f})")


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
