"""``gedp protect``'s path from a file to a release: the input is checked before the numerical stack
is imported (a Parquet input is read on a thread and the states' workers start meanwhile), then the
publication, scheduler, ledger and config are checked and the input protected: a panel (several
quarters) into one panel release, else state by state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gedp.errors import InputError

if TYPE_CHECKING:
    from gedp.accounting.ledger import Reservation
    from gedp.config import Config
    from gedp.running.recorded_release import LedgerRequest


def protect_file(input: Path, config: str, out: Path, *, jobs: Path | None = None,
                 # the input's reading
                 columns: str | None = None, pad_codes: bool = False,
                 # the release
                 seed: int | None = None, rng: str | None = None, not_for_publication: bool = False,
                 workflow: str | None = None, integer: bool | None = None, allow_large_mu: bool = False,
                 allow_over_cap: bool = False,
                 # where it runs
                 engine: str = "local", scheduler: str | None = None, processes: int | None = None,
                 tls_ca_file: Path | None = None, tls_cert: Path | None = None, tls_key: Path | None = None,
                 insecure_scheduler: bool = False,
                 # the budget's accounting
                 ledger: Path | None = None, lifetime_cap: float | None = None, dataset_id: str | None = None,
                 annual_cap: float | None = None,
                 on_note: Callable[[str], None] = lambda note: None,
                 on_step: Callable[[str], None] = lambda step: None) -> tuple[dict, Reservation | None]:
    """Protect the microdata file ``input`` (as ``gedp protect`` takes it: ``columns`` as
    STORED=GEDP,...) into the release folder ``out``; returns the manifest and the ledger's
    reservation (None without ``ledger``). ``on_note`` receives each note on the input's reading,
    ``on_step`` each state or quarter done."""
    from gedp.synth.intake import configured_attributes, inspect_input, load_input, parse_columns

    intake = inspect_input(input, columns=parse_columns(columns), pad_codes=pad_codes,
                           attributes=configured_attributes(config))
    for note in intake.notes:
        on_note(note)
    if engine == "local" and intake.parquet and not intake.needs_translation():
        from gedp.synth.prefetch import prefetch_input

        prefetch_input(intake.path)  # read on a thread while the numerical stack is imported
    from gedp.running.state_pool import early_workers  # started while the input is checked and read

    with early_workers(intake.path, processes if engine == "local" else 1):
        from gedp.config import resolve_config
        from gedp.measure.rng import check_publication
        from gedp.running.engine import scheduler_access, tls_credentials
        from gedp.running.recorded_release import ledger_request

        check_publication(seed, rng, not_for_publication)
        access = scheduler_access(scheduler, tls_credentials(tls_ca_file, tls_cert, tls_key), insecure_scheduler)
        request = ledger_request(ledger, lifetime_cap, dataset_id, not_for_publication, annual_cap)
        cfg = resolve_config(config, workflow, allow_large_mu, integer)
        return _protected(load_input(intake), cfg, out, request, jobs, on_step, seed=seed, rng=rng, engine=engine,
                          scheduler=access, processes=processes, allow_over_cap=allow_over_cap)


def _protected(source: Any, cfg: Config, out: Path, request: LedgerRequest | None, jobs: Path | None,
               on_step: Callable[[str], None], allow_over_cap: bool = False,
               **options: Any) -> tuple[dict, Reservation | None]:
    """Protect a checked input: a panel (several quarters) into one panel release, else state by
    state as one release; returns the manifest and the ledger reservation (None without a ledger)."""
    from gedp.running.panel_protect import is_panel, protect_panel
    from gedp.running.recorded_release import protect_recorded

    if is_panel(source):  # several quarters: one panel release
        if jobs is not None:
            raise InputError("--jobs goes with a release of one quarter, not a panel")
        return protect_panel(source, cfg, out, ledger=request, allow_over_cap=allow_over_cap,
                             on_quarter=lambda quarter: on_step(f"quarter {quarter} done"), **options)
    return protect_recorded(source, cfg, out, ledger=request, jobs=jobs,
                            on_state=lambda state: on_step(f"state {state} done"), **options)
