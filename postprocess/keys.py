"""The public columns a tabulation groups by: plain names, importable without pandas (a further
request answered from a release's kept index, ``gedp.release.quick``, checks its keys here)."""

from __future__ import annotations

from collections.abc import Sequence

from gedp.synth.columns import CONFIDENTIAL


def by_columns(by: str | Sequence[str]) -> list[str]:
    """The columns of a ``by``: a list of names, or a comma-separated string ("" or "total": none);
    anything else (None, a number, bytes, a list holding a non-string) refused as an InputError."""
    if isinstance(by, str):
        return [] if by.strip() in ("", "total") else [c.strip() for c in by.split(",") if c.strip()]
    if isinstance(by, (bytes, bytearray)) or not isinstance(by, Sequence) or not all(isinstance(c, str) for c in by):
        from gedp.errors import InputError

        raise InputError(f"by must be column names: a comma-separated string or a list of strings, not "
                         f"{type(by).__name__}" + (" holding a non-string" if isinstance(by, Sequence) else ""))
    return list(by)


def worker_keys(by: str | Sequence[str]) -> list[str]:
    """The worker columns (of a job frame) among a tabulation's keys."""
    from gedp.synth.jobs import FAMILY_COLUMNS  # the job table's schema, not the job frame's solver

    return [c for c in by_columns(by) if c in FAMILY_COLUMNS]


def tabulation_keys(by: str | Sequence[str], columns: Sequence[str], public: Sequence[str]) -> list[str]:
    """The public columns a tabulation of data with ``columns`` (``public`` of them) groups by.

    ``by`` is a list of columns or a comma-separated string ("" or "total": the total). County codes
    repeat across states, so a county key always carries the state (added before it).

    Raises:
        ValueError: a confidential attribute or a column the data do not have.
    """
    keys = list(dict.fromkeys(by_columns(by)))
    attributes = [c for c in keys if c in CONFIDENTIAL]
    if attributes:
        raise ValueError(f"cannot tabulate by {', '.join(attributes)}: confidential attributes are summed, not "
                         f"grouped by; group by public columns ({', '.join(public)})")
    unknown = [c for c in keys if c not in columns]
    if unknown:
        raise ValueError(f"cannot tabulate by {', '.join(unknown)}: no such column")
    if "county" in keys and "state" not in keys:
        keys.insert(keys.index("county"), "state")
    return keys


SIZE_CLASS = "size_class"
#: Derived columns a release can be tabulated by (from implicates; ``postprocess.derived``).
DERIVED = (SIZE_CLASS,)


def has_derived(by: str | Sequence[str]) -> bool:
    """Whether a tabulation's keys hold a derived column (kept here, without pandas, so that a
    request by public columns alone does not import the implicates' tabulation)."""
    return any(column in DERIVED for column in by_columns(by))
