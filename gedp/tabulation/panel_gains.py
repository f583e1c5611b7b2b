"""Gross job gains and losses from releases (``gedp.postprocess.gains``), with each establishment's
noise taken from the releases themselves: the variance of its protected value in each quarter, from
the release's kept margin structure (``gedp.release.margins``; of a panel release, each quarter's
own, as its ``per_quarter`` manifest states it). Nothing but the releases is read.

An establishment's change has the variance of its two protected values' variances summed, minus
twice their covariance under the release's noise design (0 for independent quarters); one absent
from a quarter has level 0 there, with no error. The margins (``*_moe``) cover the noise of the
protected changes only: they take the establishments' change noise as independent of each other
and, for gains and losses, lay Var max(X, 0), X ~ N(d, s^2), at the observed change d around the
raw sums; they do not cover the bias left in the corrected sums (see the gains and losses page).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.measure.design import ChangeCells, quarter_design
from gedp.postprocess.gains import EMPLOYMENT, gains_losses
from gedp.release.margins import kept_variances
from gedp.release.reader import read_manifest, read_quarter


def establishment_variances(release: str | Path, attribute: str = EMPLOYMENT, quarter: str | None = None) -> pd.Series:
    """The variance of each establishment's protected ``attribute`` in a release (in one ``quarter``
    of a panel release), by estab_id (each establishment a cell of its own in the margin structure)."""
    protected = read_quarter(release, quarter)
    count = len(protected)
    variance = kept_variances(release, quarter)[attribute](np.arange(count), count).variance
    return pd.Series(variance, index=protected["estab_id"].to_numpy(), name=attribute)


def change_sd(first: pd.Series, second: pd.Series, covariance: Callable[[ChangeCells], np.ndarray] | None = None,
              quarters_apart: int = 1) -> pd.Series:
    """Each establishment's sd of its protected change from its variances in two quarters (by
    estab_id; 0 where absent) and, for one in both, the design's ``covariance`` of the two values
    (``QuarterDesign.covariance``; None: independent)."""
    ids = first.index.union(second.index)
    v1, v2 = (series.reindex(ids).fillna(0.0).to_numpy(float) for series in (first, second))
    both = ids.isin(first.index) & ids.isin(second.index)
    cov = np.zeros(len(ids))
    if covariance is not None:
        cov[both] = covariance(ChangeCells(first.name or EMPLOYMENT, v1[both], v2[both], quarters_apart))
    return pd.Series(np.sqrt(np.maximum(v1 + v2 - 2 * cov, 0.0)), index=ids)


def between_releases(earlier: str | Path, later: str | Path, by: str | Sequence[str], *,
                     attribute: str = EMPLOYMENT, level: float = 0.95) -> pd.DataFrame:
    """Gains, losses and net change of ``attribute`` by ``by`` from the release of one quarter to
    the release of a later one (independent releases), raw and corrected, with margins at ``level``."""
    sd = change_sd(establishment_variances(earlier, attribute), establishment_variances(later, attribute))
    return gains_losses(read_quarter(earlier), read_quarter(later), by, attribute=attribute, sd=sd, level=level)


def panel_release_gains_losses(release: str | Path, quarters: str, by: str | Sequence[str], *,
                               attribute: str = EMPLOYMENT, moe: bool = False, level: float = 0.95) -> pd.DataFrame:
    """Gains, losses and net change of ``attribute`` by ``by`` between the quarters ``FROM:TO`` of a
    panel release: raw and corrected sums, and with ``moe`` their margins at ``level`` (module
    docstring: what they cover); each establishment's noise from its quarters' margin structures
    and the release's noise design."""
    from gedp.release.reader import change_quarters

    first, second, apart = change_quarters(release, quarters)
    design = quarter_design(read_manifest(release)["design"]["name"])
    variances = [establishment_variances(release, attribute, quarter) for quarter in (first, second)]
    sd = change_sd(*variances, design.covariance, apart)
    try:
        table = gains_losses(read_quarter(release, first), read_quarter(release, second), by, attribute=attribute,
                             sd=sd, level=level)
    except ValueError as err:
        raise InputError(str(err)) from None
    return table if moe else table.drop(columns=[c for c in table.columns if c.endswith("_moe")])
