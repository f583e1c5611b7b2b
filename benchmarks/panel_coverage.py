"""Coverage of the margins of over-the-year changes in panel releases (run on demand, not a test).

A 5-quarter panel is grown from a state synthesized from its published QCEW file; it is protected
``--releases`` times (seeds 1000, 1001, ...), and each county x NAICS-3 cell's change from the first
quarter to the last, with its margin at 95%, is compared with the panel's true change. With
``--annual-mu MU`` every quarter is protected with the recommended config scaled to MU / sqrt(4)
(four quarters spend MU, as ``gedp plan --quarters 4 --mu-total MU`` plans them). Reported per
attribute and size band (the cell's true month-1 employment in the first quarter; "all": every
cell): the share of cells whose true change lies within the margin, with its binomial standard
error, and the median absolute error of the change.

    nice -n 10 python benchmarks/panel_coverage.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --releases 20 --annual-mu 2.3065 --out benchmarks/panel-coverage-annual-ri.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.config import Config, load_config, parse_config
from gedp.postprocess.changes import change_table
from gedp.postprocess.tabulate import tabulate
from gedp.synth.establishments import synthesize_state
from gedp.synth.panel import grown_panel
from gedp.synth.qcew import read_qcew

KEYS = ["state", "county", "naics3"]
ATTRIBUTES = ("m1emp", "m2emp", "m3emp", "wage")
BANDS = [(0, 0, "0"), (1, 9, "1-9"), (10, 99, "10-99"), (100, 999, "100-999"),
         (1000, math.inf, "1000+")]
CHANGE = "2016Q1:2017Q1"


def true_changes(panel: pd.DataFrame) -> pd.DataFrame:
    """The panel's true change of every cell from 2016Q1 to 2017Q1, and its first-quarter month-1 employment."""
    levels = [tabulate(panel[(panel["year"] == year) & (panel["qtr"] == 1)], KEYS) for year in (2016, 2017)]
    truth = change_table(*levels, KEYS, ATTRIBUTES)
    first = levels[0].set_index(KEYS)["m1emp"]
    truth["size"] = first.reindex(pd.MultiIndex.from_frame(truth[KEYS])).fillna(0.0).to_numpy()
    return truth


def band_of(size: np.ndarray) -> np.ndarray:
    names = np.empty(len(size), dtype=object)
    for low, high, name in BANDS:
        names[(size >= low) & (size <= high)] = name
    return names


def annual_config(annual_mu: float) -> Config:
    """The recommended config with every query's mu (and the cap) scaled so that a quarter spends
    annual_mu / sqrt(4)."""
    config = load_config("recommended")
    factor = annual_mu / math.sqrt(4) / config.plan.budget().total
    raw = dict(config.raw, mu_cap=round(config.raw["mu_cap"] * factor, 4),
               queries=[dict(query, mu={a: mu * factor for a, mu in query["mu"].items()})
                        for query in config.raw["queries"]])
    return parse_config(raw, "recommended scaled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--releases", type=int, default=20)
    parser.add_argument("--annual-mu", type=float, default=None,
                        help="protect each quarter at this mu / sqrt(4) (default: the recommended config)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = load_config("recommended") if args.annual_mu is None else annual_config(args.annual_mu)
    print(f"each quarter at mu {config.plan.budget().total:.4f}", flush=True)
    rng = np.random.default_rng(1)
    panel = grown_panel(synthesize_state(read_qcew(args.qcew), rng=rng), "2016Q1:2017Q1", rng=rng)
    truth = true_changes(panel)
    rows = []
    start = time.perf_counter()
    for release_index in range(args.releases):
        release = gedp.protect(panel, config, seed=1000 + release_index, not_for_publication=True)
        estimate = release.tabulate(KEYS[1:], change=CHANGE, moe=True)
        joined = truth.merge(estimate, on=KEYS, suffixes=("_true", ""))
        for attribute in ATTRIBUTES:
            error = (joined[f"{attribute}_chg"] - joined[f"{attribute}_chg_true"]).abs()
            covered = error <= joined[f"{attribute}_chg_moe"]
            rows.append(pd.DataFrame({"release": release_index, "attribute": attribute,
                                      "band": band_of(joined["size"].to_numpy()), "covered": covered.to_numpy(),
                                      "error": error.to_numpy()}))
        print(f"release {release_index + 1}/{args.releases} done ({time.perf_counter() - start:.0f}s)", flush=True)
    cells = pd.concat(rows, ignore_index=True)
    cells = pd.concat([cells, cells.assign(band="all")], ignore_index=True)  # every band together
    summary = cells.groupby(["attribute", "band"]).agg(cells=("covered", "size"), coverage=("covered", "mean"),
                                                       median_error=("error", "median")).reset_index()
    summary["se"] = np.sqrt(summary["coverage"] * (1 - summary["coverage"]) / summary["cells"])
    result = {"qcew": args.qcew.name, "releases": args.releases, "quarter_mu": config.plan.budget().total,
              "change": CHANGE, "level": 0.95,
              "cells_per_release": len(truth), "summary": summary.to_dict(orient="records")}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
