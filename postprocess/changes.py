"""Changes between two quarters' tabulations of protected microdata, with margins of error.

A cell's change is its level in the second quarter minus its level in the first, both tabulated
from the protected microdata (a cell without establishments in a quarter has level 0 there, with
no error: which establishments exist is public). Its variance is

    Var(L2 - L1) = Var(L1) + Var(L2) - 2 Cov(L1, L2),

each level's variance taken from its margin (below) and the covariance C from the noise design
across quarters (``measure.design.QuarterDesign.covariance``; 0 for independent quarters).

A level's margin is the half-width of its score interval, z sqrt(V + (z g / 2)^2), g the slope of
its stated variance V in its true total (``postprocess.variances``: the stated variance is V + g e
at an error e). With the levels' slopes given, a change's margin is the half-width of its own
score interval: its stated variance V1 + V2 - 2C moves with the errors as g1 e1 + g2 e2, whose
regression on the change's error e2 - e1 has slope g = (g2 (V2 - C) - g1 (V1 - C)) / (V1 + V2 - 2C),
so the margin is z sqrt(V1 + V2 - 2C + (z g / 2)^2). The levels' slopes mostly cancel in it (a
cell's quarters carry alike slopes), where adding the two levels' widened variances (m / z)^2,
as without slopes, widens a change of a small cell twice. Without the slopes each level's
variance is (margin / z)^2. The percent change is 100 times the
change over the first level (missing where the first level is 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from gedp.measure.design import ChangeCells
from gedp.postprocess.moe import MOE_SLOPE

#: Suffixes of the change columns of an attribute.
CHANGE, CHANGE_MOE, PERCENT_CHANGE = "_chg", "_chg_moe", "_pct_chg"
#: Values of the two quarters' cells.
Pair = tuple[np.ndarray, np.ndarray]


def change_columns(name: str, before: np.ndarray, after: np.ndarray, margins: Pair | None,
                   z: float | None, covariance: Callable[[ChangeCells], np.ndarray] | None,
                   quarters_apart: int, slopes: Pair | None = None) -> dict[str, np.ndarray]:
    """``<name>_chg``, ``<name>_chg_moe`` (with ``margins``, the two levels' margins at quantile
    ``z``, and ``slopes``, their variances' slopes when known: module docstring) and
    ``<name>_pct_chg`` of cells at levels ``before`` and ``after``."""
    columns = {name + CHANGE: after - before}
    if margins is not None and z is not None:
        g1, g2 = (np.zeros(len(before)), np.zeros(len(before))) if slopes is None else slopes
        v1, v2 = (np.maximum((margin / z) ** 2 - (z * g / 2) ** 2, 0.0) for margin, g in zip(margins, (g1, g2)))
        cells = ChangeCells(name, v1, v2, quarters_apart)
        shared = np.zeros(len(before)) if covariance is None else covariance(cells)
        variance = np.maximum(v1 + v2 - 2.0 * shared, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(variance > 0, (g2 * (v2 - shared) - g1 * (v1 - shared)) / variance, 0.0)
        columns[name + CHANGE_MOE] = z * np.sqrt(variance + (z * slope / 2) ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        columns[name + PERCENT_CHANGE] = np.where(before > 0, 100.0 * (after - before) / before, np.nan)
    return columns


def _paired(first: pd.DataFrame, second: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The two tables side by side on their keys (``<column>@1``, ``<column>@2``), sorted by the
    keys; a cell missing from one table is 0 there (a value missing in a cell stays missing)."""
    if not keys:
        return first.add_suffix("@1").join(second.add_suffix("@2"))
    merged = first.merge(second, on=keys, how="outer", suffixes=("@1", "@2"), sort=True, indicator=True)
    for side, absent in (("@1", "right_only"), ("@2", "left_only")):
        values = [column for column in merged.columns if column.endswith(side)]
        merged[values] = merged[values].astype(float)
        merged.loc[merged["_merge"] == absent, values] = 0.0
    return merged.drop(columns="_merge").reset_index(drop=True)


def change_table(first: pd.DataFrame, second: pd.DataFrame, keys: Sequence[str], attributes: Sequence[str], *,
                 z: float | None = None, covariance: Callable[[ChangeCells], np.ndarray] | None = None,
                 quarters_apart: int = 1) -> pd.DataFrame:
    """The change of every cell present in either quarter's table (tables of ``tabulate`` by
    ``keys``, with ``<attribute>_moe`` columns when ``z`` is given, and ``<attribute>_moe_slope``
    when known): keys, ``estabs_chg`` and, per
    attribute, ``<attribute>_chg``, ``<attribute>_chg_moe`` (with ``z``) and ``<attribute>_pct_chg``,
    sorted by the keys."""
    keys = list(keys)
    merged = _paired(first, second, keys)
    table = merged[keys].copy()
    table["estabs_chg"] = (merged["estabs@2"] - merged["estabs@1"]).astype(np.int64)
    for attribute in attributes:
        margins, slopes = _margins(merged, attribute, z)
        for column, values in change_columns(attribute, merged[f"{attribute}@1"].to_numpy(),
                                             merged[f"{attribute}@2"].to_numpy(), margins, z, covariance,
                                             quarters_apart, slopes).items():
            table[column] = values
    return table


def _margins(merged: pd.DataFrame, column: str, z: float | None) -> tuple[Pair | None, Pair | None]:
    """The two quarters' margins of ``column`` in paired tables (``_paired``) and their slopes, each
    None where the tables lack them or without ``z``."""
    def pair(suffix: str) -> Pair | None:
        if z is None or f"{column}{suffix}@1" not in merged:
            return None
        return merged[f"{column}{suffix}@1"].to_numpy(), merged[f"{column}{suffix}@2"].to_numpy()

    return pair("_moe"), pair(MOE_SLOPE)


#: The columns of a QCEW publication table that BLS gives over-the-year changes of.
QCEW_CHANGED = ("qtrly_estabs", "month1_emplvl", "month2_emplvl", "month3_emplvl", "total_qtrly_wages",
                "avg_wkly_wage")
QCEW_CELL = ["area_fips", "own_code", "industry_code", "agglvl_code"]
#: A QCEW level's publication and the same rows as tabulated, unrounded with their margins' pieces.
PublishedLevel = tuple[pd.DataFrame, pd.DataFrame]


def qcew_changes(year_before: PublishedLevel, table: PublishedLevel, *, z: float | None = None,
                 covariance: Callable[[ChangeCells], np.ndarray] | None = None) -> pd.DataFrame:
    """A QCEW publication ``table`` with BLS's over-the-year columns ``oty_<column>_chg`` and
    ``oty_<column>_pct_chg`` (percent to one decimal, as BLS publishes it) against the same level's
    publication of the quarter a year before (``year_before``), and ``oty_<column>_chg_moe`` where
    both levels have the column's margins (``z``: their normal quantile): the margins of
    ``change_table`` from the levels' unrounded margins and slopes, rounded up to whole numbers.

    Each ``PublishedLevel`` is (publication, the same rows as tabulated: ``qcew_level``)."""
    def values(level: PublishedLevel) -> pd.DataFrame:
        published, tabulated = level
        margins = [c for c in tabulated.columns if c.endswith(("_moe", MOE_SLOPE))]
        return published[QCEW_CELL + [c for c in published.columns if c in QCEW_CHANGED]].join(tabulated[margins])

    merged = _paired(values(year_before), values(table), QCEW_CELL)
    changes = {}
    for column in QCEW_CHANGED:
        margins, slopes = _margins(merged, column, z)
        for name, values in change_columns(column, merged[f"{column}@1"].to_numpy(), merged[f"{column}@2"].to_numpy(),
                                           margins, z, covariance, 4, slopes).items():
            rounded = np.round(values, 1) if name.endswith(PERCENT_CHANGE) else np.ceil(values) if name.endswith(
                CHANGE_MOE) else values  # margins rounded up, as the levels' are
            changes["oty_" + name] = rounded
    oty = pd.concat([merged[QCEW_CELL], pd.DataFrame(changes)], axis=1)
    # changes of whole published numbers, and margins rounded up: whole numbers, as BLS writes them
    # (empty where a cell has no level a year before)
    whole = [name for name in changes if not name.endswith(PERCENT_CHANGE)]
    return table[0].merge(oty, on=QCEW_CELL, how="left").astype({name: "Int64" for name in whole})
