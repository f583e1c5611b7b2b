"""Whether the wage margins' noise, taken at the wage the identity answers were weighed at, is what
makes small wage cells over-cover (run on demand, not a test; a diagnostic, not a method).

The wage fit weighs each cell's summed identity answers by their noise variance vd at its prior
(``WageFit``'s weighed wages: the cell's rate x protected employment), and its margins state that
variance as the answers' noise; the sqrt mechanism's noise grows with the wage, so a cell whose wages
lie below its prior has less noise than stated, one above more. ``wages._noise_excess`` corrects this
for idle establishments only, and only upward, with the cells taken as independent (v^2 e / vd^2 per
cell). This script measures, on the model's cells (county x NAICS-6 where the plan has county wage
queries, QCEW level 78), the coverage per band of the true total with

* **stated**: the release's margins (``wage_margins.wage_variances``);
* **sandwich**: the stated variance with that term replaced by the exact sandwich of the cells' least
  squares at the answers' noise evaluated at the released wages, for every establishment and of
  either sign: with K = diag(1 / v) + A' M A the fit's precision (rates fixed) and
  eps_c = e_c / vd_c^2 (e_c: the cell's noise variance at its released wages less at the weighed
  ones), Var = K^-1 (K + diag(eps)) K^-1, whose form for cell c adds sum_j eps_j (K^-1)_jc^2 (never
  negative in all: K + diag(eps) is the fit's precision at the answers' noise there).

    nice -n 10 python benchmarks/wage_noise_sandwich.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --config recommended --releases 5 --out benchmarks/wage-noise-sandwich-ri-recommended.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).parent))
from level_coverage import scaled_config, synthetic_truth, wilson  # noqa: E402
from wage_margin_terms import TOTAL_BANDS, banded, kept_priors  # noqa: E402

import gedp  # noqa: E402
from gedp.postprocess import wages  # noqa: E402
from gedp.postprocess.wage_margins import wage_variances  # noqa: E402
from gedp.postprocess.wage_rates import CellsInPlanCells  # noqa: E402
from gedp.release.reader import release_answers, release_wage_psi  # noqa: E402

Z = 1.959963984540054
CHUNK = 1000


def sandwich_terms(fit: wages.WageFit, eps: np.ndarray) -> np.ndarray:
    """Per cell c: sum_j eps_j (K^-1)_jc^2, K^-1 e_c = (I + S A' M A)^-1 S e_c (fixed cells: 0)."""
    s = np.where(fit.fixed_cells, 0.0, fit.cell_variance)
    operator = CellsInPlanCells(fit.coarse_groups, fit.group_variance, s, fit.coarse_cells)
    n = len(s)
    identity = sp.identity(n, format="csc")
    out = np.zeros(n)
    for start in range(0, n, CHUNK):
        columns = np.arange(start, min(start + CHUNK, n))
        p = sp.csc_matrix((s[columns], (columns, np.arange(len(columns)))), shape=(n, len(columns)))
        solved = operator.left_solve(identity, p)  # K^-1 e_c for the chunk's cells, cells x chunk
        out[columns] = eps @ solved**2
    return out


def release_cells(truth: pd.DataFrame, release: gedp.Release) -> pd.DataFrame:
    """One row per model cell: truth, estimate, the stated variance and the sandwich's."""
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    answers = release_answers(release.folder, protected)
    with kept_priors() as kept:
        fit = wages.fit_wages(answers, protected, release_wage_psi(release.folder))
    p, last, vd = kept["problem"], kept["last"], kept["priors"][1]
    n = len(fit.totals)
    weighed_at = last.weight_rate * p.employment
    noise = p.psi.estimate_variance(fit.values, p.sd) - p.psi.estimate_variance(weighed_at, p.sd)
    e = np.bincount(fit.cell_codes, weights=noise, minlength=n)
    eps = np.divide(e, vd**2, out=np.zeros(n), where=vd > 0)
    stated = wage_variances(fit, fit.cell_codes, n)
    sandwich = np.maximum(stated - np.where(fit.fixed_cells, 0.0, fit.noise_excess) + sandwich_terms(fit, eps), 0.0)
    truth_total = np.bincount(fit.cell_codes, weights=truth["wage"].to_numpy(), minlength=n)
    return pd.DataFrame({"truth": truth_total, "estimate": fit.totals, "stated": stated, "sandwich": sandwich,
                         "fixed": fit.fixed_cells})


def summary(cells: pd.DataFrame) -> list[dict]:
    """Per band of the true total: cells, coverage under either variance (Wilson interval), zero margins."""
    cells = cells[~cells.fixed & (cells.truth > 0)].assign(band=lambda c: banded(c.truth, TOTAL_BANDS))
    rows = []
    for band, part in cells.groupby("band", sort=False):
        if not band:
            continue
        row: dict = {"band": band, "cells": len(part)}
        for name in ("stated", "sandwich"):
            covered = np.abs(part.estimate - part.truth) <= Z * np.sqrt(part[name])
            row[name] = float(covered.mean())
            row[f"{name}_wilson"] = list(wilson(float(covered.mean()), len(part)))
            row[f"{name}_zero_margins"] = int((part[name] <= 0).sum())
        rows.append(row)
    return sorted(rows, key=lambda r: [b[2] for b in TOTAL_BANDS].index(r["band"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--mu", type=float, default=2.3065)
    parser.add_argument("--config", default="recommended")
    parser.add_argument("--releases", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    truth = synthetic_truth(args.qcew)
    config, frames, start = scaled_config(args.mu, args.config), [], time.perf_counter()
    for index in range(args.releases):
        release = gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        frames.append(release_cells(truth, release).assign(release=index))
        print(f"release {index + 1}/{args.releases} ({time.perf_counter() - start:.0f}s)", flush=True)
    rows = summary(pd.concat(frames, ignore_index=True))
    args.out.write_text(json.dumps({"qcew": args.qcew.name, "mu": args.mu, "config": args.config,
                                    "releases": args.releases, "bands": rows}, indent=1) + "\n")
    for row in rows:
        print(f"{row['band']:>8}: {row['cells']:6d} cell-releases, stated {row['stated']:.2%}, sandwich "
              f"{row['sandwich']:.2%} ({row['sandwich_zero_margins']} margins of 0)")


if __name__ == "__main__":
    main()
