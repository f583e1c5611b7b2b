"""The page headers of a Parquet part, read from its bytes before any page is: a reader sizes each
page's buffer by its header's ``uncompressed_page_size`` (Arrow: up to 2 GiB), which the footer's
sizes do not bound (a 332 KB part whose first page header stated 1.5 GB had a read reach 1.64 GB).

Each column chunk's pages are walked as a reader walks them (from its dictionary page, or its first
data page, to the end of the bytes its footer states: ``chunk_range``), each header decoded from
the Thrift compact protocol (``decode_header``: its type, sizes and values; every other field
skipped), reading only the headers' bytes (a seek and a small read each). A header that does not
decode, is longer than MAX_HEADER_BYTES, or states a page running past its chunk, more than
MAX_PAGES pages in a chunk (or SPARE_PAGES besides one per VALUES_PER_PAGE of its values), header
bytes beyond SPARE_HEADER_BYTES and HEADER_BYTES_PER_PAGE a page, data pages holding other than the
chunk's values, or a dictionary of more entries than the chunk's values or its own bytes (a reader
reserves 16 bytes an entry before decoding) is refused (PageError, naming the column); the caller
checks the sizes the headers state (``part_sizes``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

#: The longest page header decoded: gedp's are 20-40 bytes (a data page's statistics: at most 4 KB
#: each of its minimum and maximum, pyarrow's limit); Arrow's reader stops at 16 MiB.
MAX_HEADER_BYTES = 1 << 16
#: The most pages a column chunk may hold: gedp's hold one per 20,000 rows or 1 MiB (pyarrow's
#: defaults), 51 in a row group of a million rows.
MAX_PAGES = 10_000
#: The bytes first read for a header (doubled while it does not fit, up to MAX_HEADER_BYTES).
FIRST_READ = 256
#: The deepest nesting of structs, lists and maps skipped in a header (Parquet's: 3).
MAX_DEPTH = 16
#: Parquet's page types: DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2.
DATA_PAGES = (0, 3)
DICTIONARY_PAGE = 2
PAGE_TYPES = (0, 1, 2, 3)
#: Pages a chunk may hold besides one per VALUES_PER_PAGE of its values: gedp's pages hold thousands
#: of values each; a page per row made a walk of 80 MB of pages take 30 s.
SPARE_PAGES = 16
VALUES_PER_PAGE = 64
#: Header bytes a chunk may hold besides HEADER_BYTES_PER_PAGE a page (gedp's are 20-200 bytes):
#: 1,000 headers of 64 KB each made a 67 MB part take 48 s to walk.
SPARE_HEADER_BYTES = MAX_HEADER_BYTES
HEADER_BYTES_PER_PAGE = 1024
# Thrift compact protocol types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
_I32_RANGE = range(-(1 << 31), 1 << 31)


class PageError(ValueError):
    """A page header that cannot be what a Parquet writer wrote (its reason)."""


class _Short(PageError):
    """The bytes end before the header does."""


@dataclass(frozen=True)
class PageHeader:
    """A page's type, its sizes (uncompressed and compressed), the values it holds (a data page's;
    0 otherwise), its header's length in bytes and a dictionary page's entries."""

    kind: int
    uncompressed: int
    compressed: int
    values: int
    length: int
    entries: int = 0  # a dictionary page's values (its entries); 0 otherwise


class _Reader:
    """Thrift compact protocol over bytes: each read checked against their end."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise _Short("ends inside its header")
        self.at += 1
        return self.data[self.at - 1]

    def skip(self, count: int) -> None:
        if count < 0:
            raise PageError("states a negative length")
        if self.at + count > len(self.data):
            raise _Short("ends inside its header")
        self.at += count

    def varint(self) -> int:
        value = 0
        for shift in range(0, 70, 7):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
        raise PageError("holds a varint of more than 10 bytes")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def i32(self) -> int:
        value = self.zigzag()
        if value not in _I32_RANGE:
            raise PageError("holds a 32-bit number out of range")
        return value

    def fields(self, depth: int) -> Iterator[tuple[int, int]]:
        """Each field's id and type of a struct, to its stop."""
        if depth > MAX_DEPTH:
            raise PageError(f"nests more than {MAX_DEPTH} levels")
        last = 0
        while True:
            byte = self.byte()
            if byte == 0:
                return
            kind, delta = byte & 0x0F, byte >> 4
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def value(self, kind: int, depth: int) -> None:
        """Skip a value of ``kind``."""
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.skip(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.skip(8)
        elif kind == _BINARY:
            self.skip(self.varint())
        elif kind in (_LIST, _SET):
            header = self.byte()
            size, element = header >> 4, header & 0x0F
            self.elements(self.varint() if size == 15 else size, [element], depth)
        elif kind == _MAP:
            size = self.varint()
            if size:
                header = self.byte()
                self.elements(size, [header >> 4, header & 0x0F], depth)
        elif kind == _STRUCT:
            for _, field in self.fields(depth + 1):
                self.value(field, depth + 1)
        else:
            raise PageError(f"holds a field of unknown type {kind}")

    def elements(self, size: int, kinds: list[int], depth: int) -> None:
        """Skip ``size`` elements of ``kinds`` (a list's, or a map's keys and values); each takes a
        byte at least, so a size beyond the bytes left ends the header."""
        if size > len(self.data) - self.at:
            raise _Short("ends inside its header")
        for _ in range(size):
            for kind in kinds:
                if kind in (_TRUE, _FALSE):
                    self.skip(1)  # a boolean in a collection is a byte
                else:
                    self.value(kind, depth + 1)


def decode_header(data: bytes) -> PageHeader:
    """The page header at the start of ``data`` (Thrift compact: parquet.thrift's PageHeader, its
    fields 1-3 and its data page's values, field 1 of field 5 or 8); PageError when it does not
    decode, _Short when ``data`` ends first."""
    reader = _Reader(data)
    found: dict[int, int] = {}
    counted = {5: 0, 7: 0, 8: 0}  # the values of a data page (v1, v2) and a dictionary page's entries
    for field, kind in reader.fields(0):
        if field in (1, 2, 3):
            if kind != _I32:
                raise PageError(f"states its field {field} as Thrift type {kind}, not a 32-bit number")
            found[field] = reader.i32()
        elif field in counted and kind == _STRUCT:
            for inner, inner_kind in reader.fields(1):
                if inner == 1 and inner_kind == _I32:
                    counted[field] = reader.i32()
                else:
                    reader.value(inner_kind, 1)
        else:
            reader.value(kind, 0)
    if len(found) < 3:
        raise PageError("lacks its type or sizes")
    kind, uncompressed, compressed = found[1], found[2], found[3]
    values, entries = counted[5] or counted[8], counted[7]
    if kind not in PAGE_TYPES or min(uncompressed, compressed, values, entries, counted[5], counted[8]) < 0:
        raise PageError(f"states a page of type {kind}, {uncompressed:,} bytes uncompressed, {compressed:,} "
                        f"compressed, {values:,} values, {entries:,} entries")
    return PageHeader(kind, uncompressed, compressed, values if kind in DATA_PAGES else 0, reader.at,
                      entries if kind == DICTIONARY_PAGE else 0)


def read_header(file: BinaryIO, at: int, end: int) -> PageHeader:
    """The page header at byte ``at`` of ``file``, read before byte ``end`` (its chunk's end), in
    reads of FIRST_READ bytes doubled while it does not fit, up to MAX_HEADER_BYTES."""
    size = FIRST_READ
    while True:
        length = min(size, end - at, MAX_HEADER_BYTES)
        file.seek(at)
        try:
            return decode_header(file.read(length))
        except _Short:
            if length == end - at:
                raise PageError(f"holds a page header running past its chunk (at byte {at:,})") from None
            if length == MAX_HEADER_BYTES:
                raise PageError(f"holds a page header longer than {MAX_HEADER_BYTES:,} bytes") from None
        size *= 2


def chunk_range(data_page_offset: int, dictionary_page_offset: int | None, compressed: int) -> tuple[int, int]:
    """The bytes of a column chunk as Arrow reads them: from its dictionary page when it states one
    before its first data page, for the compressed size its footer states."""
    start = data_page_offset
    if dictionary_page_offset is not None and 0 < dictionary_page_offset < start:
        start = dictionary_page_offset
    return start, start + compressed


def walk_chunk(file: BinaryIO, start: int, end: int, values: int) -> list[PageHeader]:
    """The headers of the pages of the chunk at bytes [``start``, ``end``) of ``file`` holding
    ``values`` values (its footer's), each page within it, the last ending at its end; PageError
    otherwise (more than MAX_PAGES pages, or data pages holding other than ``values``)."""
    pages: list[PageHeader] = []
    at, header_bytes = start, 0
    most = min(MAX_PAGES, SPARE_PAGES + values // VALUES_PER_PAGE)
    while at < end:
        if len(pages) == most:
            raise PageError(f"holds more than {most:,} pages for its {values:,} values")
        page = read_header(file, at, end)
        at += page.length + page.compressed
        header_bytes += page.length
        if at > end:
            raise PageError(f"holds a page of {page.compressed:,} bytes running past its chunk's end")
        if header_bytes > SPARE_HEADER_BYTES + HEADER_BYTES_PER_PAGE * (len(pages) + 1):
            raise PageError(f"holds page headers of {header_bytes:,} bytes in its first {len(pages) + 1:,} pages")
        if page.entries > min(values, page.uncompressed):
            raise PageError(f"holds a dictionary of {page.entries:,} entries in {page.uncompressed:,} bytes for its "
                            f"{values:,} values")
        pages.append(page)
    held = sum(page.values for page in pages)
    if held != values:
        raise PageError(f"holds pages of {held:,} values, its footer states {values:,}")
    return pages
