"""Signed errors of county cells (QCEW levels 71-74, and any other) by plan and postprocessing variant.

For each release of a synthesized state under a config, and each variant of its postprocessing, the
month-1 employment cells of the chosen levels are compared with the truth: mean signed error over
the cells' sd (the sd of the cells' errors across releases, and the stated one), median relative
error on the published cells, split by ownership. Variants:

* ``protect``: as ``gedp protect`` postprocesses (the config's variance mode, nonnegativity);
* ``unsmoothed``: the months' identity answers as released (variance mode ``estimated``);
* ``unbounded``: the same least squares without x >= 0 (``wls.unbounded_totals``, spread within each
  cell of the measured columns in proportion to the identity variances).

With the stated margins (variant ``protect``): mean z, mean z^2 and the coverage of the 95% margins
per size band with Clopper-Pearson intervals. With several configs, each one's median relative error
on the published cells per level is printed as a ratio to the first's (baseline, say). ``--sources``
prints instead, per county, the sd of each measurement of its month-1 total (identity answers as
weighed, each query grouped by county). ``CANDIDATES`` holds the hand-written plan shapes measured in
benchmarks/RESULTS-countybias.md (``plan_yaml`` writes one).

Usage (under nice, from the repository root):

    python benchmarks/county_bias.py STATE.parquet PUBLISHED.csv CONFIG [CONFIG ...] --releases 3 --seed 1
    python benchmarks/county_bias.py STATE.parquet - CONFIG --sources
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from gedp.config import Config, load_config
from gedp.evaluation.accuracy import published_flags
from gedp.evaluation.replicate import child_streams
from gedp.measure.queries import Groupings, group_establishments
from gedp.measure.workflows import measure
from gedp.postprocess.attributes import MONTHS
from gedp.postprocess.models import PostprocessOptions
from gedp.postprocess.moe import variance_function
from gedp.postprocess.months import month_answers
from gedp.postprocess.protect import protect_microdata
from gedp.postprocess.tabulate import qcew_keys
from gedp.postprocess.wls import attribute_system, unbounded_totals
from gedp.synth.qcew import read_qcew
from gedp.synth.schema import public_columns

ATTRIBUTE = "m1emp"
Z95 = 1.959963984540054
#: Size bands of true employment for the coverage of the 95% margins.
BANDS = (1, 10, 100, 1_000, np.inf)
TOTAL_MU = 2.3065
#: The wage shape of configs/recommended.yaml (its mu per query), scaled to fill a plan's total.
WAGE_SHAPE = {"identity": 0.7325, "state": 0.1597, "state,naics5": 0.3103, "state,county,naics5": 0.3103,
              "state,county": 0.3103}
#: Candidate employment shapes (mu per month and query; the months alike), wages filling the rest.
CANDIDATES = {
    # identity + county x NAICS-5 only, 8% of mu^2 to wages (60% of employment's to the identity)
    "identity-cn5": {"identity": 0.9894, "state,county,naics5": 0.8079},
    # identity + county x NAICS-6 + state (3% of employment's mu^2), 16% to wages
    "identity-cn6-state": {"identity": 0.9454, "state": 0.2114, "state,county,naics": 0.7424},
    # configs/recommended.yaml's employment shape with its state query turned into a county query
    "rec-county": {"identity": 0.8868, "state,county": 0.4227, "state,naics5": 0.512, "state,county,naics5": 0.512},
    # baseline's aggregate queries at 1 / 1.1 of their mu (every level within 10% of baseline's error by
    # 1 / mu scaling), the identity the rest, 16% and 12% of mu^2 to wages
    "kept-aggregates-16": {"identity": 0.6757, "state": 0.1818, "state,naics5": 0.5455, "state,county": 0.5455,
                           "state,county,naics5": 0.6364},
    "kept-aggregates-12": {"identity": 0.7258, "state": 0.1818, "state,naics5": 0.5455, "state,county": 0.5455,
                           "state,county,naics5": 0.6364},
    # ... and with the state query's mu^2 shared between a state (0.2) and a county query
    "rec-county-small-state": {"identity": 0.8868, "state": 0.2, "state,county": 0.3724, "state,naics5": 0.512,
                               "state,county,naics5": 0.512},
    # ... and with a county query at 0.45 beside a state query at 0.2, more to NAICS-5, 14% to wages
    "balanced": {"identity": 0.85, "state": 0.2, "state,county": 0.45, "state,naics5": 0.55,
                 "state,county,naics5": 0.5},
    # ... and with a county query at 0.5 beside a smaller state query
    "rec-county-state": {"identity": 0.8868, "state": 0.2, "state,county": 0.5, "state,naics5": 0.45,
                         "state,county,naics5": 0.45},
}
VARIANTS = ("protect", "unsmoothed", "unbounded")


def plan_yaml(employment: dict[str, float], total_mu: float = TOTAL_MU) -> str:
    """A config of configs/recommended.yaml's settings with this employment shape (three months alike)
    and its wage shape scaled to fill ``total_mu``."""
    employment_squares = 3 * sum(mu ** 2 for mu in employment.values())
    wage_scale = np.sqrt((total_mu ** 2 - employment_squares) / sum(mu ** 2 for mu in WAGE_SHAPE.values()))
    header = Path(__file__).parent.parent / "configs" / "recommended.yaml"
    lines = [line for line in header.read_text().splitlines() if not line.startswith("#")]
    text = "\n".join(lines[:lines.index("queries:") + 1]).replace("mu_cap: 2.307", f"mu_cap: {total_mu + 5e-4:.4f}")
    for query in dict.fromkeys([*employment, *WAGE_SHAPE]):
        by = "identity" if query == "identity" else "[" + ", ".join(query.split(",")) + "]"
        mu = {m: employment[query] for m in MONTHS if query in employment}
        if query in WAGE_SHAPE:
            mu["wage"] = round(float(WAGE_SHAPE[query] * wage_scale), 4)
        text += f"\n- by: {by}\n  mu: {{" + ", ".join(f"{k}: {v}" for k, v in mu.items()) + "}"
    return text + "\n"


def unbounded_values(answers, public: pd.DataFrame, groupings: Groupings) -> np.ndarray:
    """Establishment values of the least squares without x >= 0 (identity answers and nested groups)."""
    system, identity_rows, cell_codes = attribute_system(answers, public, "estimated", groupings=groupings)
    totals = unbounded_totals(system, identity_rows, cell_codes)
    identity = next(a for a in answers if a.query.is_identity)
    order = public["estab_id"].to_numpy()
    position = pd.Index(identity.keys["estab_id"]).get_indexer(order)
    a, v = identity.estimate[position], identity.variance[position]
    n_cells = int(cell_codes.max()) + 1
    gap = totals - np.bincount(cell_codes, a, n_cells)
    return a + v * (gap / np.bincount(cell_codes, v, n_cells))[cell_codes]


def county_sd_sources(truth: pd.DataFrame, config: Config, rng: np.random.Generator) -> pd.DataFrame:
    """Per county, the sd of what measures its month-1 total: the identity answers' sum (as the least
    squares weighs them, months smoothed by the config's mode) and the sum of each measured query's
    answers within the county (queries grouped by county)."""
    public = truth[public_columns(truth)]
    plan = config.plan.restrict(tuple(a for a in MONTHS if a in config.plan.attributes))
    measurements = measure(truth, plan, rng=rng)
    raw = {a: measurements.for_attribute(a) for a in plan.attributes}
    turned = month_answers(raw, config.variance_mode, plan.psi, public, loadings=False)
    county_of = public.set_index("estab_id")["county"]
    out = {}
    for answer in turned[ATTRIBUTE]:
        if answer.query.is_identity:
            county = county_of.loc[answer.keys["estab_id"]].to_numpy()
            out["identity (as weighed)"] = pd.Series(answer.variance).groupby(county).sum()
        elif "county" in answer.query.by:
            out[" x ".join(answer.query.by[1:])] = pd.Series(answer.variance).groupby(
                answer.keys["county"].to_numpy()).sum()
    sd = np.sqrt(pd.DataFrame(out))
    sd["all combined"] = 1 / np.sqrt((1 / sd**2).sum(axis=1))
    return sd.assign(true=truth.groupby("county")[ATTRIBUTE].sum())


def one_release(truth: pd.DataFrame, config: Config, rng: np.random.Generator, variants: Sequence[str],
                levels: dict[int, object], groupings: Groupings) -> dict[str, dict[int, tuple]]:
    """Per variant and level: the protected cells and their stated sd (variant ``protect`` only)."""
    public = truth[public_columns(truth)]
    plan = config.plan.restrict(tuple(a for a in MONTHS if a in config.plan.attributes))
    measurements = measure(truth, plan, rng=rng, groupings=groupings)
    measured = {a: measurements.for_attribute(a) for a in plan.attributes}
    base = PostprocessOptions.from_config(config)
    out: dict[str, dict[int, tuple]] = {}
    for variant in variants:
        sd = None
        if variant == "unbounded":
            turned = month_answers(measured, config.variance_mode, plan.psi, public, loadings=False)
            values = unbounded_values(turned[ATTRIBUTE], public, groupings)
        else:
            options = base if variant == "protect" else dataclasses.replace(base, variance_mode="estimated")
            release, _ = protect_microdata(measured, public, options, groupings=groupings)
            values = release[ATTRIBUTE].to_numpy()
            if variant == "protect":
                answers = month_answers(measured, config.variance_mode, plan.psi, public)
                sd = variance_function(ATTRIBUTE, answers, release)
        out[variant] = {}
        for level, grouping in levels.items():
            cell_sd = None if sd is None else sd(grouping.codes, grouping.n_groups).half_width(Z95) / Z95
            out[variant][level] = (grouping.sum(values), cell_sd)
    return out


def coverage_by_band(true: np.ndarray, covered: np.ndarray) -> dict[str, list]:
    """Per size band of ``true``: [cell-releases, coverage, 95% Clopper-Pearson interval]."""
    out = {}
    band = np.digitize(true, BANDS[1:-1])
    for b in range(len(BANDS) - 1):
        hits = covered[:, band == b]
        n, k = hits.size, int(hits.sum())
        if n:
            low = stats.beta.ppf(0.025, k, n - k + 1) if k else 0.0
            high = stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
            out[f"[{BANDS[b]:g}, {BANDS[b + 1]:g})"] = [n, k / n, float(low), float(high)]
    return out


def level_figures(true: np.ndarray, protected: np.ndarray, stated_sd: np.ndarray | None, keys: pd.DataFrame,
                  published: np.ndarray) -> dict:
    """Bias and error figures of one level's cells (true >= 1), overall and by ownership."""
    out = {}
    for own in ["all", *sorted(keys["own"].unique())]:
        cells = (true >= 1) & (True if own == "all" else (keys["own"] == own).to_numpy())
        if not cells.any():
            continue
        error = protected[:, cells] - true[cells]
        spread = error.std(axis=0, ddof=1) if len(error) > 1 else np.full(cells.sum(), np.nan)
        entry = {"cells": int(cells.sum()),
                 "mean_error": float(error.mean()),
                 "bias_over_sd": float(np.mean(error.mean(axis=0) / np.where(spread > 0, spread, np.nan))),
                 "median_relative_error": float(np.median(np.abs(error) / true[cells])),
                 "rms_relative_error": float(np.sqrt(np.mean((error / true[cells]) ** 2)))}
        shown = cells & published
        if shown.any():
            entry["published_median_relative_error"] = float(
                np.median(np.abs(protected[:, shown] - true[shown]) / true[shown]))
        if stated_sd is not None:
            z = error / stated_sd[:, cells]
            entry["mean_z"] = float(np.nanmean(z))
            entry["mean_z2"] = float(np.nanmean(z ** 2))
            entry["coverage_by_band"] = coverage_by_band(true[cells], np.abs(z) <= Z95)
        out[str(own)] = entry
    return out


def run(truth: pd.DataFrame, published_path: str, config_name: str, releases: int, seed: int,
        variants: Sequence[str], level_list: Sequence[int]) -> dict:
    config = load_config(config_name)
    public = truth[public_columns(truth)]
    published = read_qcew(published_path)
    groupings = Groupings(public)
    levels = {level: group_establishments(public, qcew_keys(public, level)) for level in level_list}
    true = {level: g.sum(truth[ATTRIBUTE].to_numpy()) for level, g in levels.items()}
    cells: dict[str, dict[int, list]] = {v: {level: [] for level in levels} for v in variants}
    stated: dict[int, list] = {level: [] for level in levels}
    for rng in child_streams(seed, releases):
        result = one_release(truth, config, rng, variants, levels, groupings)
        for variant in variants:
            for level in levels:
                cells[variant][level].append(result[variant][level][0])
                if variant == "protect":
                    stated[level].append(result[variant][level][1])
    figures: dict = {}
    for variant in variants:
        for level, grouping in levels.items():
            sd = np.array(stated[level]) if variant == "protect" else None
            figures.setdefault(variant, {})[str(level)] = level_figures(
                true[level], np.array(cells[variant][level]), sd, grouping.keys,
                published_flags(published, level, grouping.keys))
    return {"config": config_name, "releases": releases, "seed": seed, "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("state")
    parser.add_argument("published")
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--releases", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--levels", default="71,72,73,74")
    parser.add_argument("--out", default=None)
    parser.add_argument("--sources", action="store_true", help="the sd of each source of county totals")
    args = parser.parse_args()
    truth = pd.read_parquet(args.state)
    if args.sources:
        for name in args.configs:
            sources = county_sd_sources(truth, load_config(name), np.random.default_rng(args.seed))
            print(name, sources.round(1), sep="\n")
        return
    results = [run(truth, args.published, name, args.releases, args.seed, args.variants.split(","),
                   [int(x) for x in args.levels.split(",")]) for name in args.configs]
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    print_lines(results)
    if len(results) > 1:
        print_ratios(results)


def print_ratios(results: Sequence[dict], figure: str = "published_median_relative_error") -> None:
    """A figure per level (default: the median relative error on published cells), and each config's
    ratio to the first's; then the same for the root mean squared relative error of all cells."""
    first = results[0]["figures"]["protect"]
    print(f"{figure}: level " + " ".join(f"{Path(r['config']).stem[:18]:>18s}" for r in results))
    for level, by_own in first.items():
        base = by_own["all"].get(figure)
        if not base:
            continue
        ratios = [r["figures"]["protect"][level]["all"].get(figure, np.nan) / base for r in results[1:]]
        print(f"{level:5s} {100 * base:17.3f}% " + " ".join(f"{x:18.2f}" for x in ratios))
    if figure != "rms_relative_error":
        print_ratios(results, "rms_relative_error")


def print_lines(results: Sequence[dict]) -> None:
    """One line of figures per config, variant, level and ownership."""
    for result in results:
        for variant, by_level in result["figures"].items():
            for level, by_own in by_level.items():
                for own, e in by_own.items():
                    print(f"{result['config'][:40]:40s} {variant:10s} {level} own={own:3s} n={e['cells']:4d} "
                          f"bias/sd={e['bias_over_sd']:+.2f} mean_err={e['mean_error']:+9.1f} "
                          f"mre={e['median_relative_error']:.4f} rms={e['rms_relative_error']:.4f} "
                          f"pub={e.get('published_median_relative_error', np.nan):.4f}"
                          + (f" z={e['mean_z']:+.2f} z2={e['mean_z2']:.2f} cov=" + " ".join(
                              f"{band}:{c:.3f}" for band, (_, c, _, _) in e["coverage_by_band"].items())
                             if "mean_z" in e else ""))


if __name__ == "__main__":
    main()
