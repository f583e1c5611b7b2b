"""The smallest establishments' two changes drawn jointly against the truth (a diagnostic of WHOLE_CHANGES).

    python benchmarks/implicates_whole_joint.py --qcew FILE --structure NAME[,NAME] --whole-changes
        [--cell-changes all] [--seed 1] [--draws 2]

Fits the implicates' priors on one release of a synthetic state (``release.implicates.prepare``) and draws
the months of the establishments the whole-change model covers (month-1 answer below psi(WHOLE_SIZE)).
Prints, truth and drawn: the joint shares of the month-2 change j_2 = x_2 - x_1 and of d_3 = x_3 - x_2 (-2 or
less, -1, 0, +1, +2 or more), the persistence P(d_3 = 0 | j_2 != 0) and P(d_3 = 0 | j_2 = 0), the shares of
month 1's values 0..9 and the size classes 1-2 (month 3 below 5, 5-9): establishments and month-3
employment; then the same draws with month 1's whole-number prior smoothed (its weights convolved with
(1/4, 1/2, 1/4) ``--smooth`` times; a what-if, the fitted change weights held), and under the implicates'
replicate priors (``PosteriorModel.replicate``: the Bayesian bootstrap each implicate draws under). The
truth is read for the comparison only. ``docs/evaluation/implicates-measurements.md`` (the smallest
establishments in whole employees) reports runs.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.postprocess.implicates import BURN_IN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

MONTHS = ["m1emp", "m2emp", "m3emp"]
LABELS = ["<=-2", "-1", "0", "+1", ">=+2"]


def step(change: np.ndarray) -> np.ndarray:
    """The change's category 0..4 (LABELS)."""
    return np.clip(np.round(change), -2, 2).astype(int) + 2


def joint_table(months: np.ndarray) -> pd.DataFrame:
    """Shares of (j_2, d_3) by category, rows j_2, columns d_3."""
    j2, d3 = step(months[:, 1] - months[:, 0]), step(months[:, 2] - months[:, 1])
    table = np.zeros((5, 5))
    np.add.at(table, (j2, d3), 1.0)
    return pd.DataFrame(table / len(months), index=[f"j2 {x}" for x in LABELS], columns=[f"d3 {x}" for x in LABELS])


def facts(months: np.ndarray, everyone: np.ndarray) -> dict:
    """Persistence, month 1's shares and the size classes 1-2 (of ``everyone``: every establishment's months)."""
    j2, d3 = months[:, 1] - months[:, 0], months[:, 2] - months[:, 1]
    m3 = everyone[:, 2]
    out = {"P(d3=0|j2!=0)": np.mean(d3[j2 != 0] == 0), "P(d3=0|j2=0)": np.mean(d3[j2 == 0] == 0),
           "P(j2=0)": np.mean(j2 == 0), "P(j3=0)": np.mean(months[:, 2] == months[:, 0]),
           "class1 estabs": np.sum(m3 < 4.5), "class2 estabs": np.sum((m3 >= 4.5) & (m3 < 9.5)),
           "class1 m3emp": m3[m3 < 4.5].sum(), "class2 m3emp": m3[(m3 >= 4.5) & (m3 < 9.5)].sum()}
    out.update({f"x1={n}": np.mean(np.round(months[:, 0]) == n) for n in range(10)})
    return out


def smoothed(weights: np.ndarray, times: int) -> np.ndarray:
    """``weights`` convolved ``times`` with (1/4, 1/2, 1/4) (mass beyond the ends reflected back in)."""
    w = np.asarray(weights, dtype=float)
    for _ in range(times):
        padded = np.concatenate([w[:1], w, w[-1:]])
        w = 0.25 * padded[:-2] + 0.5 * padded[1:-1] + 0.25 * padded[2:]
    return w / w.sum()


def drawn(model, rng: np.random.Generator, draws: int, small: np.ndarray, priors=None) -> tuple[pd.DataFrame, dict]:
    local = np.arange(len(model.answers.months))
    tables, fact = [], []
    for m in model.months_chain(local, rng, BURN_IN, draws, priors=priors):
        tables.append(joint_table(m[small]))
        fact.append(facts(m[small], m))
    return sum(tables) / draws, {k: float(np.mean([f[k] for f in fact])) for k in fact[0]}


def main() -> None:
    parser = diagnostic_arguments()
    parser.add_argument("--smooth", type=int, default=2, help="times month 1's weights are convolved")
    args = parser.parse_args()
    truth, draws, rng = seeded_draws(args)
    pd.set_option("display.width", 160)
    for rows, model in draws.models:
        if model.whole is None:
            continue
        small = model.whole.small
        true_months = truth[MONTHS].to_numpy(float)[rows]
        print("whole-change model:", model.whole.summary())
        print("truth\n", joint_table(true_months[small]).round(4).to_string())
        result = {"truth": facts(true_months[small], true_months)}
        table, result["drawn"] = drawn(model, rng, args.draws, small)
        print("drawn\n", table.round(4).to_string())
        weights = model.whole.weights()
        level = {**weights, "level": smoothed(weights["level"], args.smooth)}
        priors = dataclasses.replace(model.priors, whole=level)
        table, result["month 1 smoothed"] = drawn(model, rng, args.draws, small, [priors] * args.draws)
        print("drawn, month 1's prior smoothed\n", table.round(4).to_string())
        replicates = [model.replicate(rng) for _ in range(args.draws)]
        table, result["replicates"] = drawn(model, rng, args.draws, small, replicates)
        print("drawn under the implicates' replicate priors\n", table.round(4).to_string())
        for j, rep in enumerate(replicates):
            print(f"replicate {j + 1}'s month-1 G_sel:", np.round(rep.whole["level"], 4).tolist())
        print(pd.DataFrame(result).round(4).to_string())
        print("month 1's fitted G_sel:", np.round(weights["level"], 4).tolist())


if __name__ == "__main__":
    main()
