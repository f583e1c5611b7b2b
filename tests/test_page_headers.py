"""A release's part whose page headers state sizes its footer does not account for is refused from
its headers before a page is read (a 332 KB part whose page header stated 1.5 GB uncompressed had a
read reach 1.64 GB: the footer's sizes were honest, so its checks passed)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gedp
from gedp.errors import InputError
from gedp.release.page_headers import (
    FIRST_READ,
    MAX_HEADER_BYTES,
    MAX_PAGES,
    SPARE_PAGES,
    VALUES_PER_PAGE,
    PageError,
    chunk_range,
    decode_header,
    walk_chunk,
)
from gedp.release.part_sizes import check_footer
from gedp.synth.jobs import synthesize_jobs
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

#: The size the crafted page header states: 1.5 GB (Arrow decompresses a page into a buffer of it).
LIE = 1_500_000_000


# --- a test-side Thrift compact codec (structs, numbers, texts, booleans: what a PageHeader holds) ----
def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value, at, shift = value | (byte & 0x7F) << shift, at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _parse(data: bytes, at: int = 0) -> tuple[list, int]:
    """A struct at ``at``: its fields as [id, type, value] (a struct's value its fields), and its end."""
    fields, last = [], 0
    while data[at]:
        kind, delta = data[at] & 0x0F, data[at] >> 4
        assert delta, "a long-form field id"
        last, at = last + delta, at + 1
        if kind in (1, 2):
            value = None
        elif kind in (5, 6):
            raw, at = _varint(data, at)
            value = (raw >> 1) ^ -(raw & 1)
        elif kind == 8:
            length, at = _varint(data, at)
            value, at = data[at:at + length], at + length
        else:
            assert kind == 12, f"a field of type {kind}"
            value, at = _parse(data, at)
        fields.append([last, kind, value])
    return fields, at + 1


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _encode(fields: list) -> bytes:
    out, last = bytearray(), 0
    for field, kind, value in fields:
        out.append((field - last) << 4 | kind)
        last = field
        if kind in (5, 6):
            out += _encode_varint(value << 1 ^ value >> 63)
        elif kind == 8:
            out += _encode_varint(len(value)) + value
        elif kind == 12:
            out += _encode(value)
    return bytes(out + b"\0")


def _field(fields: list, number: int) -> list:
    return next(field for field in fields if field[0] == number)


def _first_data_page(part: Path, column: str) -> tuple[int, int]:
    """The offset of the first data page of ``column``'s first chunk, and the chunk's end."""
    chunk = next(pq.read_metadata(part).row_group(0).column(k) for k in range(pq.read_metadata(part).num_columns)
                 if pq.read_metadata(part).row_group(0).column(k).path_in_schema == column)
    return chunk.data_page_offset, chunk_range(chunk.data_page_offset, chunk.dictionary_page_offset,
                                               chunk.total_compressed_size)[1]


def lying_header(part: Path, column: str = "county", size: int = LIE) -> None:
    """``part`` (pyarrow's Snappy pages, as gedp writes them) with its first data page of ``column``
    stating ``size`` bytes uncompressed, its header re-encoded to its own length (``_replace``: the
    page statistics a read does not use cut or padded for the bytes the new size takes), every other
    byte kept."""
    content = bytearray(part.read_bytes())
    at, _ = _first_data_page(part, column)
    header, end = _parse(bytes(content), at)
    assert _field(header, 1)[2] == 0 and _field(header, 2)[2] < size
    _field(header, 2)[2] = size
    _replace(content, at, end, header)
    part.write_bytes(bytes(content))


def _replace(content: bytearray, at: int, stop: int, header: list) -> None:
    """``content``'s header at [``at``, ``stop``) replaced by ``header`` re-encoded to the same length:
    its page statistics' null count dropped and their minimum and maximum cut, or padded, as it needs."""
    statistics = _field(_field(header, 5)[2], 5)[2]
    if len(_encode(header)) > stop - at:
        statistics.remove(_field(statistics, 3))
    texts = [field for field in statistics if field[1] == 8]
    while len(_encode(header)) > stop - at and any(field[2] for field in texts):
        longest = max(texts, key=lambda field: len(field[2]))
        longest[2] = longest[2][:-1]
    while len(_encode(header)) < stop - at:
        texts[0][2] += b"0"
    encoded = _encode(header)
    assert len(encoded) == stop - at, "the header re-encoded to another length"
    content[at:stop] = encoded


@pytest.fixture(scope="module")
def honest(seeded_small_release) -> Path:
    return seeded_small_release("honest", 400)


def _copy(honest: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    return copy, copy / "protected.parquet" / "part-44.parquet"


def test_the_test_codec_reads_and_writes_a_header_back_unchanged(honest):
    """The test's own encoder (which crafts the lying header) is the inverse of its parser on a real
    header: the crafted part differs from its honest copy in its size field alone."""
    part = honest / "protected.parquet" / "part-44.parquet"
    content = part.read_bytes()
    at, _ = _first_data_page(part, "county")
    header, end = _parse(content, at)
    assert _encode(header) == content[at:end]


#: A child process reading the microdata through the API, printing Arrow's peak allocation (MB),
#: its peak resident memory (MB) and the refusal.
CHILD = """
import re, sys
import pyarrow as pa
import gedp
from gedp.errors import InputError
try:
    gedp.Release(sys.argv[1]).microdata
    message = "read"
except InputError as err:
    message = str(err)
peak = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
print(pa.default_memory_pool().max_memory() / 1e6, int(peak) / 1024)
print(message)
"""


def test_a_page_header_stating_a_huge_page_is_refused_before_arrow_allocates_it(honest, tmp_path):
    """The crafted part (its footer honest) is refused in one line naming the part and the column, by a
    child process whose Arrow allocations stay under 50 MB and its resident memory under 400 MB (at
    the code before: the read reached 1.5 GB of Arrow allocations, then failed with Arrow's error)."""
    copy, part = _copy(honest, tmp_path)
    lying_header(part)
    assert pq.read_metadata(part).num_rows == 400  # the footer decodes, its sizes untouched
    child = subprocess.run([sys.executable, "-c", CHILD, str(copy)], capture_output=True, text=True, timeout=300,
                           check=True)
    peaks, said = child.stdout.strip().splitlines()
    arrow, resident = map(float, peaks.split())
    assert arrow < 50 and resident < 400, (arrow, resident)
    assert re.fullmatch(rf"release '{re.escape(str(copy))}': protected.parquet/part-44.parquet column 'county' holds "
                        r"page headers stating 1,50\d,\d{3},\d{3} bytes uncompressed, more than the [\d,]+ its footer "
                        r"states: a compression bomb \(an edited or damaged copy\)", said), said


def _unknown_type(content: bytearray, at: int, end: int) -> None:
    """The header's data page header field (a struct) typed 13, which Thrift does not define."""
    header, _ = _parse(bytes(content), at)
    position = at + len(_encode(header[:3])) - 1  # after fields 1-3 (not their stop byte)
    assert content[position] & 0x0F == 12
    content[position] = content[position] & 0xF0 | 13


def _past_the_chunk(content: bytearray, at: int, end: int) -> None:
    """The first data page stating a compressed size running past its chunk (the same varint length)."""
    header, stop = _parse(bytes(content), at)
    _field(header, 3)[2] = _field(header, 3)[2] + end - at
    _replace(content, at, stop, header)


def _varint_of_eleven_bytes(content: bytearray, at: int, end: int) -> None:
    content[at + 3:at + 14] = b"\x80" * 11


def _negative_size(content: bytearray, at: int, end: int) -> None:
    header, stop = _parse(bytes(content), at)
    _field(header, 2)[2] = -_field(header, 2)[2]
    _replace(content, at, stop, header)


MALFORMED = {
    "unknown field type": (_unknown_type, "holds a field of unknown type 13"),
    "compressed size past the chunk": (_past_the_chunk, "running past its chunk's end"),
    "varint of eleven bytes": (_varint_of_eleven_bytes, "holds a varint of more than 10 bytes"),
    "negative size": (_negative_size, "states a page of type 0, -"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_page_header_is_refused_in_one_line(honest, tmp_path, case):
    copy, part = _copy(honest, tmp_path)
    content = bytearray(part.read_bytes())
    at, end = _first_data_page(part, "county")
    MALFORMED[case][0](content, at, end)
    assert len(content) == part.stat().st_size
    part.write_bytes(bytes(content))
    with pytest.raises(InputError) as refused:
        _ = gedp.Release(copy).microdata
    message = str(refused.value)
    assert "\n" not in message and "part-44.parquet column 'county'" in message, message
    assert MALFORMED[case][1] in message, message


class _Counted:
    """A file counting the bytes read from it."""

    def __init__(self, file) -> None:
        self.file, self.read_bytes = file, 0

    def seek(self, at: int) -> int:
        return self.file.seek(at)

    def read(self, size: int) -> bytes:
        data = self.file.read(size)
        self.read_bytes += len(data)
        return data


def _headers_of(part: Path) -> list[tuple[list, int, int, int]]:
    """Each chunk's pages as the test's parser reads them (sizes and header lengths), its footer's
    uncompressed size and values, and what gedp's walk reads (a read of FIRST_READ bytes a header at
    most: never the pages)."""
    metadata = pq.read_metadata(part)
    found = []
    with open(part, "rb") as file:
        content = part.read_bytes()
        for group in range(metadata.num_row_groups):
            for column in range(metadata.num_columns):
                chunk = metadata.row_group(group).column(column)
                start, end = chunk_range(chunk.data_page_offset, chunk.dictionary_page_offset,
                                         chunk.total_compressed_size)
                parsed, at = [], start
                while at < end:
                    header, stop = _parse(content, at)
                    values = next((_field(_field(header, k)[2], 1)[2] for k in (5, 8)
                                   if any(field[0] == k for field in header)), 0)
                    parsed.append((_field(header, 1)[2], _field(header, 2)[2], _field(header, 3)[2], values,
                                   stop - at))
                    at = stop + _field(header, 3)[2]
                counted = _Counted(file)
                walked = [(page.kind, page.uncompressed, page.compressed, page.values, page.length)
                          for page in walk_chunk(counted, start, end, chunk.num_values)]
                assert counted.read_bytes <= FIRST_READ * len(walked), "the walk read more than its headers"
                found.append((parsed, walked, chunk.total_uncompressed_size, chunk.num_values))
    return found


@pytest.fixture(scope="module")
def every_kind(honest, tmp_path_factory) -> list[Path]:
    """A part of each output gedp writes: protected microdata and measurements, a panel quarter's of
    each, and a job frame's."""
    first = generate_profile(load_profile("small"), n_establishments=300, rng=np.random.default_rng(3))
    panel = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(3))
    folder = tmp_path_factory.mktemp("panel") / "release"
    gedp.protect(panel, seed=4, not_for_publication=True, allow_over_cap=True).write(folder)
    state = generate_profile(load_profile("small"), n_establishments=300, rng=np.random.default_rng(11))
    jobs = gedp.protect(state.drop(columns=["m2emp", "m3emp", "wage"]), "jobs",
                        input=gedp.Input(jobs=synthesize_jobs(state, rng=np.random.default_rng(12))), seed=3,
                        not_for_publication=True)
    jobs_folder = tmp_path_factory.mktemp("jobs") / "release"
    jobs.write(jobs_folder)
    parts = [*honest.glob("*.parquet/*.parquet"), *folder.glob("*.parquet/*.parquet"),
             *jobs_folder.glob("*.parquet/*.parquet")]
    assert {part.parent.name for part in parts} >= {"protected.parquet", "measurements.parquet",
                                                    "protected_jobs.parquet"}
    return parts


def test_the_walk_reads_every_kind_of_honest_part_as_its_writer_wrote_it(every_kind):
    """On each honest part, gedp's walk reads each page as the test's own parser does, its pages'
    sizes with their headers' adding up to the uncompressed size the writer's footer states for their
    chunk (Arrow counts both), and its data pages' values to the chunk's."""
    for part in every_kind:
        for parsed, walked, uncompressed, values in _headers_of(part):
            assert walked == parsed and 0 < len(walked) < MAX_PAGES, part
            assert sum(page[1] + page[4] for page in walked) == uncompressed, part
            assert sum(page[3] for page in walked) == values, part
        check_footer(part.parent.parent, part.parent.name, part)  # the checks every reader passes through


def test_a_header_cut_short_is_refused(honest):
    """A header ending (its chunk ending) at any byte before its own end: inside a varint, a field
    header or a statistic, refused by the decoder and by the walk."""
    chunk, values, first = _header_and_chunk(honest)
    _, stop = _parse(chunk, first)
    for cut in range(first + 1, stop):
        with pytest.raises(PageError):
            decode_header(chunk[first:cut])
        with pytest.raises(PageError, match="holds a page header running past its chunk"):
            walk_chunk(io.BytesIO(chunk[:cut]), first, cut, values)


def test_the_walk_is_bounded_in_pages_and_header_bytes():
    """More than MAX_PAGES empty pages in a chunk, or a header of more than MAX_HEADER_BYTES (an unknown
    field of 70,000 bytes), are refused without reading further."""
    empty = _encode([[1, 5, 0], [2, 5, 0], [3, 5, 0]])
    pages = io.BytesIO(empty * (MAX_PAGES + 5))
    with pytest.raises(PageError, match=f"holds more than {MAX_PAGES:,} pages"):
        walk_chunk(pages, 0, len(empty) * (MAX_PAGES + 5), VALUES_PER_PAGE * MAX_PAGES)
    assert pages.tell() <= len(empty) * (MAX_PAGES + 1) + FIRST_READ
    long = _encode([[1, 5, 0], [2, 5, 0], [3, 5, 0], [9, 8, b"x" * 70_000]])
    with pytest.raises(PageError, match=f"holds a page header longer than {MAX_HEADER_BYTES:,} bytes"):
        walk_chunk(io.BytesIO(long), 0, len(long), 0)
    assert walk_chunk(io.BytesIO(empty * 3), 0, len(empty) * 3, 0)[2].length == len(empty)


def _header_and_chunk(honest: Path) -> tuple[bytes, int, int]:
    part = honest / "protected.parquet" / "part-44.parquet"
    metadata = pq.read_metadata(part)
    chunk = next(metadata.row_group(0).column(k) for k in range(metadata.num_columns)
                 if metadata.row_group(0).column(k).path_in_schema == "county")
    start, end = chunk_range(chunk.data_page_offset, chunk.dictionary_page_offset, chunk.total_compressed_size)
    return part.read_bytes()[start:end], chunk.num_values, chunk.data_page_offset - start


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_mutated_headers_are_decoded_or_refused_never_crash(honest, data):
    """Random byte edits (overwrites, insertions, deletions) in a real chunk's headers either decode or
    raise PageError: never IndexError, struct.error or a loop beyond the chunk."""
    chunk, values, first = _header_and_chunk(honest)
    edited = bytearray(chunk)
    for _ in range(data.draw(st.integers(1, 6))):
        spot = data.draw(st.integers(0, min(len(edited), first + 80) - 1))
        action = data.draw(st.sampled_from(["set", "insert", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if action == "set":
            edited[spot] = byte
        elif action == "insert":
            edited.insert(spot, byte)
        elif len(edited) > 1:
            del edited[spot]
    try:
        decode_header(bytes(edited[first:]))
    except PageError:
        pass
    try:
        pages = walk_chunk(io.BytesIO(bytes(edited)), 0, len(edited), values)
    except PageError:
        return
    assert sum(page.length + page.compressed for page in pages) == len(edited)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_decoded_or_refused(data):
    try:
        header = decode_header(data)
    except PageError:
        return
    assert header.length <= len(data) and min(header.uncompressed, header.compressed, header.values) >= 0


def test_a_chunk_of_a_page_per_row_is_refused_after_few_headers(honest, tmp_path):
    """pyarrow's own writer with a page per row (80 MB of such pages took 30 s to walk, each part 2-3
    times a command): more than SPARE_PAGES pages besides one per VALUES_PER_PAGE values is refused."""
    copy, part = _copy(honest, tmp_path)
    pq.write_table(pq.read_table(part), part, use_dictionary=False, write_statistics=False, data_page_size=1,
                   write_batch_size=1)
    values = pq.read_metadata(part).row_group(0).column(0).num_values
    with pytest.raises(InputError) as refused:
        _ = gedp.Release(copy).microdata
    most = SPARE_PAGES + values // VALUES_PER_PAGE
    assert f"holds more than {most:,} pages for its {values:,} values" in str(refused.value), str(refused.value)


def test_fat_page_headers_are_refused_after_the_first_ones():
    """Headers padded with an unknown field of 60,000 bytes (1,000 of them made a 67 MB part take 48 s
    to walk): a chunk's header bytes beyond MAX_HEADER_BYTES and 1 KiB a page are refused, the file read
    no further than the two headers it took (of 1,000: 60 MB)."""
    fat = _encode([[1, 5, 1], [2, 5, 0], [3, 5, 0], [9, 8, b"x" * 60_000]])
    chunk = _Counted(io.BytesIO(fat * 1000))
    with pytest.raises(PageError, match="holds page headers of 120,"):
        walk_chunk(chunk, 0, len(fat) * 1000, 0)
    assert chunk.read_bytes <= 2 * 2 * MAX_HEADER_BYTES  # two headers, each read in doubling reads


def _dictionary_stating(part: Path, column: str, entries: int) -> None:
    """``part`` rewritten by pyarrow with page checksums, then ``column``'s dictionary page header
    stating ``entries`` values, re-encoded to its own length (its checksum dropped, an unknown field
    padding what is left), every other byte kept."""
    pq.write_table(pq.read_table(part), part, compression="snappy", write_page_checksum=True)
    content = bytearray(part.read_bytes())
    chunk = next(pq.read_metadata(part).row_group(0).column(k) for k in range(pq.read_metadata(part).num_columns)
                 if pq.read_metadata(part).row_group(0).column(k).path_in_schema == column)
    at = chunk.dictionary_page_offset
    header, end = _parse(bytes(content), at)
    assert _field(header, 1)[2] == 2, header
    header = [field for field in header if field[0] != 4]  # the checksum
    _field(_field(header, 7)[2], 1)[2] = entries
    padded = header
    for pad in range(0, end - at):
        padded = [*header, [15, 8, b"x" * pad]]
        if len(_encode(padded)) >= end - at:
            break
    assert len(_encode(padded)) == end - at, "no padding re-encodes the header to its length"
    content[at:end] = _encode(padded)
    part.write_bytes(bytes(content))


@pytest.mark.parametrize("entries", [2**31 - 1, 2**20])
def test_a_dictionary_page_stating_more_entries_than_its_chunk_holds_is_refused(honest, tmp_path, entries):
    """A dictionary page header whose entries (its own values) exceed its chunk's values or its bytes
    (Arrow reserves 16 bytes an entry before decoding: 2^31 - 1 of them, 34 GB reserved) is refused
    in one line before a page is read."""
    copy, part = _copy(honest, tmp_path)
    _dictionary_stating(part, "county", entries)
    with pytest.raises(InputError) as refused:
        _ = gedp.Release(copy).microdata
    message = str(refused.value)
    assert "\n" not in message and "part-44.parquet column 'county'" in message, message
    assert f"holds a dictionary of {entries:,} entries" in message, message
