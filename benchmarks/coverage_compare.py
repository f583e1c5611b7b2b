"""Two runs of ``level_coverage.py --cells`` on the same state, plan and seeds (before and after a
change), compared cell by cell (run on demand, not a test).

Per level, attribute and band: the coverage of each run, the bands outside the target (93-97% with
500+ cell-releases, 91-98% with 100-499), and how far the change is from noise, three ways: the
binomial standard error of one run's coverage (cells as if independent), its standard error between
releases (the spread of the releases' coverages over sqrt(R): cells of one release share its noise),
and the paired difference's standard error between releases (the same seeds give both runs the same
noise draws, so most of the noise cancels in the difference); with the cells that flipped each way.
Then level 78's median relative error of each run, with the paired difference between releases.

    python benchmarks/coverage_compare.py before.parquet after.parquet [--releases 5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

KEYS = ["level", "attribute", "band"]


def target(coverage: pd.Series, cells: pd.Series) -> pd.Series:
    """Whether each band's coverage is outside its target (bands under 100 cell-releases: never)."""
    narrow = (cells >= 500) & ((coverage < 0.93) | (coverage > 0.97))
    wide = (cells >= 100) & (cells < 500) & ((coverage < 0.91) | (coverage > 0.98))
    return narrow | wide


def compare(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per band: both runs' coverages, their standard errors and the paired difference (module)."""
    paired = before.merge(after, on=["release", "level", "attribute", "cell"], suffixes=("_b", "_a"))
    if (paired["band_b"] != paired["band_a"]).any():
        raise ValueError("the runs' cells differ: not the same state")
    paired = paired.rename(columns={"band_b": "band"})
    paired["covered_b"], paired["covered_a"] = paired["covered_b"].astype(float), paired["covered_a"].astype(float)
    per_release = paired.groupby([*KEYS, "release"], sort=False)[["covered_b", "covered_a"]].mean()
    per_release["difference"] = per_release["covered_a"] - per_release["covered_b"]
    between = per_release.groupby(KEYS, sort=False).agg(["std", "size"])
    out = paired.groupby(KEYS, sort=False).agg(
        cells=("covered_b", "size"), before=("covered_b", "mean"), after=("covered_a", "mean"))
    flips = paired["covered_a"] - paired["covered_b"]
    by_band = [paired[key] for key in KEYS]
    out["gained"] = (flips > 0).groupby(by_band, sort=False).sum()
    out["lost"] = (flips < 0).groupby(by_band, sort=False).sum()
    out["se_binomial"] = np.sqrt(out["before"] * (1 - out["before"]) / out["cells"])
    releases = between[("covered_b", "size")]
    out["se_releases"] = between[("covered_b", "std")] / np.sqrt(releases)
    out["se_difference"] = between[("difference", "std")] / np.sqrt(releases)
    out["outside_before"] = target(out["before"], out["cells"])
    out["outside_after"] = target(out["after"], out["cells"])
    return out.reset_index()


def paired_median_error(before: pd.DataFrame, after: pd.DataFrame, level: str = "78") -> pd.DataFrame:
    """Per attribute at ``level``: each run's median relative error (cells with truth > 0, over the
    releases), and the paired difference of the releases' medians with its standard error between
    releases, beside one run's (so that a narrower margin is not bought with a worse estimate)."""
    def medians(run):
        cells = run[(run["level"].astype(str) == level) & run["relative_error"].notna()]
        return cells.groupby(["attribute", "release"])["relative_error"].median()

    per_release = pd.concat({"before": medians(before), "after": medians(after)}, axis=1)
    per_release["difference"] = per_release["after"] - per_release["before"]
    grouped = per_release.groupby(level="attribute")
    out = grouped.agg(releases=("difference", "size"), difference=("difference", "mean"))
    out["se_difference"] = grouped["difference"].std() / np.sqrt(out["releases"])
    out["se_releases"] = grouped["before"].std() / np.sqrt(out["releases"])
    for name, run in (("before", before), ("after", after)):
        cells = run[(run["level"].astype(str) == level) & run["relative_error"].notna()]
        out[name] = cells.groupby("attribute")["relative_error"].median()
    return out.reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--releases", type=int, help="only the first R releases of each run")
    args = parser.parse_args()
    runs = [pd.read_parquet(path) for path in (args.before, args.after)]
    if args.releases is not None:
        runs = [run[run["release"] < args.releases] for run in runs]
    table = compare(*runs)
    for name, narrow in (("500+", table["cells"] >= 500), ("100-499", table["cells"] < 500)):
        part = table[narrow & (table["cells"] >= 100)]
        print(f"bands of {name} cell-releases: {len(part)}; outside the target before "
              f"{int(part['outside_before'].sum())}, after {int(part['outside_after'].sum())}")
    shown = table[table["outside_before"] | table["outside_after"]]
    print(shown.round(4).to_string(index=False))
    print("level 78's median relative error, paired by release:")
    print(paired_median_error(*runs).round(5).to_string(index=False))


if __name__ == "__main__":
    main()
