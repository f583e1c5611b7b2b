"""A plan beside the shipped baseline in the agency's terms: `gedp evaluate accuracy --config PLAN`.

Both are simulated on the same state with the same seed (paired releases, ``evaluation.accuracy``);
the report puts side by side, per QCEW level and attribute, the median relative error on the
published cells, the coverage of the 95% margins per size band, and the share of all county x
NAICS-6 (level 78) cells within 10% and 25% of the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gedp.evaluation.accuracy import LEVELS, AccuracyResult, render_accuracy, summarize
from gedp.evaluation.report import Report

#: Shares of level-78 cells within these relative errors.
WITHIN = (0.10, 0.25)
DETAIL_LEVEL = 78


@dataclass(frozen=True)
class Comparison:
    plan: AccuracyResult
    baseline: AccuracyResult
    plan_name: str


def within_shares(result: AccuracyResult, level: int = DETAIL_LEVEL) -> dict[str, dict[str, float]]:
    """Per attribute: the share of all cells of ``level`` (true >= 1, every release) within each of WITHIN."""
    cells = result.levels[level]
    out = {}
    for attribute, true in cells.true.items():
        keep = true >= 1
        error = np.abs(cells.protected[attribute][:, keep] - true[keep]) / true[keep]
        out[attribute] = {f"{bound:.0%}": float(np.mean(error <= bound)) for bound in WITHIN}
    return out


def render_comparison(comparison: Comparison, out: Path) -> dict:
    """report.md and summary.json side by side; each run's own report in plan/ and baseline/."""
    figures = {name: summarize(result) for name, result in (("plan", comparison.plan),
                                                            ("baseline", comparison.baseline))}
    for name, result in (("plan", comparison.plan), ("baseline", comparison.baseline)):
        render_accuracy(result, out / name)
    within = {"plan": within_shares(comparison.plan), "baseline": within_shares(comparison.baseline)}
    report = Report(out, f"Accuracy of plan '{comparison.plan_name}' beside baseline")
    report.section("Setup", f"{comparison.plan.setup}; baseline: {comparison.baseline.setup}; "
                   f"{comparison.plan.replications} paired releases each (seed {comparison.plan.seed}). "
                   "Each run's full report is in plan/ and baseline/.")
    attributes = list(comparison.plan.state_z)
    rows = []
    for level in LEVELS:
        for attribute in attributes:
            pair = [figures[name]["levels"][str(level)][attribute].get("published", {}).get("median_relative_error")
                    for name in ("plan", "baseline")]
            rows.append([level, attribute, *(_pct(v) for v in pair), _ratio(*pair)])
    report.section("Median relative error on the published cells")
    report.table(["level", "attribute", "plan", "baseline", "plan / baseline"], rows)
    report.section("Coverage of the 95% margins by cell size (all levels pooled)")
    bands = [[a, band, _pct(c), _pct(figures["baseline"]["coverage_95_by_band_all_levels"][a][band])]
             for a in attributes for band, c in figures["plan"]["coverage_95_by_band_all_levels"][a].items()]
    report.table(["attribute", "true cell value", "plan", "baseline"], bands)
    report.section(f"Level {DETAIL_LEVEL} cells (all, true >= 1) within 10% and 25%")
    report.table(["attribute", *(f"{name} within {b:.0%}" for name in within for b in WITHIN)],
                 [[a, *(_pct(within[name][a][f"{b:.0%}"]) for name in within for b in WITHIN)] for a in attributes])
    summary = {"experiment": "accuracy", "plan": comparison.plan_name, "replications": comparison.plan.replications,
               "seed": comparison.plan.seed, **figures, "within_level_78": within}
    report.write(summary)
    return summary


def _pct(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.2f}%"


def _ratio(plan: float | None, baseline: float | None) -> str:
    return "n/a" if not plan or not baseline else f"{plan / baseline:.2f}"


def render(result: AccuracyResult | Comparison, out: Path) -> dict:
    """The accuracy report of one config, or a plan's beside baseline."""
    return render_comparison(result, out) if isinstance(result, Comparison) else render_accuracy(result, out)
