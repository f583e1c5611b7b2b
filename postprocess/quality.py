"""Quality flags of published values from their margins of error, in the spirit of the flags of the
Census Bureau's differentially private County Business Patterns demonstration, which publishes each
cell's coefficient of variation (CV: standard deviation of the error / value) and withholds cells
whose CV is 100% or more.

A value's standard deviation is its margin of error divided by the normal quantile of its
confidence level (a margin at 95% is 1.96 standard deviations). Its flag is the band of its CV:

* ``A``: CV below 5% (precise),
* ``B``: 5% to 15% (good),
* ``C``: 15% to 30% (use with care),
* ``D``: 30% to 100% (unreliable),
* ``X``: 100% or more, or a value of 0 with a nonzero margin (the noise is as large as the value:
  the DP CBP demonstration would withhold it).

Nothing is withheld here: the flag says how far to trust a value that is published anyway.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

#: Upper CV bounds (exclusive) of the flags, in order; anything above the last is ``NOISY_FLAG``.
CV_BANDS = ((0.05, "A"), (0.15, "B"), (0.30, "C"), (1.0, "D"))
NOISY_FLAG = "X"
#: What each flag means, for notes and pages.
FLAG_MEANINGS = {"A": "CV below 5%", "B": "CV 5% to 15%", "C": "CV 15% to 30%: use with care",
                 "D": "CV 30% to 100%: unreliable", "X": "CV 100% or more: as noisy as the value"}


def coefficients_of_variation(values: np.ndarray, margins: np.ndarray, level: float) -> np.ndarray:
    """Each value's CV: its margin of error at confidence ``level`` over the normal quantile, over
    the value's size (0 where both are 0, infinite where only the value is)."""
    sd = np.asarray(margins, dtype=float) / NormalDist().inv_cdf(0.5 + level / 2)
    size = np.abs(np.asarray(values, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd == 0, 0.0, sd / size)


def quality_flags(values: np.ndarray, margins: np.ndarray, level: float) -> np.ndarray:
    """Each value's flag (``CV_BANDS``; ``NOISY_FLAG`` for a CV of 100% or more or not a number)."""
    cv = coefficients_of_variation(values, margins, level)
    bounds = np.array([bound for bound, _ in CV_BANDS])
    names = np.array([flag for _, flag in CV_BANDS] + [NOISY_FLAG], dtype=object)
    band = np.searchsorted(bounds, np.where(np.isnan(cv), np.inf, cv), side="right")
    return names[band]
