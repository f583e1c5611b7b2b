"""Tabulations of a release's job frame: protected jobs by establishment and worker columns, with
margins of error (``gedp tabulate --jobs``, ``Release.tabulate_jobs``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gedp.errors import InputError
from gedp.postprocess.combine import checked_level
from gedp.release.format import JOBS_FILE
from gedp.release.reader import check_adds_up, read_stored, release_answers, release_families


def read_job_frame(folder: str | Path) -> pd.DataFrame:
    """A release's protected job frame; InputError when the release has none."""
    if not release_families(folder):
        raise InputError(f"release '{folder}' has no job frame (protect with --jobs and a config with job families)")
    frame = read_stored(folder, JOBS_FILE)
    # its texts as pandas' "string", as gedp wrote them (a part's pandas metadata are not trusted)
    return frame.astype({column: "string" for column in frame.columns
                         if not pd.api.types.is_numeric_dtype(frame[column])})


def tabulate_job_frame(folder: str | Path, protected: pd.DataFrame, by: str | Sequence[str], *,
                       where: str | None = None, moe: bool = False, level: float = 0.95) -> pd.DataFrame:
    """Protected jobs of a release's job frame by establishment and worker columns (``by``), over
    the establishments matching ``where``, with margins of error ``jobs_moe`` (``moe``); see
    ``postprocess.jobframe.tabulate_jobs``."""
    from gedp.postprocess.jobframe import tabulate_jobs
    from gedp.postprocess.keys import by_columns

    keys = by_columns(by)
    jobs = read_job_frame(folder)
    check_adds_up(folder, jobs, protected)
    if moe:
        checked_level(level)
    try:
        return tabulate_jobs(protected, jobs, release_families(folder), keys, where=where, moe=moe, level=level,
                             answers=release_answers(folder, protected) if moe else None)
    except ValueError as err:
        raise InputError(str(err)) from None
