"""Coverage, bias and spread of the implicates' combined estimates, from implicates_utility.py's rows.

    python benchmarks/implicates_summary.py rows.csv [rows2.csv ...] [--statistics] [--table]

Per file: the share of releases whose combined 95% interval holds the truth, over the statewide
statistics (every size class's establishments, month-3 employment and average weekly wage, and the
flows, deciles, concentration and slopes) and over the sector x size-class cells of 20+ true
establishments (establishments and month-3 employment). With ``--statistics``, each statewide
statistic's diagnosis over the releases: its mean relative error, its bias and its spread between
releases each over the interval's standard error sqrt(T) (a bias many times sqrt(T) is a posterior
that is wrong, a spread many times sqrt(T) an interval that is too narrow). With ``--table``, one
Markdown table of every file: each statewide statistic's coverage and mean relative error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

BY_CLASS = ("estabs", "m3emp", "avg_weekly_wage")
FLOWS = ("job_creation_rate", "job_destruction_rate", "no_change_share", "growth_p10", "growth_p25", "growth_p75",
         "growth_p90", "top10_share", "hhi", "slope_pooled", "slope_cells")
MIN_SECTOR_CLASS_ESTABS = 20


def load(path: Path, m: int = 10) -> pd.DataFrame:
    """The rows of implicates_utility.py (drawn with ``m`` implicates), with ``covered`` and ``sqrt_t``
    (the interval's half-width over t_{m-1, 0.975}: Rubin's standard error sqrt(T))."""
    rows = pd.read_csv(path, dtype={"sector": str}, keep_default_na=False, na_values={"implicates": [""], "lo": [""],
                                                                                       "hi": [""], "truth": [""]})
    rows["covered"] = (rows["lo"] <= rows["truth"]) & (rows["truth"] <= rows["hi"])
    releases = rows["release_seed"].nunique()
    rows["sqrt_t"] = (rows["hi"] - rows["lo"]) / 2 / stats.t.ppf(0.975, m - 1)
    rows.attrs["releases"] = releases
    return rows


def statewide(rows: pd.DataFrame) -> pd.DataFrame:
    """The judged statewide rows: each size class's BY_CLASS statistics and the FLOWS."""
    state = rows[rows["sector"] == ""]
    judged = (state["statistic"].isin(BY_CLASS) & (state["size_class"] > 0)) | state["statistic"].isin(FLOWS)
    return state[judged & state["lo"].notna()]


def sector_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """Establishments and month-3 employment of the sector x size-class cells of 20+ true establishments."""
    cells = rows[(rows["sector"] != "") & (rows["size_class"] > 0)]
    estabs = cells[cells["statistic"] == "estabs"].groupby(["sector", "size_class"])["truth"].first()
    big = estabs[estabs >= MIN_SECTOR_CLASS_ESTABS].index
    cells = cells[cells["statistic"].isin(("estabs", "m3emp")) & cells["lo"].notna()]
    return cells[pd.MultiIndex.from_frame(cells[["sector", "size_class"]]).isin(big)]


def diagnosis(rows: pd.DataFrame) -> pd.DataFrame:
    """Per statewide statistic over the releases: truth, mean error (relative: NaN where the truth is 0),
    coverage, mean bias and the spread of the combined estimates between releases, each over the mean
    sqrt(T)."""
    grouped = statewide(rows).assign(error=lambda r: r["implicates"] - r["truth"]).groupby(
        ["statistic", "size_class"], sort=True)
    out = pd.DataFrame({"truth": grouped["truth"].first(), "error": grouped["error"].mean(),
                        "coverage": grouped["covered"].mean()})
    out["relative_error"] = out["error"] / out["truth"].abs().where(out["truth"] != 0)
    sqrt_t = grouped["sqrt_t"].mean()
    out["bias_over_sqrt_t"] = grouped["error"].mean() / sqrt_t
    out["spread_over_sqrt_t"] = grouped["implicates"].std() / sqrt_t
    return out


def error_text(statistic: str, row: pd.Series) -> str:
    """The mean error: in points for the no-change share, absolute where the truth is 0, else relative."""
    if statistic == "no_change_share":
        return f"{100 * row['error']:+.1f} pts"
    if row["truth"] == 0:
        return f"{row['error']:+.3g}, truth 0"
    return f"{100 * row['relative_error']:+.1f}%"


def markdown(diagnosed: dict[str, pd.DataFrame]) -> str:
    """Statistic x file: coverage (mean error, ``error_text``)."""
    index = sorted(set().union(*(d.index for d in diagnosed.values())),
                   key=lambda key: (key[0] not in BY_CLASS, key[0], key[1]))
    lines = ["| statistic | " + " | ".join(diagnosed) + " |", "|---" * (len(diagnosed) + 1) + "|"]
    for statistic, size_class in index:
        cells = []
        for d in diagnosed.values():
            if (statistic, size_class) not in d.index:
                cells.append("-")
                continue
            row = d.loc[(statistic, size_class)]
            error = error_text(statistic, row)
            cells.append(f"{row['coverage']:.0%} ({error})")
        name = f"{statistic} {size_class}" if size_class else statistic
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", type=Path, nargs="+")
    parser.add_argument("--statistics", action="store_true")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--m", type=int, default=10, help="implicates per release of the rows")
    args = parser.parse_args()
    if args.table:
        print(markdown({path.stem: diagnosis(load(path, args.m)) for path in args.rows}))
        return
    for path in args.rows:
        rows = load(path, args.m)
        state, cells = statewide(rows), sector_cells(rows)
        by_statistic = cells.groupby("statistic")["covered"].mean()
        diagnosed = diagnosis(rows)
        print(f"{path.name}: {rows.attrs['releases']} releases; coverage, statewide statistics "
              f"{state['covered'].mean():.0%} ({state.groupby(['statistic', 'size_class']).ngroups}); sector x class "
              f"(20+ estabs) estabs {by_statistic.get('estabs', np.nan):.0%} / m3emp "
              f"{by_statistic.get('m3emp', np.nan):.0%} ({cells.groupby(['sector', 'size_class']).ngroups} cells); "
              f"median |bias| / sqrt(T) {diagnosed['bias_over_sqrt_t'].abs().median():.2f}, median spread between "
              f"releases / sqrt(T) {diagnosed['spread_over_sqrt_t'].median():.2f}")
        if args.statistics:
            with pd.option_context("display.width", 160, "display.max_rows", 200):
                print(diagnosed.round(3).to_string())


if __name__ == "__main__":
    main()
