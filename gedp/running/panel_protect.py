"""Panels of quarters through the release path: a panel input is protected quarter by quarter
with the noise design of ``gedp.measure.design`` (each quarter as a release of one quarter is
today; the lifetime ledger records the panel as one release of all its quarters, all or nothing)
and joined into one panel release (``gedp.release.panel``). Its tabulations are
``gedp.tabulation.panel_tables``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gedp.accounting.ledger import Reservation
from gedp.config import Config
from gedp.errors import BudgetError, InputError, run_started
from gedp.measure.design import INDEPENDENT, QuarterDesign
from gedp.measure.workflows import MeasurementPlan
from gedp.release.format import QUARTER_KEY
from gedp.release.panel import QUARTER_MANIFEST_FILE, write_panel
from gedp.release.writer import check_output_directory, staged_directory, work_folder
from gedp.running.engine import Scheduler, Source, check_request, protect_input, read_source
from gedp.running.recorded_release import LedgerRequest, publication_hooks, reserved
from gedp.synth.io import footers_one_value
from gedp.synth.panel import check_panel, panel_quarters, quarter_label
from gedp.synth.paths import check_input_path
from gedp.synth.schema import canonical_ids


def input_quarters(source: Source) -> list[tuple[int, int]]:
    """The quarters (year, qtr) of an input, reading only those columns ([] without them)."""
    try:
        frame = read_source(source, ["year", "qtr"])
    except (InputError, KeyError, ValueError):
        return []  # no year and qtr columns: a release of one quarter, checked as today
    frame = frame.dropna()
    try:
        return panel_quarters(frame.astype({"year": "int64", "qtr": "int64"}))
    except (TypeError, ValueError):
        return []  # malformed: refused by the checks of a release of one quarter


def is_panel(source: Source) -> bool:
    """Whether an input holds more than one quarter (then it is protected as a panel); a Parquet input
    whose footers show one year and one quarter is not, without reading its rows."""
    if not isinstance(source, pd.DataFrame) and _footers_show_one_quarter(source):
        return False
    return len(input_quarters(source)) > 1


def _footers_show_one_quarter(path: str | Path) -> bool:
    """Whether a Parquet input's footers show one year and one quarter (``footers_one_value``); False
    for any other input, and for one the checks that read it will refuse."""
    try:
        checked = check_input_path(path)
        return footers_one_value(checked, "year") and footers_one_value(checked, "qtr")
    except (InputError, OSError, ValueError, pa.ArrowException):
        return False


def quarter_seed(seed: int | None, quarter: tuple[int, int]) -> int | None:
    """A quarter's own seed derived from the release's (None stays None): quarters never share a stream."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, *quarter]).generate_state(1, np.uint64)[0] >> 1)


def panel_plan(config: Config, design: QuarterDesign, quarters: int) -> MeasurementPlan:
    """The one plan every quarter of a panel is measured with under ``design`` (what the ledger
    charges each quarter); InputError for a design whose quarters' plans differ."""
    plans = [design.quarter_plan(config.plan, index, quarters) for index in range(quarters)]
    if any(plan != plans[0] for plan in plans[1:]):
        raise InputError(f"quarter design '{design.name}' measures its quarters with different plans; the ledger "
                         "charges a panel whose quarters share one plan")
    return plans[0]


def over_cap(config: Config, plan: MeasurementPlan, design: QuarterDesign, quarters: int,
             allow_over_cap: bool = False) -> bool:
    """Whether a panel of ``quarters`` quarters, each measured with ``plan``, spends more than the
    config's cap (``mu_cap``, or the default cap of a config without one) for an establishment in
    every quarter; refused (BudgetError, before the ledger is touched) unless ``allow_over_cap``."""
    quarter_mu = plan.budget().total
    total, cap = design.panel_mu(quarter_mu, quarters), config.plan.cap
    if cap is None or total <= cap * (1 + 1e-12):
        return False
    if not allow_over_cap:
        over = (f"the config's mu_cap {cap:.4f}" if config.raw.get("mu_cap") is not None
                else f"{cap:.4f}, the cap of a config without mu_cap")
        raise BudgetError(
            f"a panel of {quarters} quarters under config '{config.name}' spends mu {total:.4f} for an establishment "
            f"in every quarter (sqrt({quarters}) x {quarter_mu:.4f} a quarter), over {over}; "
            f"nothing was measured. Protect fewer quarters, use a config whose quarters fit the cap (gedp plan "
            f"--quarters {quarters} --mu-total {cap:g} writes one), or give --allow-over-cap (allow_over_cap=True) "
            f"to spend mu {total:.4f}")
    return True


@run_started()
def protect_panel(source: Source, config: Config, out: str | Path, *, ledger: LedgerRequest | None,
                  seed: int | None = None, rng: str | None = None, engine: str = "local",
                  scheduler: Scheduler | None = None, design: QuarterDesign = INDEPENDENT,
                  on_quarter: Callable[[str], None] | None = None,
                  processes: int | None = None, allow_over_cap: bool = False) -> tuple[dict, Reservation | None]:
    """Protect every quarter of a panel (``synth.panel.check_panel``; each quarter's rows checked
    as microdata when protected) with the ``design`` and write one panel release to ``out``; returns
    its manifest and its ledger reservation (None without a ledger). The quarters are made in a
    staging folder beside ``out`` that this run holds (``writer.work_folder``: removed when the run
    ends, also on Ctrl-C and SIGTERM, and by the next run after a SIGKILL), each with its manifest
    under a name no reader takes for a release's, and then joined.

    With a ``ledger``, all quarters are reserved as one release before any noise is drawn (each row
    charged in its quarter: ``gedp.running.recorded_release.reserved``), so a panel past a cap is refused with nothing
    charged or written; the reservation is committed once the panel release is complete, just before
    its manifest is written, and the manifest's ``lifetime`` section states the panel's charge. A
    panel that spends more than the config's cap is refused first unless ``allow_over_cap``
    (``over_cap``)."""
    out = Path(out).resolve()
    check_output_directory(out)
    panel = check_panel(read_source(source))
    quarters = panel_quarters(panel)
    plan = panel_plan(config, design, len(quarters))
    beyond_cap = over_cap(config, plan, design, len(quarters), allow_over_cap)
    # before the ledger is touched, as for a release of one quarter
    check_request(config, list(pd.unique(panel["state"].astype(str))), seed=seed, rng=rng, engine=engine,
                  scheduler=scheduler, processes=processes)
    out.parent.mkdir(parents=True, exist_ok=True)
    with reserved(ledger, panel, dataclasses.replace(config, plan=plan), out) as reservation, \
            work_folder(out, "quarters") as work:
        folders: dict[str, Path] = {}
        for quarter in quarters:
            label = quarter_label(*quarter)
            rows = (panel["year"] == quarter[0]) & (panel["qtr"] == quarter[1])
            folders[label] = work / label
            protect_input(panel[rows.to_numpy()].reset_index(drop=True), dataclasses.replace(config, plan=plan),
                          folders[label], seed=quarter_seed(seed, quarter), rng=rng, engine=engine,
                          scheduler=scheduler, key={QUARTER_KEY: label}, processes=processes,
                          manifest_name=QUARTER_MANIFEST_FILE)
            if on_quarter is not None:
                on_quarter(label)
        with staged_directory(out) as staging:
            manifest = write_panel(folders, staging, design, int(canonical_ids(panel["estab_id"]).nunique()),
                                   over_cap=beyond_cap, **publication_hooks(reservation))
    return manifest, reservation


