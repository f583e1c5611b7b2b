"""Predicted accuracy of a plan on a public stand-in, from the least squares' covariance.

A plan's error at a QCEW cell is predicted by the variance the margins of error state for that cell
(``postprocess.moe``: the weighted least squares' covariance, and the wage fit's for wages), computed
from one simulated measurement of the stand-in (a state synthesized from the published file: public
data only). The identity answers carry the psi-mechanism's variance, 2 s^2 (2 x + s^2) for sqrt; the
pnc answers (Delta_g / mu)^2 with Delta_g from the stand-in's upper bounds; the months are smoothed
as a release smooths them. A cell's relative error |x~ - x| / x is then about |Z| sd_c / x_c, Z
standard normal, so the median relative error over the cells C of a level is the m solving

    (1 / |C|) sum_c P(|Z| <= m x_c / sd_c) = 1 / 2,

the median of the mixture (cells with a true value of at least 1, as ``evaluation.accuracy``
reports). The bounds x >= 0 and the wage prior's bias are left out; simulated releases of the
stand-in calibrate the prediction (``simulate``; the method page gives the figures).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from gedp.evaluation.accuracy import published_flags
from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.measure.queries import Groupings
from gedp.postprocess.moe import variance_function
from gedp.postprocess.months import month_answers
from gedp.postprocess.tabulate import qcew_keys
from gedp.synth.qcew import PublishedState
from gedp.synth.schema import public_columns

#: The QCEW levels a plan may be judged on: the state levels (51-58) and the county levels (71-78).
QCEW_LEVELS = (*range(51, 59), *range(71, 79))
#: Cells of a level the prediction takes at most (a public random subset of the published cells:
#: the median of thousands of cells moves little, and the wage margins' cost grows with the cells).
MAX_CELLS = 400


@dataclass(frozen=True)
class TargetCells:
    """The cells of one QCEW level a plan is judged on: which establishment enters which (codes,
    -1 for none) and their true totals on the stand-in per attribute."""

    level: int
    codes: np.ndarray
    n_cells: int
    true: dict[str, np.ndarray]


def published_levels(published: PublishedState) -> tuple[int, ...]:
    """The QCEW levels (51-58, 71-78) of which ``published`` has at least one unsuppressed cell: the
    planner's default targets, employment and wages weighted equally."""
    aggregates = published.aggregates
    present = set(aggregates.loc[~aggregates["suppressed"].astype(bool), "agglvl"].astype(int))
    return tuple(level for level in QCEW_LEVELS if level in present)


def target_cells(standin: pd.DataFrame, published: PublishedState | None, levels: Sequence[int],
                 attributes: Sequence[str], *, seed: int = 0, max_cells: int | None = MAX_CELLS) -> list[TargetCells]:
    """The published cells (every cell without ``published``) of each level with a true value of
    at least 1 in some attribute, at most ``max_cells`` of them per level (a seeded random subset;
    None: all)."""
    public = standin[public_columns(standin)]
    groupings = Groupings(public)
    rng = np.random.default_rng(seed)
    out = []
    for level in levels:
        grouping = groupings(tuple(qcew_keys(public, level)))
        keep = np.ones(grouping.n_groups, dtype=bool) if published is None else published_flags(
            published, level, grouping.keys)
        chosen = np.flatnonzero(keep)
        if max_cells is not None and len(chosen) > max_cells:
            chosen = np.sort(rng.choice(chosen, max_cells, replace=False))
        index = np.full(grouping.n_groups, -1)
        index[chosen] = np.arange(len(chosen))
        codes = index[grouping.codes]
        true = {a: np.bincount(codes[codes >= 0], weights=standin[a].to_numpy(dtype=float)[codes >= 0],
                               minlength=len(chosen)) for a in attributes}
        out.append(TargetCells(level, codes, len(chosen), true))
    return out


def median_relative_error(true: np.ndarray, variance: np.ndarray) -> float:
    """The median over cells (true >= 1) and noise of |x~ - x| / x when x~ - x ~ N(0, variance)
    (NaN or infinite variance: an error beyond any bound); NaN without such cells."""
    positive = true >= 1
    if not positive.any():
        return float("nan")
    ratio = np.sqrt(np.where(np.isnan(variance[positive]), np.inf, variance[positive])) / true[positive]

    def covered(log_m: float) -> float:
        with np.errstate(divide="ignore"):
            return float(np.mean(2 * stats.norm.cdf(np.exp(log_m) / ratio) - 1)) - 0.5

    if np.mean(np.isinf(ratio)) >= 0.5:
        return float("inf")
    finite = ratio[np.isfinite(ratio) & (ratio > 0)]
    if len(finite) == 0:
        return 0.0
    low, high = np.log(finite.min()) - 5, np.log(finite.max()) + 5
    return float(np.exp(optimize.brentq(covered, low, high, xtol=1e-6)))


def prepared_answers(answers: Mapping[str, Sequence[NoisyAnswer]], variance_mode: str, psi: NeighborFunction,
                     public: pd.DataFrame) -> dict[str, list[NoisyAnswer]]:
    """The answers as the margins of error take them (months smoothed as a release smooths them)."""
    return month_answers(answers, variance_mode, psi, public)


def predicted_errors(answers: Mapping[str, Sequence[NoisyAnswer]], standin: pd.DataFrame,
                     cells: Sequence[TargetCells], attributes: Sequence[str],
                     wage_psi: NeighborFunction | None) -> dict[int, dict[str, float]]:
    """Predicted median relative error per level and attribute of ``attributes`` from prepared
    answers (``prepared_answers``) of the stand-in; ``wage_psi`` when wages are fitted with
    employment (the plan's psi), as ``gedp tabulate --moe`` reads a release."""
    out: dict[int, dict[str, float]] = {target.level: {} for target in cells}
    for attribute in attributes:
        variances = variance_function(attribute, answers, standin, wage_psi if attribute == "wage" else None)
        for target in cells:
            variance = variances(target.codes, target.n_cells).variance
            out[target.level][attribute] = median_relative_error(target.true[attribute], variance)
    return out
