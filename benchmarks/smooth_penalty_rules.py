"""The smooth month-1 prior's penalty rules on simulated bands (run on demand; results in
docs/evaluation/implicates-measurements.md, "The penalty's choice").

    python benchmarks/smooth_penalty_rules.py --seeds 0-19 [--rows 20000] [--folds 5,10] [--out rows.csv]

Each band: month 1 of ``3 * rows`` establishments drawn from a known prior on whole numbers, answered as
sqrt(n) + N(0, 0.56^2), those below psi(5) kept (the first ``rows``), as ``whole_changes.LevelFit`` sees
them. Two priors: "geometric" (P(n) proportional to 0.7^n) and "few-zeros" (the same with P(0) a tenth of
it: a kink a second-difference penalty must give up some likelihood to keep). For each band the folds'
held-out scores are computed once per fold count and each rule's penalty refitted on all the answers;
printed: per prior, rule and fold count, the chosen penalties and the total variation of H to the truth
over n = 0..9 (mean, sd, largest), and with ``--out`` one row per band and rule.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.measure.neighbors import make_psi
from gedp.postprocess import penalty_choice, whole_changes
from gedp.postprocess.deconvolve import smooth_log_weights, softmax
from gedp.postprocess.penalty_choice import chosen_penalty, held_out_fold_scores
from gedp.postprocess.whole_changes import LevelFit, differences

SD = 0.56
PSI = make_psi("sqrt")
TOP = 9
PRIORS = {"geometric": lambda n: 0.7**n, "few-zeros": lambda n: 0.7**n * np.where(n == 0, 0.1, 1.0)}


def band(prior: str, seed: int, rows: int) -> tuple[np.ndarray, float, np.ndarray]:
    """A simulated band's month-1 answers below psi(5), the cut, and the truth's H over 0..TOP."""
    rng = np.random.default_rng(seed)
    n = np.arange(60.0)
    truth = PRIORS[prior](n)
    first = rng.choice(60, 3 * rows, p=truth / truth.sum())
    omega = PSI(first.astype(float)) + SD * rng.standard_normal(len(first))
    cut = float(PSI(np.array([5.0]))[0])
    return omega[omega < cut][:rows], cut, truth[:TOP + 1] / truth[:TOP + 1].sum()


def distance(fit: LevelFit, weights: np.ndarray, truth: np.ndarray) -> float:
    """Total variation between H of ``weights`` and ``truth`` over 0..TOP."""
    h = np.exp(fit.log_prior(weights, TOP))
    return float(0.5 * np.abs(h / h.sum() - truth).sum())


def one_band(prior: str, seed: int, rows: int, fold_counts: list[int]) -> list[dict]:
    omega, cut, truth = band(prior, seed, rows)
    whole_changes.SMOOTH_LEVEL = False
    fit = LevelFit.of(omega, SD, PSI, cut)  # the likelihood and selection (and the NPMLE's weights)
    counts, d = np.ones(fit.likelihood.matrix.shape[0]), differences(len(fit.weights) - 1)
    out = [{"prior": prior, "seed": seed, "rule": "npmle", "folds": 0, "penalty": np.nan,
            "tv": distance(fit, fit.weights, truth)}]
    for folds in fold_counts:
        penalty_choice.SMOOTH_FOLDS = folds
        scores = held_out_fold_scores(fit.likelihood.matrix, counts, d)
        for rule in ("best", "one-se"):
            penalty = chosen_penalty(scores, rule=rule)
            weights = softmax(smooth_log_weights(fit.likelihood.matrix, counts, d, penalty))
            out.append({"prior": prior, "seed": seed, "rule": rule, "folds": folds, "penalty": penalty,
                        "tv": distance(fit, weights, truth)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--folds", default="5")
    parser.add_argument("--priors", default="geometric,few-zeros")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    first, last = (int(x) for x in args.seeds.split("-"))
    fold_counts = [int(f) for f in args.folds.split(",")]
    start = time.process_time()
    rows = [r for prior in args.priors.split(",") for seed in range(first, last + 1)
            for r in one_band(prior, seed, args.rows, fold_counts)]
    frame = pd.DataFrame(rows)
    if args.out is not None:
        frame.to_csv(args.out, index=False)
    summary = frame.groupby(["prior", "rule", "folds"]).agg(
        bands=("tv", "size"), tv_mean=("tv", "mean"), tv_sd=("tv", "std"), tv_max=("tv", "max"),
        penalties=("penalty", lambda p: " ".join(f"{np.log10(x):g}" for x in p if np.isfinite(x))))
    print(summary.to_string())
    print(f"processor time {time.process_time() - start:.1f} s")


if __name__ == "__main__":
    main()
