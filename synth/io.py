"""Readers and writers for establishment microdata (CSV and Parquet)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gedp.synth.columns import data_like_fields, headerless_rule
from gedp.synth.csv_values import read_error
from gedp.synth.footers import range_bounds, stamp, value_ranges
from gedp.synth.jobs import JOB_COLUMNS, validate_jobs
from gedp.synth.keycodes import sorted_codes, taken_frame
from gedp.synth.paths import check_input_path, is_parquet
from gedp.synth.prefetch import prefetched_table
from gedp.synth.schema import CARRIED, CODE_WIDTHS, CONFIDENTIAL, InputError, check_columns, validate_microdata

#: Columns read as text from CSV so that leading zeros of codes survive (and year/qtr are checked as text).
TEXT_COLUMNS = ("estab_id", *CODE_WIDTHS, "own", *CARRIED, *JOB_COLUMNS)
#: Longest CSV header read: a header is a few dozen names, and reading stops here on a file without lines.
MAX_HEADER_CHARACTERS = 1 << 16


class Parts(NamedTuple):
    """Some parts of a Parquet input (a file is its one part), read as the whole input is read (with
    its first part's columns ``schema``, in its order): those that may hold the rows asked
    (``parts_holding``). ``stamps`` are the parts' sizes and modification times before the input was
    first read."""

    input: str
    files: tuple[str, ...]
    schema: pa.Schema
    stamps: tuple[tuple[int, ...], ...]


class PinnedCsv(NamedTuple):
    """A CSV input and the SHA-256 of its bytes when it was first read (``read_csv_pinned``):
    ``read_columns`` parses it only from bytes of that digest, and refuses it when the file holds
    others (changed or swapped between two reads of one release)."""

    input: str
    sha256: str


def input_stamps(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Every part of a Parquet input (a file: itself) with its ``stamp``, taken before the input is
    read; None for CSV."""
    if not is_parquet(path):
        return None
    files = ds.dataset(path, format="parquet", schema=pa.schema([])).files  # the input's order; none opened
    return {file: stamp(file) for file in files}


def every_part(path: Path, stamps: Mapping[str, tuple[int, ...]]) -> Parts:
    """All the parts of a Parquet input (those of ``stamps``) as ``Parts``: read only while unchanged."""
    return Parts(str(path), tuple(stamps), ds.dataset(list(stamps), format="parquet").schema, tuple(stamps.values()))


def parts_holding(path: Path, column: str, values: Mapping[str, Sequence],
                  stamps: Mapping[str, tuple[int, ...]]) -> dict[str, Parts]:
    """For each key of ``values``, the parts of a Parquet input (those of ``stamps``) whose row-group
    statistics of ``column`` allow a row holding one of the key's values: every footer is read once
    here, so that each key's reader opens only its parts (all of them where no statistics tell)."""
    dataset = ds.dataset(list(stamps), format="parquet")
    ranges = [value_ranges(fragment.metadata, column) for fragment in dataset.get_fragments()]
    holding = {}
    for key, accepted in values.items():
        files = tuple(file for file, bounds in zip(stamps, ranges) if _may_hold(bounds, accepted)) or tuple(stamps)
        holding[key] = Parts(str(path), files, dataset.schema, tuple(stamps[file] for file in files))
    return holding


def footers_one_value(path: Path, column: str) -> bool:
    """Whether the footers of a Parquet input show ``column`` to hold one value wherever it has one:
    in every row group of every part its statistics' minimum and maximum are that value (missing
    values aside). False when they do not tell (CSV, a part without statistics or without the column)."""
    if not is_parquet(path):
        return False
    values: set = set()
    for fragment in ds.dataset(path, format="parquet").get_fragments():
        bounds = range_bounds(fragment.metadata, column)
        if bounds is None:
            return False
        values |= bounds
    return len(values) == 1


def _may_hold(ranges: list[tuple] | None, values: Sequence) -> bool:
    """Whether row groups of these ranges (None: unknown) may hold one of ``values``."""
    try:
        return ranges is None or any(low <= value <= high for low, high, _ in ranges for value in values)
    except TypeError:  # a value of another type than the statistics': no telling
        return True


def input_columns(path: Path) -> list[str]:
    """The column names of a checked input as stored (pandas would rename a repeated CSV column)."""
    if is_parquet(path):
        dataset = ds.dataset(path, format="parquet")
        names = list(dataset.schema.names)  # the first part's
        for fragment in dataset.get_fragments():  # footers only: every part has the same columns
            missing = [c for c in names if c not in fragment.physical_schema.names]
            if missing:
                raise InputError(f"input '{path}': part '{Path(fragment.path).relative_to(path)}' has no column "
                                 f"{missing[0]!r}; every part needs the same columns")
        return names
    with path.open(newline="", encoding="utf-8-sig") as file:  # -sig: a byte order mark, as pandas drops it
        header = file.readline(MAX_HEADER_CHARACTERS)
    if len(header) == MAX_HEADER_CHARACTERS:
        raise InputError(f"input file '{path}': the header line is longer than {MAX_HEADER_CHARACTERS:,} characters")
    names = next(csv.reader([header]), [])
    if data_like_fields(names):
        raise InputError(f"input file '{path}': {headerless_rule(data_like_fields(names))}")
    return names


def read_csv_pinned(path: str | Path, columns: Sequence[str] | None = None) -> tuple[pd.DataFrame, PinnedCsv]:
    """``read_columns`` of a CSV input, and the input pinned to the bytes read (``PinnedCsv``), so
    that every later read of it is of the same data."""
    digest: list[str] = []
    frame = read_columns(path, columns, digest=digest)
    return frame, PinnedCsv(str(path), digest[0])


def read_columns(path: str | Path | Parts | PinnedCsv, columns: Sequence[str] | None = None,
                 where: tuple[str, Sequence] | None = None, required: Sequence[str] | None = None,
                 digest: list[str] | None = None) -> pd.DataFrame:
    """Read ``columns`` (all when None) of microdata as stored, CSV codes as text; with ``where =
    (column, values)`` only the rows whose column holds one of the values (Parquet: filtered while reading).
    ``required`` names the columns the file must have (default: those of establishment microdata).
    ``Parts`` of a Parquet input are read as the input would be, but only they are opened, and only
    while their stamps are unchanged; a ``PinnedCsv`` only from bytes of its digest. A CSV file's
    bytes are read once into memory and parsed from there; their SHA-256 is appended to ``digest``.

    Raises:
        InputError: the path is not a regular input (``check_input_path``), a column is named twice
            or a required one is missing, the file cannot be read, or Parts or a PinnedCsv changed.
    """
    parts = path if isinstance(path, Parts) else None
    pinned = path.sha256 if isinstance(path, PinnedCsv) else None
    path = check_input_path(path.input if isinstance(path, (Parts, PinnedCsv)) else path)
    try:
        names = list(parts.schema.names) if parts else input_columns(path)
        if not names:
            raise InputError(f"input file '{path}' is empty")
        check_columns(names, attributes=(), required=required)
        if is_parquet(path):
            source = list(parts.files) if parts else path
            filters = None if where is None or _every_row_holds(source, *where) else [(where[0], "in", list(where[1]))]
            frame = _prefetched_frame(source, columns, filters)
            if frame is None:
                frame = pd.read_parquet(source, columns=None if columns is None else list(columns), filters=filters,
                                        schema=parts.schema if parts else None)
            if parts and tuple(stamp(file) for file in parts.files) != parts.stamps:
                raise InputError(f"input '{path}' was changed while gedp read it: its parts differ from those "
                                 "read first")
            return frame
        frame = pd.read_csv(_csv_bytes(path, pinned, digest), dtype={c: str for c in TEXT_COLUMNS}, encoding="utf-8",
                            usecols=columns)
        return frame if where is None else frame[frame[where[0]].isin(where[1])].reset_index(drop=True)
    except InputError:
        raise
    except pd.errors.EmptyDataError:
        raise InputError(f"input file '{path}' is empty") from None
    except UnicodeDecodeError:
        raise InputError(f"input file '{path}' cannot be read: it is not UTF-8 text") from None
    except OSError as err:
        raise InputError(f"input file '{path}' cannot be read: {err.strerror or type(err).__name__}") from None
    except (pd.errors.ParserError, csv.Error, ValueError, KeyError) as err:  # messages may quote a value
        raise InputError(f"input file '{path}' cannot be read: {read_error(err)}") from None


def _csv_bytes(path: Path, pinned: str | None, digest: list[str] | None) -> io.BytesIO:
    """A CSV file's bytes, read once; refused when ``pinned`` is another digest than theirs."""
    data = path.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    if pinned is not None and sha256 != pinned:
        raise InputError(f"input '{path}' was changed while gedp read it: its bytes differ from those read first")
    if digest is not None:
        digest.append(sha256)
    return io.BytesIO(data)


def _prefetched_frame(source: Path | list[str], columns: Sequence[str] | None,
                      filters: list[tuple] | None) -> pd.DataFrame | None:
    """``pd.read_parquet(source, columns, filters)`` from the table ``synth.prefetch`` read ahead,
    when it is of ``source``'s files and they are unchanged since; None otherwise. A read of every
    column is its last use."""
    files = tuple(source) if isinstance(source, list) else (str(source),)
    table = prefetched_table(files, take=columns is None)
    if table is None or any(pa.types.is_timestamp(kind) for kind in table.schema.types):
        return None  # pandas adjusts time zones after converting: left to it
    if columns is not None:  # pd.read_parquet reads the stored index columns too
        index = (table.schema.pandas_metadata or {}).get("index_columns", [])
        table = table.select([*columns, *(c for c in index if isinstance(c, str) and c not in columns)])
    if filters is not None:
        table = table.filter(pq.filters_to_expression(filters))
    frame = table.to_pandas()
    if table.schema.metadata and b"PANDAS_ATTRS" in table.schema.metadata:
        frame.attrs = json.loads(table.schema.metadata[b"PANDAS_ATTRS"])
    return frame


def _every_row_holds(path: Path | list[str], column: str, values: Sequence) -> bool:
    """Whether the statistics of every row group of a Parquet input show ``column`` holding one of
    ``values`` in all its rows (one value, none missing): then a filter on it would keep every row and
    only cost its evaluation. A state is protected from the rows read this way only when the rows of
    all states add up to the input's (``gedp.running.engine.protect_input``)."""
    accepted = set(values)
    for fragment in ds.dataset(path, format="parquet").get_fragments():
        ranges = value_ranges(fragment.metadata, column)
        if ranges is None or not all(low == high and low in accepted and not missing for low, high, missing in ranges):
            return False
    return True


def read_microdata(path: str | Path, attributes: Sequence[str] | None = CONFIDENTIAL) -> pd.DataFrame:
    """Read and validate establishment microdata from ``.csv`` or ``.parquet`` (a file, or a folder
    of Parquet parts such as a release's ``protected.parquet``).

    ``attributes=None`` takes whichever confidential attributes the file has (protected microdata
    may carry a subset); at least one is required.

    Raises:
        InputError: the file is missing, not a regular file, unreadable, of an unknown type, or fails
            validation.
    """
    frame = read_columns(path)
    if attributes is None:
        attributes = [c for c in CONFIDENTIAL if c in frame.columns]
        if not attributes:
            raise InputError(f"input file '{path}' has none of the attribute columns {', '.join(CONFIDENTIAL)}")
    return validate_microdata(frame, attributes)


def write_microdata(microdata: pd.DataFrame, path: str | Path) -> None:
    """Write microdata as Parquet (codes stay strings) or CSV, by the file's suffix."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        microdata.to_csv(path, index=False)
    else:
        microdata.to_parquet(path, index=False)


def sorted_by(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``frame`` sorted by ``columns`` (ascending, stable, missing values last), index reset: what
    ``sort_values(columns, kind="stable", ignore_index=True)`` gives, sorted in Arrow (text keys are
    compared as bytes, in code point order). The leading columns, codes with few distinct values, are
    sorted as the ranks of their values folded into whole numbers (``_leading_ranks``), the last one
    as it is: Arrow then compares strings only between rows of equal leading values. Rows are taken
    in that order by ``taken_frame`` (fixed-width text as bytes)."""
    keys = {f"rank {index}": rank for index, rank in enumerate(_leading_ranks(frame, columns[:-1]))}
    keys["last"] = pa.array(frame[columns[-1]])
    order = pc.sort_indices(pa.table(keys), sort_keys=[(key, "ascending") for key in keys])
    return taken_frame(frame, np.asarray(order))


#: Largest number of combinations of ranks folded into one int64 key.
MAX_FOLDED = 1 << 62


def _leading_ranks(frame: pd.DataFrame, columns: Sequence[str]) -> list[np.ndarray]:
    """int64 keys ordered as ``columns`` are: each value's rank among the column's sorted distinct
    values (missing ones last), consecutive columns folded into one key while their combinations fit."""
    keys: list[np.ndarray] = []
    combinations = MAX_FOLDED
    for column in columns:
        codes, distinct = sorted_codes(frame[column])
        size = len(distinct) + 1
        rank = np.where(codes < 0, size - 1, codes)
        if combinations * size <= MAX_FOLDED:
            keys[-1] = keys[-1] * size + rank
            combinations *= size
        else:
            keys.append(rank)
            combinations = size
    return keys


def read_jobs(path: str | Path, establishments: pd.DataFrame) -> pd.DataFrame:
    """Read a job table (``.csv``, ``.parquet`` or a folder of parts) and validate it against the
    establishment microdata; see ``gedp.synth.jobs.validate_jobs``."""
    return validate_jobs(read_columns(path, required=JOB_COLUMNS[:-1]), establishments)
