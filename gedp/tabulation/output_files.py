"""Files a command writes: complete or not at all (through a temporary name in the same folder), and
the machine-readable summary beside a table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gedp.errors import InputError


def check_output_file(path: Path) -> None:
    """Refuse a path that cannot become a file: a folder, a parent that is not a folder, a name too
    long, a parent that cannot be created."""
    from gedp.release.writer import check_output_path

    check_output_path(path.resolve())
    if path.is_dir():
        raise InputError(f"output '{path}' is a folder; give a file name")


def summary_path(out: Path) -> Path:
    """Where the summary of a table or page written to ``out`` goes: beside it, ``out``.json."""
    return out.with_name(out.name + ".json")


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Write a file through a temporary name in the same folder, renamed only when complete; a path
    that cannot be a file (a folder, a parent that is not a folder, a name too long) is refused."""
    check_output_file(path)
    staging = path.with_name(f".{path.stem}.partial{path.suffix}")  # same suffix: same format
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(staging)
        staging.replace(path)
    except OSError as err:
        staging.unlink(missing_ok=True)
        raise InputError(f"output '{path}' cannot be written ({err.strerror or type(err).__name__})") from None
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def write_summary(out: Path, summary: dict) -> None:
    """A table's ``summary`` as JSON beside it (``out``.json)."""
    write_atomically(summary_path(out),
                     lambda path: path.write_text(json.dumps(summary, indent=2) + "\n"))
