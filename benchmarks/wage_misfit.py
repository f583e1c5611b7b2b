"""How far the wage fit's stated variances miss its errors, and what a release can tell of it (run on
demand, not a test).

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000,
...) under ``--config`` scaled to ``--mu``. Printed:

* **the fit's spreads** (``postprocess.wages``: detail rates around their NAICS-5 rate, sibling rates
  around their parent, cells around their prior, shares), each pass's moment estimate of the squared
  relative spread with its sandwich standard error (sum of (excess - s^2 scale)^2, square root, over
  the summed scale; marked (w): the weighted moments of ``postprocess.spread_moments`` and their own
  standard error), from the first release. A negative estimate is raised to the module's floor.
* **per QCEW level**, over the releases: the measured ratio of squared error to stated variance
  (sum (T^ - T)^2 / sum V_T), the coverage of the 95% margins, and the ratio a release alone
  estimates by moments from its identity answers: with D_T the sum of T's identity wage answers
  and N_T its noise variance (unbiased: the sqrt psi's variance is linear in the total),
  m_T = (D_T - T^)^2 - N_T + 2 V_T is unbiased for the squared error of T^ when T^ weighs every
  identity answer at its true noise variance (then Cov(D_T - T, T^ - T) = V_T whatever the priors'
  errors); lambda^ = sum w m / sum w V with w = V / (N_w + lambda V)^2 (N_w: the noise variance at
  the protected values) and its sandwich standard error, averaged over the releases.

    nice -n 10 python benchmarks/wage_misfit.py --qcew ../shared/data/qcew_2016q1_44.csv --mu 2.3065 \\
        --config baseline --releases 5
"""

from __future__ import annotations

import traceback

import numpy as np
import pandas as pd
from level_coverage import state_and_config, state_parser

import gedp
from gedp.measure.queries import IDENTITY, Groupings, group_establishments
from gedp.postprocess import spread_moments, wages
from gedp.postprocess.moe import variance_functions
from gedp.postprocess.tabulate import qcew_keys
from gedp.release.reader import release_answers, release_wage_psi
from gedp.synth.schema import public_columns

LEVELS = (51, 52, 53, 54, 55, 56, 57, 58, 71, 72, 73, 74, 75, 76, 77, 78)
Z = 1.959963984540054


def moment_ratio(residual: np.ndarray, noise: np.ndarray, stated: np.ndarray, weighing: np.ndarray
                 ) -> tuple[float, float]:
    """lambda^ and its sandwich standard error (module docstring), weights iterated three times."""
    keep = (stated > 0) & (weighing > 0)
    r, n, v, nw = residual[keep], noise[keep], stated[keep], weighing[keep]
    m = r**2 - n + 2 * v
    ratio = 1.0
    for _ in range(3):
        w = v / (nw + max(ratio, 0.1) * v) ** 2
        ratio = float(np.sum(w * m) / np.sum(w * v))
    return ratio, float(np.sqrt(np.sum(w**2 * (m - ratio * v) ** 2)) / np.sum(w * v))


def spread_recorder() -> list[tuple[str, float, float]]:
    """Record every moment estimate of the wage fit's spreads (its caller, s^2, standard error)."""
    seen: list[tuple[str, float, float]] = []
    squared_spread = wages._squared_spread

    def recorded(codes, excess, scale, n_states):
        out = squared_spread(codes, excess, scale, n_states)
        se = np.sqrt(np.bincount(codes, weights=(excess - out[codes] * scale) ** 2, minlength=n_states)) / np.maximum(
            np.bincount(codes, weights=scale, minlength=n_states), 1e-300)
        seen.append((traceback.extract_stack(limit=2)[0].name, float(out[0]), float(se[0])))
        return out

    weighted_spread = wages.weighted_squared_spread

    def recorded_weighted(codes, excess, scale, noise, n_states, start):
        out, se = weighted_spread(codes, excess, scale, noise, n_states, start)
        seen.append((traceback.extract_stack(limit=2)[0].name + " (w)", float(out[0]), float(se[0])))
        return out, se

    wages._squared_spread, wages.weighted_squared_spread = recorded, recorded_weighted
    spread_moments.weighted_squared_spread = recorded_weighted  # the sibling rates' and idle wages' spreads
    return seen


def level_rows(truth: pd.DataFrame, release: gedp.Release, groupings: dict) -> list[dict]:
    """Per level: squared errors, stated variances, and the identity answers' moment ratio."""
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    answers = release_answers(release.folder, protected)
    psi = release_wage_psi(release.folder)
    variance = variance_functions(answers, protected, psi)["wage"]
    codes = Groupings(protected[public_columns(protected)])(IDENTITY).codes
    [identity] = [a for a in answers["wage"] if a.query.is_identity]
    answer = identity.estimate[codes]
    sd = np.broadcast_to(identity.sd, (int(codes.max()) + 1,))[codes]
    noise = psi.estimate_variance(answer, sd)  # linear in the total: unbiased at the answers
    weighing = psi.estimate_variance(np.maximum(protected["wage"].to_numpy(), 0.0), sd)
    rows = []
    for level, grouping in groupings.items():
        stated = variance(grouping.codes, grouping.n_groups).variance
        true, estimate = grouping.sum(truth["wage"].to_numpy()), grouping.sum(protected["wage"].to_numpy())
        ratio, se = moment_ratio(grouping.sum(answer) - estimate, grouping.sum(noise), stated, grouping.sum(weighing))
        rows.append({"level": level, "cells": grouping.n_groups, "squared_error": float(np.sum((estimate - true) ** 2)),
                     "stated": float(np.sum(stated)),
                     "covered": float(np.mean(np.abs(estimate - true) <= Z * np.sqrt(stated))),
                     "moment_ratio": ratio, "moment_se": se})
    return rows


def main() -> None:
    args = state_parser(__doc__, mu=2.3065).parse_args()
    truth, config = state_and_config(args)
    public = truth[public_columns(truth)]
    groupings = {level: group_establishments(public, [k for k in qcew_keys(truth, level) if k not in ("year", "qtr")])
                 for level in LEVELS}
    seen = spread_recorder()
    rows = []
    for index in range(args.releases):
        release = gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        if index == 0:
            print("the wage fit's spreads (first release; caller, s^2 by moments, its standard error):")
            for caller, value, se in seen:
                print(f"  {caller:16s} {value:10.4f} +- {se:.4f}")
        rows += level_rows(truth, release, groupings)
    frame = pd.DataFrame(rows).groupby("level").agg(
        cells=("cells", "first"), squared_error=("squared_error", "sum"), stated=("stated", "sum"),
        coverage=("covered", "mean"), moment_ratio=("moment_ratio", "mean"), moment_se=("moment_se", "mean"))
    frame["measured_ratio"] = frame.pop("squared_error") / frame.pop("stated")
    print(frame.round(3).to_string())


if __name__ == "__main__":
    main()
