"""Where the smallest establishments' excess job flows come from: the change priors' weights or their form.

    python benchmarks/implicates_oracle_changes.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--draws 2]
        [--cell-changes MODE]

Fits the implicates' priors on one release of a synthetic state (``implicates_utility.seeded_draws``), then
refits every change band's weights on the TRUE changes in psi scale (the same components, the same offsets
with ``--cell-changes``, a likelihood of a hundredth of the answers' sd: the band prior as near the truth as
its form allows; a diagnostic, nothing ships from it) and prints per band of the true mean employment the
truth's job flows and the draws' under the fitted and under these priors (``implicates_change_bands``'
table). Draws near the truth under the refitted weights put the excess in the weights (what the answers
identify); draws as far off put it in the form (one prior per band in psi scale, months rounded).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.postprocess.deconvolve import MixtureFit
from gedp.postprocess.prior_components import change_fit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_change_bands import EDGES, MONTHS, band_table, mean_table  # noqa: E402
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

#: The refit's likelihood sd, as a share of the answers' difference sd.
SHARP = 0.01


def true_priors(model, true_months: np.ndarray):
    """The model's priors with every change band's weights refitted on the true changes (module docstring)."""
    omega, sd = model.answers.months, model.answers.month_sd
    theta = model.psi(true_months)
    _, band, steps = model.change_bands()
    changes = []
    for b, step in enumerate(steps):
        rows = band == b
        pair = []
        for k in (1, 2):
            spread = float(np.hypot(sd[0], sd[k]))
            offset = model.offsets(rows)[:, k - 1]
            _, _, means, sds = change_fit(omega[rows, k] - omega[rows, 0] - offset, spread, step)
            truth = theta[rows, k] - theta[rows, 0] - offset
            pair.append(MixtureFit.of(truth, SHARP * spread, means, sds).solve())
        changes.append(tuple(pair))
    return dataclasses.replace(model.priors, changes=changes)


def main() -> None:
    args = diagnostic_arguments(__doc__).parse_args()
    truth, draws, rng = seeded_draws(args)
    pd.set_option("display.width", 160)
    for rows, model in draws.models:
        true_months = truth[MONTHS].to_numpy(float)[rows]
        band = np.searchsorted(EDGES, true_months.mean(axis=1), side="right") - 1
        local = np.arange(len(rows))
        print("truth\n", band_table(true_months, band).round(3).to_string())
        print("drawn, fitted priors\n", mean_table(model, local, band, rng, args.draws).round(3).to_string())
        priors = true_priors(model, true_months)
        print("drawn, change weights refitted on the true changes\n",
              mean_table(model, local, band, rng, args.draws, [priors] * args.draws).round(3).to_string())


if __name__ == "__main__":
    main()
