"""Establishment microdata schema (SPEC section 2) and its validation, done once on entry."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gedp.errors import InputError
from gedp.synth.accounts import UNIQUE_RULE, account_text
from gedp.synth.columns import CARRIED, CODE_WIDTHS, CONFIDENTIAL
from gedp.synth.csv_values import may_hold_point
from gedp.synth.hierarchy import derive_industry_codes
from gedp.synth.keycodes import digit_bytes

#: Own code written when the input has no ``own`` column (QCEW private ownership).
PRIVATE_OWN = "5"
#: Public columns derived from ``naics``.
DERIVED = ("naics5", "naics4", "naics3", "sector", "supersector", "domain")
#: Largest confidential value accepted: far above any establishment's quarterly wages, far below
#: where the squares in the variance formulas would overflow.
MAX_VALUE = 1e13
#: Every public column of validated microdata, in output order.
PUBLIC = ("estab_id", "state", "county", "own", "naics", *DERIVED)
#: Longest text shown of a value in a message (a key, a config value, an estab_id).
SHOWN_CHARACTERS = 40




def shown(value: object) -> str:
    """repr(value) cut to SHOWN_CHARACTERS, so that no message grows with its input."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "..."


def _refuse(column: str, bad: np.ndarray, frame: pd.DataFrame, rule: str) -> None:
    """Raise an InputError naming the column, the rule and the first offending row (its number and
    estab_id): never a value or a count, which may be confidential."""
    if not bad.any():
        return
    first = int(np.argmax(bad))
    where = f"row {first + 1}"
    if "estab_id" in frame.columns:
        where += f" (estab_id {str(frame['estab_id'].iloc[first])[:SHOWN_CHARACTERS]})"
    raise InputError(f"column '{column}': {rule}; first at {where}")


def normalize_code(frame: pd.DataFrame, column: str, width: int) -> pd.Series:
    """Codes as strings of exactly ``width`` ASCII digits; text is stripped of surrounding blanks and
    whole numbers are zero-padded (FIPS stored as int). The one normalization of codes in gedp.

    Arrow text already of ``width`` digits is its own answer (checked on its bytes); other text and
    whole-number columns are normalized once per distinct value (a column of millions of rows holds
    a few thousand codes at most); other columns value by value."""
    raw = frame[column]
    if digit_bytes(raw, width) is not None:  # already normalized: every value is its own text
        return raw.astype(str)
    if pd.api.types.is_integer_dtype(raw) or pd.api.types.is_string_dtype(raw) and raw.dtype != object:
        positions, distinct = pd.factorize(raw, use_na_sentinel=False)
        text, malformed = code_text(pd.Series(distinct, name=column), width)
        text, malformed = text.take(positions).set_axis(raw.index), malformed[positions]
    else:
        text, malformed = code_text(raw, width)
    _refuse(column, malformed, frame, f"codes must be {width} ASCII digit{'s' if width > 1 else ''}")
    return text.astype(str)


def code_text(raw: pd.Series, width: int) -> tuple[pd.Series, np.ndarray]:
    """Codes as text (stripped; whole numbers zero-padded to ``width``) and which are not ``width`` digits."""
    if pd.api.types.is_integer_dtype(raw):
        text = raw.astype("int64").astype(str).str.zfill(width)
        text = text.where(raw >= 0, raw.astype(str))
    else:
        text = raw.astype("string").str.strip()
    return text, ~text.str.fullmatch(f"[0-9]{{{width}}}").fillna(False).to_numpy(dtype=bool)


def whole_numbers(frame: pd.DataFrame, column: str, low: int, high: int, rule: str) -> np.ndarray:
    """Whole numbers in [low, high] as int64: numbers, or text of ASCII digits (blanks stripped)."""
    raw = frame[column]
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        values = raw.to_numpy(dtype=float, na_value=np.nan)
    else:
        text = raw.astype("string").str.strip()
        digits = text.where(text.str.fullmatch("[0-9]{1,9}").fillna(False))
        values = pd.to_numeric(digits, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        good = (values >= low) & (values <= high) & (values == np.floor(values))
    _refuse(column, ~good, frame, rule)
    return values.astype(np.int64)


def _numeric_nonnegative(frame: pd.DataFrame, column: str) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    _refuse(column, ~np.isfinite(values), frame, "values must be finite numbers")
    _refuse(column, values < 0, frame, "values must be >= 0")
    _refuse(column, values > MAX_VALUE, frame, f"values must be <= {MAX_VALUE:.0e}")
    return values


def required_columns(attributes: Sequence[str]) -> list[str]:
    """The columns microdata must have to measure ``attributes``."""
    return ["estab_id", *CODE_WIDTHS, *attributes]


def check_columns(columns: Sequence[object], attributes: Sequence[str], required: Sequence[str] | None = None) -> None:
    """Refuse a column name given twice (a reader would keep one silently) or a required one missing
    (``required``, by default the microdata columns needed for ``attributes``)."""
    names = [str(c) for c in columns]
    repeated = next((c for i, c in enumerate(names) if c in names[:i]), None)
    if repeated is not None:
        raise InputError(f"column {shown(repeated)} appears more than once")
    required = required_columns(attributes) if required is None else list(required)
    missing = [c for c in required if c not in names]
    if missing:
        raise InputError(
            f"missing column{'s' if len(missing) > 1 else ''} {', '.join(repr(c) for c in missing)}; "
            f"required: {', '.join(required)}"
        )


def estab_ids(frame: pd.DataFrame, unique_checked: bool = False) -> pd.Series:
    """The estab_id column as canonical text (``canonical_ids``), refused if one is missing or
    (unless ``unique_checked``: the caller checked them over rows that include these) repeats an
    earlier one."""
    ids = frame["estab_id"]
    _refuse("estab_id", ids.isna().to_numpy(), frame.drop(columns="estab_id"), "values must not be missing")
    ids = canonical_ids(ids)
    _refuse("estab_id", (ids.str.len() > MAX_ID_CHARS).to_numpy(), frame.assign(estab_id=ids),
            f"ids must be at most {MAX_ID_CHARS} characters (a release's readers refuse longer keys)")
    if not unique_checked:
        _check_unique(ids)
    return ids


def _check_unique(ids: pd.Series) -> None:
    """Refuse two ids of one lifetime account (``account_ids``: ``1002`` and ``01002``, ``A1`` and
    `` a1 ``), with or without a ledger: a release would measure the establishment twice while its
    account is charged once. The message names the two rows, never their ids."""
    accounts = account_ids(ids, refuse=False)
    if not _any_repeat(accounts):
        return
    texts = pd.Series(accounts.to_numpy(zero_copy_only=False))
    later = int(np.argmax(texts.duplicated(keep="first").to_numpy()))
    earlier = int(np.argmax((texts == texts.iloc[later]).to_numpy()))
    raise InputError(f"column 'estab_id': {UNIQUE_RULE}; row {later + 1} is the establishment of row {earlier + 1}")


#: Text of a whole number written with a decimal point ("1002.0", " 17.00 "), as spreadsheets and
#: floating-point columns write ids: its digits are the id.
WHOLE_NUMBER_TEXT = r"^\s*([0-9]+)\.0*\s*$"
#: Largest whole number a float64 holds exactly: a floating-point id beyond it may be another id rounded.
EXACT_FLOAT_INTEGER = 2**53
#: The rule of establishment ids, as messages state it.
ID_RULE = "ids must be text or whole numbers"
#: The longest establishment id: a release's measurements are keyed by it, and its readers refuse a
#: longer key (``gedp.release.measurement_checks.MAX_KEY_CHARS``) as an edited copy's.
MAX_ID_CHARS = 64


def canonical_ids(ids: pd.Series) -> pd.Series:
    """Establishment ids as canonical text, the one form of an establishment's id in gedp (in a
    release and in the ledger's keys), whatever the column's type:

    * text stays as it is, except text of a whole number written with a decimal point, "1002.0" or
      "1002.00", which is its digits, "1002" (``WHOLE_NUMBER_TEXT``);
    * integers are their decimal digits;
    * floating-point and decimal numbers must be whole (floats below 2**53, where every whole number
      is exact) and are their integer's digits: 1002.0 is "1002";
    * binary values must be UTF-8 text, then read as text.

    Anything else (booleans, dates, non-whole numbers, a mix of types) is refused, naming the first
    offending row, never its value. Missing ids are left to the caller (``estab_ids``)."""
    if pd.api.types.is_integer_dtype(ids) and not pd.api.types.is_bool_dtype(ids):
        return ids.astype(str)
    if not isinstance(ids.dtype, pd.StringDtype):
        ids = _as_series(_arrow_id_text(ids), ids)
    text = pa.array(ids)
    if may_hold_point(text):  # the usual ids hold no point: nothing to rewrite
        text = pc.replace_substring_regex(text, WHOLE_NUMBER_TEXT, r"\1")
        ids = _as_series(text, ids)
    return ids.astype(str)


def _as_series(text: pa.Array | pa.ChunkedArray, like: pd.Series) -> pd.Series:
    """Arrow text as a pandas Series with the index and name of ``like``, row for row."""
    return text.to_pandas().set_axis(like.index).rename(like.name)


def _arrow_id_text(ids: pd.Series) -> pa.Array:
    """Ids of a column that is not text nor integers as Arrow text (see ``canonical_ids``)."""
    frame = pd.DataFrame({"row": np.arange(len(ids))})
    try:
        values = pa.array(ids, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise InputError(f"column 'estab_id': {ID_RULE}, not a mix of types (e.g. numbers and text in one "
                         "column); write every id as text") from None
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    kind = values.type
    if pa.types.is_floating(kind):
        numbers = ids.to_numpy(dtype=float, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            bad = ~((numbers == np.floor(numbers)) & (np.abs(numbers) < EXACT_FLOAT_INTEGER)) & ~np.isnan(numbers)
        _refuse("estab_id", bad, frame, f"{ID_RULE}: floating-point ids must be whole numbers below 2**53 "
                "(write ids as text or integers)")
        return pc.cast(pc.cast(values, pa.int64()), pa.string())
    if pa.types.is_decimal(kind):
        whole = pc.equal(pc.round(values, 0), values).to_numpy(zero_copy_only=False)
        _refuse("estab_id", ~pd.Series(whole).fillna(True).to_numpy(dtype=bool), frame,
                f"{ID_RULE}: decimal ids must be whole numbers")
        return pc.cast(values, pa.string())  # "1002.00": its digits by WHOLE_NUMBER_TEXT
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        try:
            return pc.cast(values, pa.large_string())
        except pa.ArrowInvalid:
            bad = np.array([not _utf8(v) for v in values.to_pylist()])
            _refuse("estab_id", bad, frame, f"{ID_RULE}: binary ids must be UTF-8 text")
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind) or \
            pa.types.is_null(kind):
        return pc.cast(values, pa.large_string())
    raise InputError(f"column 'estab_id': {ID_RULE}, not {_type_name(kind)}; write every id as text")


def _utf8(value: bytes | None) -> bool:
    """Whether a binary id is UTF-8 text (a missing one is left to the caller)."""
    try:
        value is None or value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _type_name(kind: pa.DataType) -> str:
    """How a message names an Arrow type: booleans, dates and times, or the type itself."""
    if pa.types.is_boolean(kind):
        return "booleans"
    if pa.types.is_temporal(kind):
        return "dates or times"
    return str(kind)


def _any_repeat(texts: pd.Series | pa.Array) -> bool:
    """Whether a text repeats: sorted in Arrow and neighbours compared, which takes a few seconds and
    a fraction of the memory of a hash table for the millions of ids of a national input."""
    values = pa.array(texts)  # no copy for pandas' Arrow-backed text
    ordered = pc.take(values, pc.sort_indices(values))
    return len(ordered) > 1 and pc.any(pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))).as_py()


def validate_microdata(frame: pd.DataFrame, attributes: Sequence[str] = CONFIDENTIAL,
                       unique_ids_checked: bool = False) -> pd.DataFrame:
    """Check establishment microdata and return it in canonical form (``unique_ids_checked``: the
    estab_ids were checked unique over rows that include these, e.g. a whole input split by state).

    Canonical form: the public columns of ``PUBLIC`` as strings (derived industry codes added), the
    requested confidential ``attributes`` as float64, and ``year``/``qtr`` as int64 when present.

    Raises:
        InputError: no rows, a missing or repeated column, a missing or repeated ``estab_id``, a
            malformed code, year or quarter, an unknown NAICS sector, or a confidential value that is
            not a finite number in [0, MAX_VALUE].
    """
    if len(frame) == 0:
        raise InputError("input has zero establishments (no data rows)")
    check_columns(frame.columns, attributes)
    frame = frame.reset_index(drop=True)
    out = pd.concat([pd.DataFrame({"estab_id": estab_ids(frame, unique_ids_checked)}), canonical_codes(frame)],
                    axis=1)
    for column, (low, high, rule) in CARRIED.items():
        if column in frame.columns:
            out[column] = whole_numbers(frame, column, low, high, rule)
    for column in attributes:
        out[column] = _numeric_nonnegative(frame, column)
    return out


def canonical_codes(frame: pd.DataFrame) -> pd.DataFrame:
    """The public codes of microdata (``frame``, index 0..n-1) in canonical form: ``CODE_WIDTHS``' codes
    and ``own`` normalized, the industry codes derived from ``naics`` (``validate_microdata``'s codes);
    InputError naming the column and the first row of a malformed code or an unknown NAICS sector."""
    out = pd.DataFrame({column: normalize_code(frame, column, width) for column, width in CODE_WIDTHS.items()})
    out["own"] = normalize_code(frame, "own", 1) if "own" in frame.columns else PRIVATE_OWN
    industry = derive_industry_codes(out["naics"])
    _refuse("naics", industry["supersector"].isna().to_numpy(), frame, "codes must be in a private NAICS sector")
    return pd.concat([out, industry], axis=1)


def public_columns(microdata: pd.DataFrame) -> list[str]:
    """The public columns present in validated microdata (everything a release may show exactly)."""
    return [c for c in (*PUBLIC, *CARRIED) if c in microdata.columns]


def account_ids(ids: pd.Series, refuse: bool = True) -> pa.Array:
    """Establishment ids as the text of their lifetime account: their canonical text
    (``canonical_ids``) under the account rule (``gedp.synth.accounts.account_text``)."""
    return account_text(pa.array(canonical_ids(ids), type=pa.large_string()), refuse)
