"""NAICS and geography hierarchy of the QCEW: sectors, supersectors, domains, aggregation levels."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from gedp.synth.keycodes import digit_bytes, prefix_text, taken_text

#: Two-digit NAICS prefixes that BLS publishes as one sector.
MERGED_SECTORS = {
    "31": "31-33", "32": "31-33", "33": "31-33",
    "44": "44-45", "45": "44-45",
    "48": "48-49", "49": "48-49",
}

#: BLS supersector of every private NAICS sector.
SUPERSECTOR_OF_SECTOR = {
    "11": "1011", "21": "1011",
    "23": "1012",
    "31-33": "1013",
    "22": "1021", "42": "1021", "44-45": "1021", "48-49": "1021",
    "51": "1022",
    "52": "1023", "53": "1023",
    "54": "1024", "55": "1024", "56": "1024",
    "61": "1025", "62": "1025",
    "71": "1026", "72": "1026",
    "81": "1027",
    "99": "1029",
}

#: Goods-producing supersectors form domain 101; every other supersector is in 102.
GOODS_SUPERSECTORS = frozenset({"1011", "1012", "1013"})

#: Industry column tabulated at each QCEW aggregation level (state 51-58; county 71-78 = state + 20).
INDUSTRY_OF_STATE_LEVEL = {
    51: None, 52: "domain", 53: "supersector", 54: "sector",
    55: "naics3", 56: "naics4", 57: "naics5", 58: "naics",
}
STATE_LEVELS = tuple(INDUSTRY_OF_STATE_LEVEL)
COUNTY_LEVELS = tuple(level + 20 for level in STATE_LEVELS)
#: The industry code BLS writes for "all industries".
ALL_INDUSTRIES = "10"


def derive_industry_codes(naics: pd.Series) -> pd.DataFrame:
    """Every coarser industry code of six-digit NAICS codes.

    Returns columns naics5, naics4, naics3, sector, supersector and domain, aligned with ``naics``.
    Sectors outside SUPERSECTOR_OF_SECTOR map to missing supersector and domain (the caller validates).
    Arrow text of six digits (normalized codes) is cut as bytes: the prefixes are built from them and
    the sector codes taken by the two-digit prefix. Other columns are derived once per distinct
    NAICS code (a state has about a thousand) and taken back to the rows.
    """
    digits = digit_bytes(naics, 6)
    if digits is None:
        positions, distinct = pd.factorize(naics.astype(str))
        coarser = _coarser_codes(pd.Series(distinct))
        return pd.DataFrame({column: pd.Series(coarser[column].array.take(positions, allow_fill=True),
                                               index=naics.index) for column in coarser.columns})
    prefixes = {f"naics{width}": prefix_text(digits, width) for width in (5, 4, 3)}
    two_digits = (digits[:, 0].astype(np.intp) - ord("0")) * 10 + (digits[:, 1] - ord("0"))
    by_two_digits = _two_digit_codes()
    sectors = {column: taken_text(by_two_digits[column], two_digits) for column in ("sector", "supersector", "domain")}
    return pd.DataFrame({**prefixes, **sectors}, index=naics.index)


@functools.lru_cache(maxsize=1)
def _two_digit_codes() -> pd.DataFrame:
    """``_coarser_codes`` of the 100 two-digit codes 00-99, made once (read, never changed, by
    ``derive_industry_codes``: 1.5 ms a call, a sixth of validating 30 establishments)."""
    return _coarser_codes(pd.Series([f"{number:02d}" for number in range(100)], dtype="str"))


def _coarser_codes(codes: pd.Series) -> pd.DataFrame:
    """``derive_industry_codes`` of distinct text codes: prefixes, and the sector's supersector and domain."""
    out = pd.DataFrame({"naics5": codes.str[:5], "naics4": codes.str[:4], "naics3": codes.str[:3]})
    sectors = [MERGED_SECTORS.get(c, c) for c in codes.str[:2]]
    supersectors = [SUPERSECTOR_OF_SECTOR.get(sector) for sector in sectors]
    out["sector"] = pd.array(sectors, dtype="str")
    out["supersector"] = pd.array(supersectors, dtype="str")
    out["domain"] = pd.array([None if supersector is None else "101" if supersector in GOODS_SUPERSECTORS else "102"
                              for supersector in supersectors], dtype="str")
    return out
