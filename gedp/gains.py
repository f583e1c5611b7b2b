"""Gross job gains and losses between two releases (``gedp.postprocess.gains``), with each
establishment's noise taken from the releases themselves: the variance of its protected value in
each quarter, from the release's kept margin structure (``gedp.release.margins``), summed over the
two quarters (independent releases). Nothing but the two releases is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.postprocess.gains import EMPLOYMENT, gains_losses
from gedp.release.margins import kept_variances
from gedp.release.reader import read_protected


def establishment_variances(release: str | Path, attribute: str = EMPLOYMENT) -> pd.Series:
    """The variance of each establishment's protected ``attribute`` in a release, by estab_id (each
    establishment a cell of its own in the release's margin structure)."""
    protected = read_protected(release)
    count = len(protected)
    variance = kept_variances(release)[attribute](np.arange(count), count).variance
    return pd.Series(variance, index=protected["estab_id"].to_numpy(), name=attribute)


def between_releases(earlier: str | Path, later: str | Path, by: str | Sequence[str], *,
                     attribute: str = EMPLOYMENT, level: float = 0.95) -> pd.DataFrame:
    """Gains, losses and net change of ``attribute`` by ``by`` from the release of one quarter to
    the release of a later one, raw and corrected, with margins of error at ``level``."""
    sd = np.sqrt(establishment_variances(earlier, attribute).add(establishment_variances(later, attribute),
                                                                 fill_value=0.0))
    return gains_losses(read_protected(earlier), read_protected(later), by, attribute=attribute, sd=sd, level=level)
