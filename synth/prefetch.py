"""A one-file Parquet input read on a thread while ``gedp protect`` imports its numerical stack
(Arrow reads outside the GIL): ``synth.io.read_columns`` takes its columns from that table while
the file is unchanged. Importable before pandas (only pyarrow and the standard library)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from gedp.synth.footers import stamp, value_ranges


class _Prefetch(NamedTuple):
    """The input read ahead: its ``file`` and ``stamp`` before the read; ``table`` holds the table
    once read with the file unchanged (stays empty if the read failed or the file changed)."""

    file: str
    stamp: tuple[int, ...]
    thread: threading.Thread
    table: list[pa.Table]


#: The input being read ahead (at most one).
_prefetched: list[_Prefetch] = []


def prefetch_input(path: Path) -> None:
    """Start reading every column of a checked Parquet file whose ``state`` statistics show one
    value (this process protects it; a folder or a file of several states is read by the states'
    readers) on a thread. A read that fails leaves nothing: the reader reads the file again and
    reports the error as it would have."""
    if not path.is_file() or not _one_state(path):
        return
    file, before, table = str(path), stamp(path), []

    def read() -> None:
        try:
            read = pq.read_table(file, use_pandas_metadata=True, use_threads=False)  # one core: imports go on
        except Exception:  # noqa: BLE001 - raised again, as the reader's InputError, by its own read
            return
        if stamp(file) == before:
            table.append(read)

    thread = threading.Thread(target=read, name="gedp-prefetch")
    _prefetched[:] = [_Prefetch(file, before, thread, table)]
    thread.start()


def _one_state(path: Path) -> bool:
    """Whether the footer's row-group statistics show one ``state`` value in the whole file."""
    try:
        ranges = value_ranges(pq.read_metadata(path), "state")
    except (OSError, pa.ArrowException):
        return False
    return ranges is not None and len({bound for low, high, _ in ranges for bound in (low, high)}) == 1


def prefetched_table(files: tuple[str, ...], *, take: bool) -> pa.Table | None:
    """The table read ahead if it is of ``files`` (one file), unchanged since; None otherwise.
    ``take``: forget it here (its last use)."""
    if not _prefetched or (_prefetched[0].file,) != files:
        return None
    prefetch = _prefetched[0]
    prefetch.thread.join()
    if take:
        _prefetched.clear()
    if not prefetch.table or stamp(prefetch.file) != prefetch.stamp:
        return None
    return prefetch.table[0]
