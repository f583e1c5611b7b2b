"""Panels of quarters: establishment microdata over several quarters (``year``, ``qtr``), read and
checked, and a synthetic panel grown from one synthetic quarter by public business dynamics.

A panel holds one row per establishment and quarter; an establishment keeps its ``estab_id`` and
its public columns (state, county, naics, own) in every quarter it appears in, and may appear
(an opening) or disappear (a closing) from one quarter to the next.

The synthetic dynamics (``BED_2016``, the one table of these rates in gedp) use round figures of
the U.S. Bureau of Labor Statistics' Business Employment Dynamics (BED), private sector,
seasonally adjusted, as first published in the BED news releases on the quarters of 2016 (vintage:
the releases of 2016-2017, e.g. USDL-17-0476, "Business Employment Dynamics - Third Quarter 2016",
April 26, 2017): Table A, "Private sector gross job gains and job losses", for the shares of
employment, and Table 3, establishments by direction of employment change, for the shares of
establishments. Per quarter, as shares of the previous quarter: gross job gains about 6.0% of
employment (expanding establishments 4.9%, opening ones 1.1%), gross job losses about 5.7%
(contracting 4.7%, closing 1.0%); openings about 3.6% and closings about 3.3% of establishments;
about 28% of establishments expand and 27% contract. Gains are at the low end of the releases'
6.0-6.4% (6.4% in the third quarter of 2016, USDL-17-0476, with losses of 7.0 million against
7.7 million of gains, about 5.8%; 6.2% in the fourth, USDL-17-1046; 6.0% in the first of 2017,
USDL-17-1481). Most of the change comes from expanding and
contracting establishments. Seasonal movement (``SEASONAL``) is a small table of approximate
not-seasonally-adjusted employment by quarter relative to the annual average, from BLS Current
Employment Statistics national series around 2016, for the four sectors with the clearest pattern.
Wages follow employment, with a wage-growth term of 0.7% a quarter (about 2.8% a year) and an
establishment's own variation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.synth.io import read_columns
from gedp.synth.rules import month2_employment
from gedp.synth.schema import (
    CARRIED,
    CODE_WIDTHS,
    CONFIDENTIAL,
    InputError,
    _refuse,
    canonical_ids,
    check_columns,
    normalize_code,
    validate_microdata,
    whole_numbers,
)

#: The columns an establishment keeps the same in every quarter it appears in, and their codes' widths.
STABLE_COLUMNS = {**CODE_WIDTHS, "own": 1}
QUARTER_PATTERN = re.compile(r"^([0-9]{4})Q([1-4])$")
#: Most quarters a panel may hold (25 years).
MAX_QUARTERS = 100


@dataclass(frozen=True)
class Dynamics:
    """Per-quarter business dynamics, as shares of the previous quarter (see the module's sources)."""

    opening_share: float = 0.036  # openings / establishments
    closing_share: float = 0.033  # closings / establishments
    opening_employment: float = 0.011  # employment of openings / employment
    closing_employment: float = 0.010  # employment of closings / employment
    gains: float = 0.060  # gross job gains / employment (expanding + opening)
    losses: float = 0.057  # gross job losses / employment (contracting + closing)
    expanding_share: float = 0.28  # expanding establishments / continuing ones
    contracting_share: float = 0.27  # contracting establishments / continuing ones
    wage_growth: float = 0.007  # growth of wages per employee per quarter
    wage_sd: float = 0.03  # an establishment's own quarterly variation of wages per employee (log scale)


BED_2016 = Dynamics()

#: Employment by quarter relative to the annual average (not seasonally adjusted), by NAICS sector:
#: construction, retail trade, educational services, arts and recreation, accommodation and food.
Seasonal = Mapping[str, tuple[float, float, float, float]]
SEASONAL: Seasonal = {
    "23": (0.95, 1.01, 1.03, 1.01),
    "44-45": (0.98, 0.99, 1.00, 1.03),
    "61": (1.02, 1.01, 0.95, 1.02),
    "71": (0.93, 1.04, 1.08, 0.95),
    "72": (0.97, 1.02, 1.03, 0.98),
}


def quarter_label(year: int, qtr: int) -> str:
    """A quarter's label ``YYYYQn``, e.g. "2016Q1"."""
    return f"{int(year):04d}Q{int(qtr)}"


def parse_quarter(text: str) -> tuple[int, int]:
    """(year, qtr) of a label such as "2016Q1"; InputError otherwise."""
    match = QUARTER_PATTERN.match(text.strip())
    if match is None:
        raise InputError(f"quarter '{text}' must be YYYYQn: a year, Q, and a quarter 1-4, e.g. 2016Q1")
    return int(match.group(1)), int(match.group(2))


def quarter_range(text: str) -> list[tuple[int, int]]:
    """The quarters from FIRST to LAST of "FIRST:LAST" (e.g. "2016Q1:2017Q1", five quarters)."""
    if text.count(":") != 1:
        raise InputError(f"--quarters '{text}' must be FIRST:LAST, e.g. 2016Q1:2017Q1")
    first, last = (parse_quarter(part) for part in text.split(":"))
    start, stop = first[0] * 4 + first[1] - 1, last[0] * 4 + last[1] - 1
    if not 1 <= stop - start + 1 <= MAX_QUARTERS:
        raise InputError(f"--quarters '{text}': the last quarter must come after the first, and at most "
                         f"{MAX_QUARTERS} quarters")
    return [(index // 4, index % 4 + 1) for index in range(start, stop + 1)]


def panel_quarters(frame: pd.DataFrame) -> list[tuple[int, int]]:
    """The distinct (year, qtr) of microdata, in order ([] without year and qtr columns)."""
    if not {"year", "qtr"} <= set(frame.columns):
        return []
    pairs = frame[["year", "qtr"]].drop_duplicates()
    return sorted((int(y), int(q)) for y, q in pairs.itertuples(index=False))


def read_panel_source(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    """A panel as stored: a DataFrame, one CSV or Parquet file, or a folder of Parquet parts or of
    CSV files (one per quarter, say), joined."""
    if isinstance(source, pd.DataFrame):
        return source.reset_index(drop=True)
    path = Path(source)
    csvs = sorted(path.glob("*.csv")) if path.is_dir() else []
    if not csvs:
        return read_columns(path)
    return pd.concat([read_columns(part) for part in csvs], ignore_index=True)


def check_panel(frame: pd.DataFrame) -> pd.DataFrame:
    """Check the rules of a panel (each quarter's rows are checked as microdata when protected or by
    ``validate_panel``); returns ``frame`` with ``year`` and ``qtr`` as whole numbers.

    Rules: ``year`` and ``qtr`` present and valid; one row per (estab_id, year, qtr); an
    establishment's public columns (state, county, naics, own) the same in every quarter it appears
    in (a moved or reclassified establishment takes a new estab_id).
    """
    if not {"year", "qtr"} <= set(frame.columns):
        raise InputError("a panel needs the columns 'year' and 'qtr'")
    check_columns(frame.columns, attributes=())
    frame = frame.reset_index(drop=True)
    carried = {column: whole_numbers(frame, column, *CARRIED[column]) for column in ("year", "qtr")}
    frame = frame.assign(**carried)
    ids = canonical_ids(frame["estab_id"])
    repeated = pd.DataFrame({"estab_id": ids, **carried}).duplicated().to_numpy()
    _refuse("estab_id", repeated, frame, "values must be unique within a quarter (year, qtr)")
    codes = pd.DataFrame({column: normalize_code(frame, column, width) for column, width in STABLE_COLUMNS.items()
                          if column in frame.columns}, index=frame.index)
    first = codes.groupby(ids.to_numpy(), sort=False).transform("first")
    for column in codes.columns:
        _refuse(column, (codes[column] != first[column]).to_numpy(), frame,
                "values of an establishment must be the same in every quarter (give a moved or reclassified "
                "establishment a new estab_id)")
    return frame


def validate_panel(frame: pd.DataFrame, attributes: Sequence[str] = CONFIDENTIAL) -> pd.DataFrame:
    """A checked panel (``check_panel``) in canonical form: each quarter's rows validated as
    microdata (``validate_microdata``), the quarters in order."""
    frame = check_panel(frame)
    quarters = frame.groupby(["year", "qtr"], sort=True).ngroup()
    return pd.concat([validate_microdata(frame[quarters == index], attributes) for index in range(quarters.max() + 1)],
                     ignore_index=True)


def read_panel(source: str | Path | pd.DataFrame, attributes: Sequence[str] = CONFIDENTIAL) -> pd.DataFrame:
    """Read and check a panel (``read_panel_source``, ``validate_panel``)."""
    return validate_panel(read_panel_source(source), attributes)


def seasonal_factors(sector: np.ndarray, qtr: int,
                     seasonal: Seasonal = SEASONAL) -> np.ndarray:
    """Each establishment's seasonal employment factor in quarter ``qtr`` (1 outside ``seasonal``)."""
    factors = np.ones(len(sector))
    for code, by_quarter in seasonal.items():
        factors[sector == code] = by_quarter[qtr - 1]
    return factors


def synthesize_panel(first: pd.DataFrame, quarters: Sequence[tuple[int, int]], *, rng: np.random.Generator,
                     dynamics: Dynamics = BED_2016,
                     seasonal: Seasonal = SEASONAL) -> pd.DataFrame:
    """A panel over ``quarters`` grown from ``first`` (validated microdata of one synthetic quarter,
    which becomes the first quarter): each next quarter closes, opens, expands and contracts
    establishments at the ``dynamics``' rates (``next_quarter``) and moves the sectors of
    ``seasonal`` by their factors."""
    state = first.assign(year=quarters[0][0], qtr=quarters[0][1])
    underlying = state["m3emp"].to_numpy(dtype=float)
    frames = [state]
    for index, (year, qtr) in enumerate(quarters[1:], start=1):
        state, underlying = next_quarter(state, underlying, (year, qtr), quarters[0][1], f"{index:03d}", rng=rng,
                                         dynamics=dynamics, seasonal=seasonal)
        frames.append(state)
    return validate_panel(pd.concat(frames, ignore_index=True))


def next_quarter(previous: pd.DataFrame, underlying: np.ndarray, quarter: tuple[int, int], base_qtr: int, tag: str,
                 *, rng: np.random.Generator, dynamics: Dynamics,
                 seasonal: Seasonal = SEASONAL) -> tuple[pd.DataFrame, np.ndarray]:
    """The next quarter of a panel and its establishments' underlying (seasonally neutral) month-3
    employment: closings drawn with weights falling with size (so that they hold ``closing_share``
    of the establishments and about ``closing_employment`` of the employment), openings copying
    the public columns of a random continuing establishment, then expansions and contractions
    scaled so that gross gains and losses reach their shares. Observed employment is the
    underlying one times the sector's seasonal factor relative to the first quarter's; new
    establishments' ids are ``<state>-<tag>-<number>``."""
    n, total = len(previous), float(underlying.sum())
    closed = _closings(underlying, round(dynamics.closing_share * n), dynamics.closing_employment, rng)
    kept = np.flatnonzero(~closed)
    level = underlying[kept].copy()
    draw = rng.random(len(kept))
    expanding, contracting = draw < dynamics.expanding_share, (draw >= 1 - dynamics.contracting_share) & (level > 0)
    births = round(dynamics.opening_share * n)
    birth_sizes = _sizes(dynamics.opening_employment * total / max(births, 1), births, rng)
    level[expanding] += _changes(level[expanding], dynamics.gains * total - birth_sizes.sum(), None, rng)
    lost = dynamics.losses * total - underlying[closed].sum()
    level[contracting] -= _changes(level[contracting], lost, level[contracting], rng)
    parents = kept[rng.integers(0, len(kept), births)]
    ids = np.char.add(f"{previous['state'].iloc[0]}-{tag}-", np.char.zfill(np.arange(births).astype(str), 6))
    frame = pd.concat([previous.iloc[kept], previous.iloc[parents].assign(estab_id=ids)], ignore_index=True)
    new_level = np.concatenate([level, birth_sizes])
    sectors = frame["sector"].to_numpy()
    season = seasonal_factors(sectors, quarter[1], seasonal) / seasonal_factors(sectors, base_qtr, seasonal)
    _move(frame, np.rint(new_level * season), len(kept), quarter, dynamics, rng)
    return frame, new_level


def _closings(level: np.ndarray, count: int, employment_share: float, rng: np.random.Generator) -> np.ndarray:
    """Which establishments close: ``count`` drawn without replacement with weights (1 + level)^-beta,
    beta chosen (bisection) so that the closings' expected share of employment is ``employment_share``."""
    def share(beta: float) -> float:
        weights = (1.0 + level) ** -beta
        return float(count * (weights * level).sum() / weights.sum() / max(level.sum(), 1.0))

    low, high = 0.0, 4.0
    for _ in range(40):
        low, high = ((low + high) / 2, high) if share((low + high) / 2) > employment_share else (low, (low + high) / 2)
    weights = (1.0 + level) ** -((low + high) / 2)
    closed = np.zeros(len(level), dtype=bool)
    closed[rng.choice(len(level), size=count, replace=False, p=weights / weights.sum())] = True
    return closed


def _sizes(mean: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Employment of ``count`` new establishments: whole numbers >= 1, log-normal (sd 0.8) of about ``mean``."""
    return np.maximum(np.rint(mean * np.exp(0.8 * rng.standard_normal(count) - 0.32)), 1.0)


def _changes(level: np.ndarray, target: float, cap: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
    """Whole-number changes of establishments at ``level`` summing to about ``target``: proportional
    to (level + 1) times a log-normal draw, scaled (bisection), at least 1 and at most ``cap``."""
    if len(level) == 0:
        return level
    raw = (level + 1.0) * np.exp(0.8 * rng.standard_normal(len(level)))
    upper = np.inf if cap is None else cap

    def scaled(k: float) -> np.ndarray:
        return np.minimum(np.maximum(np.rint(k * raw), 1.0), upper)

    low, high = 0.0, 1.0
    while scaled(high).sum() < target and high < 1e6:
        high *= 2
    for _ in range(50):
        low, high = ((low + high) / 2, high) if scaled((low + high) / 2).sum() < target else (low, (low + high) / 2)
    return scaled(high)


def _move(frame: pd.DataFrame, month3: np.ndarray, continuing: int, quarter: tuple[int, int], dynamics: Dynamics,
          rng: np.random.Generator) -> None:
    """Set a quarter's months and wages in ``frame`` (its first ``continuing`` rows carry the last
    quarter's values, the rest are openings): month 1 a third of the way from last quarter's month
    3, month 2 by the synthesizer's month-2 rule; wages per employee grow by ``wage_growth`` with
    the establishment's own variation (openings take their parent's)."""
    before = frame["m3emp"].to_numpy(dtype=float).copy()
    before[continuing:] = month3[continuing:]
    employment = (frame[["m1emp", "m2emp", "m3emp"]].to_numpy(dtype=float)).mean(axis=1)
    per_employee = np.divide(frame["wage"].to_numpy(dtype=float), employment, out=np.zeros(len(frame)),
                             where=employment > 0)
    per_employee[employment == 0] = np.median(per_employee[employment > 0])
    m1 = np.rint(before + (month3 - before) / 3)
    m2 = month2_employment(m1, month3, rng=rng)
    own = dynamics.wage_sd * rng.standard_normal(len(frame)) - dynamics.wage_sd ** 2 / 2
    growth = np.exp(dynamics.wage_growth + own)
    frame["year"], frame["qtr"] = quarter
    frame["m1emp"], frame["m2emp"], frame["m3emp"] = m1, m2, month3
    frame["wage"] = np.rint((m1 + m2 + month3) / 3 * per_employee * growth)


def grown_panel(first: pd.DataFrame, quarters: str, *, rng: np.random.Generator) -> pd.DataFrame:
    """``synthesize_panel`` over the quarters "FIRST:LAST" (``quarter_range``) from a synthetic
    quarter whose year and quarter must be FIRST (a profile's or a QCEW file's)."""
    wanted = quarter_range(quarters)
    have = panel_quarters(first)
    if have != wanted[:1]:
        shown = ", ".join(quarter_label(*q) for q in have) or "none"
        raise InputError(f"--quarters {quarters} must start at the synthetic quarter's own quarter ({shown})")
    return synthesize_panel(first, wanted, rng=rng)
