"""``gedp ledger show`` and ``gedp ledger clear``: the lifetime budget ledger listed, and a pending
release cleared."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column, Table

from gedp.cli.command_line import app, console, plain, printable, reported_errors

ledger_app = typer.Typer(no_args_is_help=True, help="Inspect the lifetime budget ledger and clear pending releases.")
app.add_typer(ledger_app, name="ledger")

Ledger = Annotated[Path, typer.Option(help="The lifetime budget ledger (its JSON file).")]
PendingRelease = Annotated[str, typer.Option(help="Id of the pending release to clear (see gedp ledger show).")]


@ledger_app.command(name="show")
def ledger_show(ledger: Ledger) -> None:
    """Print every release of a ledger (its dataset, cap, charge and status).

    Then the accounts' psi and gammas, the most spent account and the head of the ledger's chain."""
    from gedp.accounting.ledger_file import CLEARED, PENDING
    from gedp.accounting.ledger_listing import list_ledger

    with reported_errors():
        listing = list_ledger(ledger)
    releases = Table(Column("dataset", overflow="fold"), *(Column(c, no_wrap=True) for c in (
        "release", "status", "cap", "charge mu", "establishments", "date (UTC)")), Column("quarters", overflow="fold"),
        Column("config", overflow="fold"),
        title=f"ledger {plain(ledger)}")
    for r in listing.book["releases"].values():
        status = f"[red]{r['status']}[/]" if r["status"] == PENDING else r["status"]
        annual = "" if r.get("annual_cap") is None else f", {r['annual_cap']:.4f} a year"
        quarters = ", ".join(q for q, _ in r.get("quarters", []) if q is not None) or "-"
        releases.add_row(r["dataset_id"] or "-", r["id"], status, f"{r['lifetime_cap']:.4f}{annual}",
                         _charge(listing.charges[r["id"]], r), f"{r['establishments']:,}",
                         r["date_utc"][:16].replace("T", " "), quarters, printable(r["config"]))
    console.print(releases)
    if listing.counting:
        gammas = dict(kv for r in reversed(listing.counting) for kv in r["gammas"].items())
        console.print(f"accounts: psi {_psi_text(listing.counting[0]['psi'])}, gammas {_gammas_text(gammas)}; "
                      f"the most spent establishment is at mu {listing.most:.4f} of its cap {listing.cap:.4f}")
    console.print(f"Each establishment's spending composes the charges of every pending or committed release that "
                  f"includes it, once per quarter it is in, as sqrt(sum of mu^2); {CLEARED} releases do not count. "
                  f"Head of the ledger's chain: "
                  f"{listing.book['head']} (keep it elsewhere: a ledger rewritten from an earlier head is not "
                  f"detected).")


@ledger_app.command(name="clear")
def ledger_clear(ledger: Ledger, release: PendingRelease) -> None:
    """Clear a pending release (a run that failed or was killed before publishing): its mu stops counting.

    Clear only a release you know was not published; committed releases cannot be cleared. A run
    killed before its commit leaves hidden staging folders beside its --out without a manifest: no
    gedp reader takes them for a release, and the next run writing that --out removes them."""
    from gedp.accounting.ledger import clear

    with reported_errors():
        entry = clear(ledger, release)
    console.print(f"Cleared pending release {entry['id']} (charge mu {_charge(entry['charge'], entry)}, reserved "
                  f"{entry['date_utc']}): it no longer counts against its establishments' caps.")


def _charge(charge: float | None, release: dict) -> str:
    """A ledger release's charge as ``gedp protect`` states it: its largest charge to one establishment
    (``ledger_spending.release_charge``; None: not known, the key file of a cleared release is gone) and, for a
    release of several quarters, its charge per quarter an establishment is in."""
    if len(release.get("quarters") or []) <= 1:
        return f"{release['mu']:.4f}"
    per_quarter = f"{release['mu']:.4f} a quarter"
    return per_quarter if charge is None else f"{charge:.4f} ({per_quarter})"


def _psi_text(psi: object) -> str:
    """A ledger's neighbour function as a reader writes it: ``sqrt (a = 0)`` (its name, then its other
    parameters); anything else a rewritten ledger holds, shown escaped."""
    if not isinstance(psi, dict) or "name" not in psi:
        return printable(psi)
    rest = ", ".join(f"{printable(k)} = {printable(v)}" for k, v in psi.items() if k != "name")
    return printable(psi["name"]) + (f" ({rest})" if rest else "")


def _gammas_text(gammas: dict) -> str:
    """The accounts' gammas as ``m1emp 0.5, wage 50``."""
    return ", ".join(f"{printable(name)} {printable(value)}" for name, value in gammas.items())

