"""BLS size classes of establishments (first-quarter size-class tables): codes 1-9 by month-3
employment, code 1 including establishments of 0.

BLS classes establishments by whole employees: fewer than 5, 5-9, 10-19, 20-49, 50-99, 100-249,
250-499, 500-999, 1,000 or more. A protected release holds fractional employment, so a value is
first rounded to whole employees half up (4.5 is in class 2, 4.49 in class 1), as a published
table would print it; whole-number microdata are classed exactly as BLS does.
"""

from __future__ import annotations

import numpy as np

#: The smallest whole-number month-3 employment of size classes 2..9 (class 1: below 5, 0 included).
SIZE_LOWER_BOUNDS = (5, 10, 20, 50, 100, 250, 500, 1000)
#: Size codes in order.
SIZE_CODES = tuple(range(1, len(SIZE_LOWER_BOUNDS) + 2))
#: BLS's size titles (the open data's size_titles), by code; 0 is every size.
SIZE_TITLES = {
    0: "All establishment sizes",
    1: "n < 5",
    **{code: f"{low} <= n < {high}" for code, low, high in
       zip(SIZE_CODES[1:-1], SIZE_LOWER_BOUNDS[:-1], SIZE_LOWER_BOUNDS[1:])},
    SIZE_CODES[-1]: f"n >= {SIZE_LOWER_BOUNDS[-1]}",
}


def size_class(month3: np.ndarray) -> np.ndarray:
    """BLS size code (1-9, int8) of each month-3 employment, rounded to whole employees half up
    (module docstring). Values must be finite and >= 0 (checked by the microdata's validation)."""
    whole = np.floor(np.asarray(month3, dtype=float) + 0.5)
    return (np.searchsorted(np.asarray(SIZE_LOWER_BOUNDS, dtype=float), whole, side="right") + 1).astype(np.int8)
