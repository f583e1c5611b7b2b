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

This module holds those entry points and the reading of a translated input; ``gedp.synth.input_layout``
holds the matching of column names (and the ``Intake``), ``gedp.synth.csv_values`` the streaming
check of a CSV file's values.

Messages name columns, rules and row numbers, never a value; they go to the operator's terminal only
and are never written into a release or its manifest (nothing is written when input is refused).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gedp.errors import InputError
from gedp.synth.columns import CODE_WIDTHS, CONFIDENTIAL
from gedp.synth.csv_values import NUMBER, check_csv_values, read_error
from gedp.synth.input_layout import (
    PADDED,
    WHOLE_NUMBER_NOTE,
    Intake,
    Problems,
    column_label,
    csv_header,
    resolve_columns,
)


class InputNote(UserWarning):
    """Something gedp did to read an input that its operator should know (e.g. ids read as whole numbers)."""


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
    header, delimiter = (list(schema), ",") if parquet else csv_header(path, problems)
    for name in sorted({n for i, n in enumerate(header) if n in header[:i]}):
        problems.add(f"column {name!r} appears more than once; hint: rename or remove one of them")
    problems.raise_any()
    intake = resolve_columns(path, parquet, header, delimiter, columns or {}, attributes, problems)
    intake.pad_codes = pad_codes
    if parquet:
        _check_parquet_types(intake, schema, attributes, problems)
        _check_id_type(intake, schema, problems)
    else:
        check_csv_values(intake, attributes, problems)
    problems.raise_any()
    return intake


def _check_parquet_types(intake: Intake, schema: Mapping[str, Any], attributes: Sequence[str],
                         problems: Problems) -> None:
    """Parquet keeps types: a confidential attribute stored as text is refused from the schema alone."""
    import pyarrow as pa

    for column in (a for a in attributes if a in intake.names):
        kind = schema[intake.names[column]]
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
            stored_as = "text" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else str(kind)
            problems.add(f"{column_label(intake.names[column], column)} is stored as {stored_as}, not as numbers; "
                         "hint: write it as a numeric column (thousands separators and blanks removed)")


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
        intake.notes.append(WHOLE_NUMBER_NOTE.format(name=column_label(stored, "estab_id"), how=how))
    elif pa.types.is_boolean(kind) or pa.types.is_temporal(kind):
        problems.add(f"{column_label(stored, 'estab_id')} is stored as {kind}; hint: ids must be text or whole numbers")


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
            raise InputError(f"input '{intake.path}': {column_label(stored, column)} holds a value that is not a "
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
    intake = resolve_columns(Path(), False, header, ",", columns or {}, attributes, problems)
    problems.raise_any()
    intake.pad_codes = pad_codes
    named = source.set_axis(header, axis=1)
    if "estab_id" in intake.names and str(named[intake.names["estab_id"]].dtype).startswith("float"):
        warnings.warn(WHOLE_NUMBER_NOTE.format(name=column_label(intake.names["estab_id"], "estab_id"),
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
