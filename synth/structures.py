"""Within-establishment structures other than the synthesizer's own, applied to a synthesized state.

The generator (``synth.establishments``) splits each county x NAICS-6 cell with rules of its own:
every establishment's months move a little (log-sd 0.05 around a shared size weight, month 2 by the
month-2 rule) and wages per employee scatter around the cell's with no tie to size. A method that
estimates within-establishment distributions from a release (priors, month smoothing) must also work
where establishments follow other rules; these structures rewrite a synthesized state under such
rules, keeping every published total they do not deliberately change:

* ``HeavyTailedMonths``: most establishments keep their headcount from one month to the next (a
  point mass at no change), the others change by a heavy-tailed relative amount (Student-t), a few
  by half or more. Month 1 is kept; months 2 and 3 are redrawn, then each cell's month-2 and
  month-3 totals are restored by rescaling the cell's movers only (whole numbers, controlled
  rounding), so the establishments without change keep exactly none. A cell whose movers cannot
  carry its total (no mover, or its movers' proposals sum to 0) is rescaled as a whole.
* ``WageElasticity``: wage per employee proportional to e^elasticity within each cell (e the mean
  monthly employment) times log-normal scatter; each cell's wage total is kept exactly
  (establishments without employment keep their wages).
* ``MovingCells``: whole cells grow or shrink by 30-60% within the quarter (month 3 against month 1),
  as seasonal industries do: whole NAICS-6 industries (every county's cell alike) and single cells
  drawn at random among cells of ``min_employment`` or more. Month 1 and wages are kept; the
  cell's month-2 and month-3 totals change (month 2 part of the way), split among its
  establishments in proportion to their own months. The published totals above these cells change
  with them, deliberately.

Each is a frozen dataclass with ``apply(frame, rng) -> frame`` (a new frame, validated, same rows in
the same order); ``apply_structures`` applies several in turn, and ``STRUCTURES`` names the
defaults (``gedp evaluate utility --structure``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gedp.synth.rules import proportional_shares, split_integer
from gedp.synth.schema import validate_microdata

#: The cells whose totals the structures keep (public columns).
CELL = ("county", "naics")


def _check_range(name: str, value: float, low: float, high: float, low_open: bool = False) -> None:
    if not (low < value if low_open else low <= value) or not value <= high:
        raise ValueError(f"{name} ({value}) must be in {'(' if low_open else '['}{low}, {high}]")


@dataclass(frozen=True)
class HeavyTailedMonths:
    """Month-to-month change: none with probability ``no_change``, else a relative change
    ``sd`` x Student-t(``df``), at least one employee, never below 0 (module docstring)."""

    no_change: float = 0.6
    sd: float = 0.08
    df: float = 2.0

    def __post_init__(self) -> None:
        _check_range("no_change", self.no_change, 0.0, 1.0)
        _check_range("sd", self.sd, 0.0, np.inf)
        _check_range("df", self.df, 0.0, np.inf, low_open=True)

    def apply(self, frame: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        cells = _cells(frame)
        previous = frame["m1emp"].to_numpy(float)
        out = frame.copy()
        for month in ("m2emp", "m3emp"):
            mover = rng.random(len(frame)) >= self.no_change
            relative = self.sd * rng.standard_t(self.df, len(frame))
            step = np.rint(previous * relative)
            step = np.where(step == 0, np.sign(relative), step)  # a mover changes by one at least
            proposal = np.where(mover, np.maximum(previous + step, 0.0), previous)
            previous = _restore_totals(cells, proposal, mover, frame[month].to_numpy(float))
            out[month] = previous
        return validate_microdata(out)


@dataclass(frozen=True)
class WageElasticity:
    """Wage per employee proportional to e^``elasticity`` x exp(``log_sd`` N(0, 1)) within cells."""

    elasticity: float = 0.6
    log_sd: float = 0.3

    def __post_init__(self) -> None:
        _check_range("elasticity", self.elasticity, -1.0, np.inf, low_open=True)
        _check_range("log_sd", self.log_sd, 0.0, np.inf)

    def apply(self, frame: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        cells = _cells(frame)
        employment = frame[["m1emp", "m2emp", "m3emp"]].to_numpy(float).mean(axis=1)
        wages = frame["wage"].to_numpy(float)
        employing = employment > 0
        weight = np.zeros(len(frame))
        weight[employing] = (employment[employing] ** (1.0 + self.elasticity)
                             * np.exp(self.log_sd * rng.standard_normal(int(employing.sum()))))
        # the wages of establishments with employment, split again by the weights
        pool = np.bincount(cells, weights=np.where(employing, wages, 0.0))
        out = frame.copy()
        out["wage"] = np.where(employing, split_integer(cells, pool, proportional_shares(cells, weight)), wages)
        return validate_microdata(out)


@dataclass(frozen=True)
class MovingCells:
    """Cells that grow or shrink by ``low``-``high`` of month 1 by month 3: every cell of a share
    ``industry_share`` of NAICS-6 industries, and a share ``cell_share`` of the other cells, among
    cells of ``min_employment`` or more in month 1; month 2 moves a uniform 30-70% of the way."""

    industry_share: float = 0.1
    cell_share: float = 0.05
    low: float = 0.3
    high: float = 0.6
    min_employment: float = 10.0

    def __post_init__(self) -> None:
        for name in ("industry_share", "cell_share"):
            _check_range(name, getattr(self, name), 0.0, 1.0)
        _check_range("low", self.low, 0.0, 1.0)
        _check_range("high", self.high, self.low, 1.0)

    def apply(self, frame: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        cells = _cells(frame)
        n_cells = int(cells.max(initial=-1)) + 1
        month1 = np.bincount(cells, weights=frame["m1emp"].to_numpy(float), minlength=n_cells)
        industry = pd.factorize(frame["naics"])[0]
        cell_industry = np.zeros(n_cells, dtype=np.int64)
        cell_industry[cells] = industry
        seasonal = rng.random(int(industry.max(initial=-1)) + 1) < self.industry_share
        moving = (seasonal[cell_industry] | (rng.random(n_cells) < self.cell_share)) & (month1 >= self.min_employment)
        # one movement per seasonal industry (its cells alike), one per other moving cell
        industry_change = self._changes(len(seasonal), rng)
        change = np.where(seasonal[cell_industry], industry_change[cell_industry], self._changes(n_cells, rng))
        way = rng.uniform(0.3, 0.7, n_cells)
        targets = {"m3emp": np.rint(month1 * (1 + change)), "m2emp": np.rint(month1 * (1 + way * change))}
        out = frame.copy()
        for month, target in targets.items():
            values = frame[month].to_numpy(float)
            current = np.bincount(cells, weights=values, minlength=n_cells)
            total = np.where(moving, target, current)
            moved = split_integer(cells, total, proportional_shares(cells, values))
            out[month] = np.where(moving[cells], moved, values)
        return validate_microdata(out)

    def _changes(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Relative changes month 1 -> 3: +-uniform(low, high), each sign half the time."""
        return rng.choice([-1.0, 1.0], n) * rng.uniform(self.low, self.high, n)

    def moving_cells(self, frame: pd.DataFrame, before: pd.DataFrame) -> np.ndarray:
        """Which establishments' cells this structure moved (``before``: the frame it was applied to)."""
        cells = _cells(frame)
        changed = np.bincount(cells, weights=(frame["m3emp"].to_numpy(float) != before["m3emp"].to_numpy(float)))
        return changed[cells] > 0


#: The structures by name, at their default parameters.
STRUCTURES = {
    "heavy-tailed-months": HeavyTailedMonths(),
    "wage-elasticity-0.1": WageElasticity(elasticity=0.1),
    "wage-elasticity-0.6": WageElasticity(elasticity=0.6),
    "moving-cells": MovingCells(),
}


def apply_structures(frame: pd.DataFrame, names: Sequence[str], rng: np.random.Generator) -> pd.DataFrame:
    """``frame`` with the named structures (``STRUCTURES``) applied in turn."""
    unknown = [name for name in names if name not in STRUCTURES]
    if unknown:
        raise ValueError(f"structure '{unknown[0]}' is unknown; choose from {', '.join(STRUCTURES)}")
    for name in names:
        frame = STRUCTURES[name].apply(frame, rng)
    return frame


def _cells(frame: pd.DataFrame) -> np.ndarray:
    """Each establishment's county x NAICS-6 cell code."""
    return frame.groupby(list(CELL), sort=True, observed=True).ngroup().to_numpy()


def _restore_totals(cells: np.ndarray, proposal: np.ndarray, mover: np.ndarray, original: np.ndarray) -> np.ndarray:
    """``proposal`` with each cell's total back to ``original``'s: the movers' part rescaled to what
    the others leave (whole numbers); where the movers cannot carry it, the whole cell rescaled."""
    n_cells = int(cells.max(initial=-1)) + 1
    target = np.bincount(cells, weights=original, minlength=n_cells)
    fixed = np.bincount(cells, weights=np.where(mover, 0.0, proposal), minlength=n_cells)
    moving = np.bincount(cells, weights=np.where(mover, proposal, 0.0), minlength=n_cells)
    by_movers = (target >= fixed) & (moving > 0)
    movers_part = split_integer(cells, np.where(by_movers, target - fixed, 0.0),
                                proportional_shares(cells, np.where(mover, proposal, 0.0)))
    whole_cell = split_integer(cells, np.where(by_movers, 0.0, target), proportional_shares(cells, proposal))
    return np.where(by_movers[cells], np.where(mover, movers_part, proposal), whole_cell)
