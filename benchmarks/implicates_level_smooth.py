"""The level prior g's size classes, NPMLE against the smooth fit, over releases of a synthetic state.

    python benchmarks/implicates_level_smooth.py --qcew FILE --structure NAME[,NAME] --seeds 1-5

For each release seed, fits the implicates' priors (``release.implicates.prepare``, the shipped NPMLE)
and refits month 1's level prior on the same answers and components with ``deconvolve.SmoothFit``
(log g smooth, its penalty chosen by cross-validation on the answers); prints month 1's classes 1-3
expected under each (``implicates_sizeclass_diagnostic.prior_counts``) against the truth's, the chosen
penalty and the log-likelihood the smooth fit gives up against the NPMLE (nats, over the fitted answers).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from gedp.postprocess.deconvolve import MixtureFit, SmoothFit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_sizeclass_diagnostic import counts, prior_counts  # noqa: E402
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402


def log_likelihood(fit: MixtureFit, level) -> float:
    """sum_i c_i log (L_i . w) of a prior ``level`` on the fit's components (rows scaled as in the fit)."""
    weights = level.on(fit.means, fit.sds)
    return float(fit.counts[fit.likelihood.kept] @ np.log(fit.likelihood.matrix @ weights))


def main() -> None:
    parser = diagnostic_arguments()
    parser.add_argument("--seeds", default="1-5", help="release seeds, FIRST-LAST")
    args = parser.parse_args()
    first, last = (int(v) for v in args.seeds.split("-"))
    print(f"{'seed':>4s} {'truth m1 class 1/2/3':>26s} {'NPMLE g':>26s} {'smooth g':>26s} {'penalty':>8s} "
          f"{'nats lost':>9s} {'fit s':>6s}")
    for seed in range(first, last + 1):
        args.seed = seed
        truth, draws, _ = seeded_draws(args)
        for rows, model in draws.models:
            cut = model.priors.level_cut
            arguments = model._level_fit(cut)
            start = time.perf_counter()
            smooth_fit = SmoothFit.of(*arguments)
            smooth = smooth_fit.solve()
            seconds = time.perf_counter() - start
            fit = MixtureFit.of(*arguments)
            true = np.array(counts(truth[["m1emp", "m2emp", "m3emp"]].to_numpy(float)[rows]))[:3]
            npmle = np.array(prior_counts(model)[:3])
            smoothed = np.array(prior_counts(model, smooth)[:3])
            lost = log_likelihood(fit, model.priors.level) - log_likelihood(fit, smooth)
            print(f"{seed:4d} {' / '.join(f'{v:.0f}' for v in true):>26s} "
                  + " ".join(f"{' / '.join(f'{v / t - 1:+.1%}' for v, t in zip(g, true)):>26s}"
                             for g in (npmle, smoothed))
                  + f" {smooth_fit.penalty:8.3g} {lost:9.1f} {seconds:6.1f}", flush=True)


if __name__ == "__main__":
    main()
