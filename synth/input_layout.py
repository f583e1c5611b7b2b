"""The layout of an input file as agencies have it (``gedp.synth.intake``): which stored column is each of
gedp's (``ALIASES``, an explicit ``columns`` mapping, or a 5-digit area code; two candidates for one
column are refused, never guessed between), the delimiter of a CSV header, and the ``Intake`` that
records how the input is read. Standard library only: it runs before pandas, scipy or the solvers
are imported."""

from __future__ import annotations

import csv
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gedp.errors import InputProblems
from gedp.synth.columns import CODE_WIDTHS, data_like_fields, headerless_rule

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
#: The note given when ids are read as whole numbers (1002.0 as 1002).
WHOLE_NUMBER_NOTE = ("{name} holds ids {how}; each is read as its whole number (1002.0 as 1002), the one id of "
                     "that establishment in the release and in the ledger")


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


def csv_header(path: Path, problems: Problems) -> tuple[list[str], str]:
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


def resolve_columns(path: Path, parquet: bool, stored: list[str], delimiter: str, columns: Mapping[str, str],
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


def column_label(stored: str, column: str) -> str:
    """How a message names a column: its stored name, and gedp's name when that differs."""
    return f"column {stored!r}" + (f" ({column})" if normalized(stored) != column else "")
