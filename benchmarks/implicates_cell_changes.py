"""Where the implicates' job destruction is lost: in cells the point release's month pattern moves, or not.

    python benchmarks/implicates_cell_changes.py --qcew FILE --structure moving-cells,wage-elasticity-0.1 \
        [--seed 1] [--draws 2]

Fits the implicates' priors on one release of a synthetic state (``release.implicates.prepare``), draws
the months (the shipped chain, fitted priors) and splits the truth's and the draws' job creation and
destruction (month 1 -> 3, employees) and no-change share (month 1 -> 2) by the county x NAICS-6
cell's month-3 / month-1 ratio as the point release estimates it (``postprocess.months.cell_patterns``,
the shrunk pattern the release's months are smoothed toward: a public function of the release), and
by whether the structure really moved the cell. ``docs/evaluation/implicates-measurements.md`` reports a run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.postprocess.implicates import BURN_IN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

MONTHS = ["m1emp", "m2emp", "m3emp"]
#: Bins of the release's estimated month-3 / month-1 ratio of the establishment's cell.
RATIO_EDGES = np.array([0.0, 0.67, 0.8, 0.9, 0.95, 1.05, 1.11, 1.25, 1.5, np.inf])


def flows(months: np.ndarray, groups: np.ndarray, labels: list[str]) -> pd.DataFrame:
    change = months[:, 2] - months[:, 0]
    rows = []
    for g, label in enumerate(labels):
        m, c = months[groups == g], change[groups == g]
        active = (m[:, 0] > 0) | (m[:, 1] > 0)
        rows.append({"group": label, "estabs": len(m), "m1": m[:, 0].sum(), "creation": np.maximum(c, 0).sum(),
                     "destruction": np.maximum(-c, 0).sum(),
                     "no_change_12": np.mean(m[active, 1] == m[active, 0]) if active.any() else np.nan})
    return pd.DataFrame(rows).set_index("group")


def compare(truth: np.ndarray, draws: list[np.ndarray], groups: np.ndarray, labels: list[str]) -> pd.DataFrame:
    t = flows(truth, groups, labels)
    d = sum(flows(m, groups, labels) for m in draws) / len(draws)
    out = pd.DataFrame({"estabs": t["estabs"], "m1": t["m1"],
                        "destr_truth": t["destruction"], "destr_drawn": d["destruction"],
                        "destr_gap": d["destruction"] - t["destruction"],
                        "creat_truth": t["creation"], "creat_drawn": d["creation"],
                        "creat_gap": d["creation"] - t["creation"],
                        "nochange_truth": t["no_change_12"], "nochange_drawn": d["no_change_12"]})
    total = out[["destr_gap", "creat_gap"]].sum()
    out["destr_gap_share"] = out["destr_gap"] / total["destr_gap"]
    out["creat_gap_share"] = out["creat_gap"] / total["creat_gap"]
    return out


def cell_ratios(model, cells: np.ndarray) -> np.ndarray:
    """Each establishment's cell's month-3 / month-1 ratio of the month pattern the point release smooths
    its months toward (``postprocess.months``: its sector's pattern moved by its cell's own, shrunk)."""
    from gedp.postprocess.months import group_pattern, with_cell_pattern

    sd = np.asarray(model.answers.month_sd, dtype=float)[None, :]
    y = np.asfortranarray(model.psi.unbiased_estimate(model.answers.months, sd))
    pattern = with_cell_pattern(y, sd, model.psi, group_pattern(y, sd, model.psi, model.answers.industry), cells)[0]
    pattern = np.broadcast_to(pattern, y.shape)
    return pattern[:, 2] / pattern[:, 0]


def main() -> None:
    from gedp.synth.structures import STRUCTURES

    parser = diagnostic_arguments()
    args = parser.parse_args()
    truth, draws, rng = seeded_draws(args)
    pd.set_option("display.width", 200)
    for rows, model in draws.models:
        true_months = truth[MONTHS].to_numpy(float)[rows]
        cells = draws.public.iloc[rows].groupby(["county", "naics"], sort=False).ngroup().to_numpy()
        ratio = cell_ratios(model, cells)
        groups = np.searchsorted(RATIO_EDGES, ratio, side="right") - 1
        labels = [f"{RATIO_EDGES[b]:g}-{RATIO_EDGES[b + 1]:g}" for b in range(len(RATIO_EDGES) - 1)]
        drawn = list(model.months_chain(np.arange(len(rows)), rng, BURN_IN, args.draws))
        print("by the release's estimated m3 / m1 of the cell\n", compare(true_months, drawn, groups, labels)
              .round(3).to_string())
        part = truth.iloc[rows]
        if "moving-cells" in args.structure:
            from implicates_utility import truth_frame
            before = truth_frame(args.qcew, [])
            moved = STRUCTURES["moving-cells"].moving_cells(truth_frame(args.qcew, ["moving-cells"]), before)
            moved = pd.Series(moved, index=before["estab_id"].astype(str)).loc[part["estab_id"].astype(str)]
            flagged = (ratio < 0.9) | (ratio > 1.11)
            split = moved.to_numpy().astype(int) * 2 + flagged.astype(int)
            names = ["not moved, not flagged", "not moved, flagged", "moved, not flagged", "moved, flagged"]
            print("by the structure's moving cells and the release's flag (m3 / m1 outside [0.9, 1.11])\n",
                  compare(true_months, drawn, split, names).round(3).to_string())


if __name__ == "__main__":
    main()
