"""Implicates drawn once (``gedp implicates RELEASE --out DIR``) read back for the tables by a derived
column (``gedp tabulate RELEASE --by ...,size_class --implicates DIR``): every table of one folder is
combined over the same draws, and none draws again.

The folder is untrusted input (anyone may have written or edited it), and the release is read as
``gedp implicates`` reads it (its answers checked, its protected microdata re-solved from them). The
folder is refused in one line, before any table is made, unless it is ``gedp implicates`` output of
this release: its ``_implicates.json`` (at most MAX_MARKER_BYTES) records this release's identity
(``implicates.release_digest``), quarter and establishments, and 2 to MAX_IMPLICATES implicates;
the folder holds that summary and the implicates' files alone; each file holds the columns
``gedp implicates`` writes, of their types, one row per establishment of the release (its
``estab_id`` keys, each once), and sizes bounded by the establishments (checked from the files'
footers before their values are read). Its values must be finite, non-negative and at most
``MAX_VALUE``. The checks cannot prove that values which pass them were drawn by gedp: a folder of
unknown origin is drawn again. Only the drawn values and ``estab_id`` are read of it; the public
columns are the release's own, and its text is never printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.release.format import IMPLICATES_SUMMARY, MAX_MARKER_BYTES
from gedp.release.implicates import IMPLICATE_KEY, MAX_IMPLICATES, implicate_file, implicate_frame
from gedp.synth.schema import CONFIDENTIAL, MAX_VALUE

#: Fewest implicates a table is combined over: Rubin's margins come from the variance between
#: implicates, which one implicate cannot give (``postprocess.combine``).
MIN_IMPLICATES = 2
#: Bytes a file may hold per establishment and column, decompressed (a double takes 8), and beside them.
BYTES_PER_VALUE = 64
SLACK_BYTES = 1 << 20


def _unreadable() -> tuple[type[BaseException], ...]:
    """What pyarrow raises of a file that is not Parquet (its errors are ValueError, TypeError, OSError...)."""
    import pyarrow as pa

    return (OSError, ValueError, TypeError, NotImplementedError, pa.ArrowException)


@dataclass(frozen=True, eq=False)
class DrawnImplicates:
    """A folder of implicates checked against a release (``open_implicates``): its ``count``, its files,
    what its summary says of the draws (``described``) and the release's ``public`` columns they were
    drawn beside (``implicates.release_public``)."""

    folder: Path
    count: int
    files: list[Path]
    summary: dict[str, Any]
    public: pd.DataFrame

    def described(self) -> dict[str, Any]:
        """What a table's JSON summary records of the implicates it was combined over."""
        draws = {key: self.summary[key] for key in ("rng", "level_prior", "change_prior", "wage_prior", "streams")
                 if key in self.summary}
        return {"count": self.count, "folder": str(self.folder), **draws}


def open_implicates(release: str | Path, folder: str | Path, quarter: str | None = None) -> DrawnImplicates:
    """The folder ``gedp implicates`` wrote of ``release`` (of one ``quarter`` of a panel); InputError for
    anything else (the module's checks, but the values': ``implicate_frames``), or for a release its
    readers refuse (its answers checked and its protected microdata re-solved from them, as ``gedp
    implicates`` reads it: the folder's identity covers the manifest and answers, not the public columns)."""
    from gedp.release.implicates import check_public_groups, release_digest, release_public
    from gedp.release.reader import read_answers

    release, folder = Path(release), Path(folder)
    said = f"--implicates '{folder}'"
    if not folder.is_dir():
        raise InputError(f"{said} is not a folder of implicates (gedp implicates RELEASE --out DIR writes one)")
    summary = _read_summary(folder, said)
    if summary.get("gedp_implicates") != 1:
        raise InputError(f"{said} is not gedp implicates output: its {IMPLICATES_SUMMARY} is not gedp's")
    if "release_sha256" not in summary:
        raise InputError(f"{said} does not record which release it was drawn from (gedp implicates did not, "
                         "before tabulate --implicates): draw it again with gedp implicates")
    if summary["release_sha256"] != release_digest(release).hex():
        raise InputError(f"{said} was drawn from another release than '{release}' (or this release's manifest "
                         "or answers changed since): its recorded identity differs")
    if summary.get("quarter") != quarter:
        raise InputError(f"{said} was drawn for another quarter than " + (quarter or "the release's one"))
    count = summary.get("implicates")
    if isinstance(count, bool) or not isinstance(count, int) or not MIN_IMPLICATES <= count <= MAX_IMPLICATES:
        raise InputError(f"{said} must hold {MIN_IMPLICATES} to {MAX_IMPLICATES:,} implicates"
                         + (f", not {count}: a table's margins are Rubin's, from the variance between implicates, "
                            "which one cannot give" if count in (0, 1) else ""))
    public = release_public(release, quarter)
    n = len(public)
    if summary.get("establishments") != n:
        raise InputError(f"{said} was not drawn over this release's {n:,} establishments")
    names = [implicate_file(k, count) for k in range(1, count + 1)]
    if summary.get("files") != names:
        raise InputError(f"{said} is not gedp implicates output: its summary does not list its {count} files")
    _check_listing(folder, {*names, IMPLICATES_SUMMARY}, said)
    files = [folder / name for name in names]
    expected = _column_kinds(public)
    for path in files:
        _check_footer(path, expected, n, said)
    check_public_groups(read_answers(release, quarter), public)  # the release read as gedp implicates reads it
    return DrawnImplicates(folder, count, files, summary, public)


def implicate_frames(drawn: DrawnImplicates) -> Iterator[pd.DataFrame]:
    """Each implicate of ``drawn`` as ``gedp implicates`` drew it (``implicate_frame``: the release's
    public columns, in its order, beside the drawn values), one at a time; InputError for rows that are not
    the release's establishments each once, or values that are not finite, negative or above MAX_VALUE."""
    from gedp.release.part_sizes import open_part

    public = drawn.public
    ids = pd.Index(public["estab_id"])
    n = len(ids)
    for k, path in enumerate(drawn.files, start=1):
        said = f"--implicates '{drawn.folder}': {path.name}"
        try:  # the dictionary of the ids' text: each key once, never a copy of each row's
            table = open_part(path, read_dictionary=["estab_id"] if _kind(public["estab_id"]) == "text" else None
                              ).read(columns=[IMPLICATE_KEY, "estab_id", *CONFIDENTIAL], use_pandas_metadata=False)
        except _unreadable():
            raise InputError(f"{said} cannot be read as Parquet (its pages do not decode)") from None
        if table.num_rows != n:
            raise InputError(f"{said} holds {table.num_rows:,} rows, not the release's {n:,} establishments")
        if not (table.column(IMPLICATE_KEY).to_numpy() == k).all():
            raise InputError(f"{said} holds rows of another implicate than {k}")
        positions = _positions(table.column("estab_id"), ids)
        if (positions < 0).any():  # a key the release does not hold, or none
            raise InputError(f"{said} holds establishments the release does not")
        if (np.bincount(positions, minlength=n) != 1).any():
            raise InputError(f"{said} repeats establishments (and so misses others): one row per establishment")
        values = np.column_stack([table.column(c).to_numpy().astype(float) for c in CONFIDENTIAL])
        bad = ~(np.isfinite(values) & (values >= 0) & (values <= MAX_VALUE))
        if bad.any():
            column = CONFIDENTIAL[int(np.argmax(bad.any(axis=0)))]
            raise InputError(f"{said}: {int(bad.sum()):,} drawn values (of {column} first) are not finite "
                             f"numbers from 0 to {MAX_VALUE:.0e}")
        ordered = np.empty_like(values)
        ordered[positions] = values
        yield implicate_frame(public, ordered, k)


def _read_summary(folder: Path, said: str) -> dict[str, Any]:
    """The folder's ``_implicates.json`` (``format.marker_content``: a regular file of at most
    MAX_MARKER_BYTES holding a JSON object); InputError otherwise."""
    from gedp.release.format import marker_content

    summary = marker_content(folder / IMPLICATES_SUMMARY)
    if summary is None:
        raise InputError(f"{said} is not gedp implicates output: it has no {IMPLICATES_SUMMARY} of gedp's (a "
                         f"file of at most {MAX_MARKER_BYTES >> 20} MiB holding a JSON object)")
    return summary


def _check_listing(folder: Path, names: set[str], said: str) -> None:
    """The folder holds ``names``, regular files, and nothing else (looked at up to one entry beyond them)."""
    import os

    found = set()
    with os.scandir(folder) as entries:
        for entry in entries:
            found.add(entry.name)
            if entry.name not in names or not entry.is_file() or len(found) > len(names):
                raise InputError(f"{said} holds other entries than gedp implicates writes (its "
                                 f"{IMPLICATES_SUMMARY} and implicate files alone)")
    if found != names:
        raise InputError(f"{said} misses {len(names - found)} of the files its {IMPLICATES_SUMMARY} lists")


def _check_footer(path: Path, expected: dict[str, str], n: int, said: str) -> None:
    """A file's size, rows, columns (names and kinds) and pages' sizes from its footer and page headers
    (``part_sizes``: the footer decoded within its limits, each page's header stating at most what the
    footer states), before any value is read."""
    from gedp.release.part_sizes import MAX_FOOTER_BYTES, check_pages, footer_bytes, open_part

    bound = BYTES_PER_VALUE * n * len(expected) + SLACK_BYTES
    said, size = f"{said}: {path.name}", path.stat().st_size
    if size > bound:
        raise InputError(f"{said} is over {bound:,} bytes, more than {n:,} establishments' implicate takes")
    try:
        footer = footer_bytes(path) if size >= 12 else -1
        if not 0 <= footer <= min(MAX_FOOTER_BYTES, size - 12):
            raise ValueError("footer")
        metadata = open_part(path).metadata
        kinds = {field.name: _arrow_kind(field.type) for field in metadata.schema.to_arrow_schema()}
        groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
    except _unreadable():
        raise InputError(f"{said} cannot be read as Parquet (its footer does not decode within gedp's "
                         "limits)") from None
    if list(kinds) != list(expected) or kinds != expected:
        raise InputError(f"{said} does not hold the columns gedp implicates writes of this release (implicate, "
                         "the release's columns, then the drawn attributes, each of its type)")
    if metadata.num_rows != n or sum(group.num_rows for group in groups) != n:
        raise InputError(f"{said} holds {metadata.num_rows:,} rows, not the release's {n:,} establishments")
    unpacked = sum(group.column(c).total_uncompressed_size for group in groups for c in range(group.num_columns))
    if unpacked > bound:
        raise InputError(f"{said} unpacks to over {bound:,} bytes, more than {n:,} establishments' implicate takes")
    try:
        check_pages(said, "implicates", path, groups, size - footer - 8)
    except InputError as err:
        rule = str(err).removeprefix(f"release '{said}': implicates/{path.name} ")
        raise InputError(f"{said} {rule}") from None


def _column_kinds(public: pd.DataFrame) -> dict[str, str]:
    """The columns of an implicate of a release whose public columns are ``public``, with their kinds."""
    return {IMPLICATE_KEY: "integer", **{c: _kind(public[c]) for c in public.columns},
            **{c: "floating" for c in CONFIDENTIAL}}


def _kind(column: pd.Series) -> str:
    """A pandas column's kind: integer, floating, text or its dtype's name."""
    return {"i": "integer", "u": "integer", "f": "floating", "O": "text", "U": "text", "T": "text"}.get(
        column.dtype.kind, "text" if pd.api.types.is_string_dtype(column.dtype) else str(column.dtype))


def _arrow_kind(arrow_type: Any) -> str:
    """A Parquet column's kind, as ``_kind`` names a pandas column's (the widths pandas writes may vary)."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        return "integer"
    if pa.types.is_floating(arrow_type):
        return "floating"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "text"
    return str(arrow_type)


def _positions(column: Any, ids: pd.Index) -> np.ndarray:
    """Each row's position among the release's ``ids`` (-1: not there, or no key): of each chunk's
    dictionary of distinct keys once (``read_dictionary``: never a copy of each row's text), then of its rows."""
    import pyarrow as pa

    chunks = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            found = np.append(ids.get_indexer(chunk.dictionary.to_numpy(zero_copy_only=False)), -1)
            chunks.append(found[chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False)])
        else:
            chunks.append(ids.get_indexer(chunk.to_numpy(zero_copy_only=False)))
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.intp)
