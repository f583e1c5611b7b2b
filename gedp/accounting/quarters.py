"""Quarters in the lifetime ledger: labels, and the accounts' spending over a year of quarters.

A quarter is labelled ``YYYYQn`` (``2016Q1``), the label of the input's ``year`` and ``qtr``
columns. A release records, per quarter it covers, the establishments present in it; an
establishment present in k of a release's quarters is charged the composition of k quarters'
charges, sqrt(k) mu (Gaussian: mu^2 add). A release without quarters (an input without ``year`` and
``qtr``) is one unlabelled block, which counts in every year.

The annual cap bounds the spending of every 4 consecutive quarters (a rolling year), not of
calendar years only: the guarantee "any year of an establishment's data costs at most the annual
cap" then holds for every span of a year an attacker may look at, including one that straddles
a new year (with calendar years, spending a year's budget in the fourth quarter and another in the
next first quarter would cost twice the cap over two quarters). For equal quarters both rules admit
the same releases.

The labels are the operator's: the ledger cannot tell which quarter a file's values belong to. It
refuses a quarter that has not begun on the day of the release (``check_begun``), so spending cannot
be moved into years still to come; relabelling past quarters (the same data called 2016 and 2012)
moves spending between the years the annual cap sees but never past the lifetime cap, which binds
whatever the labels: the lifetime cap is the guarantee, the annual cap a planning rule on labels.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from gedp.synth.panel import parse_quarter, quarter_label
from gedp.synth.schema import InputError

#: Quarters in the window of the annual cap.
YEAR = 4


def quarter_index(label: str) -> int:
    """Consecutive quarters have consecutive indexes (``2016Q4`` + 1 = ``2017Q1``)."""
    if not isinstance(label, str):
        raise InputError(f"quarter '{label}' must be YYYYQn: a year, Q, and a quarter 1-4, e.g. 2016Q1")
    year, qtr = parse_quarter(label)
    return year * 4 + qtr - 1


def index_label(index: int) -> str:
    """The label of a quarter index (``quarter_index``'s inverse)."""
    return quarter_label(index // 4, index % 4 + 1)


def row_quarters(year: Iterable, qtr: Iterable) -> pd.Series:
    """The quarter label of every row from its ``year`` and ``qtr`` values (refused when one is not
    a whole year 1900-2100 or a quarter 1-4)."""
    frame = pd.DataFrame({"year": pd.to_numeric(pd.Series(year), errors="coerce"),
                          "qtr": pd.to_numeric(pd.Series(qtr), errors="coerce")})
    bad = ~(frame["year"].between(1900, 2100) & frame["qtr"].isin([1, 2, 3, 4])
            & (frame["year"] % 1 == 0))
    if bad.any():
        row = frame[bad].index[0]
        raise InputError(f"row {row}: year and qtr must be a year 1900-2100 and a quarter 1-4 to label the "
                         "release's quarter in the ledger")
    return frame["year"].astype(int).astype(str).str.zfill(4) + "Q" + frame["qtr"].astype(int).astype(str)


def check_begun(labels: Iterable[str], today: dt.date | None = None) -> None:
    """Refuse a quarter that begins after ``today`` (UTC by default): no file can hold its values yet,
    and recording it would move spending into a year the annual cap has not reached."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    current = today.year * 4 + (today.month - 1) // 3
    future = sorted({label for label in labels if quarter_index(label) > current}, key=quarter_index)
    if future:
        raise InputError(f"quarter {future[0]} has not begun (today is {today.isoformat()}, in "
                         f"{index_label(current)}): the ledger records only quarters that have begun; check "
                         "the input's year and qtr")


def windows(labels: Sequence[str]) -> list[tuple[int, ...]]:
    """The rolling years (4 consecutive quarter indexes) that hold at least one of ``labels``."""
    starts = sorted({quarter_index(label) - shift for label in labels for shift in range(YEAR)})
    return [tuple(range(start, start + YEAR)) for start in starts]


def window_name(window: tuple[int, ...]) -> str:
    """``2016Q2-2017Q1``: how messages name a rolling year."""
    return f"{index_label(window[0])}-{index_label(window[-1])}"


def window_spending(by_quarter: dict[str | None, np.ndarray], window: tuple[int, ...], size: int) -> np.ndarray:
    """Per establishment (``size`` of them): its squared spending in a rolling year (its quarters in
    the window, plus the unlabelled releases, which count in every year)."""
    total = np.zeros(size)
    for label, spent2 in by_quarter.items():
        if label is None or quarter_index(label) in window:
            total = total + spent2
    return total
