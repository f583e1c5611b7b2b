"""Which input paths gedp reads: regular CSV or Parquet files, or folders of Parquet parts. Light:
importable before the numerical stack (the first check of an input uses it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from gedp.errors import InputError

PARQUET_SUFFIXES = (".parquet", ".pq")
#: What a path is when it is neither a regular file nor a folder (never opened: a FIFO blocks, a
#: device never ends).
_KINDS = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
          stat.S_ISSOCK: "a socket"}


def _regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS.items() if test(mode)), "not a file")
        raise InputError(f"input '{path}' is not a regular file ({kind})")


def parquet_parts(folder: Path) -> list[Path]:
    """The Parquet parts of a folder of any name (Spark, DuckDB and Polars write them), in sorted
    order; entries named ``_*`` or ``.*`` (``_SUCCESS``, ``.crc``) are skipped as pyarrow skips them.

    Raises:
        InputError: an entry that is not a regular file or a folder, or no part at all.
    """
    parts = []
    for where, names, files in os.walk(folder):
        names[:] = sorted(n for n in names if not n.startswith((".", "_")))
        for name in sorted(files):
            if not name.startswith((".", "_")):
                entry = Path(where) / name
                try:
                    _regular(entry, entry.stat().st_mode)
                except OSError as err:
                    raise InputError(f"input '{entry}' cannot be read ({err.strerror})") from None
                parts.append(entry)
    if not parts:
        raise InputError(f"input '{folder}' is a folder without Parquet parts (names starting with '_' or '.' are "
                         "skipped); give a .csv or .parquet file, or a folder of Parquet parts")
    return parts


def check_input_path(path: str | Path) -> Path:
    """Refuse, without opening it, an input that is not a regular ``.csv`` or Parquet file or a
    folder whose entries (hidden ``.*`` and ``_*`` names, which Parquet readers skip, aside) are all
    regular files or folders of them."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        raise InputError(f"input file '{path}' does not exist") from None
    if stat.S_ISDIR(mode):
        parquet_parts(path)
        return path
    _regular(path, mode)
    suffix = path.suffix.lower()
    if suffix != ".csv" and suffix not in PARQUET_SUFFIXES:
        raise InputError(f"input file '{path}': unknown type '{suffix}' (use .csv or .parquet)")
    return path


def is_parquet(path: Path) -> bool:
    """Whether a checked input is Parquet (a file or a folder of parts) rather than CSV."""
    return path.is_dir() or path.suffix.lower() in PARQUET_SUFFIXES


def parquet_columns(path: Path) -> dict[str, Any]:
    """The columns of a checked Parquet input and their Arrow types, from the parts' footers alone.

    Raises:
        InputError: a part that is not Parquet, or parts with different columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = parquet_parts(path) if path.is_dir() else [path]
    schemas = []
    for part in parts:
        try:
            schemas.append(pq.read_schema(part))
        except (pa.ArrowInvalid, OSError) as err:
            raise InputError(f"input '{part}' cannot be read as Parquet ({str(err).splitlines()[0][:200]})") from None
    schema = schemas[0]
    for part, found in zip(parts, schemas):
        missing = [n for n in schema.names if n not in found.names]
        if missing:
            raise InputError(f"input '{path}': part '{part.relative_to(path)}' has no column {missing[0]!r}; every "
                             "part needs the same columns")
    return {name: schema.field(name).type for name in schema.names}
