"""Tabulations of establishment microdata: any group-by, and the QCEW aggregation levels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

import pandas as pd

from gedp.measure.answers import NoisyAnswer
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


def select(microdata: pd.DataFrame, where: str | None) -> np.ndarray:
    """Which establishments match ``where`` (a pandas expression on columns; all when None)."""
    if not where:
        return np.ones(len(microdata), dtype=bool)
    try:
        keep = np.asarray(microdata.eval(where), dtype=bool)
    except Exception as err:  # pandas raises many types for a bad expression
        raise ValueError(f"where '{where}': {str(err).splitlines()[0]}") from None
    if keep.shape != (len(microdata),):
        raise ValueError(f"where '{where}' is not a filter of establishments")
    return keep


def tabulation_with_margins(microdata: pd.DataFrame, by: Sequence[str], *, where: str | None = None,
                            answers: Mapping[str, Sequence[NoisyAnswer]] | None = None,
                            level: float = 0.95) -> pd.DataFrame:
    """``tabulate`` over the establishments matching ``where``; with the release's noisy ``answers``
    by attribute, adds ``<attribute>_moe`` = z * sd of each cell from the least-squares covariance."""
    from scipy import stats

    from gedp.measure.queries import group_establishments
    from gedp.postprocess.moe import answers_variances
    from gedp.synth.schema import public_columns

    if not 0 < level < 1:
        raise ValueError(f"level ({level}) must be between 0 and 1")
    keep = select(microdata, where)
    if not keep.any():
        raise ValueError("no establishments to tabulate" + (f" match where '{where}'" if where else ""))
    table = tabulate(microdata[keep], list(by))
    if answers is not None:
        public = microdata[public_columns(microdata)]
        codes = np.full(len(microdata), -1, dtype=np.int64)
        codes[keep] = group_establishments(microdata[keep], list(by)).codes
        z = float(stats.norm.ppf(0.5 + level / 2))
        for attribute, attribute_answers in answers.items():
            table[f"{attribute}_moe"] = z * np.sqrt(answers_variances(attribute_answers, public, codes, len(table)))
    return table


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
