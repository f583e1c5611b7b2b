"""Wage priors of implicates: wage per employee given the establishment's own size, by deconvolution.

z = log(w / E), E the quarter's average employment. Its prior is, per supersector x size band of E, a
distribution of the residual r = z - s(log E) on a grid (with an atom at w = 0), where s is piecewise
linear in log E through one point per size band: (the band's mean log E, the mean of the band's
deconvolved prior of z), less their mean. So the wage per employee moves with size within a band as
it does across bands, instead of being flat within each band.

Every prior is the NPMLE of its weights (``deconvolve.npmle_weights``, solved to the optimum) on the
likelihood of each establishment's wage answer at the grid's points; a replicate re-solves them under
Bayesian-bootstrap weights (one Exp(1) weight per establishment, shared by its band's and its cell's
priors), which is how each implicate gets its own draw of the wage priors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gedp.postprocess.deconvolve import npmle_weights

#: Size bands (employment) of the wage priors.
SIZE_EDGES = np.array([2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 1000.0])
#: Wage per employee grid: log of quarterly wages per employee from $100 to $2,000,000, every 0.07.
WAGE_Z = np.arange(np.log(100.0), np.log(2e6), 0.07)
#: Fewest establishments of a supersector x band with a prior of its own (others use the band's).
MIN_WAGE_CELL = 300
#: Most establishments a prior is solved on (a random subset of larger cells, fixed at the fit).
WAGE_FIT_PER_CELL = 3000
#: Fewest establishments of a band whose mean places a point of the size shift s.
MIN_SHIFT_BAND = 100
#: Grid points whose likelihood is below this (each row scaled to its largest) for every row of a fit
#: are left out of it: their optimal weight is 0 (their gradient is far below the optimum's 1).
NEGLIGIBLE_LIKELIHOOD = 1e-12

Key = tuple[int, int]  # (supersector, band); supersector -1: the band over every supersector


def size_shift(average: np.ndarray, shift: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """s(log E) at each average employment E > 0 (flat beyond the first and last points)."""
    anchors, levels = shift
    with np.errstate(divide="ignore"):
        return np.interp(np.log(average), anchors, levels)


def prior_mean_z(weights: np.ndarray) -> float:
    """The mean z of a prior on (the z grid, w = 0), over its positive wages."""
    return float(weights[:-1] @ WAGE_Z / weights[:-1].sum())


@dataclass
class WageFit:
    """The likelihoods of one draw of a sample's months (rows x (z grid, w = 0), each row scaled to its
    largest value) and which rows each prior is solved on."""

    likelihood: np.ndarray
    rows: dict[Key, np.ndarray]
    groups: int

    @classmethod
    def of(cls, likelihood: np.ndarray, band: np.ndarray, group: np.ndarray, groups: int,
           rng: np.random.Generator) -> WageFit:
        """The fit of rows in ``band`` (index into SIZE_EDGES's bands) and supersector ``group``."""
        rows: dict[Key, np.ndarray] = {}
        for b in np.unique(band):
            in_band = np.flatnonzero(band == b)
            rows[(-1, int(b))] = subset(in_band, rng)
            for g in np.unique(group[in_band]):
                cell = in_band[group[in_band] == g]
                if len(cell) >= MIN_WAGE_CELL:
                    rows[(int(g), int(b))] = subset(cell, rng)
        return cls(likelihood, rows, groups)

    def solve(self, counts: np.ndarray, start: dict[Key, np.ndarray] | None = None) -> dict[Key, np.ndarray]:
        """Every prior's NPMLE weights with each row counted ``counts`` times (started from ``start``)."""
        return {key: solved(self.likelihood[rows], counts[rows], None if start is None else start[key])
                for key, rows in self.rows.items()}

    def table(self, weights: dict[Key, np.ndarray]) -> np.ndarray:
        """Supersector x band x points: each cell's weights (its band's when it has none of its own, the
        nearest band's when the band has none)."""
        bands = sorted(b for g, b in weights if g == -1)

        def cell(g: int, b: int) -> np.ndarray:
            own = weights.get((g, b), weights.get((-1, b)))
            return own if own is not None else weights[(-1, min(bands, key=lambda k: abs(k - b)))]

        return np.stack([np.stack([cell(g, b) for b in range(len(SIZE_EDGES) + 1)]) for g in range(self.groups)])


def subset(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(rows, WAGE_FIT_PER_CELL, replace=False)) if len(rows) > WAGE_FIT_PER_CELL else rows


def solved(likelihood: np.ndarray, counts: np.ndarray, start: np.ndarray | None) -> np.ndarray:
    """NPMLE weights on the points (0 on those negligible for every row), floored at 1e-300 (logs)."""
    used = likelihood.max(axis=0) > NEGLIGIBLE_LIKELIHOOD
    weights = np.zeros(likelihood.shape[1])
    begin = None if start is None else np.maximum(start[used], 1e-12)
    weights[used] = npmle_weights(likelihood[:, used], counts, start=begin)
    return np.maximum(weights, 1e-300)


def fitted_shift(weights: dict[Key, np.ndarray], band: np.ndarray, log_average: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """s's points: per band of MIN_SHIFT_BAND or more rows, (its rows' mean log E, its prior's mean z),
    levels less their mean (no shift with fewer than two such bands)."""
    points = [(float(log_average[band == b].mean()), prior_mean_z(weights[(-1, b)]))
              for g, b in sorted(weights) if g == -1 and (band == b).sum() >= MIN_SHIFT_BAND]
    if len(points) < 2:
        return np.zeros(1), np.zeros(1)
    anchors, levels = (np.array(v) for v in zip(*points))
    return anchors, levels - levels.mean()
