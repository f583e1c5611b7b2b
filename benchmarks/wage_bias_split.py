"""Whether the wage margins of statewide cells miss by bias (the model's misfit) or by a too-small
variance (run on demand, not a test; a diagnosis with the truth).

Reads a ``level_coverage.py --cells`` run (R releases of one synthesized state and plan, the same
truth) and the state's QCEW file. Per wage cell of levels 54-58 with a true total of $1M or more:
its bias b (mean over the releases of estimate - truth), its spread s (the releases' sd of the
estimate) and its stated variance V (median over the releases). The mean squared error splits as
b^2 + s^2 (R - 1) / R; printed per level and band, as shares of V: b^2 less its noise s^2 / R, and
s^2. Then, per band of the cell's true wage per employee against its NAICS-3 parent's (log ratio),
the same with the coverage and the mean of b / sqrt(V): where the bias is. ``coverage``: of the
stated margins z sqrt(V); ``coverage_run``: of the run's margins (with ``--misfit``, the misfit
term's: ``postprocess.wage_misfit``).

    python benchmarks/wage_bias_split.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --cells ri-baseline.parquet --out benchmarks/wage-bias-split-ri-baseline.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from level_coverage import synthetic_truth

from gedp.measure.queries import group_establishments
from gedp.postprocess.tabulate import qcew_keys
from gedp.synth.schema import public_columns

LEVELS = (54, 55, 56, 57, 58)
RATIO_EDGES = (-5, -0.5, -0.25, -0.1, 0.1, 0.25, 0.5, 5)
Z = 1.959963984540054


def parent_ratios(truth: pd.DataFrame) -> pd.DataFrame:
    """Per cell of LEVELS: log of its true wage per employee over its NAICS-3 parent's (employment:
    the mean of the months)."""
    public = truth[public_columns(truth)]
    employment = truth[["m1emp", "m2emp", "m3emp"]].mean(axis=1).to_numpy()
    wage = truth["wage"].to_numpy()
    parent = group_establishments(public, ["state", "naics3"])
    rate = parent.sum(wage) / np.maximum(parent.sum(employment), 1e-9)
    frames = []
    for level in LEVELS:
        grouping = group_establishments(public, [k for k in qcew_keys(truth, level) if k not in ("year", "qtr")])
        at_parent = grouping.sum(rate[parent.codes] * employment)
        frames.append(pd.DataFrame({"level": level, "cell": np.arange(grouping.n_groups),
                                    "log_ratio": np.log(np.maximum(grouping.sum(wage), 1e-9) / np.maximum(at_parent,
                                                                                                         1e-9))}))
    return pd.concat(frames)


def per_cell(cells: pd.DataFrame) -> pd.DataFrame:
    """Bias, spread, stated variance and coverage per wage cell of LEVELS (over the releases)."""
    cells = cells[cells["attribute"] == "wage"].assign(level=lambda c: c["level"].astype(int))
    cells = cells[cells["level"].isin(LEVELS)].assign(error=lambda c: c["estimate"] - c["truth"])
    cells = cells.assign(covered_stated=lambda c: c["error"].abs() <= Z * np.sqrt(c["stated"]))
    return cells.groupby(["level", "cell"]).agg(
        band=("band", "first"), truth=("truth", "first"), bias=("error", "mean"), spread=("error", "std"),
        stated=("stated", "median"), covered=("covered_stated", "mean"), covered_run=("covered", "mean"),
        releases=("error", "size")).reset_index()


def split(frame: pd.DataFrame) -> pd.Series:
    r = frame["releases"]
    return pd.Series({"cells": len(frame), "coverage": frame["covered"].mean(),
                      "coverage_run": frame["covered_run"].mean(),
                      "bias2_over_v": ((frame["bias"] ** 2 - frame["spread"] ** 2 / r) / frame["stated"]).mean(),
                      "spread2_over_v": (frame["spread"] ** 2 / frame["stated"]).mean(),
                      "mean_bias_z": (frame["bias"] / np.sqrt(frame["stated"])).mean()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--cells", type=Path, required=True, help="a level_coverage.py --cells run with wages' "
                        "stated variances")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cells = per_cell(pd.read_parquet(args.cells))
    cells = cells.merge(parent_ratios(synthetic_truth(args.qcew)), on=["level", "cell"])
    large = cells[cells["truth"] >= 1e6]
    by_band = large.groupby(["level", "band"]).apply(split, include_groups=False).reset_index()
    large = large.assign(ratio_band=pd.cut(large["log_ratio"], RATIO_EDGES).astype(str))
    by_ratio = large.groupby("ratio_band", sort=False).apply(split, include_groups=False).reset_index()
    by_ratio = by_ratio.assign(low=by_ratio["ratio_band"].str.extract(r"\((-?[\d.]+)")[0].astype(float)
                               ).sort_values("low").drop(columns="low")
    print(by_band.round(3).to_string(index=False))
    print(by_ratio.round(3).to_string(index=False))
    args.out.write_text(json.dumps({"cells": args.cells.name, "by_level_band": by_band.to_dict(orient="records"),
                                    "by_parent_ratio": by_ratio.to_dict(orient="records")}, indent=1) + "\n")


if __name__ == "__main__":
    main()
