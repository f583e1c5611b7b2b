"""A release recorded in the lifetime budget ledger, the same flow for the command line and the API.

With a ledger, a release is reserved before any noise is drawn (refused when it would take any of
its establishments' accounts over their lifetime or annual cap, and then nothing is written), committed when it is
complete in its staging folder and just before it is published, and left pending, with a note saying how to clear
it, when it fails in between (``gedp.accounting.ledger``: reserve, commit, clear). Each row is charged in its
quarter, from the input's ``year`` and ``qtr`` (``input_quarters``): a panel input is reserved once for all its
quarters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gedp.accounting.ledger import Reservation, check_cap, check_dataset_id, commit, reserve
from gedp.accounting.ledger_file import PENDING, check_ledger_path, read_ledger
from gedp.accounting.quarters import row_quarters
from gedp.config import Config
from gedp.errors import GedpError, InputError, InputProblems, LockTimeout, SolverError, run_started
from gedp.options import CAPS_WITHOUT_LEDGER, Ledger
from gedp.release.format import MANIFEST_FILE
from gedp.release.writer import check_output_directory, published_outputs
from gedp.running.engine import (
    Scheduler,
    Source,
    check_request,
    input_establishments,
    input_states,
    pinned_input,
    protect_input,
    read_source,
)
from gedp.synth.io import Parts, PinnedCsv, check_input_path, input_columns
from gedp.synth.schema import canonical_ids


@dataclass(frozen=True)
class LedgerRequest:
    """Where a release is recorded: the ledger file, the dataset's lifetime cap (needed the first
    time), its declared id and its annual cap (optional)."""

    path: Path
    lifetime_cap: float | None = None
    dataset_id: str | None = None
    annual_cap: float | None = None


def ledger_request(ledger: str | Path | None, lifetime_cap: float | None, dataset_id: str | None,
                   not_for_publication: bool, annual_cap: float | None = None) -> LedgerRequest | None:
    """The checked ledger options of a release (None without a ledger), refused before anything is read:
    a cap or dataset id without a ledger, a ledger for a release not for publication, a bad cap or id."""
    if ledger is None:
        if lifetime_cap is not None or dataset_id is not None or annual_cap is not None:
            raise InputError(CAPS_WITHOUT_LEDGER)
        return None
    if not_for_publication:
        raise InputError("--ledger records releases for publication only: a --not-for-publication release "
                         "spends no lifetime budget; drop --ledger")
    check_ledger_path(Path(ledger))
    return LedgerRequest(Path(ledger), None if lifetime_cap is None else check_cap(lifetime_cap),
                         None if dataset_id is None else check_dataset_id(dataset_id),
                         None if annual_cap is None else check_cap(annual_cap, "--annual-cap"))


def requested_ledger(ledger: Ledger | None, not_for_publication: bool) -> LedgerRequest | None:
    """The checked request of a release recorded in ``ledger`` (``ledger_request``)."""
    if ledger is None:
        return None
    return ledger_request(ledger.path, ledger.lifetime_cap, ledger.dataset_id, not_for_publication, ledger.annual_cap)


def input_quarters(source: Source | Parts | PinnedCsv) -> tuple[pd.Series, pd.Series | None]:
    """The establishments of an input and each row's quarter label from its ``year`` and ``qtr``
    columns (None when it has neither: the release is charged without a quarter). An input pinned
    by ``gedp.running.engine.pinned_input`` is read as it was first read, or refused."""
    if isinstance(source, pd.DataFrame):
        names = list(source.columns)
    elif isinstance(source, Parts):
        names = list(source.schema.names)
    else:
        names = input_columns(check_input_path(source.input if isinstance(source, PinnedCsv) else source))
    if not {"year", "qtr"} <= set(names):
        return input_establishments(source), None
    frame = read_source(source, ["estab_id", "year", "qtr"])
    return canonical_ids(frame["estab_id"]), row_quarters(frame["year"], frame["qtr"])


@contextmanager
def reserved(request: LedgerRequest | None, source: Source | Parts | PinnedCsv, config: Config,
             out: str | Path) -> Iterator[Reservation | None]:
    """Reserve the config's plan for the input's establishments in the ledger (None without a
    request), charged in the accounts' terms; an input or solver error (or a ledger lock not freed in
    time) raised inside the block keeps the reservation pending and says so. A stop (Ctrl-C, SIGTERM)
    gets a note saying what the run left (``stop_note``): the command line prints it as its last line."""
    reservation = None
    if request is not None:
        estab_ids, quarters = input_quarters(source)
        reservation = reserve(request.path, estab_ids, config.plan, quarters=quarters, cap=request.lifetime_cap,
                              annual_cap=request.annual_cap, dataset_id=request.dataset_id, config=config.name)
    published: list[Path] = []
    try:
        with published_outputs() as published:
            yield reservation
    except (InputError, SolverError, LockTimeout) as err:
        if reservation is None:
            raise
        raise with_note(err, reservation.pending_note() if still_pending(reservation) else
                        f"release {reservation.release_id} was committed in ledger '{reservation.path}' (charged) "
                        "but not published; running again charges again") from None
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM on the command line (gedp.errors.Terminated)
        stop.add_note(stop_note(reservation, Path(out).resolve(), published))
        raise


def with_note(err: GedpError, note: str) -> GedpError:
    """The error again with ``note`` added: one more line of an ``InputProblems``, else after its message."""
    if isinstance(err, InputProblems):
        return InputProblems(err.subject, [*err.problems, note])
    return type(err)(f"{err}; {note}")


def stop_note(reservation: Reservation | None, out: Path, published: list[Path]) -> str:
    """What a run stopped by Ctrl-C or SIGTERM left, from what it did: whether it published its new
    release to ``out`` (``published``: the outputs it put in place) and, with a ledger, whether the
    release was committed (charged) or stays pending."""
    if out in published:
        left = f"'{out}' holds it"
    elif (out / MANIFEST_FILE).is_file():
        left = f"'{out}' holds the release it held before"
    else:
        left = f"there is no release at '{out}'"
    if reservation is None:
        return f"stopped after the new release was published: {left}" if out in published else \
            f"stopped: nothing was published; {left}"
    if still_pending(reservation):
        return f"stopped: {reservation.pending_note()}"
    when = "and published" if out in published else "but before it was published"
    return (f"stopped after release {reservation.release_id} was committed in ledger '{reservation.path}' "
            f"(charged) {when}: {left}; running again charges again")


def still_pending(reservation: Reservation) -> bool:
    """Whether the ledger still holds the reservation as pending (not committed: a run stopped before
    its commit); False when the ledger cannot be read."""
    try:
        return read_ledger(reservation.path)["releases"][reservation.release_id]["status"] == PENDING
    except (InputError, KeyError):
        return False


def publication_hooks(reservation: Reservation | None) -> dict[str, Any]:
    """``protect_input``'s options for a reserved release: its manifest's lifetime section and the
    ledger's commit just before the release is published."""
    if reservation is None:
        return {}
    return {"lifetime": reservation.summary(), "before_publish": lambda: commit(reservation)}


@run_started()
def protect_recorded(source: Source, config: Config, out: str | Path, *, ledger: LedgerRequest | None,
                     seed: int | None = None, rng: str | None = None, engine: str = "local",
                     scheduler: Scheduler | None = None, jobs: Source | None = None,
                     on_state: Callable[[str], None] | None = None,
                     key: Mapping[str, str] | None = None,
                     processes: int | None = None, tables: bool = True) -> tuple[dict, Reservation | None]:
    """Protect ``source`` into the release folder ``out`` (``gedp.running.engine.protect_input``), recorded
    in the lifetime ledger when ``ledger`` is given; returns the manifest and the reservation.

    The output folder, engine, generator and job table are checked before the ledger is touched,
    and the ledger before any noise is drawn; ``on_state`` follows the protection of each state.
    ``key``: columns of one value each added to the outputs (``gedp.running.engine.protect_one_state``);
    ``processes``: the local engine's worker processes and ``tables`` (False: no QCEW tables, the
    pipeline audit's runs) as for ``gedp.running.engine.protect_input``.
    """
    check_output_directory(Path(out).resolve())
    inputs = input_states(source)
    check_request(config, list(inputs.codes), seed=seed, rng=rng, engine=engine, jobs=jobs is not None,
                  scheduler=scheduler, processes=processes)
    with reserved(ledger, pinned_input(source, inputs), config, out) as reservation:
        manifest = protect_input(source, config, out, seed=seed, rng=rng, engine=engine, scheduler=scheduler,
                                 jobs=jobs, on_state=on_state, inputs=inputs, key=key, processes=processes,
                                 tables=tables, **publication_hooks(reservation))
    return manifest, reservation
