"""The months' draws per size band against the truth: share with no change and job flows.

    python benchmarks/implicates_change_bands.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--draws 2]
        [--no-atom-from 50]

Fits the implicates' priors on one release of a synthetic state (``release.implicates.prepare``), draws
the months (the chain of ``gedp implicates``, its seed the release's + 1000) and prints per band of the
true mean employment: establishments, share with no change over the quarter (m2 = m1 = m3) and from
month 1 to 2, job creation and destruction from month 1 to 3 (employees), the share of changes of
exactly one employee and of five or more; for the truth, the draws, and the draws under the same
priors without the no-change atom in the change bands whose lower edge is ``--no-atom-from`` employees
or more (what the atom adds). Before them, each state's fitted atom weights and their standard errors
(``PosteriorModel.summary``); with ``--cell-changes fitted`` the offsets' fitted slopes per change band
and the truth's (its changes in psi scale regressed on the same offsets). ``docs/evaluation/implicates-measurements.md``
(the no-change atom; the cells' month patterns) reports runs.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.postprocess.cell_changes import band_slopes, mode_offsets
from gedp.postprocess.deconvolve import Mixture
from gedp.postprocess.implicates import BURN_IN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

MONTHS = ["m1emp", "m2emp", "m3emp"]
EDGES = np.array([0, 5, 10, 20, 50, 100, 250, np.inf])


def band_table(months: np.ndarray, band: np.ndarray) -> pd.DataFrame:
    """Per band: establishments, no-change shares, job flows m1 -> m3 and the shares of small and large changes."""
    rows = []
    for b in range(len(EDGES) - 1):
        m = months[band == b]
        change = m[:, 2] - m[:, 0]
        rows.append({"band": f"{EDGES[b]:g}-{EDGES[b + 1]:g}", "estabs": len(m),
                     "no_change": np.mean((m[:, 1] == m[:, 0]) & (m[:, 2] == m[:, 0])),
                     "no_change_12": np.mean(m[:, 1] == m[:, 0]),
                     "creation": np.maximum(change, 0).sum(), "destruction": np.maximum(-change, 0).sum(),
                     "one_employee": np.mean(np.abs(change) == 1), "five_or_more": np.mean(np.abs(change) >= 5)})
    return pd.DataFrame(rows).set_index("band")


def truth_slopes(model, true_months: np.ndarray) -> list[float]:
    """Per change band: the slope of the truth's changes in psi scale on the offsets b (``band_slopes``), the
    beta the answers' slope estimates."""
    _, band, _ = model.change_bands()
    offset, _ = mode_offsets(model.answers, model.psi, band, "all")
    theta = model.psi(true_months)
    return [round(float(b), 3) for b in band_slopes(theta[:, 1:] - theta[:, :1], offset, band,
                                                                      model.answers.change_cell)[0]]


def without_atom(model, from_size: float):
    """The model's fitted priors without the atom at 0 in the change bands whose lower edge is ``from_size``+."""
    lower = np.concatenate([[0.0], model.psi.inverse(model.priors.bands)])
    changes = [tuple(Mixture(h.means, h.sds, np.where((h.sds == 0) & (h.means == 0), 0.0, h.weights)
                             / h.weights[(h.sds != 0) | (h.means != 0)].sum()) for h in pair)
               if lower[b] >= from_size * (1 - 1e-9) else pair for b, pair in enumerate(model.priors.changes)]
    return dataclasses.replace(model.priors, changes=changes)


def mean_table(model, local: np.ndarray, band: np.ndarray, rng: np.random.Generator, draws: int,
               priors=None) -> pd.DataFrame:
    tables = [band_table(m, band) for m in model.months_chain(local, rng, BURN_IN, draws, priors=priors)]
    return sum(tables) / len(tables)


def main() -> None:
    parser = diagnostic_arguments()
    parser.add_argument("--no-atom-from", type=float, default=50.0, help="employees")
    args = parser.parse_args()
    truth, draws, rng = seeded_draws(args)
    pd.set_option("display.width", 160)
    for rows, model in draws.models:
        summary = model.summary()
        print("change bands from (employees):", [0.0] + [round(b, 1) for b in summary["change_bands"]])
        print("atom weights (months 2, 3):", summary["no_change_share"])
        print("their standard errors:", summary["no_change_se"])
        if "whole_changes" in summary:
            print("whole changes of the smallest establishments:", summary["whole_changes"])
        true_months = truth[MONTHS].to_numpy(float)[rows]
        if "change_slopes" in summary:
            print("offsets' slopes per band (their se):", summary["change_slopes"], summary["change_slopes_se"])
            print("the truth's (its changes in psi scale on the same offsets):", truth_slopes(model, true_months))
        band = np.searchsorted(EDGES, true_months.mean(axis=1), side="right") - 1
        local = np.arange(len(rows))
        print("truth\n", band_table(true_months, band).round(3).to_string())
        print("drawn\n", mean_table(model, local, band, rng, args.draws).round(3).to_string())
        priors = without_atom(model, args.no_atom_from)
        print(f"drawn without the atom from {args.no_atom_from:g} employees\n",
              mean_table(model, local, band, rng, args.draws, [priors] * args.draws).round(3).to_string())


if __name__ == "__main__":
    main()
