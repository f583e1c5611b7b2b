"""What a Parquet input's files tell before their rows are read: each file's stamp (which file it
is, its size and its modification and change times) and its footer's row-group statistics of a
column. Standard library only, so the read-ahead (``synth.prefetch``) and the pool's early start
(``gedp.running.state_pool``) use it before pandas."""

from __future__ import annotations

import os
from pathlib import Path


def stamp(file: str | Path) -> tuple[int, ...]:
    """A file's device and inode, size, modification and change times (ns): what changes when the
    file is written again or another is moved in its place. The change time cannot be set back
    (``touch`` sets the modification time, and the change time to now), so a file changed and its
    times restored still has another stamp."""
    status = os.stat(file)
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns


def value_ranges(metadata, column: str) -> list[tuple] | None:
    """The (min, max, missing values) of ``column`` in each row group of a Parquet footer
    (``pyarrow.parquet.FileMetaData``); None when the footer has no such column or a row group
    no minimum and maximum."""
    if column not in metadata.schema.names:
        return None
    index = metadata.schema.names.index(column)
    ranges = []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        ranges.append((stats.min, stats.max, stats.null_count))
    return ranges


def range_bounds(metadata, column: str) -> set | None:
    """The least and greatest values of ``column`` in the row groups of a Parquet footer, as one set
    (one value: every row group holds only it); None when ``value_ranges`` does not tell."""
    ranges = value_ranges(metadata, column)
    return None if ranges is None else {bound for low, high, _ in ranges for bound in (low, high)}
