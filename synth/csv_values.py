"""One streaming pass over a CSV input read as text (``gedp.synth.intake``): every value problem
(numbers with thousands separators or decimal commas, values that are not numbers, negatives, codes
that lost their leading zeros, missing or repeated ids, rows of another width), each with its row
numbers and a hint, never a value; and a pyarrow reading error described without its values.
pyarrow is imported inside the functions (the module loads before the numerical stack)."""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gedp.synth.columns import CODE_WIDTHS
from gedp.synth.input_layout import ALIASES, AREA_COLUMN, PADDED, WHOLE_NUMBER_NOTE, Intake, Problems, column_label

#: Row numbers shown per problem (the count says how many more).
ROWS_SHOWN = 3
#: Bytes read per block by the streaming CSV reader.
BLOCK_BYTES = 1 << 22
NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
THOUSANDS = r"^[+-]?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]*)?$"
DECIMAL_COMMA = r"^[+-]?[0-9]+,[0-9]+$"
NEGATIVE_HINT = "hint: values must be >= 0 (a correction or an adjustment is not an establishment's value)"
#: An id written as a whole number with a decimal point (gedp.synth.schema.WHOLE_NUMBER_TEXT).
WHOLE_NUMBER_ID = r"^\s*[0-9]+\.0*\s*$"


class _RowLog:
    """Row numbers (1 = the first data row) of one problem: the first few and the count."""

    def __init__(self, rule: str) -> None:
        self.rule, self.rows, self.total = rule, [], 0

    def add(self, rows: list[int], total: int) -> None:
        self.rows.extend(rows[: ROWS_SHOWN - len(self.rows)] if len(self.rows) < ROWS_SHOWN else [])
        self.total += total

    def line(self) -> str:
        shown = ", ".join(str(r) for r in self.rows)
        more = f" and {self.total - len(self.rows):,} more" if self.total > len(self.rows) else ""
        return self.rule.format(rows=f"row{'s' if self.total > 1 else ''} {shown}{more}")


def check_csv_values(intake: Intake, attributes: Sequence[str], problems: Problems) -> None:
    """One streaming pass over a CSV file read as text: every value problem, its rows and a hint."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    logs: dict[str, _RowLog] = {}
    used = {name: stored for name, stored in intake.names.items() if name in (*ALIASES, *attributes)}
    wanted = [*used.values(), *([intake.area] if intake.area else []), *([intake.counts] if intake.counts else [])]
    wrong_width: list[int] = []
    ids, whole_number_ids, offset = [], [], 0
    try:
        reader = pacsv.open_csv(
            intake.path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES, encoding="utf8"),
            parse_options=pacsv.ParseOptions(delimiter=intake.delimiter, newlines_in_values=True,
                                             invalid_row_handler=lambda row: wrong_width.append(1) or "skip"),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in wanted},
                                                 include_columns=wanted, strings_can_be_null=False,
                                                 quoted_strings_can_be_null=False))
        for batch in reader:
            _check_batch(batch, intake, used, attributes, offset, logs)
            if "estab_id" in used:
                key, whole_number = _record_keys(batch, used)
                ids.append(key)
                whole_number_ids.append(whole_number)
            offset += batch.num_rows
    except pa.ArrowInvalid as err:
        problems.add(f"it cannot be read as CSV ({read_error(err)}); hint: save it as CSV UTF-8")
        return
    if wrong_width:
        problems.add(_wrong_widths(intake))
    if ids:
        _check_repeats(pa.chunked_array(ids).combine_chunks(), used["estab_id"], logs)
    if any(whole_number_ids):
        intake.notes.append(WHOLE_NUMBER_NOTE.format(name=column_label(used["estab_id"], "estab_id"),
                                                     how="written with a decimal point"))
    for log in logs.values():
        problems.add(log.line())


def read_error(err: Exception) -> str:
    """Why a reader failed, from its message but never quoting it: Arrow and pandas messages may hold
    the offending value or the whole row, so only what they say about where (row and column numbers)
    and what kind of problem is kept."""
    message = str(err)
    if "UTF8" in message or "UTF-8" in message or isinstance(err, UnicodeDecodeError):
        return "it is not UTF-8 text"
    parts = []
    if found := re.search(r"Expected (\d+) (?:columns|fields)(?: in line (\d+))?, (?:got|saw) (\d+)", message):
        expected, line, got = found.groups()
        parts.append(f"a row{f' (line {line})' if line else ''} has {got} fields, the header {expected}")
    elif "conversion error" in message or "convert" in message or "parse string" in message:
        parts.append("a value is not of its column's type")
    else:
        parts.append("malformed CSV, e.g. an unclosed quote")
    if column := re.search(r"column #(\d+)", message):
        parts.append(f"column {int(column.group(1)) + 1}")
    if row := re.search(r"[Rr]ow #(\d+)", message):
        parts.append(f"row {row.group(1)}")
    return ", ".join(parts)


def _wrong_widths(intake: Intake) -> str:
    """The problem of rows with more or fewer fields than the header, their rows found with the csv module."""
    with intake.path.open(newline="", encoding="utf-8-sig") as file:
        rows = csv.reader(file, delimiter=intake.delimiter)
        width = len(next(rows))
        bad = [number for number, row in enumerate(rows, start=1) if len(row) != width and row]
    log = _RowLog(f"{{rows}} ha{'s' if len(bad) == 1 else 've'} a number of fields other than the header's "
                  f"{width}; hint: an unquoted thousands separator ('1,234') or a '{intake.delimiter}' inside a "
                  "value: remove the separators, or quote such values")
    log.add(bad, len(bad))
    return log.line()


def _log(logs: dict[str, _RowLog], key: str, rule: str, mask: Any, offset: int) -> None:
    """Add the rows where ``mask`` (a pyarrow boolean array of one batch) is true to the problem ``key``."""
    import pyarrow.compute as pc

    total = pc.sum(mask).as_py() or 0
    if total:
        rows = [offset + int(i) + 1 for i in pc.indices_nonzero(mask)[:ROWS_SHOWN].to_pylist()]
        logs.setdefault(key, _RowLog(rule)).add(rows, total)


def _check_batch(batch: Any, intake: Intake, used: Mapping[str, str], attributes: Sequence[str], offset: int,
                 logs: dict[str, _RowLog]) -> None:
    """The value problems of one batch of text columns."""
    import pyarrow.compute as pc

    for column in attributes:  # year and qtr are left to the validation of microdata, which names their rules
        if column in used:
            _check_numbers(pc.ascii_trim_whitespace(batch.column(used[column])), used[column], column,
                           intake.delimiter, offset, logs)
    codes = [(used[c], c, w) for c, w in {**CODE_WIDTHS, "own": 1}.items() if c in used]
    if intake.area is not None:
        codes.append((intake.area, AREA_COLUMN, 5))
    for stored, column, width in codes:
        text = pc.utf8_trim_whitespace(batch.column(stored))
        if _all_codes(text, width):
            continue
        short = pc.match_substring_regex(text, f"^[0-9]{{1,{width - 1}}}$") if column in PADDED else None
        bad = pc.invert(pc.match_substring_regex(text, f"^[0-9]{{{width}}}$"))
        if short is not None and not intake.pad_codes:
            _log(logs, f"{stored}:short", f"{column_label(stored, column)}: codes shorter than {width} digits at "
                 "{rows}; hint: leading zeros were dropped (e.g. by Excel); --pad-codes pads them", short, offset)
        if short is not None:
            bad = pc.and_(bad, pc.invert(short))
        hint = (" (5 digits: state + county? give --columns NAME=area_fips)" if width == 3 else "")
        _log(logs, f"{stored}:bad", f"{column_label(stored, column)}: codes must be {width} ASCII digits; not at "
             f"{{rows}}{hint}", bad, offset)
    if "estab_id" in used:
        empty = pc.match_substring_regex(pc.utf8_trim_whitespace(batch.column(used["estab_id"])), "^$")
        _log(logs, "id:empty", f"{column_label(used['estab_id'], 'estab_id')}: ids missing at {{rows}}", empty, offset)
    if intake.counts is not None:
        other = pc.invert(pc.match_substring_regex(batch.column(intake.counts), r"^\s*1(\.0*)?\s*$"))
        _log(logs, "counts", f"column {intake.counts!r} counts establishments, and is not 1 at {{rows}}: a table "
             "of cells, not establishment microdata? hint: give one row per establishment", other, offset)


def _check_numbers(text: Any, stored: str, column: str, delimiter: str, offset: int, logs: dict[str, _RowLog]) -> None:
    """Problems of a numeric column: thousands separators, decimal commas, non-numbers, negatives."""
    import pyarrow.compute as pc

    name = column_label(stored, column)
    values = _finite_numbers(text)
    if values is not None:  # the usual case: numbers throughout, only negatives to look for
        zeros = pc.subtract(values, values)  # not pa.scalar(0.0): converting a Python value imports pandas
        _log(logs, f"{stored}:negative", f"{name}: negative values at {{rows}}; {NEGATIVE_HINT}",
             pc.less(values, zeros), offset)
        return
    number = pc.match_substring_regex(text, NUMBER)
    thousands = pc.match_substring_regex(text, THOUSANDS)
    _log(logs, f"{stored}:thousands", f"{name}: numbers with thousands separators ('1,234') at {{rows}}; hint: "
         "write plain numbers (in Excel: Format Cells > Number, without the 1000 separator)", thousands, offset)
    rest = pc.and_(pc.invert(number), pc.invert(thousands))
    if delimiter == ";":
        comma = pc.match_substring_regex(text, DECIMAL_COMMA)
        _log(logs, f"{stored}:comma", f"{name}: decimal commas ('12,5') at {{rows}}; hint: write a decimal point",
             pc.and_(comma, rest), offset)
        rest = pc.and_(rest, pc.invert(comma))
    empty = pc.match_substring_regex(text, "^$")
    _log(logs, f"{stored}:empty", f"{name}: values missing at {{rows}}; hint: write 0 where there is none",
         empty, offset)
    _log(logs, f"{stored}:text", f"{name}: values that are not numbers at {{rows}}; hint: plain numbers only "
         "(no currency signs, blanks or text)", pc.and_(rest, pc.invert(empty)), offset)
    negative = pc.and_(number, pc.match_substring_regex(text, r"^-.*[1-9]"))
    _log(logs, f"{stored}:negative", f"{name}: negative values at {{rows}}; {NEGATIVE_HINT}", negative, offset)


def _finite_numbers(text: Any) -> Any:
    """The text as float64 when every value is a finite number (Arrow's cast, far faster than the
    patterns that tell what is wrong), else None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        values = pc.cast(text, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return values if pc.all(pc.is_finite(values)).as_py() is not False else None


def _all_codes(text: Any, width: int) -> bool:
    """Whether every code is exactly ``width`` ASCII digits (the usual case)."""
    import pyarrow.compute as pc

    return pc.all(pc.match_substring_regex(text, f"^[0-9]{{{width}}}$")).as_py() is not False


def may_hold_point(text: Any) -> bool:
    """Whether an Arrow text array (or chunked array) may hold a "." : a scan of its character
    buffers, far faster than a search value by value (a sliced array's buffer may hold more than its
    values, which only costs a closer look)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)):  # e.g. views: inline text
        return bool(pc.any(pc.match_substring(text.cast(pa.large_string()), ".")).as_py())
    chunks = text.chunks if hasattr(text, "chunks") else [text]
    return any(len(chunk) and chunk.buffers()[2] is not None
               and bool((np.frombuffer(chunk.buffers()[2], dtype=np.uint8) == ord(".")).any()) for chunk in chunks)


def _record_keys(batch: Any, used: Mapping[str, str]) -> tuple[Any, bool]:
    """A row's record key: its estab_id as the text of its lifetime account ("1002.0" is "1002", as
    ``gedp.synth.schema.canonical_ids`` reads it, and "01002" and " 1002 " are "1002":
    ``gedp.synth.accounts.account_text``, unrefused), with its year and quarter
    (blanks stripped) when the input has them (a panel holds each establishment once per quarter);
    and whether an id was written as a whole number with a point."""
    import pyarrow.compute as pc

    from gedp.synth.accounts import account_text

    parts = [pc.utf8_trim_whitespace(batch.column(used[name])) for name in ("estab_id", "year", "qtr")
             if name in used]
    whole_number = may_hold_point(parts[0]) and pc.any(pc.match_substring_regex(parts[0], WHOLE_NUMBER_ID)).as_py()
    if whole_number:
        parts[0] = pc.replace_substring_regex(parts[0], WHOLE_NUMBER_ID.replace("[0-9]+", "([0-9]+)"), r"\1")
    parts[0] = account_text(parts[0], refuse=False).cast(parts[0].type)
    key = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "\x1f")
    return key, bool(whole_number)


def _check_repeats(ids: Any, stored: str, logs: dict[str, _RowLog]) -> None:
    """Rows whose record key (``_record_keys``) repeats an earlier row's: keys sorted in Arrow, neighbours compared."""
    import pyarrow.compute as pc

    if len(ids) < 2:
        return
    order = pc.sort_indices(ids)
    ordered = pc.take(ids, order)
    same = pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))
    later = pc.max_element_wise(pc.filter(order.slice(1), same), pc.filter(order.slice(0, len(order) - 1), same))
    repeated = sorted(later.to_pylist())
    if repeated:
        log = logs.setdefault("id:repeat", _RowLog(f"{column_label(stored, 'estab_id')}: ids repeating an earlier "
                                                   "row's at {rows}; hint: each establishment needs its own id (e.g. "
                                                   "the UI account and the reporting unit number together)"))
        log.add([r + 1 for r in repeated], len(repeated))
