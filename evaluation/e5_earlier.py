"""E5, earlier mechanisms and today's disclosure limitation (SPEC section 6).

On the same tabulations (county x sector, county x NAICS-3 and their state levels) of one attribute:
L1 error of Log-Laplace, Smooth Laplace, Smooth Gamma and Truncated Laplace as a ratio to input
noise infusion, per cell-size stratum, over the valid (eps, alpha) and (eps, theta) pairs; Spearman
rank correlation of protected with true cells; the gedp workflows at a few budgets; and the share
of cells (and employment) that cell suppression withholds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

from gedp.evaluation.baselines.earlier import (
    check_infusion,
    check_log_laplace,
    check_smooth_gamma,
    check_smooth_laplace,
    infusion_factors,
    is_valid,
    log_laplace,
    noise_infusion,
    smooth_gamma,
    smooth_laplace,
    truncated_laplace,
)
from gedp.evaluation.baselines.suppression import SuppressionResult, SuppressionRule, suppress, suppression_shares
from gedp.evaluation.replicate import child_streams, protected_copy, scaled_plan
from gedp.evaluation.report import Report
from gedp.measure.conversions import gdp_epsilon
from gedp.measure.queries import Grouping, group_establishments
from gedp.measure.workflows import MeasurementPlan
from gedp.postprocess.tabulate import tabulate

TABULATIONS = {
    "county x sector": ("state", "county", "sector"),
    "county x NAICS-3": ("state", "county", "naics3"),
    "state x sector": ("state", "sector"),
    "state x NAICS-3": ("state", "naics3"),
}
#: QCEW aggregation level of each tabulation (private ownership).
AGGLVL = {"county x sector": 74, "county x NAICS-3": 75, "state x sector": 54, "state x NAICS-3": 55}
STRATA = (("0-100", 0.0, 100.0), ("100-10k", 100.0, 1e4), ("10k-100k", 1e4, 1e5), ("100k+", 1e5, math.inf))
ALPHA_MECHANISMS = ("log-laplace", "smooth-laplace", "smooth-gamma")
MECHANISMS = (*ALPHA_MECHANISMS, "truncated-laplace")
#: The alpha and theta at which the report's tables and line plots show every eps.
SHOWN_ALPHA = 0.1
SHOWN_THETA = 100.0
#: delta at which a gedp budget mu is expressed as an (eps, delta) pair for comparison.
GDP_DELTA = 1e-6


@dataclass(frozen=True)
class E5Setup:
    """Every parameter of E5 (defaults: the grid of SPEC section 6)."""

    eps: tuple[float, ...] = (0.25, 0.5, 0.67, 1.0, 2.0, 4.0)
    alphas: tuple[float, ...] = (0.01, 0.05, 0.1, 0.15, 0.2)
    thetas: tuple[float, ...] = (2.0, 20.0, 50.0, 100.0, 200.0, 500.0)
    delta: float = 1e-3  # Smooth Laplace
    infusion_s: float = 0.05  # noise infusion distortion bounds (secret in practice; illustrative here)
    infusion_t: float = 0.15
    attribute: str = "m1emp"
    budget_factors: tuple[float, ...] = (0.5, 1.0, 2.0)
    rule: SuppressionRule = SuppressionRule()

    def __post_init__(self) -> None:
        check_infusion(self.infusion_s, self.infusion_t)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta ({self.delta}) must be in (0, 1)")
        for name in ("eps", "alphas", "thetas", "budget_factors"):
            values = getattr(self, name)
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{name} ({', '.join(map(str, values)) or 'none'}) must be finite numbers > 0")


@dataclass(frozen=True)
class Setting:
    mechanism: str
    eps: float
    alpha: float | None = None
    theta: float | None = None

    @property
    def shown(self) -> bool:
        """Whether the report's table and line plot show this setting (alpha SHOWN_ALPHA, theta SHOWN_THETA)."""
        return self.alpha == SHOWN_ALPHA if self.alpha is not None else self.theta == SHOWN_THETA

    @property
    def label(self) -> str:
        extra = (f" alpha {self.alpha:g}" if self.alpha is not None
                 else f" theta {self.theta:g}" if self.theta is not None else "")
        return f"{self.mechanism} eps {self.eps:g}{extra}"


def settings(setup: E5Setup) -> list[Setting]:
    """The valid grid: every (eps, alpha) pair each mechanism accepts, and every (eps, theta)."""
    checks = {
        "log-laplace": lambda e, a: is_valid(check_log_laplace, e, a),
        "smooth-laplace": lambda e, a: is_valid(check_smooth_laplace, e, a, setup.delta),
        "smooth-gamma": lambda e, a: is_valid(check_smooth_gamma, e, a),
    }
    grid = [
        Setting(m, e, alpha=a) for m in ALPHA_MECHANISMS for e in setup.eps for a in setup.alphas if checks[m](e, a)
    ]
    return grid + [Setting("truncated-laplace", e, theta=t) for e in setup.eps for t in setup.thetas]


def release(setting: Setting, values: np.ndarray, grouping: Grouping, setup: E5Setup,
            rng: np.random.Generator) -> np.ndarray:
    """One noisy answer of ``setting`` for the cells of ``grouping``."""
    common = {"attribute": setup.attribute, "eps": setting.eps, "rng": rng}
    if setting.mechanism == "log-laplace":
        return log_laplace(values, grouping, alpha=setting.alpha, **common).released
    if setting.mechanism == "smooth-laplace":
        return smooth_laplace(values, grouping, alpha=setting.alpha, delta=setup.delta, **common).released
    if setting.mechanism == "smooth-gamma":
        return smooth_gamma(values, grouping, alpha=setting.alpha, **common).released
    return truncated_laplace(values, grouping, theta=setting.theta, **common).released


class ErrorAccumulator:
    """Sum over replications of per-cell absolute errors, and Spearman correlations, per tabulation.

    Cells fall in size strata by ``sizes`` (default: their true values; E6 uses the size of the cell's
    place); with ``sizes`` given, Spearman correlations are also kept per stratum (all tabulations'
    cells of the stratum together, strata of 3 cells or more).
    """

    def __init__(self, truth: dict[str, np.ndarray], sizes: dict[str, np.ndarray] | None = None):
        self.truth = truth
        self.sizes = np.concatenate(list((sizes or truth).values()))
        self.by_stratum = sizes is not None
        self.absolute = {name: np.zeros_like(values) for name, values in truth.items()}
        self.spearman: dict[str, list[float]] = {name: [] for name in truth}
        self.stratum_spearman: dict[str, list[float]] = {label: [] for label, _, _ in STRATA}
        self.replications = 0

    def _strata(self) -> list[tuple[str, np.ndarray]]:
        return [(label, (self.sizes >= low) & (self.sizes < high)) for label, low, high in STRATA]

    def add(self, released: dict[str, np.ndarray]) -> None:
        for name, true in self.truth.items():
            self.absolute[name] += np.abs(released[name] - true)
            self.spearman[name].append(float(stats.spearmanr(released[name], true).statistic))
        if self.by_stratum:
            true, noisy = (np.concatenate([d[name] for name in self.truth]) for d in (self.truth, released))
            for label, cells in self._strata():
                if cells.sum() >= 3:
                    self.stratum_spearman[label].append(float(stats.spearmanr(noisy[cells], true[cells]).statistic))
        self.replications += 1

    def stratum_l1(self) -> dict[str, float]:
        """Mean absolute error per cell, summed over the cells of each size stratum (all tabulations)."""
        error = np.concatenate(list(self.absolute.values())) / self.replications
        return {label: float(error[cells].sum()) if cells.any() else math.nan for label, cells in self._strata()}

    def stratum_spearman_means(self) -> dict[str, float]:
        """Spearman correlation per stratum, averaged over replications (nan: fewer than 3 cells)."""
        return {label: float(np.mean(v)) if v else math.nan for label, v in self.stratum_spearman.items()}

    def spearman_means(self) -> dict[str, float]:
        return {name: float(np.mean(values)) for name, values in self.spearman.items()}

    def spearman_mean(self) -> float:
        """Spearman correlation averaged over tabulations and replications."""
        return float(np.mean(list(self.spearman_means().values())))


@dataclass(frozen=True)
class E5Result:
    """Errors of noise infusion, of every setting of the grid and of gedp; cell suppression's shares."""

    setup: E5Setup
    plan: MeasurementPlan
    grid: list[Setting]
    infusion: ErrorAccumulator
    grid_errors: dict[Setting, ErrorAccumulator]
    gedp_errors: dict[str, ErrorAccumulator]
    gedp_mu: dict[str, float]
    suppression: SuppressionResult
    shares: pd.DataFrame
    establishments: int
    replications: int
    gedp_replications: int
    seed: int
    seconds: float
    data_label: str


def compute_e5(truth: pd.DataFrame, plan: MeasurementPlan, setup: E5Setup, *, replications: int,
               gedp_replications: int, seed: int, data_label: str,
               on_step: Callable[[str], None] | None = None) -> E5Result:
    """Every mechanism of the grid, the gedp workflows and cell suppression, replicated."""
    start = time.perf_counter()
    step = on_step or (lambda _: None)
    values = truth[setup.attribute].to_numpy(dtype=float)
    groupings = {name: group_establishments(truth, by) for name, by in TABULATIONS.items()}
    true = {name: g.sum(values) for name, g in groupings.items()}
    grid = settings(setup)
    infusion = ErrorAccumulator(true)
    grid_errors = {s: ErrorAccumulator(true) for s in grid}
    for rng in child_streams(seed, replications):
        factors = infusion_factors(len(truth), s=setup.infusion_s, t=setup.infusion_t, rng=rng)
        infusion.add({name: noise_infusion(values, g, factors, attribute=setup.attribute, rng=rng).released
                      for name, g in groupings.items()})
        for setting, accumulator in grid_errors.items():
            accumulator.add({name: release(setting, values, g, setup, rng) for name, g in groupings.items()})
    step(f"earlier mechanisms: {len(grid)} settings x {replications} replications")

    gedp_errors, gedp_mu = {}, {}
    measured = plan.restrict((setup.attribute,))
    data = truth.drop(columns=[c for c in plan.attributes if c != setup.attribute])
    for factor in setup.budget_factors:
        for workflow in ("pnc", "psi"):
            scaled = scaled_plan(dataclasses.replace(measured, workflow=workflow), factor)
            label = f"gedp {workflow} mu {scaled.budget().total:.3g}"
            gedp_mu[label] = scaled.budget().total
            gedp_errors[label] = ErrorAccumulator(true)
            for rng in child_streams(seed + 1, gedp_replications):
                protected = protected_copy(data, scaled, rng=rng)
                gedp_errors[label].add({name: _aligned(protected, by, groupings[name], setup.attribute)
                                        for name, by in TABULATIONS.items()})
            step(label)

    suppression = suppress(truth, setup.rule)
    shares = suppression_shares(suppression, setup.attribute).set_index("agglvl")
    step("cell suppression")
    return E5Result(setup, measured, grid, infusion, grid_errors, gedp_errors, gedp_mu, suppression, shares,
                    len(truth), replications, gedp_replications, seed, time.perf_counter() - start, data_label)


def run_e5(out: Path, truth: pd.DataFrame, plan: MeasurementPlan, setup: E5Setup, *, replications: int,
           gedp_replications: int, seed: int, data_label: str,
           on_step: Callable[[str], None] | None = None) -> dict:
    """Compute E5 and write its report into ``out``."""
    return render_e5(compute_e5(truth, plan, setup, replications=replications, gedp_replications=gedp_replications,
                                seed=seed, data_label=data_label, on_step=on_step), out)


def _aligned(protected: pd.DataFrame, by: tuple[str, ...], grouping: Grouping, attribute: str) -> np.ndarray:
    """Protected cell totals in the order of ``grouping``'s keys (cells absent from the release: 0)."""
    return aligned_cells(tabulate(protected, by, [attribute]), grouping.keys, attribute)


def aligned_cells(table: pd.DataFrame, keys: pd.DataFrame, column: str) -> np.ndarray:
    """``table[column]`` in the order of the cells ``keys`` (matched on their columns as text; cells
    absent from ``table``: 0)."""
    on = list(keys.columns)
    merged = keys.astype(str).merge(table[[*on, column]].astype({c: str for c in on}), on=on, how="left",
                                    validate="one_to_one")
    return merged[column].fillna(0.0).to_numpy(dtype=float)


def _ratios(accumulator: ErrorAccumulator, infusion: dict[str, float]) -> dict[str, float]:
    return {label: (value / infusion[label] if infusion[label] > 0 else math.nan)
            for label, value in accumulator.stratum_l1().items()}


def render_e5(result: E5Result, out: Path) -> dict:
    """report.md, summary.json, heatmaps, lines and the suppression chart; returns the summary."""
    setup, grid, grid_errors, gedp_errors = result.setup, result.grid, result.grid_errors, result.gedp_errors
    infusion_l1 = result.infusion.stratum_l1()
    strata = [label for label, _, _ in STRATA]
    rows = {s: _ratios(a, infusion_l1) for s, a in grid_errors.items()}
    gedp_rows = {label: _ratios(a, infusion_l1) for label, a in gedp_errors.items()}
    cells_per_stratum = {label: int(sum(((v >= low) & (v < high)).sum() for v in result.infusion.truth.values()))
                         for label, low, high in STRATA}
    epsilon_of = {label: gdp_epsilon(mu) for label, mu in result.gedp_mu.items()}

    report = Report(out, "E5: earlier mechanisms and today's disclosure limitation")
    _setup_section(report, result, cells_per_stratum)
    _mechanism_table(report, result, rows, strata)
    _gedp_section(report, result, gedp_rows, epsilon_of, strata)
    _suppression_section(report, result)
    occupied = [k for k in strata if cells_per_stratum[k] > 0]  # plots leave out empty strata
    _plot_heatmaps(report, setup, grid, rows, occupied)
    _plot_lines(report, setup, grid, rows, grid_errors, gedp_rows, gedp_errors, epsilon_of, occupied)
    _plot_suppression(report, setup, result.shares)
    report.section("Findings", _findings(setup, grid, rows, gedp_rows, epsilon_of, result.shares, strata))
    written = _summary(result, cells_per_stratum, infusion_l1, rows, gedp_rows, epsilon_of)
    report.write(written)
    return written


def _setup_section(report: Report, result: E5Result, cells_per_stratum: dict[str, int]) -> None:
    """The data, tabulations, error measure and grid of the run."""
    setup = result.setup
    report.section(
        "Setup",
        f"Data: {result.data_label}, {result.establishments:,} establishments; attribute {setup.attribute}. "
        "Tabulations: "
        + ", ".join(TABULATIONS) + f" ({sum(cells_per_stratum.values()):,} cells; per size stratum "
        + ", ".join(f"{k} {v:,}" for k, v in cells_per_stratum.items()) + "). "
        f"Error: mean absolute error per cell over {result.replications} replications (seed {result.seed}), summed "
        "over the cells of each stratum (strata by true value), as a ratio to input noise infusion (factors "
        f"|f - 1| in [{setup.infusion_s:g}, {setup.infusion_t:g}], QWI ramp distribution, one factor per "
        "establishment, small cells (0, 2.5) redrawn from {1, 2}). Below 1 is more accurate than noise "
        f"infusion. Grid: eps {', '.join(f'{e:g}' for e in setup.eps)}; alpha "
        f"{', '.join(f'{a:g}' for a in setup.alphas)} (only pairs a mechanism accepts); Truncated Laplace theta "
        f"{', '.join(f'{t:g}' for t in setup.thetas)}; Smooth Laplace delta {setup.delta:g}. "
        f"{len(result.grid)} valid settings. Run time {result.seconds:.0f} s.",
    )


def _mechanism_table(report: Report, result: E5Result, rows: dict, strata: list[str]) -> None:
    """Each earlier mechanism's ratios per stratum and Spearman at the shown alpha or theta, per eps."""
    report.section(
        f"Earlier mechanisms at alpha {SHOWN_ALPHA:g} (Truncated Laplace at theta {SHOWN_THETA:g})",
        "L1 ratio to noise infusion per stratum and the mean Spearman rank correlation with the true cells "
        "(over tabulations and replications); '-' marks a pair the mechanism refuses. Every valid pair is in "
        "summary.json and the heatmaps.",
    )
    table_rows = []
    for mechanism in MECHANISMS:
        for eps in result.setup.eps:
            match = [s for s in result.grid if s.mechanism == mechanism and s.eps == eps and s.shown]
            if match:
                ratios = rows[match[0]]
                table_rows.append([mechanism, f"{eps:g}", *(ratios[k] for k in strata),
                                   result.grid_errors[match[0]].spearman_mean()])
            else:
                table_rows.append([mechanism, f"{eps:g}", *("-" for _ in strata), "-"])
    report.table(["mechanism", "eps", *(f"ratio {k}" for k in strata), "Spearman"], table_rows)


def _gedp_section(report: Report, result: E5Result, gedp_rows: dict, epsilon_of: dict[str, float],
                  strata: list[str]) -> None:
    """gedp's ratios and Spearman at each scaled budget, with the eps its mu implies."""
    setup, plan = result.setup, result.plan
    report.section(
        "gedp at comparable settings",
        f"The employment plan on {setup.attribute} alone (psi {plan.psi.name}, gamma "
        f"{plan.gammas[setup.attribute]:g}), its budget scaled by {', '.join(f'{f:g}' for f in setup.budget_factors)}; "
        f"{result.gedp_replications} replications each. eps is the (eps, delta = {GDP_DELTA:g})-DP guarantee that "
        "mu-GDP implies. The neighbors differ: gedp protects each establishment within its psi interval (sqrt, "
        "gamma 0.5: about +/-10% at 100 employees, +/-1% at 10,000), the earlier mechanisms within a factor "
        "1 + alpha at every size, so the comparison is of like budgets, not of identical guarantees.",
    )
    report.table(["workflow and total mu", "eps at delta 1e-6", *(f"ratio {k}" for k in strata), "Spearman"],
                 [[label, epsilon_of[label], *(gedp_rows[label][k] for k in strata),
                   result.gedp_errors[label].spearman_mean()] for label in gedp_rows])


def _suppression_section(report: Report, result: E5Result) -> None:
    """Cell suppression's rule, repair rounds and withheld shares per tabulation."""
    setup, suppression, shares = result.setup, result.suppression, result.shares
    report.section(
        "Cell suppression on the same tabulations",
        f"p% rule with p = {setup.rule.p:g} on {', '.join(setup.rule.attributes)}, fewer than "
        f"{setup.rule.min_estabs} establishments, secondary suppression over both hierarchies and LP audit "
        f"repair ({suppression.repair_rounds} rounds; {len(suppression.audit.failures)} failing intervals remain). "
        "A suppressed cell has no value at all: its error is the whole cell.",
    )
    report.table(["tabulation", "agglvl", "cells", "withheld cells", f"withheld {setup.attribute}"],
                 [[name, level, int(shares.loc[level, "cells"]), f"{shares.loc[level, 'suppressed_share']:.1%}",
                   f"{shares.loc[level, f'{setup.attribute}_share']:.1%}"] for name, level in AGGLVL.items()])


def _plot_suppression(report: Report, setup: E5Setup, shares: pd.DataFrame) -> None:
    """Bars of the shares of cells and of the attribute that cell suppression withholds, per tabulation."""
    figure, ax = plt.subplots(figsize=(7, 3.5))
    positions = np.arange(len(AGGLVL))
    ax.bar(positions - 0.2, [shares.loc[lv, "suppressed_share"] for lv in AGGLVL.values()], 0.4, label="cells")
    ax.bar(positions + 0.2, [shares.loc[lv, f"{setup.attribute}_share"] for lv in AGGLVL.values()], 0.4,
           label=setup.attribute)
    ax.set_xticks(positions, list(AGGLVL))
    ax.set_ylabel("share withheld")
    ax.legend()
    report.figure(figure, "e5_suppression.png", "Share of cells and of employment that cell suppression withholds")


def _summary(result: E5Result, cells_per_stratum: dict[str, int], infusion_l1: dict[str, float], rows: dict,
             gedp_rows: dict, epsilon_of: dict[str, float]) -> dict:
    """summary.json: the run, noise infusion's errors, every setting's ratios, gedp's, suppression's shares."""
    setup, shares, grid_errors = result.setup, result.shares, result.grid_errors
    return {
        "experiment": "e5",
        "data": result.data_label,
        "establishments": result.establishments,
        "attribute": setup.attribute,
        "replications": result.replications,
        "gedp_replications": result.gedp_replications,
        "seed": result.seed,
        "seconds": result.seconds,
        "setup": {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                  for k, v in dataclasses.asdict(setup).items()},
        "cells_per_stratum": cells_per_stratum,
        "noise_infusion_l1": infusion_l1,
        "noise_infusion_spearman": result.infusion.spearman_means(),
        "grid": [{**dataclasses.asdict(s), "l1_ratio": rows[s], "spearman": grid_errors[s].spearman_means()}
                 for s in result.grid],
        "gedp": [{"setting": label, "mu": result.gedp_mu[label], "eps_at_delta_1e-6": epsilon_of[label],
                  "l1_ratio": gedp_rows[label], "spearman": result.gedp_errors[label].spearman_means()}
                 for label in gedp_rows],
        "suppression": {name: {"agglvl": level, "cells": int(shares.loc[level, "cells"]),
                               "withheld_cells": float(shares.loc[level, "suppressed_share"]),
                               "withheld_value": float(shares.loc[level, f"{setup.attribute}_share"])}
                        for name, level in AGGLVL.items()},
    }


def _plot_heatmaps(report, setup, grid, rows, strata) -> None:
    figure, axes = plt.subplots(len(MECHANISMS), len(strata), figsize=(3.2 * len(strata), 2.6 * len(MECHANISMS)),
                                layout="constrained", squeeze=False)
    for r, mechanism in enumerate(MECHANISMS):
        columns = setup.thetas if mechanism == "truncated-laplace" else setup.alphas
        for c, stratum in enumerate(strata):
            grid_values = np.full((len(setup.eps), len(columns)), np.nan)
            for s in grid:
                if s.mechanism == mechanism:
                    column = columns.index(s.theta if mechanism == "truncated-laplace" else s.alpha)
                    grid_values[setup.eps.index(s.eps), column] = rows[s][stratum]
            ax = axes[r, c]
            ax.set_facecolor("lightgrey")
            image = ax.imshow(np.log10(grid_values), origin="lower", cmap="RdBu_r", vmin=-2, vmax=2, aspect="auto")
            ax.set_xticks(range(len(columns)), [f"{v:g}" for v in columns], fontsize=7)
            ax.set_yticks(range(len(setup.eps)), [f"{e:g}" for e in setup.eps], fontsize=7)
            ax.set_xlabel("theta" if mechanism == "truncated-laplace" else "alpha", fontsize=8)
            ax.set_ylabel("eps", fontsize=8)
            ax.set_title(f"{mechanism}, cells {stratum}", fontsize=9)
    figure.colorbar(image, ax=axes, label="log10 L1 ratio to noise infusion (grey: pair refused)")
    report.figure(figure, "e5_heatmaps.png", "L1 error relative to noise infusion over the whole grid (blue: better)")


def _plot_lines(report, setup, grid, rows, grid_errors, gedp_rows, gedp_errors, epsilon_of, strata) -> None:
    figure, axes = plt.subplots(1, len(strata) + 1, figsize=(4 * (len(strata) + 1), 3.6), layout="constrained")
    for mechanism in MECHANISMS:
        shown = [s for s in grid if s.mechanism == mechanism and s.shown]
        eps = [s.eps for s in shown]
        for ax, stratum in zip(axes, strata):
            ax.plot(eps, [rows[s][stratum] for s in shown], marker="o", ms=3, label=mechanism)
        axes[-1].plot(eps, [grid_errors[s].spearman_mean() for s in shown], marker="o", ms=3, label=mechanism)
    for label in gedp_rows:
        marker = "*" if " pnc " in label else "P"
        for ax, stratum in zip(axes, strata):
            ax.scatter([epsilon_of[label]], [gedp_rows[label][stratum]], marker=marker, s=60, color="black")
        axes[-1].scatter([epsilon_of[label]], [gedp_errors[label].spearman_mean()], marker=marker, s=60,
                         color="black")
    for ax, stratum in zip(axes, strata):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("eps")
        ax.set_title(f"L1 ratio, cells {stratum}")
    axes[0].set_ylabel("L1 error / noise infusion")
    axes[-1].set_xscale("log")
    axes[-1].set_xlabel("eps")
    axes[-1].set_title("Spearman rank correlation")
    axes[0].legend(fontsize=7)
    report.figure(figure, "e5_by_eps.png",
                  f"By eps at alpha {SHOWN_ALPHA:g} (Truncated Laplace theta {SHOWN_THETA:g}); black stars: gedp pnc, "
                  "black crosses: gedp all-sqrt, at the eps their mu implies at delta 1e-6")


def _findings(setup, grid, rows, gedp_rows, epsilon_of, shares, strata) -> str:
    lines = []
    for stratum in strata:
        valid = {s: r[stratum] for s, r in rows.items() if math.isfinite(r[stratum])}
        if not valid:
            lines.append(f"- cells {stratum}: no cells in this stratum.")
            continue
        best = min(valid, key=valid.get)
        beating = sum(v < 1 for v in valid.values())
        gedp_best = min(gedp_rows, key=lambda label: gedp_rows[label][stratum])
        protects = (f", which hides only a factor {1 + best.alpha:g}" if best.alpha is not None else "")
        lines.append(f"- cells {stratum}: {beating} of {len(valid)} earlier settings beat noise infusion; the best is "
                     f"{best.label} (ratio {valid[best]:.3g}{protects}); the best gedp setting, {gedp_best}, has "
                     f"ratio {gedp_rows[gedp_best][stratum]:.3g}.")
    pairs = [(label, label.replace(" pnc ", " psi ")) for label in gedp_rows if " pnc " in label]
    for stratum in strata:
        if all(math.isfinite(gedp_rows[p][stratum]) for p, _ in pairs):
            wins = sum(gedp_rows[p][stratum] < gedp_rows[q][stratum] for p, q in pairs)
            lines.append(f"- gedp, cells {stratum}: pnc is more accurate than all-sqrt at {wins} of {len(pairs)} "
                         "budgets.")
    lines.append("- The gedp budgets imply eps "
                 "" + ", ".join(sorted({f"{e:.3g}" for e in epsilon_of.values()}, key=float))
                 + f" at delta {GDP_DELTA:g}, for psi-neighbors rather than (1 + alpha) neighbors: read the gedp rows "
                 "as what the method delivers at its recommended budgets, not as a like-for-like eps comparison.")
    withheld = ", ".join(f"{name} {shares.loc[level, 'suppressed_share']:.0%}" for name, level in AGGLVL.items())
    lines.append(f"- cell suppression withholds {withheld} of the cells; every other method publishes all of them.")
    return "\n".join(lines)

