"""Accuracy of releases in the agency's terms: for every QCEW aggregation level (51-58 statewide,
71-78 by county) and attribute, the relative error of protected cells on the cells BLS published
and on all cells, the shares within 3% and 10%, artificial zeros, the state total's signed error in
units of its measurement's sd, and the coverage of the stated 95% margins of error by cell size.

Releases are simulated as ``gedp protect`` makes them (the plan's measurements, then the config's
postprocessing, wages included); the published flags come from the QCEW file the state was
synthesized from (disclosure code not N), so "published cells" are the cells BLS shows today.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

from gedp.evaluation.moving_cells import (
    CELL_MIN_EMPLOYMENT,
    INDUSTRY_CHANGE,
    INDUSTRY_MIN_EMPLOYMENT,
    MONTHS,
    moving_summary,
)
from gedp.evaluation.replicate import child_streams
from gedp.evaluation.report import Report
from gedp.measure.queries import group_establishments
from gedp.measure.workflows import measure
from gedp.postprocess.attributes import WAGE_PRIOR
from gedp.postprocess.models import PostprocessOptions
from gedp.postprocess.moe import variance_function
from gedp.postprocess.months import month_answers
from gedp.postprocess.protect import protect_microdata
from gedp.postprocess.rounding import Rounder
from gedp.postprocess.tabulate import qcew_keys
from gedp.synth.hierarchy import ALL_INDUSTRIES, COUNTY_LEVELS, INDUSTRY_OF_STATE_LEVEL, STATE_LEVELS
from gedp.synth.schema import CONFIDENTIAL, public_columns

if TYPE_CHECKING:
    from gedp.config import Config
    from gedp.synth.qcew import PublishedState

LEVELS = (*STATE_LEVELS, *COUNTY_LEVELS)
#: Size bands of the true cell value: employees for the months, dollars for wages.
BANDS = {"employment": (0, 10, 100, 1_000, np.inf), "wage": (0, 1e5, 1e6, 1e7, np.inf)}
#: The coverage a stated 95% interval should reach (issue 13's target band).
COVERAGE_TARGET = (0.93, 0.97)
NOMINAL = 0.95
#: A protected cell below this prints as 0 in whole employees or dollars.
ZERO = 0.5


def bands(attribute: str) -> tuple[float, ...]:
    return BANDS["wage" if attribute == "wage" else "employment"]


@dataclass(frozen=True)
class LevelCells:
    """The true cells of one QCEW level and what the releases made of them (replications x cells)."""

    true: dict[str, np.ndarray]
    published: np.ndarray | None  # BLS showed the cell (None: no QCEW file to say)
    protected: dict[str, np.ndarray]
    margin: dict[str, np.ndarray]  # half-widths of the stated 95% intervals


@dataclass(frozen=True)
class AccuracyResult:
    levels: dict[int, LevelCells]
    state_z: dict[str, np.ndarray]  # per replication, (protected - true) / sd of the state measurement
    state_sd_source: str
    employer_zero_share: np.ndarray  # per replication: protected m1emp >= 1 with wage < ZERO
    setup: str
    replications: int
    seed: int
    seconds: float
    data_label: str


def published_flags(published: PublishedState, level: int, keys: pd.DataFrame) -> np.ndarray:
    """Whether BLS published each cell (keys of one level's grouping), from the QCEW file."""
    rows = published.aggregates[published.aggregates["agglvl"] == level]
    shown = {(c, i): not s for c, i, s in zip(rows["county"], rows["industry"], rows["suppressed"])}
    county = keys["county"] if level in COUNTY_LEVELS else pd.Series("", index=keys.index)
    industry_column = INDUSTRY_OF_STATE_LEVEL[level - 20 if level in COUNTY_LEVELS else level]
    industry = keys[industry_column] if industry_column else pd.Series(ALL_INDUSTRIES, index=keys.index)
    return np.array([shown.get((c, i), False) for c, i in zip(county, industry)], dtype=bool)


def compute_accuracy(truth: pd.DataFrame, config: Config, *, published: PublishedState | None, replications: int,
                     seed: int, data_label: str, on_step: Callable[[str], None] | None = None,
                     levels: Sequence[int] | None = None) -> AccuracyResult:
    """Simulate ``replications`` releases of ``truth`` under ``config`` and keep, per QCEW level and
    attribute, the protected cell totals and their stated 95% margins. ``levels``: the QCEW levels kept
    (default all of LEVELS), with the state's (51) always: the others' cells and margins, most of the
    work on a large state, are not computed; the releases and the kept levels' numbers are the same."""
    start = time.perf_counter()
    plan = config.plan
    attributes = [a for a in CONFIDENTIAL if a in plan.attributes]
    public = truth[public_columns(truth)]
    if levels is not None and not set(levels) <= set(LEVELS):
        raise ValueError(f"levels {sorted(set(levels) - set(LEVELS))} are not QCEW levels of {LEVELS}")
    kept = LEVELS if levels is None else tuple(level for level in LEVELS if level in {STATE_LEVELS[0], *levels})
    groupings = {level: group_establishments(public, qcew_keys(public, level)) for level in kept}
    z95 = float(stats.norm.ppf(0.5 + NOMINAL / 2))
    true = {level: {a: g.sum(truth[a].to_numpy()) for a in attributes} for level, g in groupings.items()}
    protected = {level: {a: np.empty((replications, g.n_groups)) for a in attributes} for level, g in groupings.items()}
    margin = {level: {a: np.empty((replications, g.n_groups)) for a in attributes} for level, g in groupings.items()}
    state_z = {a: np.empty(replications) for a in attributes}
    zero_share = np.empty(replications)
    state_query = any(q.by == ("state",) for q in plan.queries)
    rounder = Rounder(public) if config.integer else None  # as gedp protect --integer rounds
    for r, rng in enumerate(child_streams(seed, replications)):
        measurements = measure(truth, plan, rng=rng)
        measured = {a: measurements.for_attribute(a) for a in attributes}
        # postprocessed as `gedp protect` does it (the config's variance mode, solver and wage model)
        kept: dict = {}  # the wage fit, which the margins would make again from the same answers and release
        release, results = protect_microdata(measured, public, PostprocessOptions.from_config(config), finish=rounder,
                                             kept=kept)
        # the margins as `gedp tabulate --moe` reads the release: its answers turned by its variance
        # mode, wages informed by employment when the solve recorded the wage prior
        answers = month_answers(measured, config.variance_mode, plan.psi, public)
        wage_psi = plan.psi if "wage" in results and results["wage"].model == WAGE_PRIOR else None
        for attribute in attributes:
            variances = variance_function(attribute, answers, release, wage_psi, kept)
            values = release[attribute].to_numpy()
            for level, grouping in groupings.items():
                protected[level][attribute][r] = grouping.sum(values)
                margin[level][attribute][r] = variances(grouping.codes, grouping.n_groups).half_width(z95)
            state = STATE_LEVELS[0]  # level 51: the state total
            state_answer = next((a for a in answers[attribute] if a.query.by == ("state",)), None)
            if state_answer is not None:
                sd = np.sqrt(state_answer.variance[0])
            else:
                sd = margin[state][attribute][r, 0] / z95
            state_z[attribute][r] = (protected[state][attribute][r, 0] - true[state][attribute][0]) / sd
        if "wage" in attributes and "m1emp" in attributes:
            employed = release["m1emp"].to_numpy() >= 1
            zero_share[r] = np.mean(release["wage"].to_numpy()[employed] < ZERO) if employed.any() else 0.0
        else:
            zero_share[r] = np.nan
        if on_step is not None:
            on_step(f"release {r + 1} of {replications}")
    levels = {
        level: LevelCells(true[level],
                          None if published is None else published_flags(published, level, grouping.keys),
                          protected[level], margin[level])
        for level, grouping in groupings.items()
    }
    setup = (f"Data: {data_label}, {len(truth):,} establishments; config '{config.name}' (plan total mu "
             f"{plan.budget().total:.4f}, workflow {plan.workflow}, wages postprocessed by '{config.wages}')")
    source = ("the state measurement (the state cell's margin for an attribute without one)" if state_query
              else "the state cell's margin")
    return AccuracyResult(levels, state_z, source, zero_share, setup, replications, seed,
                          time.perf_counter() - start, data_label)


def cell_metrics(true: np.ndarray, protected: np.ndarray, margin: np.ndarray, cells: np.ndarray) -> dict:
    """Error figures over the cells ``cells`` (mask) of every replication: relative error on cells
    with a true value >= 1 (median, 90th percentile, shares within 3% and 10%), artificial zeros
    (true >= 1, protected < ZERO) and coverage of the 95% margins."""
    positive = cells & (true >= 1)
    if not positive.any():
        return {"cells": int(cells.sum()), "cells_positive": 0}
    error = np.abs(protected[:, positive] - true[positive]) / true[positive]
    covered = np.abs(protected[:, positive] - true[positive]) <= margin[:, positive]
    return {
        "cells": int(cells.sum()), "cells_positive": int(positive.sum()),
        "median_relative_error": float(np.median(error)),
        "p90_relative_error": float(np.quantile(error, 0.9)),
        "within_3pct": float(np.mean(error <= 0.03)),
        "within_10pct": float(np.mean(error <= 0.10)),
        "artificial_zero_share": float(np.mean(protected[:, positive] < ZERO)),
        "coverage_95": float(np.mean(covered)),
    }


def coverage_by_band(true: np.ndarray, protected: np.ndarray, margin: np.ndarray, edges) -> list[dict]:
    """Coverage of the 95% margins per size band of the true value (cells with true >= 1)."""
    positive = true >= 1
    band = np.digitize(true, edges[1:-1])
    covered = np.abs(protected - true) <= margin
    out = []
    for b in range(len(edges) - 1):
        keep = positive & (band == b)
        n = int(keep.sum()) * protected.shape[0]
        out.append({"band": _band_label(edges[b], edges[b + 1]), "cells_x_releases": n,
                    "coverage_95": float(np.mean(covered[:, keep])) if n else None})
    return out


def _band_label(low: float, high: float) -> str:
    def short(x):
        return "inf" if np.isinf(x) else (f"{x / 1e6:g}M" if x >= 1e6 else (f"{x / 1e3:g}k" if x >= 1e3 else f"{x:g}"))
    return f"[{short(low)}, {short(high)})"


def summarize(result: AccuracyResult) -> dict:
    """Every figure of the report, by level and attribute."""
    attributes = list(result.state_z)
    by_level: dict = {}
    pooled_bands: dict = {}
    for level, cells in result.levels.items():
        everything = np.ones(len(next(iter(cells.true.values()))), dtype=bool)
        for attribute in attributes:
            args = (cells.true[attribute], cells.protected[attribute], cells.margin[attribute])
            entry = {"all": cell_metrics(*args, everything),
                     "bands": coverage_by_band(*args, bands(attribute))}
            if cells.published is not None:
                entry["published"] = cell_metrics(*args, cells.published)
            by_level.setdefault(str(level), {})[attribute] = entry
            for band in entry["bands"]:
                pool = pooled_bands.setdefault(attribute, {}).setdefault(band["band"], [0, 0.0])
                if band["cells_x_releases"]:
                    pool[0] += band["cells_x_releases"]
                    pool[1] += band["coverage_95"] * band["cells_x_releases"]
    return {
        "levels": by_level,
        "coverage_95_by_band_all_levels": {
            a: {band: (covered / n if n else None) for band, (n, covered) in per_band.items()}
            for a, per_band in pooled_bands.items()},
        "state_total_z": {a: {"mean": float(np.mean(z)), "sd": float(np.std(z, ddof=1)) if len(z) > 1 else None,
                              "min": float(np.min(z)), "max": float(np.max(z))} for a, z in result.state_z.items()},
        "state_sd_source": result.state_sd_source,
        "employers_paid_zero_share": float(np.nanmean(result.employer_zero_share)),
        **({"moving": moving_summary(result)} if set(MONTHS) <= set(attributes) else {}),
    }


def _figures(report: Report, result: AccuracyResult, summary: dict) -> None:
    attributes = list(result.state_z)
    levels = [str(level) for level in LEVELS]
    published = next(iter(result.levels.values())).published is not None
    figure, axes = plt.subplots(1, len(attributes), figsize=(4 * len(attributes), 3.6), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, attribute in zip(axes, attributes):
        for which, style in (("published", "o-"), ("all", "s--")):
            if which == "published" and not published:
                continue
            values = [summary["levels"][level][attribute][which].get("median_relative_error", np.nan)
                      for level in levels]
            ax.plot(range(len(levels)), values, style, label=f"{which} cells")
        ax.set_yscale("log")
        ax.set_xticks(range(len(levels)), levels, rotation=90, fontsize=7)
        ax.set_xlabel("QCEW aggregation level")
        ax.set_title(attribute)
    axes[0].set_ylabel("median relative error")
    axes[0].legend(fontsize=8)
    report.figure(figure, "error_by_level.png", "Median relative error of protected cells by QCEW level (51-58 "
                  "statewide, 71-78 by county; NAICS detail grows left to right within each)")

    figure, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for attribute in attributes:
        per_band = summary["coverage_95_by_band_all_levels"][attribute]
        shown = [(b, c) for b, c in per_band.items() if c is not None]
        ax = axes[1] if attribute == "wage" else axes[0]
        ax.plot(range(len(shown)), [c for _, c in shown], "o-", label=attribute)
        ax.set_xticks(range(len(shown)), [b for b, _ in shown])
    for ax, unit in zip(axes, ("employees", "dollars")):
        ax.axhspan(*COVERAGE_TARGET, color="grey", alpha=0.3, label="93-97%")
        ax.set_ylim(0.5, 1.0)
        ax.set_xlabel(f"true cell value ({unit})")
        ax.set_ylabel("coverage of the 95% margin")
        ax.legend(fontsize=8)
    report.figure(figure, "coverage_by_band.png", "Coverage of the stated 95% margins by cell size, all QCEW levels")

    figure, ax = plt.subplots(figsize=(6, 3.4))
    for k, attribute in enumerate(attributes):
        z = result.state_z[attribute]
        ax.scatter(np.full(len(z), k) + np.linspace(-0.15, 0.15, len(z)), z, s=12)
    ax.axhspan(-1, 1, color="grey", alpha=0.3, label="+/-1 sd")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(attributes)), attributes)
    ax.set_ylabel(f"state total error / sd of {result.state_sd_source}")
    ax.legend(fontsize=8)
    report.figure(figure, "state_totals.png", "Signed error of the protected state total in each release")


def render_accuracy(result: AccuracyResult, out: Path) -> dict:
    """report.md, summary.json and the plots; returns the summary."""
    figures = summarize(result)
    attributes = list(result.state_z)
    report = Report(out, "Accuracy of protected QCEW tables")
    report.section(
        "Setup",
        f"{result.setup}; {result.replications} simulated releases (seed {result.seed}, {result.seconds:.0f} s). "
        "Each release is measured and postprocessed as `gedp protect` does; its cells at every QCEW aggregation "
        "level are compared with the true cells. Relative errors are over cells with a true value of at least 1 "
        "and over every release; *published* cells are those the BLS file shows (disclosure code not N). "
        f"An artificial zero is a cell with a true value >= 1 whose protected value is below {ZERO} (it prints "
        "as 0). Coverage: share of cells whose stated 95% margin of error covers the true value.",
    )
    z = figures["state_total_z"]
    report.section(
        "Headline",
        f"Employers (protected month-1 employment >= 1) paid $0: {figures['employers_paid_zero_share']:.2%}. "
        "State totals, mean signed error in sd units of " + result.state_sd_source + ": "
        + ", ".join(f"{a} {z[a]['mean']:+.2f} (range {z[a]['min']:+.2f} to {z[a]['max']:+.2f})" for a in attributes)
        + ".",
    )
    for attribute in attributes:
        header = ["level", "cells"]
        kinds = ["published", "all"] if "published" in figures["levels"]["51"][attribute] else ["all"]
        for kind in kinds:
            header += [f"{kind}: median", "p90", "within 3%", "within 10%"]
        header += ["zeros", "95% coverage"]
        rows = []
        for level in LEVELS:
            entry = figures["levels"][str(level)][attribute]
            row: list[object] = [level, entry["all"]["cells"]]
            for kind in kinds:
                m = entry[kind]
                row += [_pct(m.get("median_relative_error")), _pct(m.get("p90_relative_error")),
                        _pct(m.get("within_3pct")), _pct(m.get("within_10pct"))]
            row += [_pct(entry["all"].get("artificial_zero_share")), _pct(entry["all"].get("coverage_95"))]
            rows.append(row)
        report.section(f"{attribute} by QCEW level")
        report.table(header, rows)
    if "moving" in figures:
        _moving_section(report, figures["moving"])
    report.section("Coverage of the 95% margins by cell size (all levels pooled)")
    per_band = figures["coverage_95_by_band_all_levels"]
    report.table(["attribute", "true cell value", "coverage"],
                 [[a, band, _pct(c)] for a in attributes for band, c in per_band[a].items()])
    _figures(report, result, figures)
    summary = {"experiment": "accuracy", "data": result.data_label, "replications": result.replications,
               "seed": result.seed, "seconds": result.seconds, **figures}
    report.write(summary)
    return summary


def _moving_section(report: Report, moving: dict) -> None:
    """Coverage and error of the cells whose employment moves within the quarter."""
    report.section(
        "Cells that move within the quarter",
        f"Moving cells: county x NAICS-6 cells whose month-3 employment is outside [2/3, 1.5] times month 1's, "
        f"with {CELL_MIN_EMPLOYMENT}+ employees; moving industries: statewide NAICS-3 to NAICS-6 cells of "
        f"{INDUSTRY_MIN_EMPLOYMENT:,}+ employees changing by more than {INDUSTRY_CHANGE:.0%} from month 1 to 3.")
    rows = []
    for key, label in (("moving_cells", "moving cells"), ("other_cells_10plus", "other cells of 10+ employees"),
                       ("moving_industries", "moving industries")):
        entry = moving[key]
        rows.append([label, entry["cells"], *(_pct(entry[m]["coverage_95"]) if m in entry else "n/a" for m in MONTHS),
                     *(_pct(entry[m].get("median_relative_error")) if m in entry else "n/a" for m in MONTHS)])
    report.table(["cells", "count", *(f"{m} coverage" for m in MONTHS), *(f"{m} median error" for m in MONTHS)], rows)


def _pct(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.1f}%"
