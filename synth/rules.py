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
