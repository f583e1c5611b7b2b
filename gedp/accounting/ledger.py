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

This module holds the ledger's operations (the caps' checks, the charges in the accounts' terms, reserve,
commit, clear); ``gedp.accounting.ledger_file`` holds the file (its checks, writing, lock and keyed
hashes) and ``gedp.accounting.ledger_spending`` what the accounts have spent and the budgets a release
is checked against.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.accounting.ledger_file import (
    CLEARED,
    DATASET_ID,
    PENDING,
    append_event,
    check_ledger_path,
    file_sha256,
    keys_folder,
    live,
    locked_ledger,
    positive_number,
    save_ledger,
    short_repr,
    utc_now,
)
from gedp.accounting.ledger_spending import (
    TOLERANCE,
    cap_refusal,
    in_block,
    keys_by_quarter,
    release_budgets,
    release_caps,
    release_charge,
    spending,
)
from gedp.accounting.quarters import check_begun
from gedp.errors import held_stops
from gedp.measure.budget import MAX_MU, compose
from gedp.measure.queries import IDENTITY
from gedp.measure.workflows import MeasurementPlan
from gedp.synth.schema import InputError


def check_cap(cap: float, option: str = "--lifetime-cap") -> float:
    """A lifetime (or, with ``option``, annual) cap: a finite number in (0, MAX_MU]."""
    if not positive_number(cap) or cap > MAX_MU:
        raise InputError(f"{option} ({short_repr(cap)}) must be a finite number > 0 and <= {MAX_MU:g} "
                         f"(mu {MAX_MU:g} already hides nothing)")
    return float(cap)


def check_dataset_id(name: str) -> str:
    """A dataset id: 1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit."""
    if not (isinstance(name, str) and DATASET_ID.fullmatch(name)):
        raise InputError(f"--dataset-id ({short_repr(name)}) must be 1-64 ASCII letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


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
    with locked_ledger(path, missing_ok=True) as book:
        blocks = keys_by_quarter(estab_ids, quarters, book["key"])
        check_begun(label for label in blocks if label is not None)
        keys = np.unique(np.concatenate(list(blocks.values())))
        psi, gammas = _account(book, plan)
        charges = plan_charges(plan, gammas)
        mu = compose(charges.values())
        spent = spending(path, book, keys)
        caps = release_caps(book, cap, dataset_id, spent.caps)
        annual = release_caps(book, annual_cap, dataset_id, spent.annual_caps, field="annual_cap",
                              option="--annual-cap", required=False)
        present = {label: in_block(block, keys) for label, block in blocks.items()}
        budgets = release_budgets(spent, present, mu, caps, annual)
        worst = max(budgets, key=lambda budget: float(np.max(budget.ratios())))
        at = int(np.argmax(worst.ratios()))
        if worst.ratios()[at] > 1 + TOLERANCE:
            raise cap_refusal(worst, at, len(live(book)))
        most = int(np.argmax(budgets[0].ratios()))
        years = budgets[1:]
        reservation = Reservation(
            path, secrets.token_hex(8), float(caps[most]), float(np.sqrt(budgets[0].spent2[most])), mu,
            plan.budget().total, charges, psi, gammas, float(np.sqrt(budgets[0].charge2[most])), tuple(blocks),
            None if np.isnan(annual).all() else float(np.nanmin(annual)),
            max((float(np.max(np.sqrt(y.spent2 + y.charge2))) for y in years), default=None),
            float(np.sqrt(np.max(budgets[0].charge2))))
        try:
            with held_stops():  # a stop between the key file and its event would leave a key file of no release
                _record(path, book, blocks, reservation, dataset_id, config, caps)
        except KeyboardInterrupt as stop:  # held until recorded: the release is pending, and the stop says so
            stop.add_note(f"stopped: {reservation.pending_note()}")
            raise
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
               "keys_sha256": file_sha256(keys_file), "date_utc": utc_now(), "config": config,
               "quarters": [[label, len(block)] for label, block in blocks.items()],
               "annual_cap": reservation.annual_cap}
    append_event(book, {"event": "reserve", "release": release})
    try:
        save_ledger(path, book)
    except InputError:
        keys_file.unlink(missing_ok=True)
        raise


def _find(book: dict, release_id: str) -> dict:
    release = book["releases"].get(release_id)
    if release is None or release["status"] == CLEARED:
        raise InputError(f"release '{short_repr(release_id)}' is not in the ledger")
    return release


def commit(reservation: Reservation) -> None:
    """Under the lock: mark a pending release committed (before its manifest is written)."""
    with locked_ledger(reservation.path) as book:
        release = _find(book, reservation.release_id)
        if release["status"] != PENDING:
            raise InputError(f"release {reservation.release_id} is not pending in the ledger")
        append_event(book, {"event": "commit", "release_id": reservation.release_id, "date_utc": utc_now()})
        save_ledger(reservation.path, book)


def clear(path: str | Path, release_id: str) -> dict:
    """Under the lock: clear a pending release (an operator's decision that it was never published)
    and remove its key file; returns the cleared release, with its ``charge`` (``ledger_spending.release_charge``).
    Committed releases cannot be cleared."""
    path = check_ledger_path(path)
    with locked_ledger(path) as book:
        release = _find(book, release_id)
        if release["status"] != PENDING:
            raise InputError(f"release {release_id} is {release['status']}: only a pending release can be cleared")
        charge = release_charge(path, release)
        append_event(book, {"event": "clear", "release_id": release_id, "date_utc": utc_now()})
        save_ledger(path, book)
    (keys_folder(path) / f"{release_id}.u64").unlink(missing_ok=True)
    return {**release, "charge": charge}
