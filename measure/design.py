"""The noise design across the quarters of a panel: how each quarter is measured, what the panel
costs an establishment, and the covariance of a cell's protected levels in two quarters (which a
change's margin of error needs). Every panel release and change tabulation goes through one
``QuarterDesign``, so a design that correlates quarters replaces this one object.

The independent design measures each quarter with the plan as configured, with its own noise.
Privacy: an establishment present in k quarters is measured by k independent releases, each
mu-gedp for it, so the panel is sqrt(k) mu-gedp (fully adaptive composition of mu-GDP mechanisms,
Dong, Roth and Su 2022, Corollary 3.3) under the panel neighbour relation: a record replaced by
one that is psi-close in every quarter. Changes: the two quarters' noise is independent, so a
cell's change has the variance of its first level plus that of its second (covariance 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gedp.measure.workflows import MeasurementPlan


@dataclass(frozen=True)
class ChangeCells:
    """The cells of a change tabulation for one attribute: each cell's protected level and its
    variance (the squared margin at the normal quantile, ``margin / z`` squared) in both quarters,
    in the same cell order, and how many quarters apart the two are."""

    attribute: str
    first_variance: np.ndarray
    second_variance: np.ndarray
    quarters_apart: int


@dataclass(frozen=True)
class QuarterDesign:
    """Independent quarters: each quarter measured with the configured plan and its own noise."""

    name: str = "independent"

    def quarter_plan(self, plan: MeasurementPlan, index: int, quarters: int) -> MeasurementPlan:
        """The plan quarter ``index`` (0-based) of ``quarters`` is measured with: the configured one."""
        return plan

    def panel_mu(self, quarter_mu: float, quarters: int) -> float:
        """What an establishment present in ``quarters`` quarters spends: sqrt(quarters) * quarter_mu."""
        return math.sqrt(quarters) * quarter_mu

    def covariance(self, cells: ChangeCells) -> np.ndarray:
        """Covariance of each cell's protected levels in the two quarters: 0 (independent noise)."""
        return np.zeros_like(np.asarray(cells.first_variance, dtype=float))

    def describe(self) -> dict:
        """The manifest's ``design`` section."""
        return {"name": self.name, "composition": "each quarter measured with the configured plan and its own "
                "noise; an establishment present in k quarters spends sqrt(k) times a quarter's mu",
                "change_variance": "sum of the two quarters' level variances (covariance 0)"}


INDEPENDENT = QuarterDesign()
DESIGNS = {INDEPENDENT.name: INDEPENDENT}


def quarter_design(name: str) -> QuarterDesign:
    """The design of a given name (as a panel release's manifest records it); ValueError otherwise."""
    if name not in DESIGNS:
        raise ValueError(f"quarter design {name!r} is unknown; choose one of {', '.join(DESIGNS)}")
    return DESIGNS[name]
