"""The noisy answer: what measurement hands to postprocessing (and what a release publishes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from gedp.measure.queries import Query


@dataclass(frozen=True, eq=False)
class NoisyAnswer:
    """Released answers of one query on one attribute; every field is public.

    Attributes:
        query: the group-by spec and attribute.
        keys: one row of public group keys per answer (no columns for the total).
        released: what the mechanism released (omega on the psi scale for the psi-mechanism; the
            noisy clipped sum for pnc).
        estimate: unbiased-scale estimate of each group total.
        variance: variance of ``estimate``: exact (public) for pnc, estimated from released values
            for the psi-mechanism.
        variance_kind: "exact" or "estimated".
        mechanism: "psi" or "pnc".
        mu: the GDP parameter this answer spent.
        sd: standard deviation of the noise added on the released scale, per group (the
            rounded draw's, sqrt(s^2 + grid^2 / 12)).
        grid: the public grid step every released value is a multiple of (0: not gridded, e.g.
            answers simulated by an experiment).
        variance_slope: d variance / d level per answer where postprocessing states ``variance``
            at a level estimated from the answer's own noise (``postprocess.months``); the margins
            of error widen by it (``postprocess.moe``). None: the variance does not move with the
            answer's noise (exact, or taken from other answers). Never written to a release.
        pattern_loading: per answer, the sd (in the attribute's units) of the error that shrinking it
            toward its sector's month pattern leaves, where that error is shared by every answer of its
            county x NAICS-6 cell (``postprocess.months``); the margins of error add the covariances
            (``postprocess.moe``). None: no shared error. Never written to a release.
    """

    query: Query
    keys: pd.DataFrame
    released: np.ndarray
    estimate: np.ndarray
    variance: np.ndarray
    variance_kind: Literal["exact", "estimated"]
    mechanism: str
    mu: float
    sd: np.ndarray
    grid: float = 0.0
    variance_slope: np.ndarray | None = None
    pattern_loading: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.estimate)
