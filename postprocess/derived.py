"""Tabulations of a release by attributes derived from the confidential values (BLS size classes), estimated over
implicates and combined with Rubin's rules (``postprocess.combine``): a size class is a function of
month-3 employment, which the release only knows with noise, so its tables come from the posterior.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gedp.postprocess.combine import combine
from gedp.postprocess.keys import SIZE_CLASS
from gedp.postprocess.publication import average_weekly_wage, rounded_up, whole
from gedp.postprocess.sizeclass import SIZE_TITLES, size_class
from gedp.synth.schema import CONFIDENTIAL

ESTABS = "estabs"
#: What a size-class table sums: establishments and the attributes.
COLUMNS = [ESTABS, *CONFIDENTIAL]


def tabulate_implicates(implicates: pd.DataFrame, by: str | Sequence[str], *, where: str | None = None,
                        moe: bool = True, level: float = 0.95) -> pd.DataFrame:
    """Establishments and attribute totals by ``by`` (public columns and ``size_class``) of each
    implicate (``implicate`` column), combined: the mean over implicates, and with ``moe`` the
    margin ``<column>_moe`` of Rubin's interval at ``level`` (u = 0: statistics of the establishments).

    Raises:
        ValueError: a key that is neither a column nor derived, a bad filter, or fewer than 2 implicates.
    """
    keys, sums = implicate_sums(implicates, by, where=where)
    return combined_table(sums, keys, sorted(implicates["implicate"].unique()), where=where, moe=moe, level=level)


def implicate_sums(implicates: pd.DataFrame, by: str | Sequence[str], *,
                   where: str | None = None) -> tuple[list[str], pd.DataFrame]:
    """The keys of ``by`` and, by ``implicate`` and those keys, the establishments and attribute totals
    of ``implicates`` (one implicate or several: the sums of each are its rows' alone) matching ``where``."""
    from gedp.postprocess.tabulate import group_keys, select

    frame = implicates.assign(**{SIZE_CLASS: size_class(implicates["m3emp"])})
    keys = group_keys(frame, by)
    frame = frame[select(frame, where)]
    sums = frame.assign(**{ESTABS: 1.0}).groupby(["implicate", *keys], observed=True, sort=True)[COLUMNS].sum()
    return keys, sums


def combined_table(sums: pd.DataFrame, keys: list[str], implicates: Sequence[int], *, where: str | None = None,
                   moe: bool = True, level: float = 0.95) -> pd.DataFrame:
    """``implicate_sums``' sums of the ``implicates`` (over ``where``) combined (``tabulate_implicates``); a
    cell an implicate has no establishment in counts 0 there."""
    if sums.empty:
        raise ValueError("no establishments to tabulate" + (f" match where {where!r}" if where is not None else ""))
    cells = sums.index.droplevel(0).unique().sort_values() if keys else None
    held = set(sums.index.get_level_values(0))
    empty = np.zeros((len(cells) if keys else 1, len(COLUMNS)))
    stack = np.stack([empty if k not in held else
                      sums.xs(k, level="implicate").reindex(cells, fill_value=0.0).to_numpy() if keys
                      else sums.loc[[k]].to_numpy() for k in implicates])
    combined = combine(stack)
    table = (pd.DataFrame(combined.estimate, columns=COLUMNS, index=cells).reset_index() if keys
             else pd.DataFrame(combined.estimate, columns=COLUMNS))
    if moe:
        for j, column in enumerate(COLUMNS):
            table[f"{column}_moe"] = combined.margin(level)[:, j]
    return table


def size_class_publication(table: pd.DataFrame, year: int, qtr: int) -> pd.DataFrame:
    """A combined size-class table (``tabulate_implicates`` by state, size_class and optionally
    sector) in BLS's layout: area_fips, own_code, industry_code, size_code, size_title, year, qtr,
    qtrly_estabs, month1..3_emplvl, total_qtrly_wages, avg_wkly_wage (and margins), private
    ownership, rounded as the level tables are (``postprocess.publication``): whole numbers half up,
    margins up to the next whole number, the average weekly wage from the published values and
    empty where their mean employment is 0."""
    out = pd.DataFrame({
        "area_fips": table["state"].astype(str) + "000",
        "own_code": "5",
        "industry_code": table["sector"].astype(str) if "sector" in table else "10",
        "size_code": table[SIZE_CLASS].astype(int),
        "size_title": table[SIZE_CLASS].map(SIZE_TITLES),
        "year": year, "qtr": qtr,
    })
    names = {ESTABS: "qtrly_estabs", "m1emp": "month1_emplvl", "m2emp": "month2_emplvl", "m3emp": "month3_emplvl",
             "wage": "total_qtrly_wages"}
    for source, name in names.items():
        out[name] = whole(table[source])
        if f"{source}_moe" in table:
            out[f"{name}_moe"] = rounded_up(table[f"{source}_moe"])
    out["avg_wkly_wage"] = average_weekly_wage(out["total_qtrly_wages"],
                                               [out[f"month{m}_emplvl"] for m in (1, 2, 3)])
    return out
