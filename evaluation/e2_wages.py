"""E2, employment and wages (SPEC section 6, Section 8.2 setup): budget plans and workflows."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gedp.evaluation.compare import compare_tabulations
from gedp.evaluation.replicate import child_streams, protected_copy, scaled_plan
from gedp.evaluation.report import Report
from gedp.measure.workflows import MeasurementPlan

LEVELS = {"county": ["state", "county"], "NAICS-3 (not measured)": ["state", "naics3"], "NAICS-5": ["state", "naics5"]}
ATTRIBUTES = ("m1emp", "wage")
DETAIL = ["state", "county", "naics5"]
BUDGET_FACTORS = (0.5, 1.0, 2.0, 4.0)
SWEEP_REPLICATIONS = 5


@dataclass(frozen=True)
class E2Result:
    """Errors of every plan x workflow (``combos``), averaged over replications, and the budget sweep."""

    plans: dict[str, MeasurementPlan]
    combos: dict[str, MeasurementPlan]
    group_error: dict[str, dict[str, dict[str, np.ndarray]]]
    state_error: dict[str, dict[str, list[float]]]
    detail_relative: dict[str, dict[str, np.ndarray]]
    truth_detail: dict[str, np.ndarray]
    sweep: dict[str, dict[str, float]]
    establishments: int
    replications: int
    seed: int
    seconds: float
    data_label: str


def compute_e2(truth: pd.DataFrame, plans: dict[str, MeasurementPlan], *, replications: int, seed: int,
               data_label: str) -> E2Result:
    """Replicated releases for every plan x workflow: per-group, state-total and detail errors."""
    start = time.perf_counter()
    combos = {f"{name}/{workflow}": dataclasses.replace(plan, workflow=workflow)
              for name, plan in plans.items() for workflow in ("pnc", "psi")}
    group_error = {c: {a: {level: None for level in LEVELS} for a in ATTRIBUTES} for c in combos}
    state_error = {c: {a: [] for a in ATTRIBUTES} for c in combos}
    detail_relative = {c: {a: None for a in ATTRIBUTES} for c in combos}
    truth_detail = {a: None for a in ATTRIBUTES}
    for combo, plan in combos.items():
        for rng in child_streams(seed, replications):
            protected = protected_copy(truth, plan, rng=rng)
            for attribute in ATTRIBUTES:
                for level, by in LEVELS.items():
                    absolute = compare_tabulations(truth, protected, by, attribute)["absolute"].to_numpy()
                    previous = group_error[combo][attribute][level]
                    group_error[combo][attribute][level] = absolute if previous is None else previous + absolute
                state_error[combo][attribute].append(
                    float(compare_tabulations(truth, protected, ["state"], attribute)["absolute"].sum()))
                detail = compare_tabulations(truth, protected, DETAIL, attribute)
                truth_detail[attribute] = detail["true"].to_numpy()
                previous = detail_relative[combo][attribute]
                relative = detail["relative"].to_numpy()
                detail_relative[combo][attribute] = relative if previous is None else previous + relative
        for attribute in ATTRIBUTES:
            for level in LEVELS:
                group_error[combo][attribute][level] /= replications
            detail_relative[combo][attribute] /= replications

    base_name = next(iter(plans))
    sweep = {a: {} for a in ATTRIBUTES}
    for factor in BUDGET_FACTORS:
        plan = scaled_plan(dataclasses.replace(plans[base_name], workflow="pnc"), factor)
        medians = {a: [] for a in ATTRIBUTES}
        for rng in child_streams(seed + 1, min(replications, SWEEP_REPLICATIONS)):
            protected = protected_copy(truth, plan, rng=rng)
            for attribute in ATTRIBUTES:
                medians[attribute].append(compare_tabulations(truth, protected, DETAIL, attribute)["relative"].median())
        for attribute in ATTRIBUTES:
            sweep[attribute][f"{plan.budget().total:.4f}"] = float(np.mean(medians[attribute]))
    return E2Result(plans, combos, group_error, state_error, detail_relative, truth_detail, sweep, len(truth),
                    replications, seed, time.perf_counter() - start, data_label)


def render_e2(result: E2Result, out: Path) -> dict:
    """report.md, summary.json and the four plots; returns the summary."""
    report = Report(out, "E2: employment and wages under two budget plans")
    _setup_section(report, result)
    summary = _error_summary(report, result)
    _plot_group_errors(report, result)
    _plot_state_totals(report, result)
    _plot_relative_errors(report, result)
    _plot_budget_sweep(report, result.sweep)
    report.section("Findings", *_findings(summary, result.sweep))
    written = {"experiment": "e2", "data": result.data_label, "establishments": result.establishments,
               "replications": result.replications, "seed": result.seed, "seconds": result.seconds,
               "plans": {n: p.budget().total for n, p in result.plans.items()}, "summary": summary,
               "budget_sweep": result.sweep}
    report.write(written)
    return written


def _setup_section(report: Report, result: E2Result) -> None:
    """The data, the plans' budgets per query and total, the workflows and replications."""
    plans = result.plans
    plan_lines = []
    for name, plan in plans.items():
        budgets = ", ".join(f"{q.name} {q.mu.get('m1emp', 0):g}/{q.mu.get('wage', 0):g}" for q in plan.queries)
        plan_lines.append(f"**{name}** (per month / wage: {budgets}; total mu {plan.budget().total:.4f})")
    report.section(
        "Setup",
        f"Data: {result.data_label}, {result.establishments:,} establishments. psi sqrt, gamma 0.5 for employment "
        f"and 50 for wages, zeta {next(iter(plans.values())).zeta:g}. Plans: " + "; ".join(plan_lines) + ". Each "
        f"plan runs with the pnc and the all-sqrt (psi) workflow, {result.replications} replications each (seed "
        f"{result.seed}); the run took {result.seconds:.0f} s on this machine. Per-group errors are averaged over "
        "replications; NAICS-3 is not measured by any query, so its accuracy comes from postprocessing alone.",
    )


def _error_summary(report: Report, result: E2Result) -> dict:
    """The table of median group errors, state-total and county x NAICS-5 errors; returns them by combo."""
    summary_rows, summary = [], {}
    for combo in result.combos:
        summary[combo] = {}
        for attribute in ATTRIBUTES:
            per_level = {level: float(np.median(result.group_error[combo][attribute][level])) for level in LEVELS}
            summary[combo][attribute] = {
                "median_group_mean_absolute_error": per_level,
                "state_total_mean_absolute_error": float(np.mean(result.state_error[combo][attribute])),
                "median_relative_error_county_naics5": float(np.median(result.detail_relative[combo][attribute])),
            }
            summary_rows.append([combo, attribute, *per_level.values(),
                                 summary[combo][attribute]["state_total_mean_absolute_error"],
                                 summary[combo][attribute]["median_relative_error_county_naics5"]])
    report.section("Median over groups of the mean absolute error")
    report.table(["plan/workflow", "attribute", *LEVELS, "state total", "median rel. error county x "
                                                                        "NAICS-5"], summary_rows)
    return summary


def _plot_group_errors(report: Report, result: E2Result) -> None:
    combos = result.combos
    figure, axes = plt.subplots(len(ATTRIBUTES), len(LEVELS), figsize=(15, 8), layout="constrained")
    for row, attribute in enumerate(ATTRIBUTES):
        for column, level in enumerate(LEVELS):
            ax = axes[row, column]
            ax.boxplot([np.maximum(result.group_error[c][attribute][level], 1e-3) for c in combos], showfliers=False)
            ax.set_xticks(range(1, len(combos) + 1), list(combos), rotation=20)
            ax.set_yscale("log")
            ax.set_title(f"{attribute}, {level}")
            ax.set_ylabel("mean absolute error per group")
    report.figure(figure, "e2_group_errors.png", "Per-group absolute error averaged over replications, by plan and "
                                                 "workflow")


def _plot_state_totals(report: Report, result: E2Result) -> None:
    figure, axes = plt.subplots(1, len(ATTRIBUTES), figsize=(12, 4))
    for ax, attribute in zip(axes, ATTRIBUTES):
        for combo in result.combos:
            ax.plot(range(1, result.replications + 1), result.state_error[combo][attribute], marker="o", ms=3,
                    label=combo)
        ax.set_xlabel("replication")
        ax.set_ylabel("absolute error of the state total")
        ax.set_title(attribute)
    axes[0].legend()
    report.figure(figure, "e2_state_total.png", "Absolute error of the state total in each replication")


def _plot_relative_errors(report: Report, result: E2Result) -> None:
    figure, axes = plt.subplots(1, len(ATTRIBUTES), figsize=(12, 4))
    for ax, attribute in zip(axes, ATTRIBUTES):
        for combo in [c for c in result.combos if c.endswith("/pnc")]:
            ax.scatter(np.maximum(result.truth_detail[attribute], 1.0), result.detail_relative[combo][attribute], s=4,
                       alpha=0.5, label=combo)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("true value (county x NAICS-5)")
        ax.set_ylabel("relative error, mean over replications")
        ax.set_title(attribute)
    axes[0].legend()
    report.figure(figure, "e2_relative_error.png", "Relative error against the true value of each county x NAICS-5 "
                                                   "cell")


def _plot_budget_sweep(report: Report, sweep: dict) -> None:
    figure, ax = plt.subplots(figsize=(6, 4))
    for attribute in ATTRIBUTES:
        totals = [float(t) for t in sweep[attribute]]
        ax.plot(totals, list(sweep[attribute].values()), marker="o", label=attribute)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("total mu (same shares as the first plan)")
    ax.set_ylabel("median relative error, county x NAICS-5")
    ax.legend()
    report.figure(figure, "e2_budget.png", "Error as the total budget varies (pnc workflow)")


def run_e2(out: Path, truth: pd.DataFrame, plans: dict[str, MeasurementPlan], *, replications: int, seed: int,
           data_label: str) -> dict:
    """Compute E2 and write its report into ``out``."""
    return render_e2(compute_e2(truth, plans, replications=replications, seed=seed, data_label=data_label), out)


def _findings(summary: dict, sweep: dict) -> list[str]:
    lines = []
    for attribute in ATTRIBUTES:
        ranked = sorted(summary, key=lambda c: summary[c][attribute]["median_relative_error_county_naics5"])
        best, worst = ranked[0], ranked[-1]
        lines.append(
            f"- {attribute}: lowest median relative error at county x NAICS-5 with {best} "
            f"({summary[best][attribute]['median_relative_error_county_naics5']:.2%}), highest with {worst} "
            f"({summary[worst][attribute]['median_relative_error_county_naics5']:.2%})."
        )
    for attribute, points in sweep.items():
        errors = list(points.values())
        monotone = all(later <= earlier for earlier, later in zip(errors, errors[1:]))
        lines.append(f"- {attribute}: as the total budget grows ({', '.join(points)}), the median relative error "
                     f"goes {' -> '.join(f'{e:.2%}' for e in errors)}"
                     + ("." if monotone else " (**not monotone**, against the expectation that more budget helps)."))
    return ["\n".join(lines),
            "Expectation: the uniform plan spends more on wages and less on employment than the baseline plan, so it "
            "should trade employment accuracy for much better wages; pnc should beat the all-sqrt workflow except "
            "in groups dominated by a single establishment."]
