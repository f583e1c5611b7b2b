"""The account rule: the text of an establishment's lifetime account in the ledger (``gedp.accounting.ledger``).

One rule, on Arrow text and without pandas (the first check of a CSV file runs before the numerical
stack is imported): the ledger keys accounts by it, and the validation of microdata and the first
check of a CSV file compare ids by it, so that two rows of one input are never one account.
"""

from __future__ import annotations

from typing import Any

from gedp.errors import InputError

#: Text of a number with a sign, a point or an exponent ("+12", "1e0", "1.2E+05", "-3"): an id read
#: by the rule of numbers.
NUMBER_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
#: Most digits of an id written as a number with an exponent ("1e400" is refused, not expanded).
MAX_ID_DIGITS = 64
#: The rule of ids in a ledger's accounts, as messages state it.
ACCOUNT_ID_RULE = ("ids must be ASCII text after NFKC normalization, without control, invisible, format or "
                   "non-ASCII space characters")
#: The rule of ids written as numbers, as messages state it.
NUMBER_ID_RULE = (f"an id written as a number must have at most {MAX_ID_DIGITS} digits before and "
                  f"{MAX_ID_DIGITS} after its point once its exponent is written out")
#: The rule of unique ids, as messages state it: ids are compared as the ledger's accounts are.
UNIQUE_RULE = ("ids must be unique, compared as the ledger's accounts (blanks trimmed, upper case, leading zeros "
               "dropped, numbers by value)")
#: Unicode categories refused in an account's id: control characters (Cc: NUL, tab, escape, DEL),
#: format characters (Cf: zero-width space, byte-order mark), line and paragraph separators (Zl, Zp),
#: private use (Co), surrogates (Cs) and unassigned code points (Cn); and the spaces (Zs) other than
#: the ASCII space.
INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
#: The ASCII control characters (category Cc), found in Arrow before any id is looked at in Python.
ASCII_CONTROL = r"[\x00-\x1f\x7f]"


def account_text(text: Any, refuse: bool = True) -> Any:
    """Ids (Arrow text, of establishments' canonical ids: ``gedp.synth.schema.canonical_ids``) as the
    text of their account: NFKC-normalized (fullwidth digits are digits), trimmed of white space,
    upper-cased, text that is a number (sign, point, exponent) written as its value in plain decimal
    (``_number_id``: "+1", "1e0", "1.0E+00" are "1"; "-1e0" is "-1"; "1.50", "1.5" and "15E-1" are
    "1.5"), and leading zeros dropped. A normalization that can only merge two accounts, never split
    one: ids of one value are one account however a program wrote them.

    Refused (``refuse``), naming the row but never the value: a character of an ``INVISIBLE``
    category, a space other than the ASCII space, anything non-ASCII after normalization
    (``ACCOUNT_ID_RULE``), and a number of more than MAX_ID_DIGITS digits before or after its point
    (``NUMBER_ID_RULE``). Unrefused (the checks of unique ids, which hold no accounts),
    such an id is kept as normalized."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.cast(text, pa.large_string())
    if refuse:
        _refuse_first(pc.match_substring_regex(text, ASCII_CONTROL))
    if not pc.all(pc.string_is_ascii(text)).as_py():
        text = _ascii_ids(text, refuse)
    text = pc.utf8_upper(pc.utf8_trim_whitespace(text))
    numeric = pc.match_substring_regex(text, NUMBER_TEXT)
    if pc.any(pc.and_(numeric, pc.invert(pc.match_substring_regex(text, "^[0-9]+$")))).as_py():
        values = text.to_pylist()
        for row in pc.indices_nonzero(numeric).to_pylist():
            values[row] = _number_id(values[row], row, refuse)
        text = pa.array(values, type=pa.large_string())
    return pc.utf8_ltrim(text, characters="0")


def _refuse_first(bad: Any) -> None:
    """Refuse the ids where ``bad`` (Arrow booleans) is true, naming the first one's row."""
    import pyarrow.compute as pc

    rows = pc.indices_nonzero(pc.fill_null(bad, False))
    if len(rows):
        raise InputError(f"column 'estab_id': {ACCOUNT_ID_RULE}; first at row {rows[0].as_py() + 1}")


def _ascii_ids(text: Any, refuse: bool) -> Any:
    """Ids with non-ASCII characters NFKC-normalized; with ``refuse``, refused if any holds a character
    of an ``INVISIBLE`` category or a non-ASCII space, or stays non-ASCII."""
    import unicodedata

    import pyarrow as pa

    values = text.to_pylist()
    for row, value in enumerate(values):
        if value is None or value.isascii():
            continue
        hidden = any(unicodedata.category(c) in INVISIBLE or unicodedata.category(c) == "Zs" and c != " "
                     for c in value)
        value = unicodedata.normalize("NFKC", value)
        if refuse and (hidden or not value.isascii()):
            raise InputError(f"column 'estab_id': {ACCOUNT_ID_RULE}; first at row {row + 1}")
        values[row] = value
    return pa.array(values, type=pa.large_string())


def _number_id(value: str, row: int, refuse: bool) -> str:
    """An id written as a number, as its value in plain decimal: no sign "+", no exponent, no
    trailing zeros after its point, no point after a whole number ("1.50", "+15E-1" are "1.5"). One
    of more than MAX_ID_DIGITS digits before or after its point ("1e400") is refused, or with
    ``refuse`` false kept as written."""
    from decimal import Context, Decimal

    number = Decimal(value)
    if not number:
        return "0"
    if not -MAX_ID_DIGITS <= number.adjusted() < MAX_ID_DIGITS:
        if not refuse:
            return value
        raise InputError(f"column 'estab_id': {NUMBER_ID_RULE}; first at row {row + 1}")
    return format(number.normalize(Context(prec=len(value))), "f")  # every digit kept: no rounding
