"""Which variance term makes the wage margins of small cells too wide, and whether any margin could do
better (run on demand, not a test).

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000,
...) under ``--config`` scaled to ``--mu``; the wage fit (``postprocess.wages``) is recomputed from
each release's files with the last pass's cell priors kept. On the model's cells (county x NAICS-6
where the plan has county wage queries: QCEW level 78), with T the true total, T^ the release's and
V the stated variance (``wage_margins.wage_variances``), z = (T^ - T) / sqrt(V), pooled over the
releases; cells with true employment only (the idle ones are another benchmark's):

* **terms**, per band of the true total and per band of protected employment E: the share of V that
  is the cell total's own variance cv = 1 / (1 / vd + 1 / vp) (vd: the summed identity answers' noise
  variance, vp: the prior's variance), of vp in cv, and of vp's parts (the cell spread
  (s x prior)^2, the per-employee term EMPLOYEE_VARIANCE x rate^2 x E, the protected employment's
  noise, the idle establishments' variance); the measured sum (T - prior)^2 / sum vp and the median
  of (T - prior)^2 / vp (0.455 for a normal deviation of variance vp);
* **shape**, per band of E: coverage, sd of z, the quantiles of |z| (1.96 at 95% for a normal), skew
  and kurtosis of z and of (T - prior) / sqrt(vp), and the misses on either side (T above T^ or below);
* **best symmetric margins**: coverage per band of the true total if the margins were rescaled, per
  band of E or per band of the estimate T^, by the factor that makes that band cover 95% exactly
  (factors fitted on the truth: an oracle bound on what any margin that is a function of E, or of
  T^, could do, not a method);
* **the cell spread**: the fit's s^2 (its moments, ``wages._cell_priors``) against the weighted
  moments (``spread_moments.weighted_squared_spread``) of the summed identity answers and of the
  truth, with their standard errors, per release.

    nice -n 10 python benchmarks/wage_margin_terms.py --qcew ../shared/data/qcew_2016q1_34.csv \\
        --mu 2.3065 --config baseline --releases 2 --out benchmarks/wage-margin-terms-nj-baseline.json
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
from level_coverage import state_and_config, state_parser

import gedp
from gedp.postprocess import wages
from gedp.postprocess.spread_moments import weighted_squared_spread
from gedp.postprocess.wage_margins import wage_variances
from gedp.release.reader import release_answers, release_wage_psi

Z = 1.959963984540054
TOTAL_BANDS = ((0, 1e5, "< 100k"), (1e5, 1e6, "100k-1M"), (1e6, 1e7, "1-10M"), (1e7, np.inf, ">= 10M"))
EMPLOYMENT_BANDS = ((0.5, 1, "0.5-1"), (1, 3, "1-3"), (3, 10, "3-10"), (10, 30, "10-30"), (30, 100, "30-100"),
                    (100, 300, "100-300"), (300, np.inf, ">= 300"))
ORACLE_EMPLOYMENT = (0.5, 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100, 200, np.inf)
ORACLE_ESTIMATE = (0, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 3e6, 1e7, 3e7, np.inf)


@contextlib.contextmanager
def kept_priors() -> Iterator[dict]:
    """Keep what the wage fit's last call of ``_cell_priors`` saw and returned (a diagnostic hook)."""
    kept: dict = {}
    original = wages._cell_priors

    def keeping(p, last, observed, detail_variance):
        kept.update(problem=p, last=last, priors=original(p, last, observed, detail_variance))
        return kept["priors"]

    wages._cell_priors = keeping
    try:
        yield kept
    finally:
        wages._cell_priors = original


def release_cells(truth: pd.DataFrame, release: gedp.Release) -> tuple[pd.DataFrame, dict]:
    """One row per model cell of one release, and its spread estimates."""
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    answers = release_answers(release.folder, protected)
    with kept_priors() as kept:
        fit = wages.fit_wages(answers, protected, release_wage_psi(release.folder))
    p, last = kept["problem"], kept["last"]
    rates, vd, _, vp = kept["priors"][:4]
    n = len(fit.totals)
    E = p.cell_employment
    prior = rates * E
    per_employee = rates**2 * fit.employee_variance[p.theta.cell_state] * E
    employment_noise = rates**2 * p.cell_employment_variance
    other = per_employee + employment_noise + 1.0 + p.cell_idle_variance
    employed = sum(truth[m].to_numpy() for m in ("m1emp", "m2emp", "m3emp"))
    cells = pd.DataFrame({
        "truth": np.bincount(fit.cell_codes, weights=truth["wage"].to_numpy(), minlength=n),
        "employed": np.bincount(fit.cell_codes, weights=employed, minlength=n) > 0,
        "estimate": fit.totals, "V": wage_variances(fit, fit.cell_codes, n), "E": E, "prior": prior, "vp": vp,
        "vd": vd, "cv": fit.cell_variance, "spread": vp - other, "per_employee": per_employee,
        "employment_noise": employment_noise, "idle": p.cell_idle_variance})
    cells = cells[cells.employed & ~fit.fixed_cells & (cells.V > 0)]
    state = np.zeros(len(cells), dtype=np.int64)
    noise = (cells.vp - cells.spread + E[cells.index] ** 2 * last.cell_rate_variance[cells.index]).to_numpy()
    direct = p.direct[cells.index]

    def weighted(deviation2: np.ndarray, noise: np.ndarray) -> list[float]:
        s2, se = weighted_squared_spread(state, deviation2 - noise, cells.prior.to_numpy() ** 2, noise, 1,
                                         wages.CELL_SPREAD_BOUNDS[0] ** 2)
        return [float(s2[0]), float(se[0])]

    spreads = {"fit": float(np.median(cells.spread / cells.prior**2)),
               "weighted_answers": weighted((direct - cells.prior.to_numpy()) ** 2, noise + cells.vd.to_numpy()),
               "weighted_truth": weighted((cells.truth - cells.prior).to_numpy() ** 2, noise)}
    return cells, spreads


def banded(values: pd.Series, bands: tuple) -> pd.Series:
    """Each value's band name (bands of (low, high, name))."""
    out = pd.Series("", index=values.index)
    for low, high, name in bands:
        out[(values >= low) & (values < high)] = name
    return out


def moments(x: np.ndarray) -> dict:
    """sd, quantiles of |x|, skew and kurtosis."""
    sd = float(np.std(x))
    centred = (x - x.mean()) / sd
    return {"sd": sd, "abs_q50_90_95_99": np.quantile(np.abs(x), [0.5, 0.9, 0.95, 0.99]).round(3).tolist(),
            "skew": float(np.mean(centred**3)), "kurtosis": float(np.mean(centred**4))}


def terms(cells: pd.DataFrame) -> dict:
    """The variance terms' shares (module docstring) of a set of cells."""
    def share(a: str, b: str) -> float:
        return float(cells[a].sum() / cells[b].sum())

    deviation2 = (cells.truth - cells.prior) ** 2
    return {"cells": len(cells), "coverage": float(np.mean(np.abs(cells.z) <= Z)), "cv/V": share("cv", "V"),
            "cv/vp": share("cv", "vp"), "spread/vp": share("spread", "vp"),
            "per_employee/vp": share("per_employee", "vp"), "employment_noise/vp": share("employment_noise", "vp"),
            "idle/vp": share("idle", "vp"), "sum (T-prior)^2 / sum vp": float(deviation2.sum() / cells.vp.sum()),
            "median (T-prior)^2 / vp": float(np.median(deviation2 / cells.vp)), "median E": float(cells.E.median())}


def shape(cells: pd.DataFrame) -> dict:
    """z's and the prior deviations' shape, and the misses on either side."""
    miss = np.abs(cells.z) > Z
    return {"cells": len(cells), "coverage": float(1 - miss.mean()), "z": moments(cells.z.to_numpy()),
            "prior_deviation": moments(((cells.truth - cells.prior) / np.sqrt(cells.vp)).to_numpy()),
            "misses_truth_above": int((miss & (cells.z < 0)).sum()),
            "misses_truth_below": int((miss & (cells.z > 0)).sum())}


def oracle(cells: pd.DataFrame, key: str, edges: tuple) -> dict:
    """Coverage per band of the true total with the margins rescaled per band of ``key`` to cover 95%
    each (bands of fewer than 30 cells kept as they are), and the factors."""
    scaled, factors = np.abs(cells.z).to_numpy().copy(), []
    for low, high in zip(edges[:-1], edges[1:]):
        inside = ((cells[key] >= low) & (cells[key] < high)).to_numpy()
        if inside.sum() >= 30:
            factor = float(np.quantile(scaled[inside], 0.95) / Z)
            scaled[inside] /= factor
            factors.append([low, high, round(factor, 3)])
    return {"coverage": {band: float(np.mean(scaled[(cells.band == band).to_numpy()] <= Z))
                         for band in cells.band.unique() if band},
            "factors": factors}


def main() -> None:
    parser = state_parser(__doc__, releases=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    truth, config = state_and_config(args)
    frames, spreads = [], []
    for index in range(args.releases):
        release = gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        cells, spread = release_cells(truth, release)
        frames.append(cells)
        spreads.append(spread)
        print(f"release {index + 1}/{args.releases}: cell spread s^2 {spread}", flush=True)
    cells = pd.concat(frames, ignore_index=True)
    cells["z"] = (cells.estimate - cells.truth) / np.sqrt(cells.V)
    cells["band"] = banded(cells.truth, TOTAL_BANDS)
    cells["employment_band"] = banded(cells.E, EMPLOYMENT_BANDS)
    out = {"qcew": args.qcew.name, "mu": args.mu, "config": args.config, "releases": args.releases,
           "cell_spread_s2": spreads,
           "terms_by_total": {band: terms(group) for band, group in cells.groupby("band") if band},
           "terms_by_employment": {band: terms(group) for band, group in cells.groupby("employment_band") if band},
           "shape_by_employment": {band: shape(group) for band, group in cells.groupby("employment_band") if band},
           "coverage_by_total": {band: float(np.mean(np.abs(group.z) <= Z)) for band, group in cells.groupby("band")
                                 if band},
           "oracle_by_employment": oracle(cells, "E", ORACLE_EMPLOYMENT),
           "oracle_by_estimate": oracle(cells, "estimate", ORACLE_ESTIMATE)}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name in ("coverage_by_total", "oracle_by_employment", "oracle_by_estimate"):
        print(name, json.dumps(out[name].get("coverage", out[name])))


if __name__ == "__main__":
    main()
