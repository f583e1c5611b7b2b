"""Released values on a public grid: exact snapping of Gaussian noise (SPEC section 8).

A float64 sum psi(x) + z leaks x through its low bits: when z cancels most of psi(x), the bits
below psi(x)'s last one are zero, and when x = 0 they are not (Mironov 2012 showed the same for
the Laplace mechanism). gedp therefore never releases such a sum. Every released value is an
integer multiple N * g of a public grid step g = 2^-k, with

    N = round(v / g) + round(Z / g),    Z ~ N(0, sd^2),

computed exactly in int64, where v is the statistic (psi(x), or a clipped sum). The written float
is fl(N * g), a function of the integer N alone, so no bit of it depends on the data except
through N. N * g = R(v) + R(Z) = R(R(v) + Z) (R rounds to the grid; R commutes with shifts by grid
multiples), so the release is post-processing of the Gaussian mechanism R(v) + Z, whose sensitivity
is that of v plus one grid step (rounding moves each of two neighbors' values by at most g / 2).
The mechanisms therefore calibrate their sd to that widened sensitivity, and the manifest's mu
is what they charge. The proof, with its assumptions, is in docs/exact-noise.md.
"""

from __future__ import annotations

import math

import numpy as np

from gedp.synth.schema import InputError

#: The psi-scale grid step is 2^(floor(log2 gamma) - PSI_GRID_BITS): at most gamma / 2^12, so
#: rounding widens the psi-mechanism's sensitivity by at most 0.025%.
PSI_GRID_BITS = 12
#: Grid step of pnc's clipped sums, in the attribute's units (employees, dollars): 2^-10.
VALUE_GRID = 2.0**-10
#: Largest |N| handled: int64 with room for the sum of a value and a noise draw.
MAX_GRID_UNITS = 2.0**62


def psi_grid(gamma: float) -> float:
    """Grid step of psi-mechanism answers: the power of two at or below gamma / 2^PSI_GRID_BITS."""
    if not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma ({gamma}) must be a finite number > 0")
    return 2.0 ** (math.floor(math.log2(gamma)) - PSI_GRID_BITS)


def check_grid_range(largest: float, sd: np.ndarray | float, grid: float, what: str) -> None:
    """Refuse, before any data is read, a query whose values or noise could leave the int64 range.

    ``largest`` bounds |value| of what is put on the grid (a psi of a group total, or one clipped
    value) from public quantities only (group sizes, MAX_VALUE, clip levels computed from released
    answers), so whether this fails says nothing about the data. Values and draws (up to 64 sd,
    probability below 1e-800) each stay below 2^61 grid steps, their sum below 2^62.
    """
    room = MAX_GRID_UNITS / 2 * grid
    if not float(largest) < room:
        raise InputError(f"{what}: values up to {float(largest):.3g} are beyond the release grid's range ({room:.3g} "
                         f"in steps of {grid:g}); use a larger gamma (a coarser grid) or another psi")
    if not 64.0 * float(np.max(sd, initial=0.0)) < room:
        raise InputError(f"{what}: noise sd up to {float(np.max(sd)):.3g} is beyond the release grid's range "
                         f"({room:.3g} in steps of {grid:g}); use a larger mu or a smaller gamma")


def largest_sum_units(establishments: int) -> float:
    """A bound on |N| of a released group sum of ``establishments`` values (pnc): each value at most
    MAX_VALUE (``exact_unit_sums`` sums them exactly, past int64), plus a noise draw below 2^61 units
    (``check_grid_range``). What a reader accepts of a pnc answer; a psi answer's bound is MAX_GRID_UNITS."""
    from gedp.synth.schema import MAX_VALUE

    return max(int(establishments), 1) * MAX_VALUE / VALUE_GRID + MAX_GRID_UNITS


def exact_unit_sums(units: np.ndarray, codes: np.ndarray, n_groups: int, largest_sum: float) -> np.ndarray:
    """Group sums of nonnegative grid units (< 2^62 each), exact: int64 when the public bound
    ``largest_sum`` (in units) is below 2^61, else Python integers (an object array), summed as high
    and low 31-bit halves in int64 (exact for fewer than 2^32 units per group) and joined exactly."""
    if largest_sum < MAX_GRID_UNITS / 2:
        sums = np.zeros(n_groups, dtype=np.int64)
        np.add.at(sums, codes, units)
        return sums
    high, low = np.zeros(n_groups, dtype=np.int64), np.zeros(n_groups, dtype=np.int64)
    np.add.at(high, codes, units >> 31)
    np.add.at(low, codes, units & ((1 << 31) - 1))
    return high.astype(object) * (1 << 31) + low.astype(object)


def to_grid(values: np.ndarray, grid: float, what: str) -> np.ndarray:
    """round(values / grid) as int64 (grid is a power of two, so the division is exact)."""
    scaled = np.asarray(values, dtype=float) / grid
    if not np.all(np.abs(scaled) < MAX_GRID_UNITS):
        raise InputError(f"{what}: a value does not fit the release grid {grid:g} (at most 2^62 steps); "
                         "the plan's gamma, psi or noise is too extreme for these data")
    return np.rint(scaled).astype(np.int64)


def rounded_gaussian(sd: np.ndarray | float, grid: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """round(Z / grid) as int64 for Z ~ N(0, sd^2), sd a scalar or one per draw."""
    draws = rng.standard_normal(size) * np.asarray(sd, dtype=float)
    return to_grid(draws, grid, "noise draw")


def from_grid(units: np.ndarray, grid: float) -> np.ndarray:
    """The released float of each integer N (int64, or Python integers of an object array):
    fl(N * grid), N correctly rounded to a float and scaled by the power of two grid, a function of
    N only."""
    units = np.asarray(units)
    return (units if units.dtype == object else units.astype(np.int64)).astype(float) * grid


def rounded_noise_sd(sd: np.ndarray | float, grid: float) -> np.ndarray:
    """sd of round(Z / grid) * grid: sqrt(sd^2 + grid^2 / 12) (Sheppard; exact to within a relative
    exp(-2 pi^2 sd^2 / grid^2), below 1e-30 once sd >= 2 grid)."""
    return np.sqrt(np.asarray(sd, dtype=float) ** 2 + grid**2 / 12)


def low_bits_flag(released: np.ndarray, *, magnitude: float = 16.0, bits: int = 47) -> np.ndarray:
    """The low-bit distinguisher: |omega| < magnitude and omega is not a multiple of 2^-bits.

    On a float64 sum psi(x) + z, a value below 16 carries bits down to 2^-48; when x > 0 and z
    cancels psi(x), the bits below psi(x)'s last bit are zero, so the flag singles out x = 0.
    On gridded releases every value is a multiple of the grid step and the flag is never raised.
    """
    released = np.asarray(released, dtype=float)
    step = 2.0**-bits
    return (np.abs(released) < magnitude) & (np.mod(released, step) != 0)
