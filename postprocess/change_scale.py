"""Change sizes that grow (or shrink) with the level: the implicates' change priors scaled per establishment.

The shipped change prior of a size band is one distribution of delta_k = theta_k - theta_1 (psi scale) for every
establishment of the band. A change relative to the headcount grows with the level inside a band, a change of a
fixed number of employees shrinks (in psi = sqrt). With ``postprocess.implicates.CHANGE_SCALE`` (a measurement's
knob, off: ``docs/evaluation/implicates-measurements.md``, change sizes relative to the level) an establishment's
change is delta_k = s r_k, r_k from its band's prior (an NPMLE with the atom at 0, as before) and

    s = (n / n_b)^beta_bk,   n = psi^-1(mean of its three answers), clipped to the band's sizes and >= 1,

in steps of SCALE_STEP in log n (rows of one scale share their draws' constants), n_b the band's geometric middle
size. beta per band and month maximizes the profile log-likelihood of the band's answers' differences (computed on
SCALE_POWERS, each point an NPMLE of r's prior; the vertex of the parabola through the largest and its neighbours):
beta = 0 is the shipped model, 1/2 a change proportional to the headcount (psi(n(1 + r)) - psi(n) ~ sqrt(n) r / 2),
-1/2 one of a fixed number of employees. The mean of the three answers is independent of their differences (the
months' sds equal), so conditioning on it is exact, as the band's is. beta is chosen once; each implicate's
replicate refits r's prior on the bootstrap at that beta (beta's estimation error is not carried).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.deconvolve import BINS_PER_SD, Likelihood, MixtureFit, binned, npmle_weights
from gedp.postprocess.prior_components import change_fit

#: The powers beta the profile likelihood is computed at.
SCALE_POWERS = (-0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0)
#: Steps of log n in which the scales are taken.
SCALE_STEP = 0.1
#: A band keeps beta = 0 (one size) if its profile's peak is less than this many nats above beta = 0's (0: the peak;
#: 3.3: a likelihood-ratio test of one parameter at 1%, chi^2_1(0.99) / 2).
SCALE_MIN_GAIN = 0.0


def row_sizes(mean_answer: np.ndarray, psi: NeighborFunction, band: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each row's size n (employees, module docstring) in steps of SCALE_STEP in log n, and its band's middle size:
    (n, n_b) per row. ``band``: each row's change band, ``edges``: the bands' edges in psi scale."""
    bounds = psi.inverse(np.concatenate([[-np.inf], edges, [np.inf]]))
    size = np.maximum(psi.inverse(mean_answer), 1.0)
    lower = np.maximum(bounds[band], 1.0)
    top = np.array([size[band == b].max(initial=1.0) for b in range(len(edges) + 1)])
    upper = np.maximum(np.minimum(bounds[band + 1], top[band]), lower)
    size = np.exp(np.round(np.log(np.clip(size, lower, upper)) / SCALE_STEP) * SCALE_STEP)
    return size, np.sqrt(lower * upper)


def scales(size: np.ndarray, middle: np.ndarray, beta: float | np.ndarray) -> np.ndarray:
    """s = (n / n_b)^beta."""
    return (size / middle) ** beta


class ScaledFit(MixtureFit):
    """A change prior's fit when each answer's change is its scale s times r, r from the prior: rows
    (difference, s), binned on the difference per scale; component k's likelihood N(d; s m_k, s^2 h_k^2 + sd^2)."""

    @classmethod
    def of(cls, observed: np.ndarray, sd: float, means: np.ndarray, sds: np.ndarray,
           basis: bool = False) -> ScaledFit:
        likelihood, counts = scaled_likelihood(observed[:, 0], observed[:, 1], sd, means, sds)
        return cls(means, sds, counts, Likelihood.of(likelihood, basis=basis))


def scaled_fit_arguments(difference: np.ndarray, scale: np.ndarray, sd: float, step: float) -> tuple:
    """A ScaledFit's arguments: the rows (difference, scale), their sd and r's components (``change_fit`` of the
    differences divided by their scales)."""
    return (np.column_stack([difference, scale]), *change_fit(difference / scale, sd, step)[1:])


def scaled_likelihood(difference: np.ndarray, scale: np.ndarray, sd: float, means: np.ndarray, sds: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The likelihood matrix (binned rows x components) of differences ``difference`` = s r + N(0, sd^2), r on
    components (``means``, ``sds``), and the rows' counts; rows binned to sd / BINS_PER_SD per value of ``scale``."""
    blocks, counts = [], []
    for s in np.unique(scale):
        centers, count = binned(difference[scale == s], sd / BINS_PER_SD)
        spread = np.sqrt((s * sds) ** 2 + sd * sd)
        blocks.append(np.exp(-0.5 * ((centers[:, None] - s * means[None, :]) / spread) ** 2) / spread)
        counts.append(count)
    return np.concatenate(blocks), np.concatenate(counts)


@dataclass(frozen=True)
class ChangeScales:
    """Each row's scale per change (rows x 2), each band's chosen beta per change (bands x 2) and the profile
    log-likelihoods (bands x 2 x SCALE_POWERS)."""

    scale: np.ndarray
    beta: np.ndarray
    profiles: np.ndarray


def band_scales(omega: np.ndarray, sd: np.ndarray, psi: NeighborFunction, edges: np.ndarray, band: np.ndarray,
                steps: list[float]) -> ChangeScales:
    """The changes' scales from the months' answers ``omega`` (psi scale, rows x 3) with sds ``sd``, in change bands
    ``band`` of edges ``edges`` (psi scale), each with its smallest change ``steps``."""
    size, middle = row_sizes(omega.mean(axis=1), psi, band, edges)
    profiles = np.zeros((len(steps), 2, len(SCALE_POWERS)))
    for b, step in enumerate(steps):
        rows = band == b
        for k in (1, 2) if rows.any() else ():
            difference, noise = omega[rows, k] - omega[rows, 0], float(np.hypot(sd[0], sd[k]))
            profiles[b, k - 1] = [profile_point(difference, scales(size[rows], middle[rows], beta), noise, step)
                                  for beta in SCALE_POWERS]
    beta = np.apply_along_axis(profile_peak, 2, profiles)
    zero = SCALE_POWERS.index(0.0)
    beta = np.where(profiles.max(axis=2) - profiles[:, :, zero] >= SCALE_MIN_GAIN, beta, 0.0)
    return ChangeScales(scales(size[:, None], middle[:, None], beta[band]), beta, profiles)


def profile_peak(values: np.ndarray) -> float:
    """The beta maximizing a profile: the vertex of the parabola through its largest point on SCALE_POWERS and the
    points beside it (the end point where the largest is at an end; 0 for a flat profile: an empty band)."""
    grid, top = np.asarray(SCALE_POWERS), int(np.argmax(values))
    if np.ptp(values) == 0:
        return 0.0
    if top in (0, len(grid) - 1):
        return float(grid[top])
    left, mid, right = values[top - 1:top + 2]
    curvature = left - 2 * mid + right
    vertex = 0.5 * (grid[1] - grid[0]) * (left - right) / curvature if curvature < 0 else 0.0
    return float(grid[top] + vertex)


def profile_point(difference: np.ndarray, scale: np.ndarray, sd: float, step: float) -> float:
    """The answers' log-likelihood at the NPMLE of r's prior for these scales (up to a constant of the answers)."""
    _, means, sds = change_fit(difference / scale, sd, step)[1:]
    likelihood, counts = scaled_likelihood(difference, scale, sd, means, sds)
    return float(counts @ np.log(likelihood @ npmle_weights(likelihood, counts)))
