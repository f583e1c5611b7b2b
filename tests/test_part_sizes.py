"""A release's part whose footer or pages would decode to far more than its file holds is refused
from its footer and dictionaries before its rows are read (red team F3: parts of 0.4-7.7 MB made
`gedp tabulate` reach 2.0-6.9 GB before refusing them, or answer them)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_page_headers import lying_header
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.release.part_sizes import MAX_DECODED_RATIO, PART_ROOM, decoded_bytes
from gedp.serve.releases import load_releases

runner = CliRunner()
#: Rows of the crafted parts: 6 million copies of one row decode to about 0.8 GB (protected
#: microdata) and 0.5 GB (measurements), in files of a few hundred kilobytes.
ROWS = 6_000_000


@pytest.fixture(scope="module")
def honest(seeded_small_release) -> Path:
    return seeded_small_release("honest", 400)


def _state_rows(folder: Path, rows: int) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["establishments"] = manifest["per_state"]["44"]["establishments"] = rows
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _repeated_rows(part: Path, folder: Path, output: str) -> None:
    """ROWS copies of the part's first row (runs of one value: a few bytes per million rows), the
    manifest stating as many establishments."""
    table = pq.read_table(part)
    block = table.take([0] * 1_000_000)
    with pq.ParquetWriter(part, table.schema) as writer:
        for _ in range(ROWS // 1_000_000):
            writer.write_table(block)
    if output == "protected.parquet":
        _state_rows(folder, ROWS)


def _zstd_zeros(part: Path, folder: Path, output: str) -> None:
    """The same rows as plain pages compressed by zstd: the footer states 1,000 times the file."""
    table = pq.read_table(part).take([0] * 1_000_000)
    with pq.ParquetWriter(part, table.schema, compression="zstd", compression_level=19, use_dictionary=False) as writer:
        for _ in range(ROWS // 1_000_000):
            writer.write_table(table, row_group_size=ROWS)
    if output == "protected.parquet":
        _state_rows(folder, ROWS)


def _text_column(part: Path, values: pa.Array, store_schema: bool = True) -> None:
    """The part's rows, the county column the dictionary ``values`` (every row its first value)."""
    table = pq.read_table(part)
    county = pa.DictionaryArray.from_arrays(pa.array([0] * table.num_rows, pa.int32()), values)
    table = table.set_column(table.schema.get_field_index("county"), "county", county)
    pq.write_table(table, part, compression="zstd", dictionary_pagesize_limit=1 << 31, data_page_size=1 << 30,
                   store_schema=store_schema)


def _huge_dictionary(part: Path, folder: Path, output: str) -> None:
    """The honest rows, the county column's dictionary page 2 million distinct values of 200 digits."""
    _text_column(part, pa.array([f"{k:0200d}" for k in range(2_000_000)]), store_schema=False)


def _long_text(part: Path, folder: Path, output: str) -> None:
    """The honest rows, one county text of 900,000 characters on every row (kept once in the
    dictionary, within PART_ROOM; decoded on every row: 0.36 GB at 400 rows), read back as plain text."""
    _text_column(part, pa.array(["9" * 900_000]), store_schema=False)


def _footer_rows(part: Path, folder: Path, output: str) -> None:
    """The manifest states 10 times the part's rows (its footer states the true number)."""
    _state_rows(folder, 10 * pq.read_metadata(part).num_rows)


def _dictionary_text(part: Path, folder: Path, output: str) -> None:
    """The honest rows, the county column stored as an Arrow dictionary (its schema kept) of one text
    of 900,000 characters on every row (0.36 GB decoded at 400 rows; counted before at its 4-byte
    index: read, red team finding 1)."""
    _text_column(part, pa.array(["4" * 900_000]))


def _binary_column(part: Path, folder: Path, output: str) -> None:
    """The honest rows and a binary column of 1,000,000 zero bytes on every row (0.4 GB decoded at
    400 rows, kept once in its dictionary page; counted before at 4 bytes a row: finding 4)."""
    table = pq.read_table(part)
    table = table.append_column(pa.field("note", pa.binary()), pa.array([b"\0" * 1_000_000] * table.num_rows))
    pq.write_table(table, part, compression="zstd")


def _decimal_columns(part: Path, folder: Path, output: str) -> None:
    """160 decimal columns (16 bytes a row in Arrow, a Python object of ~100 bytes each in pandas:
    finding 6)."""
    table = pq.read_table(part)
    column = pa.array([1] * table.num_rows, pa.decimal128(38, 10))
    for k in range(160):
        table = table.append_column(f"c{k}", column)
    pq.write_table(table, part, compression="zstd")


def _string_view(part: Path, folder: Path, output: str) -> None:
    """The county column as a string view (its bit width raised ValueError: a traceback, finding 8)."""
    table = pq.read_table(part)
    index = table.schema.get_field_index("county")
    pq.write_table(table.set_column(index, "county", table.column("county").cast(pa.string_view())), part)


#: A footer of 45 bytes (Thrift compact: version 1, a schema of two elements, 0 rows) declaring a list
#: of 1,000,000 row groups, the first declaring 1,000,000 column chunks, cut short: Arrow's decoder had
#: allocated 0.9 GB before failing (red team finding 3).
BOMB_FOOTER = bytes.fromhex("1502192c4806736368656d611502001504250018017800160019fcc0843d"
                            "19fcc0843d26081c150419f5c0843d")


def _footer_bomb(part: Path, folder: Path, output: str) -> None:
    part.write_bytes(b"PAR1" + BOMB_FOOTER + len(BOMB_FOOTER).to_bytes(4, "little") + b"PAR1")


def _page_header_bomb(part: Path, folder: Path, output: str) -> None:
    """The first data page of the part's first column stating 1.5 GB uncompressed, its footer honest
    (``test_page_headers.lying_header``: Arrow allocated 1.5 GB for it at the code before)."""
    lying_header(part, pq.read_metadata(part).schema.column(0).path)


CRAFTED = {
    "repeated rows": (_repeated_rows, "more than 64 times its"),
    "zstd zeros": (_zstd_zeros, "uncompressed, more than 16 times its"),
    "huge dictionary": (_huge_dictionary, "uncompressed, more than 16 times its"),
    "long text on every row": (_long_text, "more than 64 times its"),
    "footer rows": (_footer_rows, "hold 400 rows, its manifest states 4,000 establishments"),
    "dictionary text": (_dictionary_text, "holds the column 'county' as dictionary<values=string"),
    "binary column": (_binary_column, "holds the column 'note' as binary; gedp writes text, int64 and double"),
    "decimal columns": (_decimal_columns, "holds the column 'c0' as decimal128(38, 10); gedp writes"),
    "string view": (_string_view, "holds the column 'county' as string_view; gedp writes"),
    "footer bomb": (_footer_bomb, "cannot be read as the Parquet gedp writes: its footer does not decode"),
    "page header bomb": (_page_header_bomb, "holds page headers stating 1,50"),
}
OUTPUTS = {"repeated rows": ["protected.parquet", "measurements.parquet"],
           "zstd zeros": ["protected.parquet", "measurements.parquet"],
           "page header bomb": ["protected.parquet", "measurements.parquet"]}


def crafted(honest: Path, tmp_path: Path, case: str, output: str) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    CRAFTED[case][0](copy / output / "part-44.parquet", copy, output)
    return copy


#: What a child process reads the release with, each reader in turn (``sys.argv[3:]``), and prints after
#: each: the peak resident memory so far (MB: VmHWM, that of its own program; ru_maxrss would count the
#: test process it was forked from) and Arrow's peak allocation so far (MB), then the refusal. The peaks
#: after the last reader are the largest of every reader's, so each is bounded by them.
CHILD = """
import re, sys
import pyarrow as pa
import gedp
from gedp.errors import InputError
for reader in sys.argv[3:]:
    try:
        if reader == "audit":
            from gedp.audit.release import audit_release
            message = " ".join(check.detail for check in audit_release(sys.argv[1]) if check.name == "files")
        else:
            release = gedp.Release(sys.argv[1])
            release.microdata if sys.argv[2] == "protected.parquet" else release.measurements
            message = "read"
    except InputError as err:
        message = str(err)
    peak = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
    print(int(peak) / 1024, pa.default_memory_pool().max_memory() / 1e6)
    print(message)
"""


@pytest.mark.parametrize(("case", "output"), [(case, output) for case in CRAFTED
                                              for output in OUTPUTS.get(case, ["protected.parquet"])])
def test_a_part_decoding_to_far_more_than_its_file_is_refused_in_bounded_memory(honest, tmp_path, case, output):
    """Each crafted part is refused in one line naming its file and the rule, by the API and by `gedp
    audit --release` (a failed files check, the part left unread) one after the other in a child process
    (its peak memory, which bounds each reader's, under 400 MB, Arrow's allocations under 100 MB; at the
    code before, 2.0-6.9 GB for the same parts at RI's size), by `gedp tabulate` with and without --moe
    and `gedp implicates`, and by `gedp serve`'s loading (which refuses to start)."""
    copy = crafted(honest, tmp_path, case, output)
    message = CRAFTED[case][1]
    readers = ("api", "audit")
    child = subprocess.run([sys.executable, "-c", CHILD, str(copy), output, *readers], capture_output=True,
                           text=True, timeout=300, check=True)
    printed = child.stdout.strip().splitlines()
    assert len(printed) == 2 * len(readers), printed
    for reader, peaks, said in zip(readers, printed[::2], printed[1::2]):
        resident, arrow = map(float, peaks.split())
        assert message in said and "part-44.parquet" in said, (reader, said)
        assert resident < 400 and arrow < 100, (reader, resident, arrow)
    for request in (["tabulate", str(copy), "--by", "county"], ["tabulate", str(copy), "--by", "county", "--moe"],
                    ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"]):
        result = runner.invoke(app, request, env={"GEDP_CACHE_DIR": str(tmp_path / "c")})
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "imp").exists()
    with pytest.raises(InputError, match=re.escape(message)):
        load_releases([copy])


def test_a_footer_lying_about_its_length_is_refused(honest, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    part = copy / "protected.parquet" / "part-44.parquet"
    content = bytearray(part.read_bytes())
    content[-8:-4] = (1 << 31).to_bytes(4, "little")
    part.write_bytes(bytes(content))
    with pytest.raises(InputError, match=r"states a footer of 2,147,483,648 bytes \(at most 1,048,576"):
        _ = gedp.Release(copy).microdata


@pytest.mark.parametrize("output", ["protected.parquet", "measurements.parquet"])
def test_decoded_bytes_of_a_part_are_its_numbers_offsets_and_characters(honest, output):
    """Against an independent count from the rows read plainly: 8 bytes per number (per text, its
    offset: 8 bytes for Arrow's large strings, as pandas' text is stored) and each text's UTF-8
    bytes, row by row (none for a missing key); gedp's own parts decode to well under the bound."""
    part = honest / output / "part-44.parquet"
    schema = pq.read_schema(part)
    frame = pq.read_table(part).to_pandas()
    expected = 0
    for column in frame.columns:
        if frame[column].dtype.kind in "fiu":
            expected += 8 * len(frame)
        else:
            offset = 8 if pa.types.is_large_string(schema.field(column).type) else 4
            texts = [value for value in frame[column] if isinstance(value, str)]
            expected += offset * len(frame) + sum(len(value.encode()) for value in texts)
    assert decoded_bytes("r", output, part) == expected
    assert expected < MAX_DECODED_RATIO * part.stat().st_size / 4 + PART_ROOM


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["fifo", "oversized", "deeply nested", "nested mu"])
def test_a_manifest_that_cannot_be_read_in_bounded_time_and_memory_is_refused(honest, tmp_path, case):
    """manifest.json a FIFO (its read had blocked without end), larger than MAX_MANIFEST_BYTES (read
    whole before), nested 100,000 deep (json's RecursionError: a traceback), or a `mu` nested deeper
    than a query and an attribute (checked by a recursion as deep as the file nests): one line."""
    import os

    from gedp.release.validation import MAX_MANIFEST_BYTES

    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    manifest = copy / "manifest.json"
    expected = {"fifo": "manifest.json is not a regular file",
                "oversized": f"more than {MAX_MANIFEST_BYTES:,}", "deeply nested": "no readable manifest.json",
                "nested mu": "must be a number"}[case]
    if case == "fifo":
        manifest.unlink()
        os.mkfifo(manifest)
    elif case == "oversized":
        with open(manifest, "a") as file:
            file.truncate(MAX_MANIFEST_BYTES + 1)
    else:
        content = json.loads(manifest.read_text())
        deep: object = 1.0
        for _ in range(100_000 if case == "deeply nested" else 500):
            deep = {"q": deep}
        content["mu"] = deep
        unclosed = manifest.read_text().rstrip()[:-1] + ', "x": ' + "[" * 100_000
        text = json.dumps(content) if case == "nested mu" else unclosed
        manifest.write_text(text)
    with pytest.raises(InputError, match=re.escape(expected)):
        _ = gedp.Release(copy).manifest


@pytest.mark.parametrize("metadata", [{"x": 1}, {"index_columns": ["county"], "columns": []}])
def test_a_parts_pandas_metadata_is_not_trusted(honest, tmp_path, metadata):
    """A part whose pandas metadata were replaced (pandas' reader had raised KeyError on {"x": 1}, a
    traceback, or moved a column to the index: red team finding 8) reads as the honest part does:
    gedp writes no index, and reads its columns' types from their Arrow types."""
    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    part = copy / "protected.parquet" / "part-44.parquet"
    table = pq.read_table(part)
    pq.write_table(table.replace_schema_metadata({b"pandas": json.dumps(metadata).encode()}), part)
    expected = pq.read_table(honest / "protected.parquet" / "part-44.parquet").to_pandas()
    import pandas as pd

    pd.testing.assert_frame_equal(gedp.Release(copy).microdata, gedp.Release(honest).microdata)
    assert list(gedp.Release(copy).microdata.columns) == list(expected.columns)
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county"], env={"GEDP_CACHE_DIR": str(tmp_path / "c")})
    assert result.exit_code == 0 and "state,county,estabs" in result.output, result.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["deeply nested", "oversized"])
def test_a_further_tabulation_reads_the_manifest_within_the_same_bounds(honest, tmp_path, case):
    """`gedp tabulate` of a release tabulated before (its kept index answers without pandas:
    ``release.quick``) reads manifest.json through the same bounded read as every reader: a manifest
    nested 100,000 deep had raised RecursionError there (a traceback), one of 300 MB been read whole
    (red team finding 7); refused in one line now."""
    from gedp.release.validation import MAX_MANIFEST_BYTES

    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    env = {"GEDP_CACHE_DIR": str(tmp_path / "c")}
    assert runner.invoke(app, ["tabulate", str(copy), "--by", "county"], env=env).exit_code == 0
    manifest = copy / "manifest.json"
    if case == "oversized":
        with open(manifest, "a") as file:
            file.truncate(MAX_MANIFEST_BYTES + 1)
    else:
        manifest.write_text(manifest.read_text().rstrip()[:-1] + ', "x": ' + "[" * 100_000)
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county"], env=env)
    expected = f"more than {MAX_MANIFEST_BYTES:,}" if case == "oversized" else "no readable manifest.json"
    assert result.exit_code == 2 and expected in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_the_decode_room_is_given_once_per_output(honest, tmp_path):
    """Parts each within MAX_DECODED_RATIO times their size and PART_ROOM (a run of one row: ~1 MB
    decoded from ~10 KB) pass one by one, and are refused together: the room is given once per
    output, not per part (red team finding 5: 400 such parts of a panel had decoded to 1 GB)."""
    from gedp.release.part_sizes import check_decoded, check_parts

    table = pq.read_table(honest / "protected.parquet" / "part-44.parquet").take([0] * 6_000)
    paths = []
    for k in range(8):
        paths.append(str(tmp_path / f"part-{k}.parquet"))
        pq.write_table(table, paths[-1], compression="zstd")
    size = Path(paths[0]).stat().st_size
    one = decoded_bytes("r", "protected.parquet", paths[0])
    assert MAX_DECODED_RATIO * size < one <= MAX_DECODED_RATIO * size + PART_ROOM  # each within its own room
    assert 8 * one > MAX_DECODED_RATIO * 8 * size + PART_ROOM  # together beyond the room given once
    check_decoded("r", "protected.parquet", paths[:1])
    check_parts("r", "protected.parquet", paths[:1], [None])
    for check in (lambda: check_decoded("r", "protected.parquet", paths),
                  lambda: check_parts("r", "protected.parquet", paths, [None] * len(paths))):
        with pytest.raises(InputError, match=r"part-[0-9]\.parquet holds rows decoding to .* with the [0-9] parts? "
                                             r"before it, more than 64 times their"):
            check()


@pytest.mark.parametrize("quarters", [400, 401])
def test_a_panel_of_more_than_a_hundred_years_is_refused(honest, tmp_path, quarters):
    """A manifest listing 401 quarters is refused by their count (red team finding 5: 400 made-up
    quarters); 400 pass that rule (and fail the next: no per_quarter sections)."""
    from gedp.release.validation import MAX_QUARTERS

    copy = tmp_path / "copy"
    shutil.copytree(honest, copy)
    content = json.loads((copy / "manifest.json").read_text())
    content["quarters"] = [f"{1900 + k // 4}Q{k % 4 + 1}" for k in range(quarters)]
    (copy / "manifest.json").write_text(json.dumps(content))
    rule = f"lists {quarters:,} quarters, more than {MAX_QUARTERS}" if quarters > MAX_QUARTERS else "'per_quarter'"
    with pytest.raises(InputError, match=re.escape(rule)):
        _ = gedp.Release(copy).manifest
