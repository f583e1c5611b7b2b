"""Tabulations of establishment microdata: any group-by, and the QCEW aggregation levels."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gedp.synth.hierarchy import ALL_INDUSTRIES, COUNTY_LEVELS, INDUSTRY_OF_STATE_LEVEL, STATE_LEVELS
from gedp.synth.qcew import QCEW_VALUE_COLUMNS
from gedp.synth.schema import CONFIDENTIAL

QCEW_COLUMNS = (
    "area_fips", "own_code", "industry_code", "agglvl_code", "year", "qtr", "qtrly_estabs",
    *QCEW_VALUE_COLUMNS.values(),
)


def tabulate(microdata: pd.DataFrame, by: Sequence[str], attributes: Sequence[str] | None = None) -> pd.DataFrame:
    """Sum the attributes by the public columns ``by`` (() gives the total), with establishment counts.

    Returns one row per non-empty group, sorted by the keys, with ``by``, ``estabs`` and the sums.
    """
    attributes = [a for a in (attributes or CONFIDENTIAL) if a in microdata.columns]
    unknown = [c for c in by if c not in microdata.columns]
    if unknown:
        raise ValueError(f"cannot tabulate by {', '.join(unknown)}: no such column")
    if not by:
        sums = microdata[attributes].sum().to_frame().T
        sums.insert(0, "estabs", len(microdata))
        return sums
    grouped = microdata.groupby(list(by), sort=True, observed=True)
    table = grouped[attributes].sum()
    table.insert(0, "estabs", grouped.size())
    return table.reset_index()


def qcew_keys(microdata: pd.DataFrame, agglvl: int) -> list[str]:
    """The public columns whose groups are the cells of a QCEW aggregation level."""
    county = agglvl in COUNTY_LEVELS
    if agglvl not in STATE_LEVELS and not county:
        raise ValueError(f"aggregation level ({agglvl}) must be one of 51-58 or 71-78")
    industry = INDUSTRY_OF_STATE_LEVEL[agglvl - 20 if county else agglvl]
    carried = [c for c in ("year", "qtr") if c in microdata.columns]
    return ["state", *(["county"] if county else []), "own", *([industry] if industry else []), *carried]


def qcew_level(microdata: pd.DataFrame, agglvl: int) -> pd.DataFrame:
    """One QCEW aggregation level (51-58 state, 71-78 county) in BLS open-data layout."""
    by = qcew_keys(microdata, agglvl)
    county = agglvl in COUNTY_LEVELS
    industry = INDUSTRY_OF_STATE_LEVEL[agglvl - 20 if county else agglvl]
    table = tabulate(microdata, by, list(QCEW_VALUE_COLUMNS))
    out = pd.DataFrame(
        {
            "area_fips": table["state"] + (table["county"] if county else "000"),
            "own_code": table["own"],
            "industry_code": table[industry] if industry else ALL_INDUSTRIES,
            "agglvl_code": agglvl,
            "year": table["year"] if "year" in table else pd.NA,
            "qtr": table["qtr"] if "qtr" in table else pd.NA,
            "qtrly_estabs": table["estabs"],
        }
    )
    for attribute, column in QCEW_VALUE_COLUMNS.items():
        out[column] = table[attribute] if attribute in table else pd.NA
    return out


def qcew_tables(microdata: pd.DataFrame) -> pd.DataFrame:
    """Every QCEW aggregation level 51-58 and 71-78 of the microdata, stacked in BLS layout."""
    return pd.concat([qcew_level(microdata, level) for level in (*STATE_LEVELS, *COUNTY_LEVELS)], ignore_index=True)
