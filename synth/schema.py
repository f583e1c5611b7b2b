"""Establishment microdata schema (SPEC section 2) and its validation, done once on entry."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from synth.hierarchy import derive_industry_codes

#: Confidential numeric attributes, all >= 0.
CONFIDENTIAL = ("m1emp", "m2emp", "m3emp", "wage")
#: Public code columns and their exact number of digits.
CODE_WIDTHS = {"state": 2, "county": 3, "naics": 6}
#: Own code written when the input has no ``own`` column (QCEW private ownership).
PRIVATE_OWN = "5"
#: Public columns derived from ``naics``.
DERIVED = ("naics5", "naics4", "naics3", "sector", "supersector", "domain")
#: Largest confidential value accepted: far above any establishment's quarterly wages, far below
#: where the squares in the variance formulas would overflow.
MAX_VALUE = 1e13
#: QCEW extras carried through unchanged when present.
CARRIED = ("year", "qtr")
#: Every public column of validated microdata, in output order.
PUBLIC = ("estab_id", "state", "county", "own", "naics", *DERIVED)


class InputError(ValueError):
    """Input data or configuration that the tool refuses (reported in one line, exit status 2)."""


def _refuse(column: str, bad: np.ndarray, frame: pd.DataFrame, rule: str) -> None:
    """Raise an InputError naming the column, the count of offending rows and one example."""
    count = int(bad.sum())
    if count == 0:
        return
    first = int(np.flatnonzero(bad)[0])
    example = frame[column].iloc[first]
    example = example.item() if isinstance(example, np.generic) else example
    where = f"row {first + 1}"
    if "estab_id" in frame.columns and column != "estab_id":
        where += f" (estab_id {frame['estab_id'].iloc[first]})"
    noun = "row" if count == 1 else "rows"
    raise InputError(f"column '{column}': {count} {noun} {rule}; e.g. {where}: {example!r}")


def normalize_code(frame: pd.DataFrame, column: str, width: int) -> pd.Series:
    """Codes as strings of exactly ``width`` digits; whole numbers are zero-padded (FIPS stored as int)."""
    raw = frame[column]
    if pd.api.types.is_integer_dtype(raw):
        text = raw.astype("int64").astype(str).str.zfill(width)
        text = text.where(raw >= 0, raw.astype(str))
    else:
        text = raw.astype("string").str.strip()
    malformed = ~text.str.fullmatch(rf"\d{{{width}}}").fillna(False).to_numpy(dtype=bool)
    _refuse(column, malformed, frame, f"are not {width}-digit codes")
    return text.astype(str)


def _numeric_nonnegative(frame: pd.DataFrame, column: str) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    _refuse(column, ~np.isfinite(values), frame, "are missing, not numbers, or not finite")
    _refuse(column, values < 0, frame, "are negative (confidential values must be >= 0)")
    _refuse(column, values > MAX_VALUE, frame, f"exceed {MAX_VALUE:.0e} (implausible for one establishment)")
    return values


def validate_microdata(frame: pd.DataFrame, attributes: Sequence[str] = CONFIDENTIAL) -> pd.DataFrame:
    """Check establishment microdata and return it in canonical form.

    Canonical form: the public columns of ``PUBLIC`` as strings (derived industry codes added), the
    requested confidential ``attributes`` as float64, and ``year``/``qtr`` when present.

    Raises:
        InputError: no rows, a missing column, duplicate or missing ``estab_id``, a malformed code, an
            unknown NAICS sector, or a confidential value that is not a finite number >= 0.
    """
    if len(frame) == 0:
        raise InputError("input has zero establishments (no data rows)")
    required = ["estab_id", *CODE_WIDTHS, *attributes]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(
            f"missing column{'s' if len(missing) > 1 else ''} {', '.join(repr(c) for c in missing)}; "
            f"required: {', '.join(required)}"
        )
    frame = frame.reset_index(drop=True)
    ids = frame["estab_id"]
    _refuse("estab_id", ids.isna().to_numpy(), frame, "are missing")
    ids = ids.astype(str)
    _refuse("estab_id", ids.duplicated(keep="first").to_numpy(), frame.assign(estab_id=ids), "repeat an earlier estab_id")

    out = pd.DataFrame({"estab_id": ids})
    for column, width in CODE_WIDTHS.items():
        out[column] = normalize_code(frame, column, width)
    if "own" in frame.columns:
        own = frame["own"].astype("string").str.strip()
        _refuse("own", ~own.str.fullmatch(r"\d").fillna(False).to_numpy(dtype=bool), frame, "are not 1-digit ownership codes")
        out["own"] = own.astype(str)
    else:
        out["own"] = PRIVATE_OWN
    industry = derive_industry_codes(out["naics"])
    _refuse("naics", industry["supersector"].isna().to_numpy(), out, "are in no private NAICS sector")
    out = pd.concat([out, industry], axis=1)
    for column in CARRIED:
        if column in frame.columns:
            out[column] = frame[column].to_numpy()
    for column in attributes:
        out[column] = _numeric_nonnegative(frame, column)
    return out


def public_columns(microdata: pd.DataFrame) -> list[str]:
    """The public columns present in validated microdata (everything a release may show exactly)."""
    return [c for c in (*PUBLIC, *CARRIED) if c in microdata.columns]
