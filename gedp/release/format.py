"""What a release folder holds: its file names, the names of a report's files, the order of its rows
and the contents a release is written from."""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gedp.errors import InputError

if TYPE_CHECKING:  # a release's contents; a reader of the file names need not load the stages nor pandas
    import pandas as pd

    from gedp.measure.jobframe import FamilySpec
    from gedp.measure.workflows import Measurements
    from gedp.postprocess.wls import WLSResult

PROTECTED_FILE = "protected.parquet"
JOBS_FILE = "protected_jobs.parquet"
MEASUREMENTS_FILE = "measurements.parquet"
TABLES_FILE = "qcew_tables.csv"
MANIFEST_FILE = "manifest.json"
ACCURACY_FILE = "accuracy.json"
#: What an output folder may hold for gedp to replace it: a release's files (its Parquet outputs
#: may be folders of parts), identified by a manifest with gedp's keys; a report's files and the
#: plots its summary.json names.
RELEASE_FILES = frozenset({MANIFEST_FILE, PROTECTED_FILE, MEASUREMENTS_FILE, TABLES_FILE, ACCURACY_FILE, JOBS_FILE})
PART_FOLDERS = (PROTECTED_FILE, MEASUREMENTS_FILE, JOBS_FILE)
MANIFEST_KEYS = frozenset({"gedp_version", "mu_total", "files"})
#: Largest marker file (a release's manifest, a report's summary) read to tell whether a folder is gedp's.
MAX_MARKER_BYTES = 64 << 20
#: The column of a panel release's protected microdata and measurements naming each row's quarter
#: (e.g. "2016Q1"); a release of one quarter has none.
QUARTER_KEY = "quarter"

#: The summary of a folder of implicates (``gedp implicates``): its leading "_" keeps it out of
#: ``pandas.read_parquet(FOLDER)``; it lists the implicates' files (``implicate-NN.parquet``).
IMPLICATES_SUMMARY = "_implicates.json"

#: A report's files (``gedp evaluate``, ``gedp suppress``); summary.json marks a report's folder.
SUMMARY_FILE = "summary.json"
REPORT_FILES = frozenset({SUMMARY_FILE, "report.md"})
#: The files of a cell suppression report beside its summary and plots.
PUBLISHED_FILE = "cells.csv"
AUDIT_FILE = "audit_confidential.csv"
SHARES_FILE = "shares.csv"
SUPPRESSION_FILES = frozenset({PUBLISHED_FILE, AUDIT_FILE, SHARES_FILE})
#: Prefix of every file of a report computed from real (not synthetic) confidential microdata, but
#: its report.md and summary.json, which say so in a banner and in ``"confidential": true``.
CONFIDENTIAL_PREFIX = "CONFIDENTIAL-"

#: Columns a release's rows are sorted by: public keys only, whatever the input order.
RELEASE_ORDER = ("state", "county", "naics", "estab_id")


def release_order(microdata: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by public keys (state, county, naics, estab_id) so that no output keeps the
    input's order, which may follow confidential values."""
    from gedp.synth.io import sorted_by  # with Arrow's datasets: imported by a writer, not a reader

    return sorted_by(microdata, RELEASE_ORDER)


@dataclass
class StateRelease:
    """Everything the release of one state publishes, in memory: the files' contents and what its
    manifest section is built from."""

    protected: pd.DataFrame
    measurements: Measurements
    solver_results: dict[str, WLSResult]
    tables: pd.DataFrame | None  # None: not built (``state_pipeline.protect``'s tables=False)
    families: list[FamilySpec]  # the plan's job families (none without a job frame)
    rounding: dict | None = None  # what controlled rounding changed, per attribute (integer releases)
    jobs: pd.DataFrame | None = None  # the protected job frame (long), for a plan with job families


def check_outside(release: str | Path, *outputs: str | Path) -> None:
    """Refuse an output at or inside the release folder read (symbolic links resolved, as the files
    would be written), or inside any other release (``check_outside_releases``): a reader adds nothing
    to a release and never overwrites one of its files (the temporary files and summaries it writes
    beside an output go to the same folder)."""
    folder = Path(release).resolve()
    for output in outputs:
        target = Path(output).resolve()
        if target == folder or folder in target.parents:
            raise InputError(f"output '{output}' is inside the release '{release}' it reads; a reader writes "
                             "nothing into a release: give a path outside it")
    check_outside_releases(*outputs)


def marker_content(path: Path) -> dict | None:
    """The JSON object a marker file of gedp's (manifest.json, summary.json, _implicates.json) holds, or
    None when ``path`` is not a regular file of at most MAX_MARKER_BYTES holding a JSON object."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MARKER_BYTES:
            return None
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python recurses
        return None
    return content if isinstance(content, dict) else None


def release_holding(path: str | Path) -> Path | None:
    """The release folder ``path`` is or lies in (symbolic links resolved; a folder whose manifest has
    gedp's keys), or None."""
    target = Path(path).resolve()
    for folder in (target, *target.parents):
        content = marker_content(folder / MANIFEST_FILE)
        if content is not None and MANIFEST_KEYS <= content.keys():
            return folder
    return None


def check_outside_releases(*outputs: str | Path) -> None:
    """Refuse an output at or inside any release folder (``release_holding``), read or not: nothing but
    ``gedp protect`` writes into a release (``check_outside`` names the release a reader reads)."""
    for output in outputs:
        folder = release_holding(output)
        if folder is not None:
            raise InputError(f"output '{output}' is inside the release '{folder}'; nothing is written into a "
                             "release: give a path outside it")
