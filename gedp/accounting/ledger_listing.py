"""``gedp ledger show``: a lifetime budget ledger read for listing: its releases with their charges,
the releases that count, and the most spent account against its cap."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gedp.accounting.ledger_file import CLEARED, check_ledger_path, live, read_ledger
from gedp.accounting.ledger_spending import largest_spending, release_charge


@dataclass(frozen=True)
class LedgerListing:
    """A ledger's contents (``read_ledger``), each release's largest charge to one establishment by
    id (None for a cleared release: its key file is gone), the releases that count (``live``) and
    the largest spending of an account with the smallest cap it meets (``largest_spending``)."""

    book: dict
    charges: dict[str, float | None]
    counting: list[dict]
    most: float
    cap: float


def list_ledger(ledger: Path) -> LedgerListing:
    """Read and check the ledger at ``ledger`` (``NAME.json``) for listing."""
    path = check_ledger_path(ledger)
    book = read_ledger(path)
    most, cap = largest_spending(ledger, book)
    charges = {r["id"]: None if r["status"] == CLEARED else release_charge(path, r) for r in book["releases"].values()}
    return LedgerListing(book, charges, live(book), most, cap)
