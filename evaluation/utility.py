"""Analytic validity for microdata users (the SynLBD practice): the statistics an analyst computes
from a public-use file (``evaluation.microdata_stats``), on the truth and on releases of it.

Each simulated release is made as ``gedp protect`` makes it (``gedp.protect`` of the truth under the
config, a seed per release from one seed). Its point microdata gives each statistic's point
estimate; when this gedp draws implicates (``Release.implicates``), ``implicate_statistics`` draws
M of them from the release, computes every statistic on each and combines them with Rubin's rules
(``gedp.combine``; the statistics are of the state's establishments themselves, a census, so the
complete-data variance is 0 and T = (1 + 1/M) B), and the report gives how often the 95% intervals
cover the truth over the releases. That function is the one place implicates enter.

The point release states no interval for these statistics; for the size-wage slopes the report
shows how often the naive interval (the slope -+ 1.96 robust standard errors computed on the point
release as if it were the truth) covers, which is what an analyst would read.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gedp.evaluation.microdata_stats import ALL_SIZES, STATEWIDE, microdata_statistics
from gedp.evaluation.report import Report
from gedp.postprocess.sizeclass import SIZE_CODES, SIZE_TITLES

if TYPE_CHECKING:
    from gedp.config import Config

KEYS = ["statistic", "sector", "size_class"]
NOMINAL = 0.95
Z95 = 1.959963984540054
#: Implicates per release by default (the issue's M).
DEFAULT_IMPLICATES = 10
#: Size classes (statewide) and sector x class cells judged: at least this many true establishments.
MIN_CLASS_ESTABS = 100
MIN_SECTOR_CLASS_ESTABS = 20
#: Statewide statistics of the headline table, in order (besides the size classes).
FLOWS = ("job_creation_rate", "job_destruction_rate", "no_change_share", "growth_p10", "growth_p25", "growth_p75",
         "growth_p90", "top10_share", "hhi", "slope_pooled", "slope_cells")


@dataclass(frozen=True)
class UtilityResult:
    """The truth's statistics and, per release, the point release's and (None without implicates)
    the implicates' combined estimate and 95% interval (``estimate``, ``lower``, ``upper``)."""

    truth: pd.DataFrame
    point: list[pd.DataFrame]
    implicates: list[pd.DataFrame] | None
    m: int
    setup: str
    replications: int
    seed: int
    seconds: float
    data_label: str


def compute_utility(truth: pd.DataFrame, config: Config, *, replications: int, seed: int, data_label: str,
                    implicates: int = DEFAULT_IMPLICATES, on_step: Callable[[str], None] | None = None
                    ) -> UtilityResult:
    """Protect ``truth`` ``replications`` times under ``config`` (as ``gedp protect``, through the
    release path), and compute the statistics on the truth, each point release and its implicates."""
    start = time.perf_counter()
    point, combined = [], []
    seeds = np.random.SeedSequence(seed).generate_state(replications)
    for r, release_seed in enumerate(seeds):
        with tempfile.TemporaryDirectory(prefix="gedp-utility-") as folder:
            release = ReleaseFolder.protected(truth, config, Path(folder) / "release", seed=int(release_seed))
            point.append(microdata_statistics(release.microdata))
            combined.append(implicate_statistics(release, implicates, seed=int(release_seed)))
        if on_step is not None:
            on_step(f"release {r + 1} of {replications}")
    drawn = None if any(c is None for c in combined) else combined
    setup = (f"Data: {data_label}, {len(truth):,} establishments; config '{config.name}' (plan total mu "
             f"{config.plan.budget().total:.4f}); "
             + (f"{implicates} implicates per release" if drawn else "no implicates (this gedp draws none)"))
    return UtilityResult(microdata_statistics(truth), point, drawn, implicates, setup, replications, seed,
                         time.perf_counter() - start, data_label)


@dataclass(frozen=True)
class ReleaseFolder:
    """A release written by the release path (``gedp.running.recorded_release``), read as
    ``gedp.Release`` reads it: its protected microdata and its implicates."""

    folder: Path

    @classmethod
    def protected(cls, truth: pd.DataFrame, config: Config, folder: Path, *, seed: int) -> ReleaseFolder:
        """A seeded release of ``truth`` (not for publication) written to ``folder``."""
        from gedp.running.recorded_release import protect_recorded

        protect_recorded(truth, config, folder, ledger=None, seed=seed)
        return cls(folder)

    @property
    def microdata(self) -> pd.DataFrame:
        from gedp.release.reader import read_stored

        return read_stored(self.folder)

    def implicates(self, m: int, seed: int | None = None) -> pd.DataFrame:
        from gedp.release.implicates import implicates_in_memory

        return implicates_in_memory(self.folder, m, seed=seed)


def implicate_statistics(release: Any, m: int, seed: int) -> pd.DataFrame | None:
    """Every statistic combined over ``m`` implicates of ``release`` (``Release.implicates``, seeded
    with ``seed``): its keys, ``estimate``, ``lower`` and ``upper`` (Rubin's 95% interval, census:
    complete-data variance 0; NaN where a statistic is not finite in every implicate); None when
    this gedp draws no implicates or ``m`` < 2. The one place implicates enter the report."""
    draw = getattr(release, "implicates", None)
    if draw is None or m < 2:
        return None
    from gedp.postprocess.combine import combine

    drawn = draw(m, seed=seed)
    tables = [microdata_statistics(part.drop(columns="implicate"))
              for _, part in drawn.groupby("implicate", sort=True)]
    keys = tables[0][KEYS]
    if not all(table[KEYS].equals(keys) for table in tables):
        raise ValueError("the implicates' statistics are not over the same keys")
    values = np.array([table["value"].to_numpy() for table in tables])
    finite = np.isfinite(values).all(axis=0)
    out = keys.assign(estimate=np.nan, lower=np.nan, upper=np.nan)
    if finite.any():
        result = combine(values[:, finite])
        lower, upper = result.interval(NOMINAL)
        out.loc[finite, "estimate"], out.loc[finite, "lower"], out.loc[finite, "upper"] = result.estimate, lower, upper
    return out


def comparison(result: UtilityResult) -> pd.DataFrame:
    """One row per statistic: truth, the point releases' mean, their mean and largest relative error,
    the naive slope intervals' coverage, and with implicates their combined mean, relative error and
    the coverage of their 95% intervals over the releases."""
    truth = result.truth.set_index(KEYS)
    point = np.array([p.set_index(KEYS)["value"].reindex(truth.index).to_numpy() for p in result.point])
    true = truth["value"].to_numpy()
    scale = np.where(np.abs(true) > 0, np.abs(true), np.nan)
    out = truth[["value"]].rename(columns={"value": "truth"})
    out["point"] = point.mean(axis=0)
    out["point_difference"] = (point - true).mean(axis=0)
    error = (point - true) / scale
    out["point_error"] = error.mean(axis=0)
    out["point_error_max"] = np.abs(error).max(axis=0)
    variance = np.array([p.set_index(KEYS)["variance"].reindex(truth.index).to_numpy() for p in result.point])
    naive = np.abs(point - true) <= Z95 * np.sqrt(variance)
    out["point_naive_coverage"] = np.where(variance.max(axis=0) > 0, naive.mean(axis=0), np.nan)
    if result.implicates is not None:
        combined = [c.set_index(KEYS).reindex(truth.index) for c in result.implicates]
        estimate = np.array([c["estimate"].to_numpy() for c in combined])
        covered = np.array([(c["lower"].to_numpy() <= true) & (true <= c["upper"].to_numpy()) for c in combined])
        out["implicates"] = estimate.mean(axis=0)
        out["implicates_error"] = ((estimate - true) / scale).mean(axis=0)
        out["coverage"] = np.where(np.isfinite(estimate).all(axis=0), covered.mean(axis=0), np.nan)
    return out.reset_index()


def summarize(result: UtilityResult) -> dict:
    """The figures of the report: the headline rows and the judged groups (issue targets)."""
    table = comparison(result)
    statewide = table[table["sector"] == STATEWIDE]
    estabs = table.set_index(KEYS)["truth"].xs("estabs", level="statistic")
    big_class = {code for code in SIZE_CODES if estabs.get((STATEWIDE, code), 0) >= MIN_CLASS_ESTABS}
    sector_cells = {(s, c) for (s, c), n in estabs.items() if s != STATEWIDE and c != ALL_SIZES
                    and n >= MIN_SECTOR_CLASS_ESTABS}

    def worst(rows: pd.DataFrame, column: str) -> float | None:
        values = np.abs(rows[column].to_numpy(dtype=float))
        return float(np.nanmax(values)) if np.isfinite(values).any() else None

    def median(rows: pd.DataFrame, column: str) -> float | None:
        values = np.abs(rows[column].to_numpy(dtype=float))
        return float(np.nanmedian(values)) if np.isfinite(values).any() else None

    groups = {}
    for name in ("estabs", "m3emp", "avg_weekly_wage"):
        classes = statewide[(statewide["statistic"] == name) & statewide["size_class"].isin(big_class)]
        judged = np.array([(s, c) in sector_cells for s, c in zip(table["sector"], table["size_class"])], dtype=bool)
        cells = table[(table["statistic"] == name).to_numpy() & judged]
        groups[name] = {"classes_judged": len(classes), "largest_class_error_point": worst(classes, "point_error"),
                        "sector_cells_judged": len(cells),
                        "median_sector_cell_error_point": median(cells, "point_error")}
        if "implicates_error" in table:
            groups[name].update(largest_class_error_implicates=worst(classes, "implicates_error"),
                                median_sector_cell_error_implicates=median(cells, "implicates_error"))
    by_class = (statewide["size_class"] != ALL_SIZES) & statewide["statistic"].isin(["estabs", "avg_weekly_wage"])
    headline = statewide[statewide["statistic"].isin(FLOWS) | by_class]
    coverage = None
    if "coverage" in table:
        finite = table["coverage"].notna()
        coverage = {"statistics": int(finite.sum()), "mean": float(table.loc[finite, "coverage"].mean()),
                    "headline_mean": float(headline["coverage"].mean())}
    return {"groups": groups, "coverage": coverage,
            "headline": [_row(row) for row in headline.itertuples(index=False)],
            "concentration_by_sector": {
                name: median(table[(table["statistic"] == name) & (table["sector"] != STATEWIDE)], "point_error")
                for name in ("top10_share", "hhi")}}


def _row(row: Any) -> dict:
    return {key: (None if isinstance(value, float) and not np.isfinite(value) else value)
            for key, value in row._asdict().items()}


def render_utility(result: UtilityResult, out: Path) -> dict:
    """report.md, summary.json and the plots; returns the summary."""
    figures = summarize(result)
    implicates = result.implicates is not None
    report = Report(out, "Analytic validity of the microdata")
    report.section(
        "Setup",
        f"{result.setup}; {result.replications} releases (seed {result.seed}, {result.seconds:.0f} s). Each release "
        "is made as `gedp protect` makes it; every statistic is computed on the truth and on each release as an "
        "analyst would compute it from the public-use file (module `gedp.evaluation.microdata_stats`). Relative "
        "errors are (release - truth) / |truth|, averaged over the releases (largest |error| beside it). "
        + ("Implicates: each release's statistics combined over its implicates with Rubin's rules (census: "
           "T = (1 + 1/M) B); coverage is the share of releases whose 95% interval holds the truth."
           if implicates else "This gedp draws no implicates: only the point release is judged."))
    header = ["statistic", "size class", "truth", "point release", "difference", "error", "largest |error|"]
    header += ["implicates", "error", "95% coverage"] if implicates else ["naive 95% coverage"]
    rows = []
    for row in figures["headline"]:
        cells = [row["statistic"], SIZE_TITLES[row["size_class"]] if row["size_class"] else "all",
                 _number(row["truth"]), _number(row["point"]), _number(row["point_difference"]),
                 _pct(row["point_error"]), _pct(row["point_error_max"])]
        cells += ([_number(row["implicates"]), _pct(row["implicates_error"]), _pct(row["coverage"])] if implicates
                  else [_pct(row["point_naive_coverage"])])
        rows.append(cells)
    report.section("Statewide statistics")
    report.table(header, rows)
    report.section(
        "Size classes and sectors",
        f"Size classes judged: those of {MIN_CLASS_ESTABS}+ true establishments statewide; sector x class cells: "
        f"{MIN_SECTOR_CLASS_ESTABS}+.")
    group_rows = [[name, g["classes_judged"], _pct(g["largest_class_error_point"]), g["sector_cells_judged"],
                   _pct(g["median_sector_cell_error_point"])] for name, g in figures["groups"].items()]
    report.table(["statistic", "classes", "largest |error| (point)", "sector x class cells", "median |error| (point)"],
                 group_rows)
    if figures["coverage"] is not None:
        cover = figures["coverage"]
        report.section("Coverage of the implicates' intervals",
                       f"Over {cover['statistics']} statistics (every size class and sector), the combined 95% "
                       f"intervals held the truth in {_pct(cover['mean'])} of the releases on average; over the "
                       f"statewide statistics above, {_pct(cover['headline_mean'])} (target 90-97%).")
    report.section("Concentration by sector", "Median |relative error| of the point release over sectors: "
                   + ", ".join(f"{k} {_pct(v)}" for k, v in figures["concentration_by_sector"].items()) + ".")
    _figures(report, result)
    summary = {"experiment": "utility", "data": result.data_label, "replications": result.replications,
               "seed": result.seed, "seconds": result.seconds, "implicates": result.m if implicates else 0, **figures}
    report.write(summary)
    return summary


def _figures(report: Report, result: UtilityResult) -> None:
    table = comparison(result)
    statewide = table[table["sector"] == STATEWIDE].set_index(["statistic", "size_class"])
    implicates = "implicates_error" in table
    figure, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(SIZE_CODES))
    for name, marker in (("estabs", "o"), ("m3emp", "s"), ("avg_weekly_wage", "^")):
        rows = statewide.loc[name].loc[list(SIZE_CODES)]
        ax.plot(x, rows["point_error"], marker + "-", label=f"{name}, point release")
        if implicates:
            ax.plot(x, rows["implicates_error"], marker + "--", label=f"{name}, implicates")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [SIZE_TITLES[c] for c in SIZE_CODES], rotation=45, fontsize=7, ha="right")
    ax.set_ylabel("mean relative error")
    ax.legend(fontsize=7)
    report.figure(figure, "size_classes.png", "Relative error by size class (statewide): establishments, "
                  "month-3 employment and average weekly wage")

    flows = statewide.loc[list(FLOWS)].xs(ALL_SIZES, level="size_class")
    figure, axes = plt.subplots(1, 2 if implicates else 1, figsize=(12 if implicates else 8, 3.6), squeeze=False)
    y = np.arange(len(flows))
    ax = axes[0, 0]
    ax.barh(y + 0.2, flows["point_error"].fillna(0), 0.4, label="point release")
    if implicates:
        ax.barh(y - 0.2, flows["implicates_error"].fillna(0), 0.4, label="implicates")
        axes[0, 1].barh(y, flows["coverage"].fillna(0))
        axes[0, 1].axvspan(0.90, 0.97, color="grey", alpha=0.3, label="90-97%")
        axes[0, 1].set_yticks(y, flows.index, fontsize=8)
        axes[0, 1].set_xlabel("coverage of the combined 95% intervals")
        axes[0, 1].legend(fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, flows.index, fontsize=8)
    ax.set_xlabel("mean relative error (release - truth) / |truth| (0 where the truth is 0)")
    ax.legend(fontsize=8)
    report.figure(figure, "statistics_error.png", "The statewide statistics: relative error"
                  + (" and coverage of the implicates' intervals" if implicates else ""))


def _number(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{100 * value:.1f}%"
