"""The sizes a release's Parquet part states, checked before its rows are read: a part is a file
anyone may have written, and its footer says how many rows it holds and how large its pages are.

A crafted part of a few hundred kilobytes can decode to gigabytes: millions of rows of one value
(each page a run of one repeated value, a few bytes per million rows), pages of zeros compressed
a thousandfold (zstd), a dictionary page of millions of long values, or a long text on every row
kept once in its dictionary. gedp's own parts hold noisy numbers and unique establishment ids on
every row, so their bytes on disk grow with their rows: a part of Rhode Island's release holds
47.5 (protected microdata) and 19.3 (measurements) bytes per row; the parts of Rhode Island's and
New Jersey's synthetic releases (one with job families, one of whole numbers) decompress to 1.1-1.6
times their size and decode to 3.8-12.2 times it. Each part is checked, from its footer alone
wherever a release's parts are listed (``check_footer``: ``validation.listed_parts``), and from its
text columns read as dictionaries before a reader reads its rows (``check_decoded``):

* its footer at most MAX_FOOTER_BYTES, decoded within FOOTER_LIMITS, and its row groups' rows
  adding up to the rows it states;
* its columns of the types gedp writes only (COLUMN_WIDTHS: text, int64, double), so that each
  row's width is known from the footer;
* the protected microdata's parts holding the rows the manifest states for their state (and quarter);
* its pages decompressing to at most MAX_UNCOMPRESSED_RATIO times the part's size (and PART_ROOM);
* its rows decoding to at most MAX_DECODED_RATIO times the part's size (and PART_ROOM): each row
  the width of its numbers and of its texts' offsets (from the footer), and each text's characters
  (from its dictionaries: a value repeated on every row counted on every row, as a read decodes it).
* each column chunk's page headers, read from the part's bytes (``page_headers``), decoding, each
  page within its chunk, and stating at most the uncompressed bytes the footer states for the chunk
  (which the ratio above bounds): a reader decompresses a page into a buffer of the size its header
  states, whatever the footer states.

The ratios' PART_ROOM is given once per output read: each part's sizes are counted with those of
the parts before it, against their sizes added up (``check_parts``, ``check_decoded``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from gedp.errors import InputError
from gedp.release.page_headers import PageError, chunk_range, walk_chunk

#: The longest footer a part may have: gedp's are 3-8 KB (a row group per million rows, a few dozen columns).
MAX_FOOTER_BYTES = 1 << 20
#: How many times its size a part's pages may decompress to (gedp's parts, Snappy: 1.1-1.6).
MAX_UNCOMPRESSED_RATIO = 16
#: How many times its size a part's rows may decode to (gedp's parts: 3.8-12.2; a job frame's
#: measurements the most).
MAX_DECODED_RATIO = 64
#: What any part may hold beyond these ratios, in bytes (a small part's footer and dictionaries).
PART_ROOM = 1 << 20


def _refuse(release: str | Path, output: str, path: str | Path, rule: str) -> InputError:
    return InputError(f"release '{release}': {output}/{Path(path).name} {rule} (an edited or damaged copy)")


def footer_bytes(path: str | Path) -> int:
    """The length of a Parquet file's footer, as its last 8 bytes state it (the magic bytes checked
    by the caller)."""
    with open(path, "rb") as file:
        file.seek(-8, os.SEEK_END)
        return int.from_bytes(file.read(4), "little")


#: The Arrow types gedp writes a part's columns as, and the bytes a row of each decodes to besides its
#: texts' characters: texts (pandas' strings as large strings, a panel's quarter key as a string: their
#: offsets), whole numbers and floats. Any other type (a dictionary, binary, view, decimal, boolean,
#: nested or temporal column) is refused from the footer, before a row is read.
COLUMN_WIDTHS = {"large_string": 8, "string": 4, "int64": 8, "double": 8}
#: Arrow's limits on what a footer's Thrift encoding may declare: a string's bytes (the footer's own
#: bound) and a list's elements. gedp's footers hold lists of a few dozen elements: a row group per
#: million rows (a 1.4-million-row part: 2), a column chunk per column (at most ~30), a schema
#: element per column; a crafted footer of 57 bytes declaring a million row groups had Arrow
#: allocate 0.9 GB before failing.
CONTAINER_LIMIT = 10_000
FOOTER_LIMITS = {"thrift_string_size_limit": MAX_FOOTER_BYTES, "thrift_container_size_limit": CONTAINER_LIMIT}


def open_part(path: str | Path, **options):
    """The Parquet file ``path`` opened within FOOTER_LIMITS (``options``: pyarrow's ParquetFile's)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, **FOOTER_LIMITS, **options)


def read_parts(paths: list[str], columns: list[str] | None = None, filters: list | None = None):
    """The rows of ``paths`` (checked parts: ``check_decoded``) as a pandas frame, as
    ``pandas.read_parquet`` reads them but for their footers decoded within FOOTER_LIMITS and their
    pandas metadata ignored: a part's stated index and dtypes are untrusted (an edited copy's had
    pandas' reader raise KeyError, or move a column to the index), and gedp needs none of them."""
    import pyarrow.parquet as pq

    table = pq.read_table(paths, columns=columns, filters=filters, use_pandas_metadata=False, **FOOTER_LIMITS)
    return table.to_pandas(ignore_metadata=True)


def _row_width(release: str | Path, output: str, path: str | Path, schema) -> int:
    """The bytes a row of ``schema`` decodes to besides its texts' characters (COLUMN_WIDTHS); a
    column of a type gedp does not write refused, naming it."""
    width = 0
    for field in schema:
        kind = str(field.type)
        if kind not in COLUMN_WIDTHS:
            from gedp.synth.schema import shown  # the schema's cut repr (it loads pandas: a refusal only)

            raise _refuse(release, output, path, f"holds the column {shown(field.name)} as {kind[:40]}; gedp "
                                                 "writes text, int64 and double columns only")
        width += COLUMN_WIDTHS[kind]
    return width


def check_footer(release: str | Path, output: str, path: str | Path, expected_rows: int | None = None
                 ) -> tuple[int, int]:
    """The footer of the part ``path`` of ``output``, once the sizes it states are checked (see the
    module): its length, its row groups' rows (``expected_rows`` when the manifest states them), its
    pages' uncompressed size and its rows' width, without reading a page. InputError naming the part
    and the rule otherwise; returns the bytes its pages state uncompressed and its rows decode to
    besides their texts' characters."""
    import pyarrow as pa

    size = os.path.getsize(path)
    footer = footer_bytes(path)
    if footer > min(MAX_FOOTER_BYTES, size - 12):
        raise _refuse(release, output, path, f"states a footer of {footer:,} bytes (at most "
                                             f"{MAX_FOOTER_BYTES:,} and the file's {size:,})")
    try:
        metadata = open_part(path).metadata
        schema = metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError):
        raise _refuse(release, output, path, "cannot be read as the Parquet gedp writes: its footer does not decode "
                                             f"(or declares lists of more than {CONTAINER_LIMIT:,} elements)") from None
    groups = [metadata.row_group(group) for group in range(metadata.num_row_groups)]
    rows = metadata.num_rows
    if rows < 0 or sum(group.num_rows for group in groups) != rows:
        held = sum(group.num_rows for group in groups)
        raise _refuse(release, output, path, f"states {rows:,} rows, its row groups {held:,}")
    if expected_rows is not None and rows != expected_rows:
        raise InputError(f"release '{release}': its protected microdata hold {rows:,} rows, its manifest states "
                         f"{expected_rows:,} establishments ({Path(path).name}; an edited or damaged copy)")
    unpacked = sum(group.column(column).total_uncompressed_size for group in groups
                   for column in range(group.num_columns))
    decoded = rows * _row_width(release, output, path, schema)
    _check_stated(release, output, path, unpacked, decoded, size)
    check_pages(release, output, path, groups, size - footer - 8)
    return unpacked, decoded


def check_pages(release: str | Path, output: str, path: str | Path, groups: list, end: int) -> None:
    """Each column chunk of ``groups`` (a part's row groups, its pages ending before byte ``end``)
    holding pages whose headers decode (``page_headers.walk_chunk``) and state at most the bytes
    uncompressed its footer states for it (which ``_check_stated`` bounds), read header by header
    from the part's bytes before any page is: a page's header sizes the buffer a reader decompresses
    it into, whatever its footer states. Arrow reads a chunk's pages until it holds the chunk's values,
    so it reads the pages walked here, or fewer."""
    with open(path, "rb") as file:
        for group in groups:
            for index in range(group.num_columns):
                chunk = group.column(index)
                if chunk.num_values == 0:
                    continue  # a reader reads no page of a chunk of no values (an empty part's: offset 0)
                start, stop = chunk_range(chunk.data_page_offset, chunk.dictionary_page_offset,
                                          chunk.total_compressed_size)
                try:
                    if not 4 <= start <= stop <= end:
                        raise PageError(f"states its pages at bytes {start:,}-{stop:,} of the {end:,} before "
                                        "its footer")
                    pages = walk_chunk(file, start, stop, chunk.num_values)
                except PageError as err:
                    raise _refuse(release, output, path, f"column {_column(chunk.path_in_schema)} {err}") from None
                stated, footer = sum(page.uncompressed for page in pages), chunk.total_uncompressed_size
                if stated > footer:
                    raise _refuse(release, output, path, f"column {_column(chunk.path_in_schema)} holds page "
                                                         f"headers stating {stated:,} bytes uncompressed, more than "
                                                         f"the {footer:,} its footer states: a compression bomb")


def _column(name: str) -> str:
    from gedp.synth.schema import shown  # the schema's cut repr (it loads pandas: a refusal only)

    return shown(name)


def check_parts(release: str | Path, output: str, paths: list[str], expected: list[int | None]) -> None:
    """``check_footer`` of each part of ``paths`` (``expected`` its rows, or None), then the sizes its
    footer states added to those of the parts before it, against their sizes added up: PART_ROOM
    given once per output (400 parts of 1 KB each within it had together decoded to 0.6 GB)."""
    size = unpacked = decoded = 0
    for before, (path, rows) in enumerate(zip(paths, expected)):
        part_unpacked, part_decoded = check_footer(release, output, path, rows)
        size, unpacked, decoded = size + os.path.getsize(path), unpacked + part_unpacked, decoded + part_decoded
        _check_stated(release, output, path, unpacked, decoded, size, before)


def _check_stated(release: str | Path, output: str, path: str | Path, unpacked: int, decoded: int, size: int,
                  before: int = 0) -> None:
    if unpacked > MAX_UNCOMPRESSED_RATIO * size + PART_ROOM:
        raise _refuse(release, output, path, f"states pages of {unpacked:,} bytes uncompressed{_with(before)}, more "
                                             f"than {MAX_UNCOMPRESSED_RATIO} times {_their(before)} {size:,} bytes: "
                                             "a compression bomb")
    _check_decoded_size(release, output, path, decoded, size, before)


def _with(before: int) -> str:
    return f" with the {before:,} part{'s' if before > 1 else ''} before it" if before else ""


def _their(before: int) -> str:
    return "their" if before else "its"


def _check_decoded_size(release: str | Path, output: str, path: str | Path, decoded: int, size: int,
                        before: int = 0) -> None:
    if decoded > MAX_DECODED_RATIO * size + PART_ROOM:
        raise _refuse(release, output, path, f"holds rows decoding to {decoded:,} bytes or more{_with(before)}, more "
                                             f"than {MAX_DECODED_RATIO} times {_their(before)} {size:,} bytes: more "
                                             "rows than its file can hold, or one long value repeated on every row")


def check_decoded(release: str | Path, output: str, paths: list[str], columns: list[str] | None = None) -> None:
    """The parts of ``paths`` (of ``output``, listed and footer-checked: ``validation.listed_parts``)
    decode to at most MAX_DECODED_RATIO times their sizes added up, and PART_ROOM once
    (``decoded_bytes``, of their ``columns`` when given: those a reader reads), each counted with
    those before it, before any row of them is read as text."""
    size = decoded = 0
    for before, path in enumerate(paths):
        size += os.path.getsize(path)
        decoded += decoded_bytes(release, output, path, columns, MAX_DECODED_RATIO * size + PART_ROOM - decoded)
        _check_decoded_size(release, output, path, decoded, size, before)


def decoded_bytes(release: str | Path, output: str, path: str | Path, columns: list[str] | None = None,
                  stop: float = math.inf) -> int:
    """The bytes the rows of the part ``path`` decode to (of its ``columns``, all without them):
    its numbers and texts' offsets (``_row_width``) and its texts' characters, counted from its text
    columns read as dictionaries a row group at a time (each value's length times the rows that hold
    it: ``text_bytes``), never as text; the count so far once it passes ``stop``."""
    file = open_part(path)
    chosen = [field for field in file.schema_arrow if columns is None or field.name in columns]
    decoded = file.metadata.num_rows * _row_width(release, output, path, chosen)
    texts = [field.name for field in chosen if _is_text(field.type)]
    if not texts:
        return decoded
    import pyarrow as pa

    dictionaries = open_part(path, read_dictionary=texts)
    for group in range(file.metadata.num_row_groups):
        if decoded > stop:
            break
        try:
            decoded += text_bytes(dictionaries.read_row_group(group, columns=texts))
        except (pa.ArrowException, OSError):  # pages that do not decode (red team: an audit's traceback)
            raise _refuse(release, output, path, "cannot be read as the Parquet gedp writes: its pages do not "
                                                 "decode") from None
    return decoded


def _is_text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def text_bytes(table) -> int:
    """The characters (bytes) ``table``'s text columns, read as dictionaries, decode to: each
    dictionary value's length times the rows that index it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                continue
            lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
            total += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
    return total


def expected_rows(manifest: Mapping, output: str, name: str) -> int | None:
    """The rows the manifest states for the protected microdata's part ``name`` (``part-<state>`` or
    ``part-<quarter>-<state>``): its state's establishments (of its quarter); None for another output
    or a manifest without ``per_state``."""
    from gedp.release.format import PROTECTED_FILE

    if output != PROTECTED_FILE:
        return None
    quarter, _, state = name[len("part-"):-len(".parquet")].rpartition("-")
    section = manifest["per_quarter"][quarter] if quarter else manifest
    per_state = section.get("per_state")
    if isinstance(per_state, Mapping):
        return int(per_state[state]["establishments"])
    return int(section["establishments"]) if len(section["states"]) == 1 else None
