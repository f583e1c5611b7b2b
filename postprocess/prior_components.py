"""The implicates' priors (``postprocess.implicates``): their names a user chooses among, and the
components and fit arguments of the month model's priors (a level prior's grid with its atom at psi(0),
a change prior's atom at no change and its steps, the standard error of that atom, and the merging of
sparse bands)."""

from __future__ import annotations

import numpy as np

from gedp.errors import InputError
from gedp.postprocess.deconvolve import lattice_near

#: A level prior's components: every sd / LEVEL_STEPS.
LEVEL_STEPS = 3.0
#: Most points of a level prior's grid (its fit's Hessian is points^2 floats, a Newton step points^3):
#: beyond it, only the points within LEVEL_REACH answer sds of an answer, coarsened until they fit
#: (``deconvolve.lattice_near``). Ordinary releases never reach it (Rhode Island's: 139 at most).
MOST_LEVEL_POINTS = 600
LEVEL_REACH = 8.0


#: The level prior's level: month 1's (theta_1) or the quarter's (the months' precision-weighted mean).
LEVEL_PRIORS = ("month1", "quarter")


#: The changes' prior: one per change, independent, or one joint prior of the two (``joint_changes``).
CHANGE_PRIORS = ("independent", "joint")


#: The wage priors' levels: the sector's line (``sector``), or with each county x NAICS-6 cell's offset
#: (``cells``: ``PosteriorModel._cell_offsets``).
WAGE_PRIORS = ("sector", "cells")


def checked_prior(what: str, name: object, names: tuple[str, ...]) -> str:
    """A prior's name (``what``: "level", "change", "wage"), refused unless it is a string among
    ``names`` (a numpy array of one name compares equal to it element by element, and is refused)."""
    if not (isinstance(name, str) and name in names):
        raise InputError(f"{what} prior {name!r} is not one of {', '.join(names)}")
    return name


def level_components(floor: float, top: float, sd: float, lowest: float,
                     answers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A level prior's components: an atom at psi(0) (when finite), then every sd / LEVEL_STEPS up to
    ``top`` with that bandwidth; more than MOST_LEVEL_POINTS of them (an answer far from the others):
    those near the ``answers`` only, on a coarser step where even these are too many."""
    step = sd / LEVEL_STEPS
    start = floor if np.isfinite(floor) else lowest - 3 * sd
    grid = np.arange(start + step, top + step, step) if (top - start) / step < MOST_LEVEL_POINTS else None
    if grid is None or grid.size >= MOST_LEVEL_POINTS:
        grid, step = lattice_near(answers, start, top, step, LEVEL_REACH * sd, MOST_LEVEL_POINTS - 1)
    atoms = np.array([floor]) if np.isfinite(floor) else np.empty(0)
    return np.concatenate([atoms, grid]), np.concatenate([np.zeros(atoms.size), np.full(grid.size, step)])


def level_groups(sector: np.ndarray, fitted: np.ndarray, smallest: int) -> np.ndarray:
    """Each establishment's level group: k (0, 1, ... in the sectors' code order) for a sector (integer
    code >= 0) with ``smallest`` or more ``fitted`` level answers (a mask), -1 for the others."""
    sector = np.asarray(sector)
    known = sector >= 0
    counts = np.bincount(sector[known & fitted], minlength=int(sector.max(initial=-1)) + 1)
    index = np.full(counts.size, -1)
    own = np.flatnonzero(counts >= smallest)
    index[own] = np.arange(own.size)
    return np.where(known, index[np.where(known, sector, 0)], -1) if counts.size else np.full(sector.size, -1)


def change_components(smallest: float, reach: float, sd: float) -> tuple[np.ndarray, np.ndarray]:
    """A change prior's components: an atom at 0 (no change), then both signs from ``smallest`` (one
    employee's change) every sd / 4 up to 4 sd, then 15% apart up to ``reach``, each with half its step
    (with noise under a quarter of ``smallest``, only ``smallest`` before the 15% steps)."""
    near = np.arange(smallest, 4 * sd, sd / 4) if 4 * sd > smallest else np.array([smallest])
    far = near[-1] * 1.15 ** np.arange(1, max(2, int(np.ceil(np.log(reach / near[-1]) / np.log(1.15))) + 1))
    side = np.concatenate([near, far])
    width = np.diff(side, prepend=side[0] - (side[1] - side[0])) / 2
    return np.concatenate([[0.0], side, -side]), np.concatenate([[0.0], width, width])


def atom_standard_error(count: int, step: float, sd: float) -> float:
    """The standard error of the weight p of an atom at 0, estimated from ``count`` answers with noise
    ``sd``, when the rest of the mass is one ``step`` away on either side and a = step / sd is small: the
    answers' density is phi(x / sd) [1 + (1 - p) a^2 ((x / sd)^2 - 1) / 2] to order a^2, so one answer's
    Fisher information about p is a^4 / 2 and the standard error sqrt(2 / (count a^4)): the atom told
    apart from its nearest alternative, the change of one employee (with the other components' weights
    free as well, the real standard error is larger)."""
    a = step / sd
    return float(np.sqrt(2.0 / (count * a**4))) if count > 0 and a > 0 else float("inf")


def change_fit(difference: np.ndarray, sd: float, step: float) -> tuple:
    """A change prior's fit arguments: the differences, their sd and the components (``change_components``
    from one employee's change ``step`` to beyond the largest difference)."""
    reach = max(float(np.abs(difference).max()), 4 * sd) + sd
    return (difference, sd, *change_components(step, reach, sd))


def merged_bands(counts: np.ndarray, smallest: int) -> list[int]:
    """Band boundaries (indices into the counts' edges, 0 and len(counts) at the ends) after merging
    each band of fewer than ``smallest`` rows into the one below (the lowest into the one above)."""
    bounds = [0]
    total = 0
    for k, count in enumerate(counts):
        total += count
        if total >= smallest:
            bounds.append(k + 1)
            total = 0
    if bounds[-1] != len(counts):
        if len(bounds) > 1:
            bounds[-1] = len(counts)
        else:
            bounds.append(len(counts))
    return bounds
