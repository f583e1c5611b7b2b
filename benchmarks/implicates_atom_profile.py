"""How well a release's answers tell the no-change atom's weight: its profile likelihood per change band.

    python benchmarks/implicates_atom_profile.py --qcew FILE --structure NAME[,NAME] [--seed 1]

Fits the implicates' priors on one release of a synthetic state (``release.implicates.prepare``) and,
for each change prior (per size band of the answers' mean and month), the profile log-likelihood of
the weight p of its atom at 0 (no change): the largest log-likelihood of the band's answers over the
other components' weights with the atom's held at p, on p = 0, 0.05, ..., 1. Printed: the fitted
weight, the lower bound of the standard error (``atom_standard_error``) and the range of p within 2
nats of the profile's maximum (a likelihood interval of about 95%). ``docs/method/implicates.md`` (the
no-change atom) reports a run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from gedp.postprocess.deconvolve import Likelihood, MixtureFit, npmle_weights

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

GRID = np.linspace(0.0, 1.0, 21)
#: A profile's likelihood interval: the p within this many nats of its maximum.
INTERVAL_NATS = 2.0


def atom_fixed(fit: MixtureFit, p: float) -> Likelihood:
    """The likelihood of the other components' weights v (summing to 1) when the fit's atom at 0 has weight
    ``p``: columns p a + (1 - p) L_k, a the atom's column (then L' v = p a + (1 - p) L v), on the kept
    rows and in their scale (so the log-likelihoods of two p differ as the full problem's do)."""
    atom = int(np.flatnonzero((fit.sds == 0) & (fit.means == 0))[0])
    rest = np.delete(np.arange(len(fit.means)), atom)
    held = fit.likelihood
    matrix = p * held.matrix[:, [atom]] + (1.0 - p) * held.matrix[:, rest]
    along = (None if held.coefficients is None
             else p * held.coefficients[:, [atom]] + (1.0 - p) * held.coefficients[:, rest])
    return Likelihood(matrix, np.ones(len(matrix), dtype=bool), held.basis, along)


def atom_profile(fit: MixtureFit, grid: np.ndarray = GRID) -> np.ndarray:
    """The profile log-likelihood of the atom's weight at each p of ``grid`` (increasing in [0, 1]): the
    maximum over the other weights of sum_i c_i log (p a_i + (1 - p) L_i v), up to one constant, each
    to within the solver's certified gap (each p's solve starts from the one before)."""
    counts = fit.counts[fit.likelihood.kept]
    out, start = np.empty(len(grid)), None
    for j, p in enumerate(grid):
        held = atom_fixed(fit, float(p))
        columns = held.matrix.shape[1]
        v = np.full(columns, 1.0 / columns) if p >= 1.0 else npmle_weights(held, counts, start=start)
        out[j], start = float(counts @ np.log(held.matrix @ v)), v
    return out


def likelihood_interval(profile: np.ndarray, grid: np.ndarray = GRID, nats: float = INTERVAL_NATS
                        ) -> tuple[float, float]:
    """The smallest and largest p of the grid whose profile is within ``nats`` of its maximum."""
    inside = grid[profile >= profile.max() - nats]
    return float(inside.min()), float(inside.max())


def main() -> None:
    args = diagnostic_arguments(__doc__).parse_args()
    _, draws, _ = seeded_draws(args)
    for _, model in draws.models:
        summary = model.summary()
        bands = [0.0] + [round(b, 1) for b in summary["change_bands"]]
        print("band (employees) | month | answers | fitted weight | se (lower bound) | p within 2 nats | "
              "profile at 0, 0.5, max")
        counts = np.bincount(model.change_bands()[1], minlength=len(bands))
        for (kind, b, k), fit in sorted((key, fit) for key, fit in model.fits.items() if key[0] == "change"):
            profile = atom_profile(fit)
            low, high = likelihood_interval(profile)
            relative = profile - profile.max()
            print(f"{bands[b]:g}+ | {k + 1} | {counts[b]:,} | {summary['no_change_share'][b][k - 1]:.2f} | "
                  f"{summary['no_change_se'][b][k - 1]:.3g} | {low:.2f}-{high:.2f} | "
                  f"{relative[0]:.2f}, {relative[10]:.2f}, {GRID[np.argmax(profile)]:.2f}")


if __name__ == "__main__":
    main()
