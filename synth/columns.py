"""The column names and code widths of establishment microdata: plain constants, importable before
the numerical stack (the input's first check, ``gedp.synth.intake``, runs without pandas), and how
messages count rows."""

from __future__ import annotations

import re

#: Confidential numeric attributes, all >= 0.
CONFIDENTIAL = ("m1emp", "m2emp", "m3emp", "wage")
#: Public code columns and their exact number of digits.
CODE_WIDTHS = {"state": 2, "county": 3, "naics": 6}
#: Optional QCEW columns carried through as whole numbers: the smallest and largest value, and the rule.
CARRIED = {"year": (1900, 2100, "values must be years 1900-2100"), "qtr": (1, 4, "values must be quarters 1-4")}


#: A header field that is a number (a code, an id, a value): the first line of a file without a header.
_NUMBER = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")


def data_like_fields(names: list[str]) -> list[int]:
    """The positions (1 = first) of header fields that are numbers: column names never are, the
    values of a file without a header line are (its codes, ids and values)."""
    return [position for position, name in enumerate(names, start=1) if _NUMBER.fullmatch(name)]


def headerless_rule(fields: list[int]) -> str:
    """The message for a first line that looks like data, naming field positions, never their text."""
    shown = ", ".join(str(f) for f in fields[:5]) + (" ..." if len(fields) > 5 else "")
    return (f"its first line looks like a row of data, not a header (field{'s' if len(fields) > 1 else ''} {shown} "
            f"{'are numbers' if len(fields) > 1 else 'is a number'}); hint: add a header line with the column names "
            "(estab_id, state, county, naics, ...)")


def count(n: int, noun: str) -> str:
    """``n`` and the noun, singular or plural: "1 row", "1,648 rows" (nouns taking an s)."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
