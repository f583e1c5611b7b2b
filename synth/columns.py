"""The column names and code widths of establishment microdata: plain constants, importable before
the numerical stack (the input's first check, ``gedp.synth.intake``, runs without pandas), and how
messages count rows."""

from __future__ import annotations

#: Confidential numeric attributes, all >= 0.
CONFIDENTIAL = ("m1emp", "m2emp", "m3emp", "wage")
#: Public code columns and their exact number of digits.
CODE_WIDTHS = {"state": 2, "county": 3, "naics": 6}
#: Optional QCEW columns carried through as whole numbers: the smallest and largest value, and the rule.
CARRIED = {"year": (1900, 2100, "values must be years 1900-2100"), "qtr": (1, 4, "values must be quarters 1-4")}


def count(n: int, noun: str) -> str:
    """``n`` and the noun, singular or plural: "1 row", "1,648 rows" (nouns taking an s)."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
