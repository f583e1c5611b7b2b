"""Every band outside the coverage target, with what the best margin rule fitted on the truth would
give there (run on demand, not a test).

Reads the cell-release rows of ``level_coverage.py --cells`` (one state and plan; z = error / stated sd
in ``ratio``) and, for every band outside the target (93-97% with 500+ cell-releases, 91-98% with
100-499: ``coverage_compare.target``), prints and records:

* the coverage as measured, its standard error between releases, the mean, sd and kurtosis of z
  (3 for a normal) and the share of misses with the truth above the estimate;
* **the truth-fitted-factor bound** (class (a)): the band's coverage when the margins of the level and
  attribute are rescaled, per group of cells by something the release states (the estimate; the
  protected month-1 employment; both), by the factor that makes that group cover exactly 95%, fitted
  on the truth (groups of fewer than 30 cell-releases kept as they are). A margin rule that is a
  function of those columns, however it is chosen, covers each such group at 95% only with these
  factors, so a band whose bound is outside the target under every grouping is out of reach of any
  honest rule built from the release; this is an oracle's bound, not a method;
* for wages, **cells without true employment** (class (b)): their share of the band, their coverage
  and the coverage of the band's other cells (if those are inside the target, the band is out only
  through the cells without employment, for which an oracle posterior, the true distribution of
  those establishments' wages, covers 81-84% on New Jersey under ``baseline``: branch idlewage17,
  ``benchmarks/idle_wage_oracle.py`` there);
* the cells whose true total is 0: their share, their coverage (a margin that reaches the bound
  covers them; one that does not would state that the cell is not at 0) and the others';
* its class: (b) inside the target without the cells without employment, (z) inside without the
  cells whose true total is 0, (a) heavy tails, the bound outside the target under every grouping,
  (c) anything else.

    python benchmarks/band_bounds.py ri-baseline.parquet --name "Rhode Island, baseline" \\
        --out benchmarks/band-bounds-ri-baseline.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from coverage_compare import target  # noqa: E402

Z = 1.959963984540054
MIN_GROUP = 30
ESTIMATE_EDGES = {"wage": (-np.inf, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 3e6, 1e7, 3e7, np.inf),
                  "m1emp": (-np.inf, 1, 3, 10, 30, 100, 300, 1000, 3000, np.inf)}
EMPLOYMENT_EDGES = (-np.inf, 0.5, 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100, 200, 1000, np.inf)
JOINT_EDGES = (-np.inf, 0.5, 3, 10, 30, 100, 1000, np.inf)


def group_codes(values: np.ndarray, edges: tuple) -> np.ndarray:
    """The index of each value's interval [edges[i], edges[i + 1])."""
    return np.searchsorted(np.asarray(edges[1:-1]), values, side="right")


def fitted_cover(z: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Whether each cell covers when every group of ``MIN_GROUP`` or more cells has its margins
    rescaled to cover exactly 95% (the 95% quantile of |z| over Z: fitted on the truth)."""
    size = np.abs(z)
    scaled = size.copy()
    for group in np.unique(groups):
        inside = groups == group
        if inside.sum() >= MIN_GROUP:
            factor = np.quantile(size[inside], 0.95) / Z
            scaled[inside] = size[inside] / factor if factor > 0 else 0.0  # all at 0: every margin covers
    return scaled <= Z


def bounds(level_cells: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per grouping by released values, each cell's coverage under the truth-fitted factors."""
    attribute = level_cells["attribute"].iloc[0]
    estimate = group_codes(level_cells["estimate"].to_numpy(), ESTIMATE_EDGES[attribute])
    employment = group_codes(level_cells["protected_m1emp"].to_numpy(), EMPLOYMENT_EDGES)
    joint = estimate * len(JOINT_EDGES) + group_codes(level_cells["protected_m1emp"].to_numpy(), JOINT_EDGES)
    z = level_cells["ratio"].to_numpy()
    return {name: fitted_cover(z, groups) for name, groups in
            (("by_estimate", estimate), ("by_employment", employment), ("by_estimate_and_employment", joint))}


def kurtosis(z: np.ndarray) -> float:
    """The kurtosis of z (3 for a normal)."""
    centred = z - z.mean()
    return float(np.mean(centred**4) / np.mean(centred**2) ** 2)


def inside(coverage: float, cells: int) -> bool:
    """Whether a coverage meets the target for a band of ``cells`` cell-releases."""
    return not bool(target(pd.Series([coverage]), pd.Series([cells])).iloc[0])


def outside_bands(cells: pd.DataFrame) -> list[dict]:
    """The module's rows, for every band outside the target."""
    cells = cells[cells["band"] != ""]
    summary = cells.groupby(["level", "attribute", "band"], sort=False)["covered"].agg(["size", "mean"])
    rows = []
    for (level, attribute), level_cells in cells.groupby(["level", "attribute"], sort=False):
        level_cells = level_cells.reset_index(drop=True)
        covers = bounds(level_cells)
        for band, band_cells in level_cells.groupby("band", sort=False):
            n, coverage = int(summary.loc[(level, attribute, band), "size"]), float(
                summary.loc[(level, attribute, band), "mean"])
            if n < 100 or inside(coverage, n):
                continue
            where = band_cells.index.to_numpy()
            z = band_cells["ratio"].to_numpy()
            missed = ~band_cells["covered"].to_numpy()
            per_release = band_cells.groupby("release")["covered"].mean()
            row = {"level": level, "attribute": attribute, "band": band, "cells": n, "coverage": coverage,
                   "se_releases": float(per_release.std() / np.sqrt(len(per_release))),
                   "z_mean": float(z.mean()), "z_sd": float(z.std()), "z_kurtosis": kurtosis(z),
                   "misses_truth_above": float(np.mean(z[missed] < 0)) if missed.any() else None,
                   "bound": {name: float(cover[where].mean()) for name, cover in covers.items()}}
            low, high = (0.93, 0.97) if n >= 500 else (0.91, 0.98)
            row["se_from_target"] = (max(low - coverage, coverage - high) / row["se_releases"]
                                     if row["se_releases"] > 0 else None)
            row["bound_inside"] = any(inside(value, n) for value in row["bound"].values())
            lone = (band_cells["no_employment"].fillna(False).astype(bool).to_numpy()
                    if attribute == "wage" else np.zeros(len(band_cells), bool))
            covered = band_cells["covered"].to_numpy()
            row["no_employment"] = {"share": float(lone.mean()),
                                    "coverage": float(covered[lone].mean()) if lone.any() else None,
                                    "coverage_of_the_others": float(covered[~lone].mean())}
            others_inside = lone.any() and inside(float(covered[~lone].mean()), int((~lone).sum()))
            zero = band_cells["truth"].to_numpy() <= 0
            row["true_zero"] = {"share": float(zero.mean()),
                                "coverage": float(covered[zero].mean()) if zero.any() else None,
                                "coverage_of_the_others": float(covered[~zero].mean()) if (~zero).any() else None}
            nonzero_inside = zero.any() and (~zero).any() and inside(float(covered[~zero].mean()), int((~zero).sum()))
            row["class"] = ("b" if others_inside else "z" if nonzero_inside else "a" if not row["bound_inside"]
                            else "c")
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", type=Path, help="level_coverage.py --cells output")
    parser.add_argument("--name", required=True, help="the state and plan, for the record")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cells = pd.read_parquet(args.cells)
    rows = outside_bands(cells)
    n_bands = int((cells[cells["band"] != ""].groupby(["level", "attribute", "band"]).size() >= 100).sum())
    args.out.write_text(json.dumps({"run": args.name, "releases": int(cells["release"].nunique()),
                                    "bands_of_100_or_more": n_bands, "outside": rows}, indent=1) + "\n")
    print(f"{args.name}: {len(rows)} of {n_bands} bands outside the target")
    for row in rows:
        bound = " / ".join(f"{value:.1%}" for value in row["bound"].values())
        lone = row["no_employment"]
        lone_text = (f"; without employment {lone['share']:.0%} of cells, covered {lone['coverage']:.1%}, "
                     f"others {lone['coverage_of_the_others']:.1%}" if lone["share"] else "")
        zero = row["true_zero"]
        if zero["share"] and zero["coverage_of_the_others"] is not None:
            lone_text += (f"; true total 0 {zero['share']:.0%} of cells, covered {zero['coverage']:.1%}, "
                          f"others {zero['coverage_of_the_others']:.1%}")
        away = row["se_from_target"]
        print(f"  ({row['class']}) level {row['level']} {row['attribute']} {row['band']}: {row['coverage']:.1%} "
              f"of {row['cells']} (se {row['se_releases']:.1%}, {np.inf if away is None else away:.1f} se out); "
              f"z mean {row['z_mean']:+.2f}, sd {row['z_sd']:.2f}, kurtosis {row['z_kurtosis']:.1f}; "
              f"bound by estimate / employment / both {bound}{lone_text}")

if __name__ == "__main__":
    main()
