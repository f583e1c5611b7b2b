"""Wage priors of implicates: wage per employee given the establishment's own size, by deconvolution.

z = log(w / E), E the quarter's average employment. Its prior is, per sector x size band of E, a
distribution of the residual r = z - s_g(log E) on a grid (with an atom at w = 0), where s_g is a
line in log E per sector g (``ShiftPoints``: through the sector's size bands of the
months' answers, each band's mean log E against its mean log w deconvolved from its wage answers
less that). So the wage per employee moves with size within a band, as the release's answers say it
does within the sector, instead of being flat within each band; and the sector's level
is in s, so a band's prior pooled over sectors pools their residuals, not their levels.

Every prior is the NPMLE of its weights (``deconvolve.npmle_weights``, solved to the optimum) on the
likelihood of each establishment's wage answer at the grid's points; a replicate re-solves them under
Bayesian-bootstrap weights (one Exp(1) weight per establishment, shared by its band's and its cell's
priors), which is how each implicate gets its own draw of the wage priors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.deconvolve import Likelihood, fit_mixture, npmle_weights, pick_points

#: Size bands (employment) of the wage priors.
SIZE_EDGES = np.array([2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 1000.0])
#: Wage per employee grid: log of quarterly wages per employee from $100 to $2,000,000, every 0.07.
WAGE_Z = np.arange(np.log(100.0), np.log(2e6), 0.07)
#: Fewest establishments of a sector x band with a prior of its own (others use the band's).
MIN_WAGE_CELL = 300
#: Most establishments a prior is solved on (a random subset of larger cells, fixed at the fit).
WAGE_FIT_PER_CELL = 3000
#: Rows of one block of a wage draw (its points x rows arrays stay in the processor's cache).
DRAW_ROWS = 512
#: Fewest employing establishments of a sector x band of the answers that place a point of s.
MIN_SHIFT_POINT = 30
#: Fewest points of a sector's own plane of s and the cell size (``ShiftPoints.shift``).
MIN_PLANE_POINTS = 6
#: How far (in log E) beyond the first and last points s continues (the first band's point sits inside
#: the band: establishments of 1 and 2 employees have means on both sides).
EXTRAPOLATE = 1.0
#: Grid points whose likelihood is below this (each row scaled to its largest) for every row of a fit
#: are left out of it: their optimal weight is 0 (their gradient is far below the optimum's 1).
NEGLIGIBLE_LIKELIHOOD = 1e-12
#: Cell effects (county x NAICS-6): offsets of the log wage per employee every z step up to this many
#: steps either way (+-2.8: a cell's level 16 times its sector's line, or a 16th of it).
CELL_STEPS = 40
#: The offsets' grid, and the z grid extended by CELL_STEPS either way (a row's likelihood of its
#: cell's offset is its residual prior slid along it).
CELL_OFFSETS = (WAGE_Z[1] - WAGE_Z[0]) * np.arange(-CELL_STEPS, CELL_STEPS + 1)
WAGE_Z_CELLS = WAGE_Z[0] + (WAGE_Z[1] - WAGE_Z[0]) * np.arange(-CELL_STEPS, len(WAGE_Z) + CELL_STEPS)

Key = tuple[int, int]  # (sector, band); sector -1: the band over every sector


Shift = tuple[np.ndarray, np.ndarray]  # (sector x (intercept, slope)), (lowest, highest log E)


def no_shift(groups: int) -> Shift:
    return np.zeros((groups, 2)), np.zeros(2)


def size_shift(average: np.ndarray, group: np.ndarray, shift: Shift) -> np.ndarray:
    """s(log E) = a_g + b_g log E at each average employment E > 0 of sector g, log E held within
    the bounds (flat beyond them)."""
    lines, (low, high) = shift
    with np.errstate(divide="ignore"):
        x = np.clip(np.log(average), low, high)
    return lines[group, 0] + lines[group, 1] * x


@dataclass
class WageFit:
    """The likelihoods of one draw of a sample's months (rows x (z grid, w = 0), each row scaled to its
    largest value) and which rows each prior is solved on."""

    likelihood: np.ndarray
    rows: dict[Key, np.ndarray]
    groups: int
    prepared: dict[Key, tuple[np.ndarray, Likelihood]] = field(default_factory=dict)

    @classmethod
    def of(cls, likelihood: np.ndarray, band: np.ndarray, group: np.ndarray, groups: int,
           rng: np.random.Generator) -> WageFit:
        """The fit of rows in ``band`` (index into SIZE_EDGES's bands) and sector ``group``."""
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
        return {key: solved(self.ready(key), counts[rows], None if start is None else start[key])
                for key, rows in self.rows.items()}

    def ready(self, key: Key) -> tuple[np.ndarray, Likelihood]:
        """A prior's points not negligible for every row, and its rows' likelihood there made ready
        for its fit and its replicates' (``deconvolve.Likelihood``), kept after the first call."""
        if key not in self.prepared:
            likelihood = self.likelihood[self.rows[key]]
            used = likelihood.max(axis=0) > NEGLIGIBLE_LIKELIHOOD
            self.prepared[key] = used, Likelihood.of(likelihood[:, used], basis=True)
        return self.prepared[key]

    def table(self, weights: dict[Key, np.ndarray]) -> np.ndarray:
        """Supersector x band x points: each cell's weights (its band's when it has none of its own, the
        nearest band's when the band has none; equal weights on every point when no band has any: a
        fit without an employing establishment, e.g. a release whose month answers are all at or below
        psi(0), has nothing to learn the wage per employee from)."""
        bands = sorted(b for g, b in weights if g == -1)
        flat = np.full(self.likelihood.shape[1], 1.0 / self.likelihood.shape[1])

        def cell(g: int, b: int) -> np.ndarray:
            own = weights.get((g, b), weights.get((-1, b)))
            if own is not None:
                return own
            return weights[(-1, min(bands, key=lambda k: abs(k - b)))] if bands else flat

        return np.stack([np.stack([cell(g, b) for b in range(len(SIZE_EDGES) + 1)]) for g in range(self.groups)])


def subset(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(rows, WAGE_FIT_PER_CELL, replace=False)) if len(rows) > WAGE_FIT_PER_CELL else rows


def solved(ready: tuple[np.ndarray, Likelihood], counts: np.ndarray, start: np.ndarray | None) -> np.ndarray:
    """NPMLE weights on the points (0 on those negligible for every row), floored at 1e-300 (logs)."""
    used, likelihood = ready
    weights = np.zeros(len(used))
    begin = None if start is None else np.maximum(start[used], 1e-12)
    weights[used] = npmle_weights(likelihood, counts, start=begin)
    return np.maximum(weights, 1e-300)


@dataclass
class ShiftPoints:
    """The points s per sector is placed through, one per sector x size band of the months' answers'
    mean (a public function of the release, independent of the size's error within it) with
    MIN_SHIFT_POINT or more employing rows: (the mean log E of the band's draws of the months,
    E[log w] of the band less that), E[log w] under the NPMLE of psi(w) deconvolved from the band's
    wage answers alone. Both means are consistent for the band's, so the line's slope is the slope of
    log w / E on log E (grouping by the answers, Wald 1940) without the division bias a regression on
    drawn sizes has (a size drawn too large makes its wage per employee look too small). With each
    row's cell size (the mean log E of its cell's draws), the points are per sector x band x size band
    of the cell size, each with its rows' mean cell size (``shift``)."""

    keys: np.ndarray  # points x (sector, band, cell size band)
    x: np.ndarray
    y: np.ndarray
    n: np.ndarray
    members: list[np.ndarray]  # each point's rows
    cell_size: np.ndarray | None = None

    @classmethod
    def of(cls, psi: NeighborFunction, month_answers: np.ndarray, wage_answers: np.ndarray, wage_sd: float,
           average: np.ndarray, group: np.ndarray, cell_size: np.ndarray | None = None) -> ShiftPoints:
        band = np.searchsorted(psi(SIZE_EDGES), month_answers.mean(axis=1))
        outer = np.zeros(len(band), np.int64) if cell_size is None else np.searchsorted(np.log(SIZE_EDGES), cell_size)
        employing = average > 0
        points = []
        keys = ({(int(g), int(b)) for g, b in zip(group[employing], band[employing])} if cell_size is None else
                {(int(g), int(b), int(c)) for g, b, c in zip(group[employing], band[employing], outer[employing])})
        for key in keys:  # (a set's order: the points' order of the lines before cell sizes, the same sums)
            g, b, c = key if len(key) == 3 else (*key, 0)
            rows = employing & (group == g) & (band == b) & (outer == c)
            if rows.sum() >= MIN_SHIFT_POINT:
                log_average = float(np.log(average[rows]).mean())
                points.append(((g, b, c), log_average, mean_log_wage(psi, wage_answers[rows], wage_sd) - log_average,
                               rows.sum(), np.flatnonzero(rows),
                               np.nan if cell_size is None else float(cell_size[rows].mean())))
        keys, x, y, n, members, size = zip(*points) if points else ((), (), (), (), (), ())
        return cls(np.array(keys, dtype=np.int64).reshape(-1, 3), np.array(x, dtype=float), np.array(y, dtype=float),
                   np.array(n, dtype=float), list(members), None if cell_size is None else np.array(size, dtype=float))

    def placed(self, level: np.ndarray) -> ShiftPoints:
        """The same points at each one's mean ``level`` of its rows (a fitted model's E[log w / E])."""
        y = np.array([float(level[rows].mean()) for rows in self.members])
        return ShiftPoints(self.keys, self.x, y, self.n, self.members, self.cell_size)

    def shift(self, groups: int) -> tuple[Shift, np.ndarray]:
        """s per sector and each sector's coefficient of the cell size (0 without cell sizes): the
        weighted least-squares plane y = a + b log E + c cell size through its points (Mundlak 1978: the
        cell size carries the cells' levels, so b is the slope within cells; without cell sizes, the line
        y = a + b log E, a sector with fewer than two points taking the line of all points); a sector
        whose points do not determine the plane (fewer than MIN_PLANE_POINTS points, or points in fewer
        than three size bands or two cell size bands) has b and c of all points with a level per sector,
        and its own level a through its points (the all points' a without any).
        Bounds: the points' log E range widened by EXTRAPOLATE; levels less the points' mean level."""
        if len(self.x) < 2:
            return no_shift(groups), np.zeros(groups)
        x, y, n = self.x, self.y, self.n
        sector = self.keys[:, 0]
        size = self.cell_size if self.cell_size is not None else np.zeros(len(x))
        pooled = np.append(line(x, y, n), 0.0) if self.cell_size is None else pooled_plane(x, size, y, n, sector)
        fits = []
        for g in range(groups):
            mine = sector == g
            bands, cell_bands = len(np.unique(self.keys[mine, 1])), len(np.unique(self.keys[mine, 2]))
            if self.cell_size is None:
                fits.append(np.append(line(x[mine], y[mine], n[mine]), 0.0) if mine.sum() >= 2 else pooled)
            elif mine.sum() >= MIN_PLANE_POINTS and bands >= 3 and cell_bands >= 2:
                fits.append(plane(x[mine], size[mine], y[mine], n[mine]))
            else:
                level = y[mine] - pooled[1] * x[mine] - pooled[2] * size[mine]
                fits.append(np.array([n[mine] @ level / n[mine].sum() if mine.any() else pooled[0], *pooled[1:]]))
        lines = np.array(fits)[:, :2]
        lines[:, 0] -= float(n @ y / n.sum())
        return (lines, np.array([x.min() - EXTRAPOLATE, x.max() + EXTRAPOLATE])), np.array(fits)[:, 2]


def pooled_plane(x: np.ndarray, size: np.ndarray, y: np.ndarray, weight: np.ndarray, sector: np.ndarray) -> np.ndarray:
    """(mean level, slope of x, coefficient of size) of the weighted least-squares plane of y with a level
    per sector (``plane`` on the values less their sector's weighted means)."""
    total = np.bincount(sector, weight)

    def centred(v: np.ndarray) -> np.ndarray:
        return v - (np.bincount(sector, weight * v) / np.maximum(total, 1e-300))[sector]

    fit = plane(centred(x), centred(size), centred(y), weight)
    return np.array([float(weight @ (y - fit[1] * x - fit[2] * size) / weight.sum()), fit[1], fit[2]])


def plane(x: np.ndarray, size: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(intercept, slope of x, coefficient of size) of the weighted least-squares plane of y (the
    coefficient 0, and the line of y on x, where size does not vary or is collinear with x)."""
    design = np.column_stack([np.ones(len(x)), x, size]) * np.sqrt(weight)[:, None]
    coefficients, _, rank, singular = np.linalg.lstsq(design, y * np.sqrt(weight), rcond=None)
    if rank < 3 or singular[-1] < 1e-6 * singular[0]:
        return np.append(line(x, y, weight), 0.0)
    return coefficients


def line(x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(intercept, slope) of the weighted least-squares line of y on x (slope 0 if x does not vary)."""
    mx, my = weight @ x / weight.sum(), weight @ y / weight.sum()
    sxx = weight @ (x - mx) ** 2
    slope = float(weight @ ((x - mx) * (y - my)) / sxx) if sxx > 1e-12 else 0.0
    return np.array([my - slope * mx, slope])


def mean_log_wage(psi: NeighborFunction, answers: np.ndarray, sd: float) -> float:
    """E[log w] over w > 0 under the NPMLE of psi(w) deconvolved from wage answers (sd ``sd``)."""
    from gedp.postprocess.prior_components import level_components

    floor = psi.at_zero if np.isfinite(psi.at_zero) else -np.inf
    top = float(answers.max()) + 3 * sd
    prior = fit_mixture(answers, sd, *level_components(floor, top, sd, float(answers.min()), answers))
    paid = prior.means > floor
    return float(np.log(psi.inverse(prior.means[paid])) @ prior.weights[paid] / prior.weights[paid].sum())



def offset_likelihood(likelihood: np.ndarray, group: np.ndarray, band: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each row's likelihood of its cell's offset c (rows x CELL_OFFSETS): its wage answer's likelihood
    at z = s + c + r summed over its residual prior ``table[group, band]``, from ``likelihood`` (rows x
    (WAGE_Z_CELLS, w = 0), the answer's likelihood at z = s + each point, and at w = 0)."""
    k, shifts = len(WAGE_Z), len(CELL_OFFSETS)
    out = np.empty((len(likelihood), shifts))
    keys = group * table.shape[1] + band
    for key in np.unique(keys):
        rows = keys == key
        prior = table[key // table.shape[1], key % table.shape[1]]
        slid = np.zeros((likelihood.shape[1], shifts))  # slid[q, m]: the prior's weight of point q - m
        for m in range(shifts):
            slid[m:m + k, m] = prior[:k]
        slid[-1] = prior[-1]
        out[rows] = likelihood[rows] @ slid
    return out


def residual_means(table: np.ndarray) -> np.ndarray:
    """Each residual prior's mean r over w > 0 (sector x band)."""
    paid = table[..., :-1]
    return paid @ WAGE_Z / paid.sum(axis=-1)


def cell_sizes(average: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Each cell's mean log E over its establishments with E > 0 (``average``: a draw of the months), the
    mean over all such establishments for a cell without any."""
    employing = average > 0
    with np.errstate(divide="ignore"):
        log_average = np.where(employing, np.log(np.where(employing, average, 1.0)), 0.0)
    count = np.bincount(cell, employing.astype(float))
    total = np.bincount(cell, log_average, len(count))
    overall = log_average[employing].mean() if employing.any() else 0.0
    return np.where(count > 0, total / np.maximum(count, 1), overall)


def cell_offsets(log_likelihood: np.ndarray) -> np.ndarray:
    """Each cell's offset, its posterior mean under the NPMLE of the offsets' distribution over the
    cells (empirical Bayes: a cell whose answers say little is shrunk toward the distribution's mean),
    from each cell's log-likelihood of the offsets (cells x CELL_OFFSETS, any constant per cell)."""
    likelihood = np.exp(log_likelihood - log_likelihood.max(axis=1, keepdims=True))
    prior = npmle_weights(likelihood, np.ones(len(likelihood)))
    posterior = likelihood * prior[None, :]
    return posterior @ CELL_OFFSETS / posterior.sum(axis=1)


def offsets_summary(offsets: np.ndarray) -> dict:
    """The cells' fitted offsets (their log wage per employee's level) in a few public numbers: how many
    cells, their spread and range."""
    if len(offsets) == 0:
        return {"cells": 0}
    return {"cells": len(offsets), "sd": float(f"{np.std(offsets):.3g}"),
            "range": [float(f"{np.min(offsets):.3g}"), float(f"{np.max(offsets):.3g}")]}


def draw_residuals(psi: NeighborFunction, omega: np.ndarray, sd: float, average: np.ndarray, group: np.ndarray,
                   band: np.ndarray, table: np.ndarray, shift: Shift, rng: np.random.Generator,
                   offset: np.ndarray | float = 0.0) -> np.ndarray:
    """Draws of each row's residual r (-inf: w = 0) from its prior ``table[group, band]`` (the z grid's
    cells, then w = 0) times its wage answer's likelihood N(omega; psi(E e^(s(log E) + c + r)), sd^2), c
    its cell's ``offset``: a cell by its posterior weight, then uniformly within it (E = ``average`` > 0).

    Computed points x rows, DRAW_ROWS rows at a time (each grid point one vector operation over the
    rows, the cumulative weights a running sum over points, the block in the processor's cache)."""
    scale = np.exp(np.log(average) + size_shift(average, group, shift) + offset)
    with np.errstate(divide="ignore"):
        log_table = np.log(table).transpose(2, 0, 1)  # (grid, w = 0) x sector x band
    pick = np.empty(len(omega), dtype=np.int64)
    growth = np.exp(WAGE_Z)[:, None]
    distance = np.empty((len(WAGE_Z) + 1, min(DRAW_ROWS, len(omega))))
    at_zero = psi(np.zeros(1))[0]
    for start in range(0, len(omega), DRAW_ROWS):
        block = slice(start, start + DRAW_ROWS)
        width = len(omega[block])
        log_weight = log_table[:, group[block], band[block]]
        here = distance[:, :width]
        here[:-1] = psi(growth * scale[None, block])
        here[-1] = at_zero
        here -= omega[None, block]
        here *= here
        here *= 0.5 / (sd * sd)
        log_weight -= here
        pick[block] = pick_points(log_weight, rng)
    r = WAGE_Z[np.minimum(pick, len(WAGE_Z) - 1)] + (WAGE_Z[1] - WAGE_Z[0]) * (rng.random(len(pick)) - 0.5)
    return np.where(pick == len(WAGE_Z), -np.inf, r)
