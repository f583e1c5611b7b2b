"""The first look at an input file: column names as agencies have them, and every problem at once.

``inspect_input`` runs before pandas, scipy or the solvers are imported (it needs the standard
library and pyarrow, which loads numpy's core). It maps the file's column names to gedp's
(``ALIASES``, or an explicit ``columns`` mapping; two candidates for one column are refused, never
guessed between), detects the delimiter of a CSV file, and reads the file once as text with
pyarrow's streaming CSV reader, collecting every problem (missing columns, numbers written with
thousands separators, values that are not numbers, negative values, codes that lost their leading
zeros, missing or repeated ids), each with its row numbers and a hint. All of them are raised
together as one ``InputProblems``. ``load_input`` then reads an input that needs translating (other
names, delimiter or padded codes) into microdata with gedp's columns; an input already in gedp's
layout is left to the usual readers.

Messages name columns, rules and row numbers, never a value; they go to the operator's terminal only
and are never written into a release or its manifest (nothing is written when input is refused).
"""

from __future__ import annotations

import csv
import difflib
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gedp.errors import InputError, InputProblems
from gedp.synth.columns import CODE_WIDTHS, CONFIDENTIAL, data_like_fields, headerless_rule

#: Names that mean each of gedp's columns (compared in lower case, blanks and hyphens as "_"): BLS
#: open-data names, and the names of agency and UI files. The docs' table is checked against it.
ALIASES: dict[str, tuple[str, ...]] = {
    "estab_id": ("estab_id", "estab", "estabid", "establishment_id", "estab_no", "uiacct", "ui_acct", "ein"),
    "state": ("state", "st", "state_fips", "statefips", "st_fips", "stfips"),
    "county": ("county", "cnty", "county_fips", "countyfips", "cnty_fips", "cntyfips", "cty"),
    "naics": ("naics", "industry_code", "naics_code", "naicscode", "naics6", "naics_6"),
    "own": ("own", "own_code", "owncode", "ownership"),
    "m1emp": ("m1emp", "month1_emplvl", "month1_emp", "mnth1emp", "emp1", "m1_emp"),
    "m2emp": ("m2emp", "month2_emplvl", "month2_emp", "mnth2emp", "emp2", "m2_emp"),
    "m3emp": ("m3emp", "month3_emplvl", "month3_emp", "mnth3emp", "emp3", "m3_emp"),
    "wage": ("wage", "wages", "total_qtrly_wages", "totwage", "tot_wage", "total_wages", "qtrly_wages"),
    "year": ("year", "yr"),
    "qtr": ("qtr", "quarter"),
}
#: A 5-digit state + county code, split into ``state`` and ``county`` when neither is given.
AREA_COLUMN = "area_fips"
AREA_ALIASES = ("area_fips", "fips", "stcofips")
#: Establishment counts of a published table: in microdata every row is one establishment.
COUNT_ALIASES = ("qtrly_estabs", "qtrly_estabs_count", "estabs", "estab_count")
#: Codes whose leading zeros a spreadsheet drops (FIPS codes; NAICS codes never start with 0).
PADDED = ("state", "county", AREA_COLUMN)
#: Similarity (difflib's ratio) from which an unused name is shown as looking like a missing column.
LIKENESS = 0.6
#: Delimiters recognized in a CSV header, comma first.
DELIMITERS = (",", ";", "\t", "|")
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
WHOLE_NUMBER_NOTE = ("{name} holds ids {how}; each is read as its whole number (1002.0 as 1002), the one id of "
                     "that establishment in the release and in the ledger")


class InputNote(UserWarning):
    """Something gedp did to read an input that its operator should know (e.g. ids read as whole numbers)."""


def normalized(name: str) -> str:
    """A column name as compared with the aliases: lower case, blanks and hyphens as underscores."""
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


@dataclass
class Intake:
    """How an input is read: its path, format and delimiter, the stored name of each of gedp's
    columns (``names``: gedp's name -> stored name), the stored 5-digit area column split into state
    and county (``area``), and whether short codes are zero-padded (``pad_codes``)."""

    path: Path
    parquet: bool
    delimiter: str = ","
    names: dict[str, str] = field(default_factory=dict)
    area: str | None = None
    pad_codes: bool = False
    counts: str | None = None
    notes: list[str] = field(default_factory=list)

    def needs_translation(self) -> bool:
        """Whether the usual readers cannot read the input as it is."""
        renamed = any(stored != name for name, stored in self.names.items())
        return renamed or self.area is not None or self.delimiter != "," or self.pad_codes


class Problems:
    """Problems found in an input, each one line with its hint; raised together."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def raise_any(self) -> None:
        if self.lines:
            raise InputProblems(self.subject, self.lines)


def parse_columns(text: str | None) -> dict[str, str]:
    """``--columns old=new,old2=new2`` as a mapping of stored name -> gedp's name."""
    if not text:
        return {}
    mapping = {}
    for item in text.split(","):
        stored, equals, name = item.partition("=")
        if not equals or not stored.strip() or not name.strip():
            raise InputError(f"--columns item {item.strip()!r} must be STORED_NAME=GEDP_NAME")
        mapping[stored.strip()] = name.strip()
    return mapping


def configured_attributes(config: str | Path) -> tuple[str, ...]:
    """The attributes a config file or shipped config measures, read from its YAML alone (the full
    check of the config comes later); all four when it cannot be read here."""
    import yaml

    from gedp.configs import path as shipped

    try:
        source = Path(config) if Path(config).suffix.lower() in (".yaml", ".yml") else shipped(str(config))
        attributes = yaml.safe_load(source.read_text(encoding="utf-8"))["attributes"]
        chosen = tuple(a for a in CONFIDENTIAL if a in attributes)
    except Exception:  # noqa: BLE001 - the config's own loader reports what is wrong with it
        return CONFIDENTIAL
    return chosen or CONFIDENTIAL


def inspect_input(path: str | Path, *, columns: Mapping[str, str] | None = None, pad_codes: bool = False,
                  attributes: Sequence[str] = CONFIDENTIAL) -> Intake:
    """Check an input file before it is read for protection; see the module docstring.

    Raises:
        InputError: the path is not a readable input (``check_input_path``).
        InputProblems: every problem of the file, each with its rows and a hint.
    """
    from gedp.synth.paths import check_input_path, is_parquet, parquet_columns

    path = check_input_path(path)
    problems = Problems(f"input '{path}'")
    parquet = is_parquet(path)
    schema = parquet_columns(path) if parquet else {}
    header, delimiter = (list(schema), ",") if parquet else _csv_header(path, problems)
    for name in sorted({n for i, n in enumerate(header) if n in header[:i]}):
        problems.add(f"column {name!r} appears more than once; hint: rename or remove one of them")
    problems.raise_any()
    intake = _resolve(path, parquet, header, delimiter, columns or {}, attributes, problems)
    intake.pad_codes = pad_codes
    if parquet:
        _check_parquet_types(intake, schema, attributes, problems)
        _check_id_type(intake, schema, problems)
    else:
        _check_csv_values(intake, attributes, problems)
    problems.raise_any()
    return intake


def _csv_header(path: Path, problems: Problems) -> tuple[list[str], str]:
    """The header's names and the delimiter that splits it (the one giving most names gedp knows)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            line = file.readline(1 << 16)
    except UnicodeDecodeError:
        problems.add("it is not UTF-8 text; hint: save it as 'CSV UTF-8'")
        return [], ","
    known = {alias for names in ALIASES.values() for alias in names} | set(AREA_ALIASES)

    def score(delimiter: str) -> tuple[int, int]:
        names = next(csv.reader([line], delimiter=delimiter), [])
        return sum(normalized(n) in known for n in names), len(names)

    delimiter = max(DELIMITERS, key=score)
    if score(delimiter)[1] < 2:
        problems.add("its header has a single column: is it delimited by something other than "
                     "',' ';' tab or '|'? hint: save it as comma-separated CSV")
    names = next(csv.reader([line.rstrip("\r\n")], delimiter=delimiter), [])
    if data_like_fields(names):  # nothing else said about its names: they are an establishment's values
        problems.add(headerless_rule(data_like_fields(names)))
        problems.raise_any()
    return names, delimiter


def _resolve(path: Path, parquet: bool, stored: list[str], delimiter: str, columns: Mapping[str, str],
             attributes: Sequence[str], problems: Problems) -> Intake:
    """Which stored column is each of gedp's columns; problems for unknown, missing and ambiguous names."""
    intake = Intake(path, parquet, delimiter)
    for old, new in columns.items():
        if new not in ALIASES and new != AREA_COLUMN:
            problems.add(f"--columns {old}={new}: {new!r} is not a column of gedp "
                         f"(one of {', '.join([*ALIASES, AREA_COLUMN])})")
        elif old not in stored:
            problems.add(f"--columns {old}={new}: the file has no column {old!r}")
        elif new == AREA_COLUMN:
            intake.area = old
        else:
            intake.names[new] = old
    by_name: dict[str, list[str]] = {}
    for name in stored:
        by_name.setdefault(normalized(name), []).append(name)
    ambiguous = set()
    for column, aliases in ALIASES.items():
        if column not in intake.names:
            found = [n for alias in aliases for n in by_name.get(alias, []) if n not in columns]
            if not _take(intake.names, column, found, problems):
                ambiguous.add(column)
    if intake.area is None and not {"state", "county"} & set(intake.names):
        areas: dict[str, str] = {}
        _take(areas, AREA_COLUMN, [n for a in AREA_ALIASES for n in by_name.get(a, []) if n not in columns], problems)
        intake.area = areas.get(AREA_COLUMN)
    counts = [n for a in COUNT_ALIASES for n in by_name.get(a, [])]
    intake.counts = counts[0] if counts else None
    _missing(intake, stored, [c for c in attributes if c not in ambiguous], problems, ambiguous)
    return intake


def _take(names: dict[str, str], column: str, found: list[str], problems: Problems) -> bool:
    """Record the one stored column found for ``column``; two or more are refused, not guessed between
    (returns False)."""
    if len(found) == 1:
        names[column] = found[0]
    elif len(found) > 1:
        problems.add(f"columns {' and '.join(repr(n) for n in found)} could each be {column!r}; hint: say which, "
                     f"e.g. --columns {found[-1]}={column} (columns={{'{found[-1]}': '{column}'}} in Python)")
    return len(found) < 2


def _missing(intake: Intake, stored: list[str], attributes: Sequence[str], problems: Problems,
             ambiguous: set[str]) -> None:
    """A problem for each required column that no stored column names (the ``ambiguous`` ones
    aside), with the unused stored name that looks most like it."""
    required = [c for c in ("estab_id", *CODE_WIDTHS, *attributes) if c not in ambiguous]
    if intake.area is not None:
        required = [c for c in required if c not in ("state", "county")]
    used = {*intake.names.values(), intake.area}
    unused = {normalized(n): n for n in stored if n not in used}
    for column in required:
        if column in intake.names:
            continue
        looks = [max(unused, key=lambda n: _likeness(n, column))] if unused else []
        looks = [n for n in looks if _likeness(n, column) >= LIKENESS]
        others = ", ".join(ALIASES[column][1:4])
        hint = (f"; {unused[looks[0]]!r} looks like it: give --columns {unused[looks[0]]}={column}" if looks
                else f"; hint: name it {column} (or {others}), or give --columns NAME={column}")
        if column in ("state", "county") and intake.area is None and not looks:
            hint += " (a 5-digit state + county code: --columns NAME=area_fips)"
        problems.add(f"missing column {column!r}{hint}")


def _likeness(name: str, column: str) -> float:
    """How much a stored name looks like one of gedp's columns: the best similarity to its names."""
    return max(difflib.SequenceMatcher(None, name, alias).ratio() for alias in ALIASES[column])


def _check_parquet_types(intake: Intake, schema: Mapping[str, Any], attributes: Sequence[str],
                         problems: Problems) -> None:
    """Parquet keeps types: a confidential attribute stored as text is refused from the schema alone."""
    import pyarrow as pa

    for column in (a for a in attributes if a in intake.names):
        kind = schema[intake.names[column]]
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
            stored_as = "text" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else str(kind)
            problems.add(f"{_label(intake.names[column], column)} is stored as {stored_as}, not as numbers; hint: "
                         "write it as a numeric column (thousands separators and blanks removed)")


def _check_id_type(intake: Intake, schema: Mapping[str, Any], problems: Problems) -> None:
    """Parquet ids must be text or whole numbers (``gedp.synth.schema.canonical_ids``): floating-point
    and decimal ids get a note (they are read as whole numbers), booleans and dates a problem."""
    import pyarrow as pa

    if "estab_id" not in intake.names:
        return
    stored = intake.names["estab_id"]
    kind = schema[stored]
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        how = "stored as floating-point numbers" if pa.types.is_floating(kind) else "stored as decimal numbers"
        intake.notes.append(WHOLE_NUMBER_NOTE.format(name=_label(stored, "estab_id"), how=how))
    elif pa.types.is_boolean(kind) or pa.types.is_temporal(kind):
        problems.add(f"{_label(stored, 'estab_id')} is stored as {kind}; hint: ids must be text or whole numbers")


def _label(stored: str, column: str) -> str:
    """How a message names a column: its stored name, and gedp's name when that differs."""
    return f"column {stored!r}" + (f" ({column})" if normalized(stored) != column else "")


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


def _check_csv_values(intake: Intake, attributes: Sequence[str], problems: Problems) -> None:
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
        intake.notes.append(WHOLE_NUMBER_NOTE.format(name=_label(used["estab_id"], "estab_id"),
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
            _log(logs, f"{stored}:short", f"{_label(stored, column)}: codes shorter than {width} digits at "
                 "{rows}; hint: leading zeros were dropped (e.g. by Excel); --pad-codes pads them", short, offset)
        if short is not None:
            bad = pc.and_(bad, pc.invert(short))
        hint = (" (5 digits: state + county? give --columns NAME=area_fips)" if width == 3 else "")
        _log(logs, f"{stored}:bad", f"{_label(stored, column)}: codes must be {width} ASCII digits; not at "
             f"{{rows}}{hint}", bad, offset)
    if "estab_id" in used:
        empty = pc.match_substring_regex(pc.utf8_trim_whitespace(batch.column(used["estab_id"])), "^$")
        _log(logs, "id:empty", f"{_label(used['estab_id'], 'estab_id')}: ids missing at {{rows}}", empty, offset)
    if intake.counts is not None:
        other = pc.invert(pc.match_substring_regex(batch.column(intake.counts), r"^\s*1(\.0*)?\s*$"))
        _log(logs, "counts", f"column {intake.counts!r} counts establishments, and is not 1 at {{rows}}: a table "
             "of cells, not establishment microdata? hint: give one row per establishment", other, offset)


def _check_numbers(text: Any, stored: str, column: str, delimiter: str, offset: int, logs: dict[str, _RowLog]) -> None:
    """Problems of a numeric column: thousands separators, decimal commas, non-numbers, negatives."""
    import pyarrow.compute as pc

    name = _label(stored, column)
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
    """A row's record key, blanks stripped: its estab_id as the establishment's one id ("1002.0" is
    "1002", ``WHOLE_NUMBER_ID``), with its year and quarter when the input has them (a panel holds each
    establishment once per quarter); and whether an id was written as a whole number with a point."""
    import pyarrow.compute as pc

    parts = [pc.utf8_trim_whitespace(batch.column(used[name])) for name in ("estab_id", "year", "qtr")
             if name in used]
    whole_number = may_hold_point(parts[0]) and pc.any(pc.match_substring_regex(parts[0], WHOLE_NUMBER_ID)).as_py()
    if whole_number:
        parts[0] = pc.replace_substring_regex(parts[0], WHOLE_NUMBER_ID.replace("[0-9]+", "([0-9]+)"), r"\1")
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
        log = logs.setdefault("id:repeat", _RowLog(f"{_label(stored, 'estab_id')}: ids repeating an earlier row's at "
                                                   "{rows}; hint: each establishment needs its own id (e.g. the UI "
                                                   "account and the reporting unit number together)"))
        log.add([r + 1 for r in repeated], len(repeated))


def load_input(intake: Intake) -> Any:
    """The input to protect: its path when the usual readers take it as it is, else its rows read
    with gedp's column names (codes as text, short codes zero-padded with ``pad_codes``, a 5-digit
    area code split into state and county) as a pandas DataFrame."""
    if not intake.needs_translation():
        return intake.path
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    stored = [*intake.names.values(), *([intake.area] if intake.area else [])]
    if intake.parquet:
        table = pq.read_table(intake.path, columns=stored)
    else:
        try:
            table = pacsv.read_csv(intake.path, parse_options=pacsv.ParseOptions(delimiter=intake.delimiter),
                                   convert_options=pacsv.ConvertOptions(
                                       include_columns=stored, column_types={n: pa.string() for n in stored}))
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:  # its message may quote a value: never shown
            raise InputError(f"input '{intake.path}' cannot be read as CSV ({read_error(err)})") from None
        table = _numbers_read(table, intake)
    return canonical_frame(table.to_pandas(), intake)


def _numbers_read(table: Any, intake: Intake) -> Any:
    """The attribute columns of a CSV table read as text, as numbers: blanks stripped as the first
    check strips them (``_check_numbers``), then cast; a value the check let through and the cast
    refuses is named by its column and row, never shown."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for column in (c for c in CONFIDENTIAL if c in intake.names):
        stored = intake.names[column]
        text = pc.ascii_trim_whitespace(table.column(stored))
        try:
            numbers = pc.cast(text, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rows = pc.indices_nonzero(pc.invert(pc.match_substring_regex(text, NUMBER))).to_pylist()
            where = f" at row {rows[0] + 1}" if rows else ""
            raise InputError(f"input '{intake.path}': {_label(stored, column)} holds a value that is not a "
                             f"number{where}; hint: plain numbers only") from None
        table = table.set_column(table.schema.get_field_index(stored), stored, numbers)
    return table


def canonical_frame(frame: Any, intake: Intake) -> Any:
    """``frame`` (pandas) with gedp's column names: renamed, the area code split, codes padded."""
    out = frame[list(intake.names.values())].set_axis(list(intake.names), axis=1)
    if intake.area is not None:
        area = _padded(frame[intake.area], 5) if intake.pad_codes else frame[intake.area].astype("string").str.strip()
        out = out.assign(state=area.str[:2], county=area.str[2:])
    if intake.pad_codes:
        for column, width in CODE_WIDTHS.items():
            if column in intake.names and column in PADDED:
                out[column] = _padded(out[column], width)
    return out


def _padded(codes: Any, width: int) -> Any:
    """Codes as text, blanks stripped, digits-only codes shorter than ``width`` zero-padded."""
    text = codes.astype("string").str.strip()
    short = text.str.fullmatch(f"[0-9]{{1,{width}}}").fillna(False)
    return text.where(~short, text.str.zfill(width))


def prepare_input(source: Any, *, columns: Mapping[str, str] | None = None, pad_codes: bool = False,
                  attributes: Sequence[str] = CONFIDENTIAL) -> Any:
    """An input (a path, or a pandas DataFrame) checked and with gedp's column names: a file through
    ``inspect_input`` and ``load_input``; a DataFrame renamed (``columns``, then ``ALIASES``) and
    padded, its values left to the validation of microdata."""
    if isinstance(source, (str, Path)):
        intake = inspect_input(source, columns=columns, pad_codes=pad_codes, attributes=attributes)
        for note in intake.notes:
            warnings.warn(note, InputNote, stacklevel=2)
        return load_input(intake)
    problems = Problems("the microdata")
    header = [str(name) for name in source.columns]
    intake = _resolve(Path(), False, header, ",", columns or {}, attributes, problems)
    problems.raise_any()
    intake.pad_codes = pad_codes
    named = source.set_axis(header, axis=1)
    if "estab_id" in intake.names and str(named[intake.names["estab_id"]].dtype).startswith("float"):
        warnings.warn(WHOLE_NUMBER_NOTE.format(name=_label(intake.names["estab_id"], "estab_id"),
                                               how="stored as floating-point numbers"), InputNote, stacklevel=2)
    return canonical_frame(named, intake) if intake.needs_translation() else source


def read_input(path: str | Path, *, columns: Mapping[str, str] | None = None, pad_codes: bool = False,
               attributes: Sequence[str] = CONFIDENTIAL) -> Any:
    """Validated establishment microdata (pandas) from a file as agencies have it: checked by
    ``inspect_input``, translated by ``load_input``, then validated as any microdata."""
    from gedp.synth.io import read_microdata
    from gedp.synth.schema import validate_microdata

    source = load_input(inspect_input(path, columns=columns, pad_codes=pad_codes, attributes=attributes))
    return read_microdata(source, attributes) if isinstance(source, Path) else validate_microdata(source, attributes)
