"""Readers and writers for establishment microdata (CSV and Parquet)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from synth.schema import CODE_WIDTHS, CONFIDENTIAL, InputError, validate_microdata

#: Columns read as text from CSV so that leading zeros of codes survive.
TEXT_COLUMNS = ("estab_id", *CODE_WIDTHS, "own")


def read_microdata(path: str | Path, attributes: Sequence[str] | None = CONFIDENTIAL) -> pd.DataFrame:
    """Read and validate establishment microdata from ``.csv`` or ``.parquet`` (a file, or a folder
    of Parquet parts such as a release's ``protected.parquet``).

    ``attributes=None`` takes whichever confidential attributes the file has (protected microdata
    may carry a subset); at least one is required.

    Raises:
        InputError: the file is missing, unreadable, of an unknown type, or fails validation.
    """
    path = Path(path)
    if not (path.is_file() or (path.is_dir() and path.suffix.lower() == ".parquet")):
        raise InputError(f"input file '{path}' does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            frame = pd.read_csv(path, dtype={c: str for c in TEXT_COLUMNS}, encoding="utf-8")
        elif suffix in (".parquet", ".pq"):
            frame = pd.read_parquet(path)
        else:
            raise InputError(f"input file '{path}': unknown type '{suffix}' (use .csv or .parquet)")
    except InputError:
        raise
    except pd.errors.EmptyDataError:
        raise InputError(f"input file '{path}' is empty") from None
    except (UnicodeDecodeError, pd.errors.ParserError, OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"input file '{path}' cannot be read: {first_line}") from None
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
