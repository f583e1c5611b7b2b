"""How a release states the cells whose employment really moves within the quarter.

A month model that pulls every establishment toward its sector's month pattern errs alike for all of
a cell that moves otherwise; this module measures it on simulated releases (``accuracy.compute_accuracy``
results): the coverage of the stated 95% margins of each month's total over

* *moving cells*: county x NAICS-6 cells (QCEW level 78) whose month-3 employment is outside
  [2/3, 1.5] times month 1's, with 10 or more employees in month 1 or month 3;
* *moving industries*: statewide NAICS cells (levels 55-58) of 1,000 or more employees in month 1 or
  3 whose employment changes by more than 10% from month 1 to month 3;

and, for comparison, their relative errors and those of the cells that do not move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gedp.evaluation.accuracy import AccuracyResult, LevelCells

MONTHS = ("m1emp", "m2emp", "m3emp")
#: Moving cells: m3 / m1 outside [1 / CELL_RATIO, CELL_RATIO], CELL_MIN_EMPLOYMENT or more employees.
CELL_RATIO = 1.5
CELL_MIN_EMPLOYMENT = 10
CELL_LEVEL = 78
#: Moving industries: |m3 / m1 - 1| > INDUSTRY_CHANGE, INDUSTRY_MIN_EMPLOYMENT or more employees.
INDUSTRY_CHANGE = 0.10
INDUSTRY_MIN_EMPLOYMENT = 1_000
INDUSTRY_LEVELS = (55, 56, 57, 58)


def moving_cells(m1: np.ndarray, m3: np.ndarray) -> np.ndarray:
    """County x NAICS-6 cells that move within the quarter (module docstring)."""
    large = np.maximum(m1, m3) >= CELL_MIN_EMPLOYMENT
    return large & ((m3 * CELL_RATIO < m1) | (m3 > CELL_RATIO * m1))


def moving_industries(m1: np.ndarray, m3: np.ndarray) -> np.ndarray:
    """Statewide NAICS cells that move within the quarter (module docstring)."""
    large = np.maximum(m1, m3) >= INDUSTRY_MIN_EMPLOYMENT
    return large & (np.abs(m3 - m1) > INDUSTRY_CHANGE * np.maximum(m1, 1))


def _figures(cells: LevelCells, chosen: np.ndarray) -> dict:
    """Per month: cells, coverage of the 95% margins and median relative error over releases."""
    out: dict = {"cells": int(chosen.sum())}
    for month in MONTHS:
        if month not in cells.true or not chosen.any():
            continue
        true = cells.true[month][chosen]
        error = np.abs(cells.protected[month][:, chosen] - true)
        out[month] = {"coverage_95": float(np.mean(error <= cells.margin[month][:, chosen])),
                      "median_relative_error": float(np.median(error / np.maximum(true, 1)))}
    return out


def moving_summary(result: AccuracyResult) -> dict:
    """Coverage and error of moving cells and industries, and of the other cells of the same levels."""
    cells = result.levels[CELL_LEVEL]
    moving = moving_cells(cells.true["m1emp"], cells.true["m3emp"])
    sized = np.maximum(cells.true["m1emp"], cells.true["m3emp"]) >= CELL_MIN_EMPLOYMENT
    out = {"moving_cells": _figures(cells, moving), "other_cells_10plus": _figures(cells, sized & ~moving)}
    for level in INDUSTRY_LEVELS:
        if level not in result.levels:
            continue
        industry = result.levels[level]
        chosen = moving_industries(industry.true["m1emp"], industry.true["m3emp"])
        out[f"moving_industries_{level}"] = _figures(industry, chosen)
    pooled = [out[f"moving_industries_{level}"] for level in INDUSTRY_LEVELS if f"moving_industries_{level}" in out]
    total = sum(p["cells"] for p in pooled)
    out["moving_industries"] = {"cells": total, **{
        month: {"coverage_95": sum(p[month]["coverage_95"] * p["cells"] for p in pooled if month in p) / total}
        for month in MONTHS if total}}
    return out
