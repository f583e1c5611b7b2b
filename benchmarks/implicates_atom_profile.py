"""How well a release's answers tell the no-change atom's weight: its profile likelihood per change band.

    python benchmarks/implicates_atom_profile.py --qcew FILE --structure NAME[,NAME] [--seed 1]

Fits the implicates' priors on one release of a synthetic state (``release.implicates.prepare``) and,
for each change prior (per size band of the answers' mean and month), the profile log-likelihood of
the weight p of its atom at 0 (no change): the largest log-likelihood of the band's answers over the
other components' weights with the atom's held at p, on p = 0, 0.05, ..., 1. Printed: the fitted
weight, the lower bound of the standard error (``atom_standard_error``) and the range of p within 2
nats of the profile's maximum (a likelihood interval of about 95%). ``docs/evaluation/implicates-measurements.md`` (the
no-change atom) reports a run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.measure.neighbors import make_psi
from gedp.postprocess.deconvolve import Likelihood, MixtureFit, npmle_weights
from gedp.postprocess.whole_changes import GRID_SDS, WHOLE_SIZE, LevelFit, WholeFit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws, set_prior_knobs, truth_frame  # noqa: E402

GRID = np.linspace(0.0, 1.0, 21)
#: A profile's likelihood interval: the p within this many nats of its maximum.
INTERVAL_NATS = 2.0
WHOLE_BANDS = ("< 2", "2-5")
#: The recommended plan's identity answer sd of a month (gamma 0.5 / mu 0.8868, configs/recommended.yaml).
IDENTITY_SD = 0.5 / 0.8868


def atom_fixed(held: Likelihood, atom: int, p: float) -> Likelihood:
    """The likelihood of the other components' weights v (summing to 1) when the atom (column ``atom`` of
    ``held``) has weight ``p``: columns p a + (1 - p) L_k, a the atom's column (then L' v = p a + (1 - p)
    L v), on the kept rows and in their scale (so the log-likelihoods of two p differ as the full
    problem's do)."""
    rest = np.delete(np.arange(held.matrix.shape[1]), atom)
    matrix = p * held.matrix[:, [atom]] + (1.0 - p) * held.matrix[:, rest]
    along = (None if held.coefficients is None
             else p * held.coefficients[:, [atom]] + (1.0 - p) * held.coefficients[:, rest])
    return Likelihood(matrix, np.ones(len(matrix), dtype=bool), held.basis, along)


def atom_profile(fit: MixtureFit, grid: np.ndarray = GRID) -> np.ndarray:
    """The profile log-likelihood of the atom's weight at each p of ``grid`` (increasing in [0, 1]): the
    maximum over the other weights of sum_i c_i log (p a_i + (1 - p) L_i v), up to one constant, each
    to within the solver's certified gap (each p's solve starts from the one before)."""
    atom = int(np.flatnonzero((fit.sds == 0) & (fit.means == 0))[0])
    return profile_of(fit.likelihood, fit.counts[fit.likelihood.kept], atom, grid)


def whole_profile(fit: WholeFit, grid: np.ndarray = GRID) -> np.ndarray:
    """``atom_profile`` of a whole change's fit (``whole_changes.WholeFit``: its atom, no change, is column 0;
    the direction's alpha and gamma held at their fit)."""
    assert fit.likelihood is not None
    return profile_of(fit.likelihood, np.ones(int(fit.likelihood.kept.sum())), 0, grid)


def profile_of(likelihood: Likelihood, counts: np.ndarray, atom: int, grid: np.ndarray) -> np.ndarray:
    """The profile log-likelihood of column ``atom``'s weight on ``grid`` (``atom_profile``)."""
    out, start = np.empty(len(grid)), None
    for j, p in enumerate(grid):
        held = atom_fixed(likelihood, atom, float(p))
        columns = held.matrix.shape[1]
        v = np.full(columns, 1.0 / columns) if p >= 1.0 else npmle_weights(held, counts, start=start)
        out[j], start = float(counts @ np.log(held.matrix @ v)), v
    return out


def likelihood_interval(profile: np.ndarray, grid: np.ndarray = GRID, nats: float = INTERVAL_NATS
                        ) -> tuple[float, float]:
    """The smallest and largest p of the grid whose profile is within ``nats`` of its maximum."""
    inside = grid[profile >= profile.max() - nats]
    return float(inside.min()), float(inside.max())


def print_whole(fits: dict) -> None:
    """The whole changes' atom profiles (``whole_profile``) per band and change."""
    print("whole changes: band | month | fitted weight | p within 2 nats | profile at 0, 0.5, max")
    for (b, k), fit in sorted(fits.items()):
        profile = whole_profile(fit)
        low, high = likelihood_interval(profile)
        relative = profile - profile.max()
        print(f"{WHOLE_BANDS[b]} | {k + 1} | {fit.weights[0]:.2f} | {low:.2f}-{high:.2f} | "
              f"{relative[0]:.2f}, {relative[10]:.2f}, {GRID[np.argmax(profile)]:.2f}")


def budget_profiles(truth: pd.DataFrame, shares: list[float], seed: int, oracle: bool = False) -> None:
    """Month 2's whole no-change weight's profile on answers of the truth's months with the identity answers'
    noise of the recommended plan at ``shares`` times its mu^2 (sd / sqrt(share)): the establishments whose
    month-1 answer is below psi(5), month 1's prior the integer NPMLE (``oracle``: the truth's month-1 shares),
    bands < 2 and 2-5, no cells' offsets."""
    psi = make_psi("sqrt")
    months = truth[["m1emp", "m2emp"]].to_numpy(float)
    cut, edge = (float(psi(np.array([x]))[0]) for x in (WHOLE_SIZE, 2.0))
    print("mu^2 share | sd | band | answers | truth's no change | fitted | p within 2 nats")
    for share in shares:
        sd = IDENTITY_SD / np.sqrt(share)
        omega = psi(months) + sd * np.random.default_rng(seed).standard_normal(months.shape)
        small = omega[:, 0] < cut
        level = LevelFit.of(omega[small, 0], sd, psi, cut)
        top = int(np.ceil(float(psi.inverse(np.array([omega[small].max() + GRID_SDS * sd]))[0])))
        log_h = level.log_prior(level.weights, top)
        if oracle:
            with np.errstate(divide="ignore"):
                log_h = np.log(np.bincount(np.minimum(months[:, 0], top).astype(int), minlength=top + 1) / len(months))
        for b, rows in enumerate((small & (omega[:, 0] < edge), small & (omega[:, 0] >= edge))):
            fit = WholeFit.of(omega[rows, 0], omega[rows, 1], (sd, sd), log_h, psi, np.zeros(int(rows.sum())))
            low, high = likelihood_interval(whole_profile(fit))
            true_share = float(np.mean(months[rows, 1] == months[rows, 0]))
            print(f"{share:g} | {sd:.3f} | {WHOLE_BANDS[b]} | {int(rows.sum()):,} | {true_share:.2f} | "
                  f"{fit.weights[0]:.2f} | {low:.2f}-{high:.2f}", flush=True)


def level_profiles(truth: pd.DataFrame, levels: list[int], seed: int) -> None:
    """Month 2's whole no-change weight fitted on the establishments of one true month-1 level each (month 1 known:
    its prior a point mass), answers with the shipped identity noise: the truth's share, the fit, its profile's
    2-nat range and the fitted direction q."""
    psi = make_psi("sqrt")
    months = truth[["m1emp", "m2emp"]].to_numpy(float)
    omega = psi(months) + IDENTITY_SD * np.random.default_rng(seed).standard_normal(months.shape)
    print("month-1 level | establishments | truth's no change | fitted | p within 2 nats | q")
    for n in levels:
        rows = months[:, 0] == n
        log_h = np.full(n + 40, -np.inf)
        log_h[n] = 0.0
        fit = WholeFit.of(omega[rows, 0], omega[rows, 1], (IDENTITY_SD,) * 2, log_h, psi, np.zeros(int(rows.sum())))
        low, high = likelihood_interval(whole_profile(fit))
        print(f"{n} | {int(rows.sum()):,} | {np.mean(months[rows, 1] == n):.2f} | {fit.weights[0]:.2f} | "
              f"{low:.2f}-{high:.2f} | {fit.up()[0]:.2f}", flush=True)


def main() -> None:
    parser = diagnostic_arguments(__doc__)
    parser.add_argument("--whole-only", action="store_true", help="with --whole-changes, only the whole changes'")
    parser.add_argument("--budget", default="", help="mu^2 shares of the month answers (budget_profiles), e.g. 1,2,4")
    parser.add_argument("--oracle-level", action="store_true", help="with --budget, month 1's prior the truth's")
    parser.add_argument("--levels", default="", help="true month-1 levels to fit on alone (level_profiles), e.g. 1,2,4")
    args = parser.parse_args()
    if args.budget or args.levels:
        set_prior_knobs(args)
        truth = truth_frame(args.qcew, [] if args.structure == "none" else args.structure.split(","))
        if args.levels:
            level_profiles(truth, [int(x) for x in args.levels.split(",")], args.seed)
        if args.budget:
            budget_profiles(truth, [float(x) for x in args.budget.split(",")], args.seed, args.oracle_level)
        return
    _, draws, _ = seeded_draws(args)
    for _, model in draws.models:
        if model.whole is not None:
            print_whole(model.whole.fits)
        if args.whole_only:
            continue
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
