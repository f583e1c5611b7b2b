"""Where the implicates' size-wage slope is lost: one release of a synthetic state, its truth known.

    python benchmarks/implicates_slope_diagnostic.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--draws 2]

Fits the implicates' priors on one release (``release.implicates.prepare``) and computes the slopes of
``evaluation.microdata_stats`` (pooled with sector effects, within county x NAICS-6 cells) on frames
that mix true and drawn values, so each step of the model is measured alone:

* ``truth``: the synthetic state;
* ``true months, drawn wages``: the wage model given the true months (the wage prior and its draw);
* ``drawn months, true wages``: the months' chain's draw with the true wages (the size's own error);
* ``months drawn without the wage, then wages``: the months' chain without the wage coupling, then
  the wages given its draw (what the coupling adds);
* ``joint draw``: the implicate (the months' chain coupled to the wages, then the wages given it);
* ``joint draw, true wages where drawn flat``: the joint draw with the true wage of the rows whose
  wage is drawn from its likelihood alone (``WAGE_FLAT_STEPS``);
and the size shift s_g's slope per supersector against the truth's slope of log(w / E) on log E in
that supersector (least squares, pooled and within cells), so a slope lost in s_g shows there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.evaluation.microdata_stats import size_wage_slopes, within_slope
from gedp.postprocess.implicates import BURN_IN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

MONTHS = ["m1emp", "m2emp", "m3emp"]


def slopes(frame: pd.DataFrame) -> tuple[float, float]:
    table = size_wage_slopes(frame).set_index("statistic")["value"]
    return float(table["slope_pooled"]), float(table["slope_cells"])


def supersector_slopes(truth: pd.DataFrame, rows: np.ndarray, model) -> pd.DataFrame:
    """Per supersector: the truth's slopes (pooled within it, within its cells) and the model's s_g."""
    part = truth.iloc[rows]
    employment = part[MONTHS].to_numpy(float).mean(axis=1)
    wages = part["wage"].to_numpy(float)
    keep = (employment >= 1) & (wages > 0)
    x, y = np.log(employment), np.log(np.where(keep, wages, 1.0) / np.maximum(employment, 1e-9))
    group = model.answers.industry
    cells = part.groupby(["county", "naics"], sort=False).ngroup().to_numpy()
    lines = model.priors.wage_shift[0]
    out = []
    for g in range(lines.shape[0]):
        mine = keep & (group == g)
        pooled = within_slope(x[mine], y[mine], np.zeros(mine.sum(), np.int64))[0]
        within = within_slope(x[mine], y[mine], pd.factorize(cells[mine])[0])[0]
        out.append((g, int(mine.sum()), pooled, within, float(lines[g, 1])))
    return pd.DataFrame(out, columns=["supersector", "rows", "truth_slope", "truth_within_cells", "s_g_slope"])


def main() -> None:
    parser = diagnostic_arguments()
    parser.add_argument("--burn-in", type=int, default=BURN_IN, help="sweeps before the first draw")
    args = parser.parse_args()
    truth, draws, rng = seeded_draws(args)
    results = {"truth": [slopes(truth)]}
    for rows, model in draws.models:
        print(supersector_slopes(truth, rows, model).round(3).to_string(index=False))
        true_months = truth[MONTHS].to_numpy(float)[rows]
        local = np.arange(len(rows))
        table, model.priors.wage_table = model.priors.wage_table, None  # a chain without the wage coupling
        uncoupled = list(model.months_chain(local, rng, args.burn_in, args.draws))
        model.priors.wage_table = table
        for months, alone in zip(model.months_chain(local, rng, args.burn_in, args.draws), uncoupled):
            wages, on_grid = model.wage_draw(local, true_months.mean(axis=1), rng, model.priors)
            joint, joint_grid = model.wage_draw(local, months.mean(axis=1), rng, model.priors)
            flat = (months.mean(axis=1) > 0) & ~joint_grid & (joint > 0)
            frames = {
                "true months, drawn wages": (true_months, wages),
                "drawn months, true wages": (months, truth["wage"].to_numpy(float)[rows]),
                "months drawn without the wage, then wages": (alone, model.wage_draw(local, alone.mean(axis=1), rng,
                                                                                    model.priors)[0]),
                "joint draw": (months, joint),
                "joint draw, true wages where drawn flat": (months, np.where(flat, truth["wage"].to_numpy(float)[rows],
                                                                             joint)),
            }
            for name, (m, w) in frames.items():
                frame = truth.copy()
                frame.loc[rows, MONTHS] = m
                frame.loc[rows, "wage"] = w
                results.setdefault(name, []).append(slopes(frame))
    pooled_truth, cells_truth = results["truth"][0]
    print(f"\n{'frame':45s} {'pooled':>8s} {'error':>8s} {'cells':>8s} {'error':>8s}")
    for name, values in results.items():
        pooled, cells = np.mean(values, axis=0)
        errors = pooled / pooled_truth - 1, cells / cells_truth - 1
        print(f"{name:45s} {pooled:8.4f} {errors[0]:+8.1%} {cells:8.4f} {errors[1]:+8.1%}")


if __name__ == "__main__":
    main()
