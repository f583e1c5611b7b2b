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
    from gedp.options import Engine, Input, Ledger
    from gedp.running.recorded_release import LedgerRequest


def protect_file(input: Path, config: str, out: Path, *, reading: Input, engine: Engine, ledger: Ledger | None,
                 seed: int | None = None, rng: str | None = None, not_for_publication: bool = False,
                 workflow: str | None = None, integer: bool | None = None, allow_large_mu: bool = False,
                 allow_over_cap: bool = False, on_note: Callable[[str], None] = lambda note: None,
                 on_step: Callable[[str], None] = lambda step: None) -> tuple[dict, Reservation | None]:
    """Protect the microdata file ``input`` (as ``gedp protect`` takes it) into the release folder
    ``out``, read as ``reading`` says, run on ``engine`` and recorded in ``ledger``; returns the
    manifest and the ledger's reservation (None without one). The config is loaded (``workflow``,
    ``integer``, ``allow_large_mu`` as ``gedp.load`` takes them) once the input has been checked.
    ``on_note`` receives each note on the input's reading, ``on_step`` each state or quarter done."""
    from gedp.synth.intake import configured_attributes, inspect_input, load_input

    intake = inspect_input(input, columns=reading.columns, pad_codes=reading.pad_codes,
                           attributes=configured_attributes(config))
    for note in intake.notes:
        on_note(note)
    if engine.name == "local" and intake.parquet and not intake.needs_translation():
        from gedp.synth.prefetch import prefetch_input

        prefetch_input(intake.path)  # read on a thread while the numerical stack is imported
    from gedp.running.state_pool import early_workers  # started while the input is checked and read

    with early_workers(intake.path, engine.processes if engine.name == "local" else 1):
        from gedp.config import resolve_config
        from gedp.measure.rng import check_publication
        from gedp.running.engine import engine_access
        from gedp.running.recorded_release import requested_ledger

        check_publication(seed, rng, not_for_publication)
        access = engine_access(engine)
        request = requested_ledger(ledger, not_for_publication)
        cfg = resolve_config(config, workflow, allow_large_mu, integer)
        return _protected(load_input(intake), cfg, out, request, reading.jobs, on_step, seed=seed, rng=rng,
                          engine=engine.name, scheduler=access, processes=engine.processes,
                          allow_over_cap=allow_over_cap)


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
