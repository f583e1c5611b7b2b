"""Building blocks of the synthetic generator from the source appendix (SPEC section 7)."""

from __future__ import annotations

import numpy as np

#: eta of the month-2 rule for establishments (1.69 is the value for cells).
ETA_ESTABLISHMENT = 0.5
ETA_CELL = 1.69


def month2_employment(
    m1: np.ndarray, m3: np.ndarray, *, eta: float = ETA_ESTABLISHMENT, rng: np.random.Generator
) -> np.ndarray:
    """Month-2 employment from months 1 and 3 (SPEC section 7), as whole numbers.

    m2 = m1 + (m3 - m1)/2 + N(0, 2 eta |m3 - m1| / (m3 + m1)), rounded; 0 when m1 = m3 = 0; a value
    <= 0 becomes 0 when m1 or m3 is 0, else 1.
    """
    m1 = np.asarray(m1, dtype=float)
    m3 = np.asarray(m3, dtype=float)
    both = m1 + m3
    variance = np.divide(2.0 * eta * np.abs(m3 - m1), both, out=np.zeros_like(both), where=both > 0)
    m2 = np.rint(m1 + (m3 - m1) / 2.0 + rng.standard_normal(m1.shape) * np.sqrt(variance))
    nonpositive = m2 <= 0
    m2[nonpositive] = np.where((m1[nonpositive] == 0) | (m3[nonpositive] == 0), 0.0, 1.0)
    m2[both == 0] = 0.0
    return m2


def gamma_concentrations(n: int, *, rng: np.random.Generator, shape: float = 10.0, scale: float = 200.0) -> np.ndarray:
    """The source's Dirichlet concentrations a_j ~ Gamma(shape 10, scale 200), one per establishment.

    They are large (mean 2,000), so Dirichlet(a) shares are almost equal to a_j / sum(a): the
    establishments of a cell come out almost equal in size.
    """
    return rng.gamma(shape, scale, size=n)


def skewed_weights(n: int, *, rng: np.random.Generator, log_sd: float = 1.3) -> np.ndarray:
    """Heavy-tailed within-cell size weights (log-normal): a few large establishments, many small."""
    return np.exp(log_sd * rng.standard_normal(n))


def dirichlet_shares(codes: np.ndarray, concentrations: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
    """Dirichlet divider, vectorized over cells: shares p ~ Dirichlet(b_cell) that sum to 1 per cell.

    ``codes[j]`` is establishment j's cell; a cell whose concentrations are all 0 uses all ones.
    """
    concentrations = np.asarray(concentrations, dtype=float)
    all_zero = np.bincount(codes, weights=concentrations) == 0
    b = np.where(all_zero[codes], 1.0, concentrations)
    draws = rng.gamma(np.where(b > 0, b, 1.0)) * (b > 0)
    return proportional_shares(codes, draws)


def proportional_shares(codes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """weights / (their cell's sum); equal shares in a cell whose weights are all 0."""
    weights = np.asarray(weights, dtype=float)
    sizes = np.bincount(codes)
    totals = np.bincount(codes, weights=weights, minlength=len(sizes))
    equal = 1.0 / sizes[codes]
    safe_totals = np.where(totals > 0, totals, 1.0)
    return np.where(totals[codes] > 0, weights / safe_totals[codes], equal)


def split_integer(codes: np.ndarray, totals: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Controlled rounding: whole-number parts of each cell total, keeping every total exactly.

    Part j is floor or ceil of totals[codes[j]] * shares[j]; the cell's shortfall after flooring
    goes, one unit each, to its parts with the largest fractional remainders.

    Args:
        codes: cell of each part (cells 0..len(totals)-1).
        totals: whole-number cell totals >= 0.
        shares: shares >= 0 summing to 1 within each cell.
    """
    totals = np.asarray(totals)
    if np.any(totals < 0) or np.any(totals != np.round(totals)):
        raise ValueError("cell totals must be whole numbers >= 0")
    raw = totals[codes] * shares
    floor = np.floor(raw + 1e-9)
    shortfall = totals - np.bincount(codes, weights=floor, minlength=len(totals))
    order = np.lexsort((-(raw - floor), codes))
    sorted_codes = codes[order]
    first = np.searchsorted(sorted_codes, sorted_codes, side="left")
    rank = np.empty(len(codes), dtype=np.int64)
    rank[order] = np.arange(len(codes)) - first
    parts = floor + (rank < shortfall[codes])
    if np.any(shortfall < 0) or np.any(shortfall > np.bincount(codes, minlength=len(totals))):
        raise ValueError("shares do not sum to 1 within every cell")
    return parts
