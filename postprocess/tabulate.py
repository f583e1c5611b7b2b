"""Tabulations of establishment microdata: any group-by, and the QCEW aggregation levels."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from pandas._libs import groupby as libgroupby

from gedp.measure.queries import Grouping, Groupings
from gedp.postprocess.combine import checked_level
from gedp.postprocess.filters import FilterError, select_rows
from gedp.postprocess.keys import tabulation_keys
from gedp.synth.hierarchy import ALL_INDUSTRIES, COUNTY_LEVELS, INDUSTRY_OF_STATE_LEVEL, STATE_LEVELS
from gedp.synth.qcew import QCEW_VALUE_COLUMNS
from gedp.synth.schema import CONFIDENTIAL, public_columns

if TYPE_CHECKING:
    from pandas.api.extensions import ExtensionArray

    from gedp.measure.answers import NoisyAnswer
    from gedp.measure.neighbors import NeighborFunction
    from gedp.postprocess.models import VarianceFunction

QCEW_COLUMNS = (
    "area_fips", "own_code", "industry_code", "agglvl_code", "year", "qtr", "qtrly_estabs",
    *QCEW_VALUE_COLUMNS.values(),
)
#: QCEW levels of totals over every ownership (own code 0, all industries), by the private level with
#: the same areas: 50 the state's, 70 each county's.
OWNERSHIP_TOTAL_LEVELS = {50: 51, 70: 71}
#: The own code of a total over every ownership.
ALL_OWNERSHIPS = "0"


class SelectionWarning(UserWarning):
    """A selection on noisy (protected) values: margins of error assume one on public columns only."""


def group_keys(microdata: pd.DataFrame, by: str | Sequence[str]) -> list[str]:
    """The public columns a tabulation of ``microdata`` groups by (``keys.tabulation_keys``).

    Raises:
        ValueError: a confidential attribute or a column the microdata do not have.
    """
    return tabulation_keys(by, list(microdata.columns), public_columns(microdata))


def select(microdata: pd.DataFrame, where: str | None) -> np.ndarray:
    """Which establishments a filter (``postprocess.filters``: columns, comparisons, in, and / or /
    not; never run as code) keeps; all for None."""
    if where is None:
        return np.ones(len(microdata), dtype=bool)
    try:
        return select_rows(microdata, where)
    except FilterError as err:
        raise ValueError(f"where {str(where)[:80]!r}: {err}") from None


def tabulate(
    microdata: pd.DataFrame,
    by: str | Sequence[str],
    attributes: Sequence[str] | None = None,
    *,
    where: str | None = None,
    moe: bool = False,
    level: float = 0.95,
    answers: Mapping[str, Sequence[NoisyAnswer]] | None = None,
    wage_psi: NeighborFunction | None = None,
    groupings: Groupings | None = None,
    margins: Mapping[str, VarianceFunction] | None = None,
    slopes: bool = False,
) -> pd.DataFrame:
    """Sum the attributes by public columns (see ``group_keys``), with establishment counts.

    Args:
        microdata: validated microdata; with ``moe``, a release's whole protected microdata.
        by: the group-by columns; () or "total" gives the total.
        attributes: the sums (default: every confidential attribute present).
        where: keep only establishments matching this filter, e.g. "sector == '31-33'" (see
            ``postprocess.filters``: columns, comparisons, in, and / or / not). A
            filter on protected values (e.g. "m1emp > 100") warns (SelectionWarning) with ``moe``:
            the margins treat the selection as fixed, as if it were made on public columns.
        moe: add ``<attribute>_moe``, the half-width of the interval at ``level`` from the release's
            least squares covariance (no new privacy budget; needs ``answers``).
        answers: the release's noisy answers by attribute (as a release reader returns them).
        wage_psi: the release's psi when its wages were informed by employment
            (the release reader's wage psi; their margins then follow ``postprocess.wages``).
        groupings: of ``microdata``, shared by several tabulations of it (not used with ``where``).
        margins: the release's variance functions by attribute, built already (instead of
            ``answers`` and ``wage_psi``: ``postprocess.moe.variance_functions``, or kept beside the
            release: the structure a release keeps beside it).
        slopes: with ``moe``, add ``<attribute>_moe_slope``, the slope of each cell's stated variance
            in its true total (``postprocess.variances``), from which changes take their margins.

    Returns one row per non-empty group, sorted by the keys, with the keys, ``estabs`` and the sums.

    Raises:
        ValueError: a bad key, filter, level, an empty selection, or ``moe`` without answers.
    """
    keys = group_keys(microdata, by)
    attributes = [a for a in (attributes or CONFIDENTIAL) if a in microdata.columns]
    if moe and answers is None and margins is None:
        raise ValueError("margins of error need the release's answers (a release directory)")
    if moe:
        checked_level(level)
    public = public_columns(microdata)
    added = [key for key in keys if moe and key not in public]
    if added:
        raise ValueError(f"cannot give margins of error by {', '.join(map(repr, added))}: margins follow the "
                         f"release's public columns only ({', '.join(public)}); a column derived from protected "
                         "values (e.g. a size) is tabulated over implicates (by size_class, or gedp implicates and "
                         "gedp.combine)")
    keep = select(microdata, where)
    if not keep.any():
        raise ValueError("no establishments to tabulate" + (f" match where {where!r}" if where is not None else ""))
    selected = microdata if keep.all() else microdata[keep]
    grouping = (groupings if groupings is not None and where is None else Groupings(selected))(keys) if keys else None
    table = tabulation_sums(selected, attributes, grouping)
    if moe:
        from gedp.postprocess.moe import MOE_SLOPE, margins_of_error, normal_quantile, variance_functions

        noisy = [a for a in CONFIDENTIAL if where is not None and re.search(rf"\b{a}\b", where)]
        if noisy:
            warnings.warn(f"where selects on protected values ({', '.join(noisy)}): the margins of error treat "
                          f"the selection as fixed, as for a selection on public columns only", SelectionWarning,
                          stacklevel=2)
        if margins is None:
            margins = variance_functions(answers or {}, microdata, wage_psi)
        wanted = {attribute: variance for attribute, variance in margins.items() if attribute in attributes}
        z = normal_quantile(level)
        for attribute, cells in margins_of_error(microdata, wanted, keep, keys, len(table)).items():
            table[f"{attribute}_moe"] = cells.half_width(z)
            if slopes:
                table[attribute + MOE_SLOPE] = cells.slope
    return table


def tabulation_sums(selected: pd.DataFrame, attributes: Sequence[str], grouping: Grouping | None) -> pd.DataFrame:
    """A tabulation's rows: ``group_sums`` of the selected establishments, or with no ``grouping``
    their total (``estabs`` and pandas' sums of the attributes)."""
    if grouping is not None:
        return group_sums(selected, attributes, grouping)
    table = selected[list(attributes)].sum().to_frame().T
    table.insert(0, "estabs", len(selected))
    return table


def group_sums(microdata: pd.DataFrame, attributes: Sequence[str], grouping: Grouping) -> pd.DataFrame:
    """The keys, establishment count (``estabs``) and sums of ``attributes`` of every group, in group
    order: pandas' sums over the rows in order, keyed by the grouping's codes (``sums_by_codes``)."""
    sums = sums_by_codes(microdata[list(attributes)], grouping.codes, grouping.n_groups)
    columns = {column: grouping.keys[column].array for column in grouping.keys.columns}
    columns["estabs"] = np.bincount(grouping.codes, minlength=grouping.n_groups)
    columns.update(zip(attributes, sums))
    return pd.DataFrame(columns, copy=False)


def sums_by_codes(values: pd.DataFrame, codes: np.ndarray, n_groups: int) -> list[np.ndarray | ExtensionArray]:
    """Each column's sums over the rows of each group (codes 0 to ``n_groups`` - 1, every group with
    rows), bit for bit those of ``values.groupby(codes).sum()``: for columns held in one int64 or
    float64 block (``values_in_one_block``), the very kernels pandas runs on that block
    (``kernel_sums``), without its grouping machinery, which factorizes the codes again; else pandas."""
    block = values.to_numpy().T if len(values.columns) and len(codes) else None  # the block, when it is one
    if (block is None or not block.flags.c_contiguous or block.dtype not in (np.int64, np.float64)
            or not kernels_are_pandas()):
        sums = values.groupby(codes).sum()
        return [sums[column].array for column in values.columns]
    return kernel_sums(block, codes, n_groups)


def kernel_sums(block: np.ndarray, codes: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The sums of each row of ``block`` (columns x establishments) by group, as the pandas installed
    sums a block: for codes in order and no NaN, ``np.add.reduceat``; else its compensated group sum."""
    if np.all(codes[1:] >= codes[:-1]) and not (block.dtype.kind == "f" and np.isnan(block).any()):
        return list(ordered_sums(block, np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])))
    return list(compensated_sums(block, codes, n_groups))


def ordered_sums(block: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The sums of each row of ``block`` (columns x establishments) over the runs of establishments
    beginning at ``starts`` (``kernel_sums`` of codes in order): columns x runs."""
    return np.add.reduceat(block, starts, axis=1)


def compensated_sums(block: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """pandas' compensated sums of each row of ``block`` by group (``kernel_sums`` of codes in any
    order): columns x groups, each group's sum over its establishments in order."""
    out = np.full((n_groups, len(block)), np.nan if block.dtype.kind == "f" else 0, dtype=block.dtype)
    libgroupby.group_sum(out=out, counts=np.zeros(n_groups, dtype=np.int64), values=block.T,
                         labels=codes.astype(np.intp, copy=False), mask=None, result_mask=None, min_count=0,
                         is_datetimelike=False, initial=0)
    return out.T


@functools.cache
def kernels_are_pandas() -> bool:
    """Whether ``kernel_sums`` gives the bits of the pandas installed (its kernels are pandas'
    internals): checked once on sums that differ by kernel, codes in order and not."""
    columns = {"a": [1e16, 1.0, -1e16, 1.0, 3.0, 0.5], "b": [0.1, 0.2, 0.3, 1e17, 0.4, -1e17]}
    frame = values_in_one_block(pd.DataFrame(columns), list(columns))
    for codes in (np.array([0, 0, 0, 0, 1, 1]), np.array([0, 1, 0, 0, 1, 0])):
        try:
            ours = kernel_sums(frame.to_numpy().T, codes, 2)
        except (TypeError, ValueError):  # another signature
            return False
        theirs = frame.groupby(codes).sum()
        if not all(np.array_equal(sums.view(np.int64), theirs[c].to_numpy().view(np.int64))
                   for sums, c in zip(ours, columns)):
            return False
    return True


def qcew_keys(microdata: pd.DataFrame, agglvl: int) -> list[str]:
    """The public columns whose groups are the cells of a QCEW aggregation level (50 and 70: totals
    over every ownership, by state and county)."""
    if agglvl in OWNERSHIP_TOTAL_LEVELS:
        return [c for c in qcew_keys(microdata, OWNERSHIP_TOTAL_LEVELS[agglvl]) if c != "own"]
    county = agglvl in COUNTY_LEVELS
    if agglvl not in STATE_LEVELS and not county:
        raise ValueError(f"aggregation level ({agglvl}) must be one of 50-58 or 70-78")
    industry = qcew_industry(agglvl)
    carried = [c for c in ("year", "qtr") if c in microdata.columns]
    return ["state", *(["county"] if county else []), "own", *([industry] if industry else []), *carried]


def qcew_industry(agglvl: int) -> str | None:
    """The industry column of a QCEW aggregation level (None: all industries)."""
    agglvl = OWNERSHIP_TOTAL_LEVELS.get(agglvl, agglvl)
    return INDUSTRY_OF_STATE_LEVEL[agglvl - 20 if agglvl in COUNTY_LEVELS else agglvl]


def qcew_level(microdata: pd.DataFrame, agglvl: int, **options) -> pd.DataFrame:
    """One QCEW aggregation level (50-58 state, 70-78 county) in BLS open-data layout; ``options``
    (where, moe, level, answers, wage_psi, margins, slopes) as for ``tabulate``, margins named
    ``<BLS column>_moe`` (and their slopes ``<BLS column>_moe_slope``)."""
    by = qcew_keys(microdata, agglvl)
    county = "county" in by
    industry = qcew_industry(agglvl)
    table = tabulate(microdata, by, list(QCEW_VALUE_COLUMNS), **options)
    categorical = {c: table[c].cat.categories.dtype for c in by if isinstance(table[c].dtype, pd.CategoricalDtype)}
    if categorical:
        table = table.astype(categorical)  # keys as the codes' type
    columns = {
        "area_fips": table["state"] + (table["county"] if county else "000"),
        "own_code": table["own"] if "own" in table else ALL_OWNERSHIPS,
        "industry_code": table[industry] if industry else ALL_INDUSTRIES,
        "agglvl_code": agglvl,
        "year": table["year"] if "year" in table else pd.NA,
        "qtr": table["qtr"] if "qtr" in table else pd.NA,
        "qtrly_estabs": table["estabs"],
    }
    columns.update((column, table[attribute] if attribute in table else pd.NA)
                   for attribute, column in QCEW_VALUE_COLUMNS.items())
    columns.update((column + suffix, table[attribute + suffix]) for attribute, column in QCEW_VALUE_COLUMNS.items()
                   for suffix in ("_moe", "_moe_slope") if attribute + suffix in table)
    return pd.DataFrame(columns)


def qcew_tables(microdata: pd.DataFrame, groupings: Groupings | None = None) -> pd.DataFrame:
    """Every QCEW aggregation level 51-58 and 71-78 of the microdata, stacked in BLS layout.

    The key columns are factorized once for all levels (``groupings``: of ``microdata``, maybe shared)."""
    groupings = groupings or Groupings(microdata)
    summed = values_in_one_block(microdata, list(QCEW_VALUE_COLUMNS))
    return pd.concat([qcew_level(summed, level, groupings=groupings) for level in (*STATE_LEVELS, *COUNTY_LEVELS)],
                     ignore_index=True)


def values_in_one_block(microdata: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``microdata`` (same rows and columns) with those of ``columns`` it has held in one 2-D block
    when they share a NumPy dtype: pandas then sums them by a grouping in one pass, not one per column,
    each column's sums as before, bit for bit (compensated per column, or the same ``np.add.reduceat``
    for codes in order). Made once, it serves every tabulation of the same rows."""
    present = [c for c in columns if c in microdata.columns]
    dtypes = {microdata[c].dtype for c in present}
    if len(present) < 2 or len(dtypes) != 1 or not isinstance(dtypes.pop(), np.dtype):
        return microdata
    block = np.stack([microdata[c].to_numpy() for c in present])  # one C-contiguous row per column
    values = pd.DataFrame(block.T, columns=present, index=microdata.index, copy=False)
    return pd.concat([microdata.drop(columns=present), values], axis=1)[list(microdata.columns)]
