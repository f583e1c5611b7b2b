"""The wage margins' noise where the released wages lie (the fit's sandwich), model cell by model cell
(run on demand, not a test; a diagnostic).

The wage fit weighs each cell's summed identity answers by their noise variance vd at its prior
(the cell's rate x protected employment); the sqrt mechanism's noise grows with the wage, so a cell
whose wages lie below its prior has less noise than that, one above more. The margins state the
fit's sandwich K^-1 (K + diag(e / vd^2)) K^-1 (K the fit's precision with the rates fixed, e a
cell's noise variance at its released wages less at the weighed ones, of either sign:
``wages._noise_excess``, ``wage_rates.CellsInPlanCells.noise_forms``). This script measures, on the
model's cells (county x NAICS-6 where the plan has county wage queries, QCEW level 78), the
coverage per band of the true total with

* **without**: the margins without that term (the noise taken where the answers were weighed);
* **sandwich**: the release's margins (``wage_margins.wage_variances``).

    nice -n 10 python benchmarks/wage_noise_sandwich.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --config recommended --releases 5 --out benchmarks/wage-noise-sandwich-ri-recommended.json
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from level_coverage import state_and_config, state_parser, wilson  # noqa: E402
from wage_margin_terms import TOTAL_BANDS, banded  # noqa: E402

import gedp  # noqa: E402
from gedp.postprocess import wages  # noqa: E402
from gedp.postprocess.wage_margins import wage_variances  # noqa: E402
from gedp.release.reader import release_answers, release_wage_psi  # noqa: E402

Z = 1.959963984540054


def release_cells(truth: pd.DataFrame, release: gedp.Release) -> pd.DataFrame:
    """One row per model cell: truth, estimate, the variance without the noise term and the stated one."""
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    fit = wages.fit_wages(release_answers(release.folder, protected), protected, release_wage_psi(release.folder))
    n = len(fit.totals)
    stated = wage_variances(fit, fit.cell_codes, n)
    without = wage_variances(dataclasses.replace(fit, noise_excess=np.zeros(n)), fit.cell_codes, n)
    truth_total = np.bincount(fit.cell_codes, weights=truth["wage"].to_numpy(), minlength=n)
    return pd.DataFrame({"truth": truth_total, "estimate": fit.totals, "without": without, "sandwich": stated,
                         "fixed": fit.fixed_cells})


def summary(cells: pd.DataFrame) -> list[dict]:
    """Per band of the true total: cells, coverage under either variance (Wilson interval), zero margins."""
    cells = cells[~cells.fixed & (cells.truth > 0)].assign(band=lambda c: banded(c.truth, TOTAL_BANDS))
    rows = []
    for band, part in cells.groupby("band", sort=False):
        if not band:
            continue
        row: dict = {"band": band, "cells": len(part)}
        for name in ("without", "sandwich"):
            covered = np.abs(part.estimate - part.truth) <= Z * np.sqrt(part[name])
            row[name] = float(covered.mean())
            row[f"{name}_wilson"] = list(wilson(float(covered.mean()), len(part)))
            row[f"{name}_zero_margins"] = int((part[name] <= 0).sum())
        rows.append(row)
    return sorted(rows, key=lambda r: [b[2] for b in TOTAL_BANDS].index(r["band"]))


def main() -> None:
    parser = state_parser(__doc__, config="recommended", mu=2.3065)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    (truth, config), frames, start = state_and_config(args), [], time.perf_counter()
    for index in range(args.releases):
        release = gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        frames.append(release_cells(truth, release).assign(release=index))
        print(f"release {index + 1}/{args.releases} ({time.perf_counter() - start:.0f}s)", flush=True)
    rows = summary(pd.concat(frames, ignore_index=True))
    args.out.write_text(json.dumps({"qcew": args.qcew.name, "mu": args.mu, "config": args.config,
                                    "releases": args.releases, "bands": rows}, indent=1) + "\n")
    for row in rows:
        print(f"{row['band']:>8}: {row['cells']:6d} cell-releases, without {row['without']:.2%}, sandwich "
              f"{row['sandwich']:.2%} ({row['sandwich_zero_margins']} margins of 0)")


if __name__ == "__main__":
    main()
