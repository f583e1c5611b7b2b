"""The implicates' chain's coupling of the months to the wage (``postprocess.implicates``): the wage's z
drawn each sweep given the months, and its log density given a proposed average employment, carried
between the Metropolis-Hastings steps of a sweep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gedp.postprocess.implicates import PosteriorModel


class WageCoupling:
    """The wage's z = log(w / E) of a chain's establishments, drawn each sweep given their months, and
    its density given an average employment E: the wage answer's likelihood at w = E e^z times the z
    prior of E's cell. Rows whose wage was drawn from its likelihood alone (large wages), or is 0, or
    whose E is 0 are not coupled (their density ratio is taken as 1)."""

    def __init__(self, model: PosteriorModel, rows: np.ndarray) -> None:
        self.model, self.rows, self.priors = model, rows, model.priors
        self.z = np.full(len(rows), np.nan)

    def redraw(self, average: np.ndarray, rng: np.random.Generator) -> None:
        wages, on_grid = self.model.wage_draw(self.rows, average, rng, self.priors)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.z = np.where(on_grid & (wages > 0) & (average > 0), np.log(wages / average), np.nan)

    def log_density(self, average: np.ndarray) -> np.ndarray:
        coupled = np.isfinite(self.z) & (average > 0)
        out = np.full(len(average), np.nan)
        if coupled.any():
            model, rows = self.model, self.rows[coupled]
            wage = average[coupled] * np.exp(self.z[coupled])
            residual = (model.answers.wage[rows] - model.psi(wage)) / model.answers.wage_sd
            out[coupled] = -0.5 * residual**2 + model.log_wage_prior(
                self.z[coupled], average[coupled], rows, self.priors)
        return out


@dataclass
class CurrentDensity:
    """A chain's current average employment and the wage's log density at it (``WageCoupling``), carried
    from one Metropolis-Hastings step of a sweep to the next (every row's values are its own: the
    accepted rows take the proposal's, the others keep theirs)."""

    coupling: WageCoupling
    average: np.ndarray
    density: np.ndarray

    @classmethod
    def of(cls, coupling: WageCoupling, average: np.ndarray) -> CurrentDensity:
        return cls(coupling, average, coupling.log_density(average))

    def accept(self, accepted: np.ndarray, average: np.ndarray, density: np.ndarray) -> None:
        self.average = np.where(accepted, average, self.average)
        self.density = np.where(accepted, density, self.density)
