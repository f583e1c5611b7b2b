"""The Gibbs chain's autocorrelation and burn-in, measured on the statistics users compute from
implicates (docs/evaluation/implicates-measurements.md, "How many sweeps").

Runs independent chains of every establishment of a release under its fitted priors, one sweep per
draw, and prints per statistic: its stationary mean (over the chains after ``--settled`` sweeps), its
mean over the first sweeps against it (in units of its sweep-to-sweep sd), and its autocorrelation
at lags 1-4 after ``--settled`` sweeps (pooled over chains).

    python benchmarks/implicates_autocorrelation.py RELEASE --chains 4 --sweeps 60 --seed 1 [--settled 20]
"""

from __future__ import annotations

import argparse

import numpy as np

from gedp.postprocess.sizeclass import size_class
from gedp.release.implicates import prepare

#: Sweeps left out before the stationary statistics (well beyond any burn-in considered).
SETTLED = 20
#: Sweeps whose mean over the chains is shown against the stationary mean.
SHOWN = (1, 2, 4, 6, 8, 12, 16, 24)


def statistics(months: np.ndarray) -> dict[str, float]:
    """The statistics of one draw of the months (rows x 3)."""
    m1, m2, m3 = months.T
    average = ((m1 + m3) / 2).sum()
    classes = size_class(m3)
    out = {"job creation": np.maximum(m3 - m1, 0).sum() / average,
           "job destruction": np.maximum(m1 - m3, 0).sum() / average,
           "no change m1-m2": float(np.mean(m1 == m2)),
           "m3 employment": float(m3.sum())}
    for code in (1, 2, 3, 4, 5):
        out[f"estabs class {code}"] = float(np.sum(classes == code))
    return out


def chain_statistics(model, rows: np.ndarray, rng: np.random.Generator, sweeps: int) -> dict[str, np.ndarray]:
    """Each statistic after each of ``sweeps`` sweeps of one chain (started as the implicates' chains are)."""
    series: dict[str, list[float]] = {}
    for months in model.months_chain(rows, rng, 1, sweeps, thin=1):
        for name, value in statistics(months).items():
            series.setdefault(name, []).append(value)
    return {name: np.array(values) for name, values in series.items()}


def autocorrelation(chains: np.ndarray, lag: int) -> float:
    """Lag-``lag`` autocorrelation of chains x sweeps, each chain centred on its own mean, pooled."""
    centred = chains - chains.mean(axis=1, keepdims=True)
    return float((centred[:, lag:] * centred[:, :-lag]).sum() / (centred * centred).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("release")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--sweeps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settled", type=int, default=SETTLED, help="sweeps left out before the stationary statistics")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    draws = prepare(args.release, rng)
    rows, model = draws.models[0]
    runs = [chain_statistics(model, np.arange(len(rows)), rng, args.sweeps) for _ in range(args.chains)]
    print(f"{len(rows):,} establishments, {args.chains} chains x {args.sweeps} sweeps; stationary after {args.settled}")
    print(f"{'statistic':<18} {'stationary':>11} {'sd/sweep':>10} " + " ".join(f"{'sweep ' + str(k):>8}" for k in SHOWN)
          + "   " + " ".join(f"{'r' + str(lag):>6}" for lag in (1, 2, 3, 4)))
    for name in runs[0]:
        chains = np.array([run[name] for run in runs])
        settled = chains[:, args.settled:]
        sd = float(np.sqrt(settled.var(axis=1, ddof=1).mean()))
        early = [(chains[:, k - 1].mean() - settled.mean()) / sd for k in SHOWN]
        print(f"{name:<18} {settled.mean():>11.5g} {sd:>10.4g} " + " ".join(f"{e:>8.2f}" for e in early) + "   "
              + " ".join(f"{autocorrelation(settled, lag):>6.2f}" for lag in (1, 2, 3, 4)))


if __name__ == "__main__":
    main()
