"""The statistics a user of public-use establishment microdata computes (SynLBD's analytic-validity
practice), from one microdata frame: truth, a protected release or an implicate alike.

Every statistic is one row of a tidy table (``microdata_statistics``): ``statistic``, ``sector``
("" statewide, else the 2-digit sector), ``size_class`` (BLS code 1-9, 0 for every size), ``value``
and ``variance``, the complete-data variance of the estimate (0 for the QCEW's census totals and
ratios of them; the squared robust standard error of a regression slope), which multiple-imputation
combining rules need. Statistics:

* ``estabs``, ``m3emp``, ``wage``: establishments, month-3 employment and quarterly wages per BLS
  size class (``postprocess.sizeclass``: month-3 employment, whole employees), statewide and by sector.
* ``avg_weekly_wage``: BLS's average weekly wage of a class, its wages / 13 / its mean monthly
  employment (``postprocess.publication.average_weekly_wage``, unrounded); NaN without employment.
* ``job_creation_rate``, ``job_destruction_rate``: within the quarter, month 1 -> month 3: the sum
  of the establishments' positive (negative, as a positive number) changes over the average of the
  two months' total employment (Davis, Haltiwanger and Schuh).
* ``no_change_share``: the share of establishments with employment in month 1 or month 2 whose
  whole-number employment (half up) is the same in both months.
* ``growth_p10``, ``growth_p25``, ``growth_p75``, ``growth_p90``: quantiles (numpy's linear rule)
  of the DHS growth rate (m3 - m1) / ((m1 + m3) / 2), in [-2, 2], over the establishments with
  employment in month 1 or month 3, unweighted, statewide.
* ``top10_share``, ``hhi``: concentration of month-3 employment, statewide and by sector: the
  largest ten establishments' share, and the Herfindahl-Hirschman index sum s_i^2 (in [0, 1]).
* ``slope_pooled``, ``slope_cells``: the slope of log(wage / e) on log(e), e the mean monthly
  employment, over the establishments with e >= 1 and wages > 0, with sector fixed effects
  (pooled) or county x NAICS-6 cell fixed effects (within cells); least squares after removing
  the group means, groups of one establishment left out, variance the HC1 heteroskedasticity-
  robust one, n / (n - k) sum x~_i^2 e_i^2 / (sum x~_i^2)^2 with k = groups + 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gedp.postprocess.publication import WEEKS_PER_QUARTER
from gedp.postprocess.sizeclass import SIZE_CODES, size_class

#: Columns of ``microdata_statistics``'s table.
COLUMNS = ("statistic", "sector", "size_class", "value", "variance")
#: Concentration: the number of largest establishments whose share is reported.
TOP = 10
GROWTH_QUANTILES = {"growth_p10": 0.10, "growth_p25": 0.25, "growth_p75": 0.75, "growth_p90": 0.90}
#: The smallest mean monthly employment of an establishment in the size-wage regressions.
SLOPE_MIN_EMPLOYMENT = 1.0
STATEWIDE = ""
ALL_SIZES = 0


def microdata_statistics(frame: pd.DataFrame) -> pd.DataFrame:
    """Every statistic of the module docstring from one establishment microdata frame (columns
    m1emp, m2emp, m3emp, wage, sector, county, naics), as a tidy table sorted by its keys."""
    parts = [size_class_table(frame), _by_sector(frame, _changes), growth_quantiles(frame),
             _by_sector(frame, _concentration), size_wage_slopes(frame)]
    table = pd.concat(parts, ignore_index=True)[list(COLUMNS)]
    return table.sort_values(["statistic", "sector", "size_class"], kind="stable", ignore_index=True)


def size_class_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Establishments, month-3 employment, wages and average weekly wage per size class and for all
    sizes, statewide and by sector (every class listed, empty ones with 0 and a NaN wage)."""
    code = size_class(frame["m3emp"].to_numpy())
    mean_employment = (frame["m1emp"].to_numpy(float) + frame["m2emp"].to_numpy(float)
                       + frame["m3emp"].to_numpy(float)) / 3
    values = pd.DataFrame({"sector": frame["sector"].astype(str).to_numpy(), "size_class": code, "estabs": 1.0,
                           "m3emp": frame["m3emp"].to_numpy(float), "wage": frame["wage"].to_numpy(float),
                           "employment": mean_employment})
    sectors = sorted(values["sector"].unique())
    cells = pd.MultiIndex.from_product([sectors, SIZE_CODES], names=["sector", "size_class"])
    by_class = values.groupby(["sector", "size_class"]).sum().reindex(cells, fill_value=0.0)
    by_sector = by_class.groupby(level="sector").sum()
    statewide = by_class.groupby(level="size_class").sum()
    sums = pd.concat([
        by_class,
        by_sector.set_index(pd.MultiIndex.from_product([sectors, [ALL_SIZES]], names=cells.names)),
        statewide.set_index(pd.MultiIndex.from_product([[STATEWIDE], SIZE_CODES], names=cells.names)),
        pd.DataFrame([by_class.sum()], index=pd.MultiIndex.from_tuples([(STATEWIDE, ALL_SIZES)], names=cells.names)),
    ])
    sums["avg_weekly_wage"] = weekly_wage(sums["wage"].to_numpy(), sums["employment"].to_numpy())
    long = sums[["estabs", "m3emp", "wage", "avg_weekly_wage"]].stack().rename("value").reset_index()
    return long.rename(columns={long.columns[2]: "statistic"}).assign(variance=0.0)


def weekly_wage(wages: np.ndarray, mean_monthly_employment: np.ndarray) -> np.ndarray:
    """Wages / 13 / mean monthly employment; NaN where the employment is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean_monthly_employment > 0, wages / WEEKS_PER_QUARTER / mean_monthly_employment, np.nan)


def _by_sector(frame: pd.DataFrame, statistics) -> pd.DataFrame:
    """``statistics(part) -> {name: value}`` statewide and for each sector's establishments."""
    rows = [(name, STATEWIDE, value) for name, value in statistics(frame).items()]
    for sector, part in frame.groupby(frame["sector"].astype(str), sort=True):
        rows += [(name, sector, value) for name, value in statistics(part).items()]
    return pd.DataFrame(rows, columns=["statistic", "sector", "value"]).assign(size_class=ALL_SIZES, variance=0.0)


def _changes(frame: pd.DataFrame) -> dict[str, float]:
    m1, m2, m3 = (frame[m].to_numpy(float) for m in ("m1emp", "m2emp", "m3emp"))
    creation, destruction = job_flow_rates(m1, m3)
    return {"job_creation_rate": creation, "job_destruction_rate": destruction,
            "no_change_share": no_change_share(m1, m2)}


def job_flow_rates(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
    """Job creation and destruction rates from ``before`` to ``after`` (per establishment): the sums
    of positive and of negative changes over the average of the two totals (NaN without employment)."""
    change = after - before
    average = (before.sum() + after.sum()) / 2
    if average <= 0:
        return np.nan, np.nan
    return float(np.clip(change, 0, None).sum() / average), float(np.clip(-change, 0, None).sum() / average)


def no_change_share(before: np.ndarray, after: np.ndarray) -> float:
    """The share of establishments employing in either month whose whole-number employment (half up)
    is the same in both (NaN when none employs)."""
    whole_before, whole_after = np.floor(before + 0.5), np.floor(after + 0.5)
    active = (whole_before > 0) | (whole_after > 0)
    return float(np.mean(whole_before[active] == whole_after[active])) if active.any() else np.nan


def growth_rates(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """DHS growth rates (after - before) / ((before + after) / 2) of the establishments with employment
    in either month."""
    mean = (before + after) / 2
    keep = mean > 0
    return (after[keep] - before[keep]) / mean[keep]


def growth_quantiles(frame: pd.DataFrame) -> pd.DataFrame:
    """P10, P25, P75 and P90 of the month 1 -> 3 DHS growth rates, statewide."""
    rates = growth_rates(frame["m1emp"].to_numpy(float), frame["m3emp"].to_numpy(float))
    quantiles = list(GROWTH_QUANTILES.values())
    values = np.quantile(rates, quantiles) if len(rates) else np.full(len(quantiles), np.nan)
    return pd.DataFrame({"statistic": list(GROWTH_QUANTILES), "sector": STATEWIDE, "size_class": ALL_SIZES,
                         "value": values, "variance": 0.0})


def _concentration(frame: pd.DataFrame) -> dict[str, float]:
    return dict(zip(("top10_share", "hhi"), concentration(frame["m3emp"].to_numpy(float))))


def concentration(values: np.ndarray, top: int = TOP) -> tuple[float, float]:
    """The ``top`` largest values' share of the total and the HHI sum (v_i / total)^2 (NaN, NaN for a
    total of 0)."""
    total = values.sum()
    if total <= 0:
        return np.nan, np.nan
    largest = np.partition(values, len(values) - top)[-top:] if len(values) > top else values
    return float(largest.sum() / total), float(np.square(values / total).sum())


def size_wage_slopes(frame: pd.DataFrame) -> pd.DataFrame:
    """The size-wage slope with sector effects (``slope_pooled``) and within county x NAICS-6 cells
    (``slope_cells``), each with its robust variance (module docstring)."""
    employment = (frame["m1emp"].to_numpy(float) + frame["m2emp"].to_numpy(float) + frame["m3emp"].to_numpy(float)) / 3
    wages = frame["wage"].to_numpy(float)
    keep = (employment >= SLOPE_MIN_EMPLOYMENT) & (wages > 0)
    x = np.log(employment[keep])
    y = np.log(wages[keep] / employment[keep])
    kept = frame[keep]
    rows = []
    for name, columns in (("slope_pooled", ["sector"]), ("slope_cells", ["county", "naics"])):
        groups = kept.groupby(columns, sort=False).ngroup().to_numpy() if len(kept) else np.zeros(0, np.int64)
        slope, variance = within_slope(x, y, groups)
        rows.append((name, slope, variance))
    return pd.DataFrame(rows, columns=["statistic", "value", "variance"]).assign(sector=STATEWIDE, size_class=ALL_SIZES)


def within_slope(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """The least-squares slope of ``y`` on ``x`` with a fixed effect per group (``groups``: codes
    0..G-1) and its HC1 variance, over the groups of two or more observations; NaN, NaN when x does
    not vary within them."""
    sizes = np.bincount(groups, minlength=int(groups.max(initial=-1)) + 1)
    keep = sizes[groups] >= 2
    x, y, groups = x[keep], y[keep], groups[keep]
    n_groups = int((sizes >= 2).sum())
    n = len(x)
    counts = np.maximum(sizes, 1)
    x_within = x - (np.bincount(groups, x, len(sizes)) / counts)[groups]
    y_within = y - (np.bincount(groups, y, len(sizes)) / counts)[groups]
    sxx = float(x_within @ x_within)
    if n <= n_groups + 1 or sxx <= 1e-12 * max(n, 1):
        return np.nan, np.nan
    slope = float(x_within @ y_within) / sxx
    residual = y_within - slope * x_within
    variance = n / (n - n_groups - 1) * float(np.square(x_within * residual).sum()) / sxx**2
    return slope, variance
