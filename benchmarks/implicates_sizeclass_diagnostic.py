"""Where the implicates' size-class counts are biased: one release of a synthetic state, its truth known.

    python benchmarks/implicates_sizeclass_diagnostic.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--draws 2]

Fits the implicates' priors on one release (``release.implicates.prepare``) and counts the
establishments of size classes 1-3 (BLS codes by month 1's and by month 3's whole employees) in
frames that mix true and drawn values, so each part of the model is measured alone:

* ``truth``: the synthetic state;
* ``level prior g``: month 1's classes expected under the fitted level prior (its mass in each
  class's psi interval times the establishments it was fitted on; month 1's level prior only), and
  with ``--replicates K`` their mean and sd over K bootstrap replicates of the priors (the implicates'
  draws of the prior);
* ``joint draw``: the implicates' months (the chain coupled to the wages), ``--burn-in`` sweeps;
* ``months without the wage``: the chain without the wage coupling;
* ``true level, drawn changes``: the truth's level (the level prior's: month 1's, or with
  ``--level-prior quarter`` the quarter's) plus the joint draw's months less its level;
* ``drawn level, true changes``: the joint draw's level plus the truth's months less the truth's level.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

from gedp.postprocess.implicates import BURN_IN
from gedp.postprocess.sizeclass import size_class

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

MONTHS = ["m1emp", "m2emp", "m3emp"]
CLASSES = (1, 2, 3)
#: Whole employees of the classes' bounds (class c: EDGES[c - 1] <= rounded size < EDGES[c]).
EDGES = np.array([0.0, 4.5, 9.5, 19.5])


def counts(months: np.ndarray) -> list[float]:
    """Establishments of classes 1-3 by month 1's and by month 3's employment."""
    return [float(np.sum(size_class(months[:, k]) == c)) for k in (0, 2) for c in CLASSES]


def prior_counts(model, level=None) -> list[float]:
    """Month 1's classes 1-3 expected under the level prior g (``level``, else the fitted one): its mass
    in each class's psi interval times the establishments it was fitted on (those whose month-1 answer
    is below its fit's top)."""
    g, psi = model.priors.level if level is None else level, model.psi
    sd = float(model.answers.month_sd[0])
    fitted = int(np.sum(model.answers.months[:, 0] <= model.priors.level_cut + 6 * sd))
    edges = psi(EDGES[1:])
    cdf = np.array([float(np.sum(g.weights * np.where(g.sds == 0, g.means <= e,
                                                      stats.norm.cdf(e, g.means, np.maximum(g.sds, 1e-300)))))
                    for e in edges])
    return [fitted * m for m in np.diff(np.concatenate([[0.0], cdf]))] + [np.nan] * 3


def main() -> None:
    parser = diagnostic_arguments()
    parser.add_argument("--burn-in", type=int, default=BURN_IN, help="sweeps before the first draw")
    parser.add_argument("--replicates", type=int, default=0,
                        help="also the spread of g's classes over this many bootstrap replicates of the priors")
    args = parser.parse_args()
    truth, draws, rng = seeded_draws(args)
    results: dict[str, list[list[float]]] = {"truth": [counts(truth[MONTHS].to_numpy(float))]}
    for rows, model in draws.models:
        if not model.quarter:
            results["level prior g"] = [prior_counts(model)]
            if args.replicates:
                replicates = np.array([prior_counts(model, model.replicate(rng).level)[:3]
                                       for _ in range(args.replicates)])
                print(f"level prior g's month-1 classes 1-3 over {args.replicates} bootstrap replicates: mean "
                      + " ".join(f"{v:.0f}" for v in replicates.mean(axis=0)) + ", sd "
                      + " ".join(f"{v:.0f}" for v in replicates.std(axis=0, ddof=1)))
        psi, inverse = model.psi, model.psi.inverse
        true_theta = psi(truth[MONTHS].to_numpy(float)[rows])
        local = np.arange(len(rows))
        table, model.priors.wage_table = model.priors.wage_table, None  # a chain without the wage coupling
        uncoupled = list(model.months_chain(local, rng, args.burn_in, args.draws))
        model.priors.wage_table = table
        for months, alone in zip(model.months_chain(local, rng, args.burn_in, args.draws), uncoupled):
            theta = psi(months)
            level, true_level = (t @ model.month_weights for t in (theta, true_theta))
            frames = {
                "joint draw": months,
                "months without the wage": alone,
                "true level, drawn changes": np.rint(inverse(np.maximum(
                    true_level[:, None] + theta - level[:, None], model.floor))),
                "drawn level, true changes": np.rint(inverse(np.maximum(
                    level[:, None] + true_theta - true_level[:, None], model.floor))),
            }
            for name, frame in frames.items():
                results.setdefault(name, []).append(counts(frame))
    truth_counts = np.array(results["truth"][0])
    print(f"{'frame':32s} " + " ".join(f"{f'm{k} class {c}':>17s}" for k in (1, 3) for c in CLASSES))
    for name, values in results.items():
        mean = np.mean(values, axis=0)
        print(f"{name:32s} " + " ".join(f"{v:8.0f} ({v / t - 1:+6.1%})" if np.isfinite(v) else f"{'':>17s}"
                                         for v, t in zip(mean, truth_counts)))


if __name__ == "__main__":
    main()
