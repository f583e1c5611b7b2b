"""Tabulations of a panel release: of one quarter, of the change between two (margins with the
covariance of the release's noise design), the QCEW over-the-year columns, and gross job gains and
losses (``gedp.tabulation.panel_gains``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pandas as pd

from gedp.errors import InputError
from gedp.measure.design import quarter_design

#: A panel tabulation in the QCEW format without its level, as the command line's options say it.
NEEDS_AGGLVL = "--format qcew needs an aggregation level (--agglvl N; agglvl in Python)"

#: variance functions by attribute.
LoadedQuarter = Callable[[str], "tuple[pd.DataFrame, Mapping[str, Any]]"]


def tabulate_quarter(release: str | Path, by: str | Sequence[str], quarter: str, *,
                     loaded: LoadedQuarter | None = None, **options) -> pd.DataFrame:
    """``postprocess.tabulate`` of one quarter of a panel release (``options``: where, moe, level),
    margins from that quarter's least squares; the quarter's microdata and variance functions read
    from the release, or given by ``loaded`` (quarter -> both)."""
    from gedp.postprocess.tabulate import group_keys, tabulate
    from gedp.release.margins import kept_variances
    from gedp.release.reader import read_quarter

    data, variances = loaded(quarter) if loaded is not None else (read_quarter(release, quarter), None)
    margins = (variances if variances is not None else kept_variances(release, quarter)) if options.get("moe") \
        else None
    try:
        return tabulate(data, group_keys(data, by), margins=margins, **options)
    except ValueError as err:
        raise InputError(str(err)) from None


def tabulate_change(release: str | Path, by: str | Sequence[str], change: str, *, where: str | None = None,
                    moe: bool = False, level: float = 0.95, loaded: LoadedQuarter | None = None) -> pd.DataFrame:
    """The change of every cell of a tabulation by ``by`` between the quarters of ``change``
    ("FIRST:SECOND"), with margins (``moe``) whose covariance term comes from the release's design
    (``postprocess.changes.change_table``)."""
    from gedp.postprocess.changes import change_table
    from gedp.postprocess.moe import MOE_SLOPE
    from gedp.release.reader import change_quarters, read_manifest
    from gedp.synth.schema import CONFIDENTIAL

    first, second, apart = change_quarters(release, change)
    tables = [tabulate_quarter(release, by, quarter, where=where, moe=moe, level=level, slopes=moe, loaded=loaded)
              for quarter in (first, second)]
    keys = [column for column in tables[0].columns if column not in ("estabs", *CONFIDENTIAL)
            and not column.endswith(("_moe", MOE_SLOPE))]
    design = quarter_design(read_manifest(release)["design"]["name"])
    z = NormalDist().inv_cdf(0.5 + level / 2) if moe else None
    return change_table(*tables, keys, [a for a in CONFIDENTIAL if a in tables[0].columns], z=z,
                        covariance=design.covariance, quarters_apart=apart)


def qcew_change(release: str | Path, agglvl: int, change: str, *, titles: str | Path | None = None,
                where: str | None = None, moe: bool = False, level: float = 0.95) -> pd.DataFrame:
    """The QCEW publication of level ``agglvl`` for the second quarter of ``change`` (a year after
    the first) with BLS's over-the-year columns (``postprocess.changes.qcew_changes``)."""
    from gedp.postprocess.changes import qcew_changes
    from gedp.postprocess.publication import publish_levels
    from gedp.release.margins import kept_variances
    from gedp.release.reader import change_quarters, read_manifest, read_quarter

    first, second, apart = change_quarters(release, change)
    if apart != 4:
        raise InputError(f"change '{change}' is {apart} quarters apart; the QCEW format's oty_ columns are over "
                         "the year (4 quarters)")
    published = [publish_levels(read_quarter(release, quarter), agglvl, "qcew", titles, where=where, moe=moe,
                                level=level, margins=kept_variances(release, quarter) if moe else None, slopes=moe)
                 for quarter in (first, second)]
    tables = [(levels.levels[agglvl], levels.tabulated[agglvl]) for levels in published]
    design = quarter_design(read_manifest(release)["design"]["name"])
    return qcew_changes(*tables, z=NormalDist().inv_cdf(0.5 + level / 2) if moe else None,
                        covariance=design.covariance)


def tabulate_panel(release: str | Path, by: str | Sequence[str] | None, *, quarter: str | None = None,
                   change: str | None = None, gains_losses: str | None = None, agglvl: int | None = None,
                   format: str = "table", titles: str | Path | None = None, **options) -> pd.DataFrame:
    """A tabulation of a panel release: of one ``quarter`` (by ``by``, or the QCEW level ``agglvl``
    in ``format`` table or qcew), of the ``change`` between two quarters (by ``by``; or with format
    qcew, the level ``agglvl`` of the second quarter with BLS's over-the-year columns), or the gross
    job gains and losses between the quarters ``gains_losses`` "FROM:TO" by ``by``
    (``gedp.tabulation.panel_gains.panel_release_gains_losses``: raw and corrected sums, margins with moe).
    ``options``: where, moe, level."""
    from gedp.postprocess.publication import publish_levels
    from gedp.release.margins import kept_variances
    from gedp.release.reader import read_quarter

    if sum(option is not None for option in (quarter, change, gains_losses)) != 1:
        raise InputError("give one of --quarter Q (levels), --change FIRST:SECOND (changes) and --gains-losses "
                         "FROM:TO (gross job gains and losses); in Python quarter, change or gains_losses")
    if gains_losses is not None:
        from gedp.tabulation.panel_gains import panel_release_gains_losses

        if agglvl is not None or format != "table" or options.get("where"):
            raise InputError("--gains-losses goes with --by (public columns) only: no --agglvl, --format or --where "
                             "(in Python: gains_losses with by, no agglvl, format or where)")
        return panel_release_gains_losses(release, gains_losses, "total" if by is None else by,
                                          moe=bool(options.get("moe")), level=options.get("level", 0.95))
    if format not in ("table", "qcew"):
        raise InputError(f"--format {format!r} with --quarter or --change: choose table or qcew")
    if change is not None:
        if format == "qcew" or agglvl is not None:
            if agglvl is None:
                raise InputError(NEEDS_AGGLVL)
            return qcew_change(release, agglvl, change, titles=titles, **options)
        return tabulate_change(release, "total" if by is None else by, change, **options)
    if format == "table" and agglvl is None:
        return tabulate_quarter(release, "total" if by is None else by, quarter, **options)
    if agglvl is None:
        raise InputError(NEEDS_AGGLVL)
    margins = kept_variances(release, quarter) if options.get("moe") else None
    levels = publish_levels(read_quarter(release, quarter), agglvl, format, titles, margins=margins, **options)
    return levels.levels[agglvl]
