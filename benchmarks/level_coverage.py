"""Coverage of the margins of levels by size band, with what the nonnegativity bound does to small
cells (run on demand, not a test).

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000,
1001, ...) with the recommended config scaled to a quarter's ``--mu``. For county x NAICS-6 and
county x NAICS-3 cells, month-1 employment and wages: the share of cells whose true level lies
within the 95% margin, per band of the cell's true level (employment < 10, 10-99, 100-999, >= 1,000;
wages < $100k, 100k-1M, 1-10M, >= 10M), with the Wilson 95% interval of that share; the root mean
square of error / (margin / z); and for month-1 employment the establishments the solve holds at
0, the coverage of the margins the answers' variances state without the bound's shrinkage
(``coverage_unshrunk``) and, with ``--unbounded``, the coverage of those margins for the least
squares without the bound (the closed-form solve of the same answers, every establishment free: a
diagnostic, not a release). With ``--config`` another plan (a shipped config's name or a path,
scaled to ``--mu``), with ``--levels`` QCEW aggregation levels (51-58, 71-78) in place of the two
county levels; the output also gives, per level, the wage cells with wages but no true employment
in the quarter (their coverage and median estimate / truth). ``se_releases``: a band's coverage's
standard error between releases (the cells of one release share its noise, so it can exceed the
binomial one); ``--cells``: every cell-release's row (with its true total, estimate and protected
month-1 employment), for ``coverage_compare.py`` and ``band_bounds.py``.

    nice -n 10 python benchmarks/level_coverage.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --mu 1.1533 --releases 20 --out benchmarks/level-coverage-ri-1.1533.json
    nice -n 10 python benchmarks/level_coverage.py --qcew ../shared/data/qcew_2016q1_34.csv --mu 2.3065 \\
        --releases 5 --config baseline --levels 51 52 53 54 55 56 57 58 71 72 73 74 75 76 77 78 --out nj.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.config import Config, load_config, parse_config
from gedp.measure.queries import Groupings, group_establishments
from gedp.postprocess import wages
from gedp.postprocess.models import PostprocessOptions, attribute_models
from gedp.postprocess.moe import half_widths, variance_function, variance_functions
from gedp.postprocess.months import pattern_cells
from gedp.postprocess.structured import CellOperator, cell_to_group_matrix, pinned_at_zero
from gedp.postprocess.tabulate import qcew_keys
from gedp.postprocess.variances import answers_structure
from gedp.postprocess.wage_misfit import direct_measurements, misfit_variances
from gedp.postprocess.wls import attribute_system, structured_parts
from gedp.release.reader import release_answers, release_wage_psi
from gedp.synth.establishments import synthesize_state
from gedp.synth.qcew import read_qcew
from gedp.synth.schema import public_columns

LEVELS = {"county x NAICS-6": ["state", "county", "naics"], "county x NAICS-3": ["state", "county", "naics3"]}
BANDS = {"m1emp": ((0, 10, "< 10"), (10, 100, "10-99"), (100, 1000, "100-999"), (1000, math.inf, ">= 1k")),
         "wage": ((0, 1e5, "< 100k"), (1e5, 1e6, "100k-1M"), (1e6, 1e7, "1-10M"), (1e7, math.inf, ">= 10M"))}
Z = 1.959963984540054


def synthetic_truth(qcew: Path) -> pd.DataFrame:
    """The state synthesized from a published QCEW file (generator seeded 1: the same state in every
    script), in establishment order."""
    truth = synthesize_state(read_qcew(qcew), rng=np.random.default_rng(1)).sort_values("estab_id")
    return truth.reset_index(drop=True)


def scaled_config(mu: float, name: str = "recommended") -> Config:
    """A config (``name``: shipped or a path) with every query's mu (and the cap) scaled so that a
    release spends ``mu``."""
    config = load_config(name)
    factor = mu / config.plan.budget().total
    raw = dict(config.raw, mu_cap=round(config.raw["mu_cap"] * factor, 4) + 1e-4,
               queries=[dict(query, mu={a: m * factor for a, m in query["mu"].items()})
                        for query in config.raw["queries"]])
    return parse_config(raw, "recommended scaled")


def state_parser(doc: str, config: str = "baseline", mu: float | None = None,
                 releases: int | None = 5) -> argparse.ArgumentParser:
    """The options of a script that protects a state synthesized from a published QCEW file: ``--qcew``,
    ``--mu`` (required unless ``mu`` is given), ``--config`` and ``--releases`` (left out when ``releases``
    is None); the description is the first line of ``doc``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--mu", type=float, required=mu is None, default=mu, help="a release's total mu")
    parser.add_argument("--config", default=config, help="a shipped config's name or a path")
    if releases is not None:
        parser.add_argument("--releases", type=int, default=releases)
    return parser


def state_and_config(args: argparse.Namespace) -> tuple[pd.DataFrame, Config]:
    """The synthesized state of ``--qcew`` and the config ``--config`` scaled to ``--mu``."""
    return synthetic_truth(args.qcew), scaled_config(args.mu, args.config)


def each_release(truth: pd.DataFrame, config: Config, releases: int, seen: list) -> Iterator[int]:
    """Protect ``truth`` ``releases`` times (seeds 1000, ...), not for publication, ``seen`` (a pass
    recorder's list) cleared before each; yields each release's seed once it is protected."""
    for index in range(releases):
        seen.clear()
        gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        yield 1000 + index


def unbounded_values(model_answers, public: pd.DataFrame) -> np.ndarray:
    """Month-1 employment per establishment from the least squares of the release's answers (as its
    model weighs them) without the bound x >= 0: x_j = a_j + v_j lambda_c(j), every establishment free."""
    system, identity_rows, cell_codes = attribute_system(model_answers, public, "estimated")
    a, v, groups, b, w = structured_parts(system, identity_rows)
    exact, fixed = pinned_at_zero(groups, b, w)
    n_cells = int(cell_codes.max()) + 1
    c = cell_to_group_matrix(groups[~exact], cell_codes, n_cells)
    b, w = b[~exact], w[~exact]
    shifted = a + v * (c.T @ (b / w))[cell_codes]
    s = np.bincount(cell_codes, weights=np.where(fixed, 0.0, v), minlength=n_cells)
    q = np.bincount(cell_codes, weights=np.where(fixed, 0.0, shifted), minlength=n_cells)
    t = CellOperator(c, w, s).solve(q)
    lam = c.T @ ((b - c @ t) / w)
    return np.where(fixed, 0.0, a + v * lam[cell_codes])


@contextlib.contextmanager
def without_noise_excess() -> Iterator[None]:
    """The wage fit without the sandwich's noise term (``wages._noise_excess`` at 0): its margins are
    then the fit's own variance g' H^-1 g, the covariance of a tiling pnc measurement's noise with the
    estimate's error (``wage_misfit``)."""
    kept = wages._noise_excess
    wages._noise_excess = lambda p, fit, values: np.zeros(len(fit.totals))
    try:
        yield
    finally:
        wages._noise_excess = kept


def release_rows(truth: pd.DataFrame, release: gedp.Release, index: int, unbounded: bool,
                 levels: dict[str, list[str]] | None = None, misfit: float | None = None) -> list[pd.DataFrame]:
    """One row per cell, level and attribute of one release: band, covered, error / sd, and for
    month-1 employment the establishments held at 0; for wages the stated variance and the cell's
    direct measurement (``wage_misfit.direct_measurements``), and with ``misfit`` the margins of
    ``wage_misfit.misfit_variances`` at that least weight in place of the stated ones."""
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    answers = release_answers(release.folder, protected)
    variances = variance_functions(answers, protected, release_wage_psi(release.folder))
    with without_noise_excess():  # the fit's own variance: what B's noise covaries with (wage_misfit)
        covariances = variance_function("wage", answers, protected, release_wage_psi(release.folder))
    public = protected[public_columns(protected)]
    model_answers = attribute_models(answers, public, PostprocessOptions.for_margins(None))["m1emp"].answers
    unshrunk = {"m1emp": answers_structure(model_answers, public, pattern_cells=pattern_cells(public))}
    free_values = unbounded_values(model_answers, public) if unbounded else None
    rows = []
    for level, keys in (levels or LEVELS).items():
        grouping = group_establishments(public, keys)
        margins = half_widths(variances, grouping.codes, grouping.n_groups, 0.95)
        stated = (margins["wage"] / Z) ** 2
        covariance = covariances(grouping.codes, grouping.n_groups).variance
        direct, direct_noise = direct_measurements(answers["wage"], Groupings(public), grouping.codes,
                                                   grouping.n_groups)
        if misfit is not None:
            estimate = grouping.sum(protected["wage"].to_numpy())
            margins["wage"] = Z * np.sqrt(misfit_variances(estimate, stated, direct, direct_noise, misfit))
        before = half_widths(unshrunk, grouping.codes, grouping.n_groups, 0.95)["m1emp"]
        at_zero = grouping.sum((protected["m1emp"].to_numpy() <= 1e-9).astype(float))
        for attribute, bands in BANDS.items():
            true = grouping.sum(truth[attribute].to_numpy())
            error = grouping.sum(protected[attribute].to_numpy()) - true
            band = np.full(len(true), "", dtype=object)
            for low, high, name in bands:
                band[(true >= low) & (true < high)] = name
            frame = pd.DataFrame({"release": index, "level": level, "attribute": attribute, "band": band,
                                  "covered": np.abs(error) <= margins[attribute],
                                  "ratio": error / (margins[attribute] / Z), "at_zero": at_zero,
                                  "estabs": grouping.sum(np.ones(len(public))), "cell": np.arange(len(true)),
                                  "truth": true, "estimate": error + true,
                                  "protected_m1emp": grouping.sum(protected["m1emp"].to_numpy()),
                                  "relative_error": np.divide(np.abs(error), true, out=np.full(len(true), np.nan),
                                                              where=true > 0)})
            if attribute == "m1emp":
                frame["covered_unshrunk"] = np.abs(error) <= before
                frame["ratio_unshrunk"] = error / (before / Z)
            if free_values is not None and attribute == "m1emp":
                free_error = grouping.sum(free_values) - true
                frame["covered_unbounded"] = np.abs(free_error) <= before
                frame["ratio_unbounded"] = free_error / (before / Z)
            if attribute == "wage":  # cells with wages but no true employment in the quarter
                employed = sum(grouping.sum(truth[month].to_numpy()) for month in ("m1emp", "m2emp", "m3emp"))
                frame["no_employment"] = (employed == 0) & (true > 0)
                frame["estimate_over_truth"] = np.divide(error + true, true, out=np.full(len(true), np.nan),
                                                         where=true > 0)
                frame["stated"], frame["direct"], frame["direct_noise"] = stated, direct, direct_noise
                frame["covariance"] = covariance
            rows.append(frame)
    return rows


def wilson(covered: float, n: int) -> tuple[float, float]:
    """The Wilson 95% interval of a share ``covered`` of ``n`` cells (taken as independent)."""
    centre = (covered + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z / (1 + Z**2 / n) * math.sqrt(covered * (1 - covered) / n + Z**2 / (4 * n**2))
    return centre - half, centre + half


def without_employment(cells: pd.DataFrame) -> list[dict]:
    """Per level: the wage cells with wages but no true employment in the quarter, the coverage of
    their margins and the median of estimate / truth (below 1: shrunk)."""
    cells = cells[cells["no_employment"].fillna(False).astype(bool)]
    return cells.groupby("level", sort=False).agg(
        cells=("covered", "size"), coverage=("covered", "mean"),
        median_estimate_over_truth=("estimate_over_truth", "median")).reset_index().to_dict(orient="records")


def accuracy(cells: pd.DataFrame) -> list[dict]:
    """Per level and attribute: the median relative error |estimate - truth| / truth of the cells with
    truth > 0, over the releases."""
    return cells.groupby(["level", "attribute"], sort=False).agg(
        cells=("relative_error", "count"), median_relative_error=("relative_error", "median")
    ).reset_index().to_dict(orient="records")


def summarize(cells: pd.DataFrame) -> pd.DataFrame:
    """Coverage per level, attribute and band, with its Wilson interval and the diagnostics."""
    def rms(ratio: pd.Series) -> float:
        return float(np.sqrt(np.mean(ratio**2)))

    extra = {f"coverage_{name}": (f"covered_{name}", "mean") for name in ("unshrunk", "unbounded")
             if f"covered_{name}" in cells}
    extra |= {f"rms_ratio_{name}": (f"ratio_{name}", rms) for name in ("unshrunk", "unbounded")
              if f"ratio_{name}" in cells}
    summary = cells.groupby(["level", "attribute", "band"], sort=False).agg(
        cells=("covered", "size"), coverage=("covered", "mean"), rms_ratio=("ratio", rms),
        estabs=("estabs", "mean"), at_zero=("at_zero", "mean"), **extra).reset_index()
    bounds = [wilson(p, n) for p, n in zip(summary["coverage"], summary["cells"])]
    summary["low"], summary["high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    by_release = cells.groupby(["level", "attribute", "band", "release"], sort=False)["covered"].mean()
    spread = by_release.groupby(["level", "attribute", "band"], sort=False).agg(["std", "size"])
    summary["se_releases"] = (spread["std"] / np.sqrt(spread["size"])).reindex(
        pd.MultiIndex.from_frame(summary[["level", "attribute", "band"]])).to_numpy()
    return summary


def main() -> None:
    parser = state_parser(__doc__, config="recommended", releases=20)
    parser.add_argument("--unbounded", action="store_true", help="also the coverage without the bound")
    parser.add_argument("--levels", type=int, nargs="*", help="QCEW aggregation levels (default: county x "
                        "NAICS-6 and NAICS-3 cells)")
    parser.add_argument("--misfit", type=float, help="wage margins with the misfit term at this least weight "
                        "(postprocess.wage_misfit)")
    parser.add_argument("--rate-tails", action="store_true", help="the sibling rates' heavier-tailed prior "
                        "(postprocess.wages.RATE_TAILS)")
    parser.add_argument("--cell-tails", action="store_true", help="the cells' wages heavier-tailed around their "
                        "priors (postprocess.wages.CELL_TAILS)")
    parser.add_argument("--rate-spread-kept", action="store_true", help="passes 2-3 keep pass 1's sibling "
                        "rate spread (postprocess.wages.RATE_SPREAD_KEPT)")
    parser.add_argument("--cell-spread-corrected", action="store_true", help="every pass takes the cell "
                        "spread from pass 1's moment corrected for each cell's share of its rate "
                        "(postprocess.wages.CELL_SPREAD_CORRECTED)")
    parser.add_argument("--employee-variance-estimated", action="store_true", help="the per-employee variance "
                        "b estimated from each release (postprocess.wages.EMPLOYEE_VARIANCE_ESTIMATED)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cells", type=Path, help="also every cell-release's row (parquet): to compare two runs "
                        "cell by cell, benchmarks/coverage_compare.py")
    args = parser.parse_args()
    wages.RATE_TAILS = args.rate_tails
    wages.RATE_SPREAD_KEPT = args.rate_spread_kept
    wages.CELL_TAILS = args.cell_tails
    wages.CELL_SPREAD_CORRECTED = args.cell_spread_corrected
    wages.EMPLOYEE_VARIANCE_ESTIMATED = args.employee_variance_estimated
    truth, config = state_and_config(args)
    levels = {str(level): [key for key in qcew_keys(truth, level) if key not in ("year", "qtr")]
              for level in args.levels} if args.levels else None
    rows, start = [], time.perf_counter()
    for index in range(args.releases):
        release = gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        rows += release_rows(truth, release, index, args.unbounded, levels, args.misfit)
        print(f"release {index + 1}/{args.releases} ({time.perf_counter() - start:.0f}s)", flush=True)
        cells = pd.concat(rows, ignore_index=True)
        summary = summarize(cells)
        args.out.write_text(json.dumps({"qcew": args.qcew.name, "mu": config.plan.budget().total,
                                        "config": args.config, "releases": index + 1, "level": 0.95,
                                        "misfit": args.misfit, "rate_tails": args.rate_tails,
                                        "cell_tails": args.cell_tails,
                                        "cell_spread_corrected": args.cell_spread_corrected,
                                        "employee_variance_estimated": args.employee_variance_estimated,
                                        "summary": summary.to_dict(orient="records"),
                                        "no_employment": without_employment(cells),
                                        "accuracy": accuracy(cells)}, indent=1) + "\n")
    if args.cells is not None:
        cells.to_parquet(args.cells)
    print(summary.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
