"""Measuring gross job gains and losses from protected microdata: a next quarter at public BED rates,
and the bias of the raw and corrected sums against the truth.

``next_quarter`` moves a quarter of establishment microdata to the next at approximately the rates of
BLS Business Employment Dynamics (private sector, seasonally adjusted, quarters of 2015-2016, BED
news releases' Table A and Table 3): gross job gains about 6.2% of employment per quarter (5.0%
expanding establishments, 1.2% openings), gross job losses about 5.7% (4.5% contracting, 1.2%
closings); about 20% of establishments expand and 19% contract in a quarter, 3.4% open and 3.2%
close. The changes are spread over establishments in proportion to their size with an exponential
spread, at least one employee each; openings and closings are drawn among small establishments.
It is a stand-in for measuring bias, not a panel generator (no seasonality, no wage dynamics beyond
wages moving with employment).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import pandas as pd

from gedp.postprocess.gains import EMPLOYMENT

MONTHS = ("m1emp", "m2emp", "m3emp")


#: Quarterly rates: shares of establishments expanding, contracting, opening and closing (BED: numbers
#: of establishments by component), and shares of employment gained by expanding establishments and
#: openings, lost by contracting ones and closings (BED: gross job gains and losses rates).
BED_RATES: Mapping[str, float] = MappingProxyType({
    "expanding": 0.20, "contracting": 0.19, "opening": 0.034, "closing": 0.032,
    "expansion_gains": 0.050, "opening_gains": 0.012, "contraction_losses": 0.045, "closing_losses": 0.012})


def _spread(size: np.ndarray, total: float, rng: np.random.Generator) -> np.ndarray:
    """Whole changes of at least 1, about proportional to ``size`` with an exponential spread, summing
    to about ``total`` (the scale found by bisection)."""
    raw = (size + 1.0) * rng.exponential(1.0, len(size))
    low, high = 0.0, 2.0 * total / max(raw.sum(), 1e-12)
    for _ in range(40):
        scale = (low + high) / 2
        low, high = (scale, high) if np.maximum(1.0, np.round(raw * scale)).sum() < total else (low, scale)
    return np.maximum(1.0, np.round(raw * low))


def next_quarter(microdata: pd.DataFrame, rng: np.random.Generator,
                 rates: Mapping[str, float] = BED_RATES) -> pd.DataFrame:
    """The same establishments a quarter later at BED-like rates (module docstring); ``qtr``/``year``
    advanced, openings with new estab_ids and the public columns of a random existing establishment."""
    frame = microdata.reset_index(drop=True)
    employment = frame[EMPLOYMENT].to_numpy(float)
    total = employment.sum()
    n = len(frame)
    small = 1.0 / np.sqrt(1.0 + employment)
    closing = rng.choice(n, int(round(rates["closing"] * n)), replace=False, p=small / small.sum())
    rest = np.setdiff1d(np.arange(n), closing)
    moving = rng.permutation(rest)
    expanding = moving[: int(round(rates["expanding"] * n))]
    contracting = moving[len(expanding): len(expanding) + int(round(rates["contracting"] * n))]
    change = np.zeros(n)
    change[expanding] = _spread(employment[expanding], rates["expansion_gains"] * total, rng)
    change[contracting] = -np.minimum(_spread(employment[contracting], rates["contraction_losses"] * total, rng),
                                      employment[contracting])
    later = frame.copy()
    ratio = (employment + change + 1.0) / (employment + 1.0)
    for month in MONTHS:
        later[month] = np.maximum(np.round(later[month].to_numpy(float) * ratio), 0.0)
    later[EMPLOYMENT] = employment + change
    later["wage"] = later["wage"].to_numpy(float) * ratio
    later = later.drop(index=closing)
    return _advance(pd.concat([later, _openings(frame, rates, total, rng)], ignore_index=True))


def _openings(frame: pd.DataFrame, rates: Mapping[str, float], total: float, rng: np.random.Generator) -> pd.DataFrame:
    """New establishments: public columns of random existing ones, small sizes."""
    count = int(round(rates["opening"] * len(frame)))
    employment = frame[EMPLOYMENT].to_numpy(float)
    small = 1.0 / (1.0 + employment)
    opened = frame.iloc[rng.choice(len(frame), count, p=small / small.sum())].copy()
    size = _spread(np.zeros(count), rates["opening_gains"] * total, rng)
    share = opened["wage"].to_numpy(float) / np.maximum(opened[EMPLOYMENT].to_numpy(float), 1.0)
    for month in MONTHS:
        opened[month] = size
    opened["wage"] = np.round(share * size)
    opened["estab_id"] = [f"{state}-N{i:07d}" for i, state in enumerate(opened["state"])]
    return opened


def _advance(frame: pd.DataFrame) -> pd.DataFrame:
    """The next quarter's ``year`` and ``qtr``."""
    if "qtr" in frame:
        later_year = frame["qtr"] == 4
        frame["year"] = frame["year"] + later_year
        frame["qtr"] = np.where(later_year, 1, frame["qtr"] + 1)
    return frame
