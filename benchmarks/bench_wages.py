"""Accuracy of protected wages and employment on states synthesized from real QCEW files (issue 13).

For each QCEW file: synthesize the state (fixed seed), protect it R times under a plan, and report
  * artificial zeros: establishments with protected m1emp >= 1 and protected wage 0;
  * county x NAICS-6 cells with true wage > 0 published as 0;
  * median relative error |protected - true| / true of wage and m1emp on the county x NAICS-6 cells
    BLS published (disclosure code not N) and on all cells with a true value > 0;
  * the state total's signed error of every attribute, in units of the state measurement's sd;
  * coverage of the 95% margins of county x NAICS-6 cells by size band (the first M releases);
  * the whole protect time (measurement, postprocessing, writing) per release.

    python benchmarks/bench_wages.py ../shared/data/qcew_2016q1_44.csv --releases 5 --label before
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.synth.qcew import read_qcew

CELL = ["state", "county", "naics"]
ATTRIBUTES = ("m1emp", "m2emp", "m3emp", "wage")
BANDS = {"m1emp": (0, 10, 100, 1_000, np.inf), "wage": (0, 1e5, 1e6, 1e7, np.inf)}


def published_cells(path: Path) -> pd.DataFrame:
    """County x NAICS-6 private cells BLS published (keys), from the QCEW file."""
    raw = pd.read_csv(path, dtype=str)
    cells = raw[(raw["agglvl_code"] == "78") & (raw["own_code"] == "5") & (raw["disclosure_code"].fillna("") != "N")]
    return pd.DataFrame({"state": cells["area_fips"].str[:2], "county": cells["area_fips"].str[2:],
                         "naics": cells["industry_code"]}).drop_duplicates()


def measure_state(path: Path, config: str, releases: int, margins: int) -> dict:
    truth = gedp.synthesize(from_qcew=path, seed=1)
    read_qcew(path)  # the file is valid QCEW (raises otherwise)
    published = published_cells(path).assign(published=True)
    true_cells = truth.groupby(CELL, observed=True)[list(ATTRIBUTES)].sum().reset_index()
    true_cells = true_cells.merge(published, on=CELL, how="left").fillna({"published": False})
    true_totals = truth[list(ATTRIBUTES)].sum()
    rows: dict[str, list] = {k: [] for k in ("zero_share", "cells_zeroed", "seconds")}
    relative: dict[str, list] = {f"{a}_{s}": [] for a in ("wage", "m1emp") for s in ("published", "all")}
    state_z: dict[str, list] = {a: [] for a in ATTRIBUTES}
    coverage: dict[str, dict[str, list]] = {a: {} for a in BANDS}
    for r in range(releases):
        start = time.perf_counter()
        release = gedp.protect(truth, config=config, seed=100 + r, not_for_publication=True)
        micro = release.microdata
        rows["seconds"].append(time.perf_counter() - start)
        employed = micro["m1emp"] >= 1
        rows["zero_share"].append(float((employed & (micro["wage"] == 0)).sum() / max(employed.sum(), 1)))
        cells = micro.groupby(CELL, observed=True)[list(ATTRIBUTES)].sum().reset_index()
        both = true_cells.merge(cells, on=CELL, how="left", suffixes=("", "_p")).fillna(0.0)
        positive = both["wage"] > 0
        rows["cells_zeroed"].append(float(((both["wage_p"] == 0) & positive).sum() / positive.sum()))
        for attribute in ("wage", "m1emp"):
            keep = both[attribute] > 0
            error = (both[f"{attribute}_p"] - both[attribute]).abs() / both[attribute]
            relative[f"{attribute}_published"].append(float(error[keep & both["published"]].median()))
            relative[f"{attribute}_all"].append(float(error[keep].median()))
        state_rows = release.measurements[release.measurements["query"] == "state"]
        for attribute in ATTRIBUTES:
            sd = float(np.sqrt(state_rows.loc[state_rows["attribute"] == attribute, "variance"].iloc[0]))
            state_z[attribute].append(float((micro[attribute].sum() - true_totals[attribute]) / sd))
        if r < margins:
            table = release.tabulate(by=CELL, moe=True)
            merged = true_cells.merge(table, on=CELL, how="inner", suffixes=("", "_p"))
            for attribute, edges in BANDS.items():
                band = np.digitize(merged[attribute], edges[1:-1])
                covered = (merged[f"{attribute}_p"] - merged[attribute]).abs() <= merged[f"{attribute}_moe"]
                for b in range(len(edges) - 1):
                    label = f"[{edges[b]:g}, {edges[b + 1]:g})"
                    coverage[attribute].setdefault(label, []).extend(covered[band == b].tolist())
    return {
        "establishments": len(truth), "cells": len(true_cells), "published_cells": int(true_cells["published"].sum()),
        "releases": releases, "config": config,
        "artificial_zero_share": float(np.mean(rows["zero_share"])),
        "cells_true_wage_positive_published_zero": float(np.mean(rows["cells_zeroed"])),
        "median_relative_error": {k: float(np.mean(v)) for k, v in relative.items()},
        "state_total_signed_error_sd": {a: {"mean": float(np.mean(z)), "min": float(np.min(z)), "max": float(np.max(z))}
                                        for a, z in state_z.items()},
        "coverage_95": {a: {band: {"cells": len(v), "coverage": float(np.mean(v)) if v else None}
                            for band, v in bands.items()} for a, bands in coverage.items()},
        "protect_seconds_median": float(np.median(rows["seconds"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("qcew", nargs="+", type=Path)
    parser.add_argument("--config", default="baseline")
    parser.add_argument("--releases", type=int, default=5)
    parser.add_argument("--margins", type=int, default=2, help="releases whose margins of error are checked")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("wages-results.jsonl"))
    args = parser.parse_args()
    for path in args.qcew:
        measured = measure_state(path, args.config, args.releases, args.margins)
        result = {"file": path.name, "label": args.label, **measured}
        print(json.dumps(result, indent=1))
        with args.out.open("a") as out:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
