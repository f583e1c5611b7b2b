"""Writing a release: output-folder safety, a staging folder published atomically, each state's part
of every output, the measurements file, the joined tables and the manifest.

A release is written completely or not at all: everything goes into a temporary folder beside the
output, renamed into place only when complete. Each such staging folder is held by the run writing it
(an exclusive ``flock`` on the folder, which the kernel releases when the process ends, however it
ends): a run stopped by Ctrl-C or SIGTERM removes its own, and the folders of a killed run (SIGKILL, a
crash of the machine) are removed by the next run writing the same output, which can take their lock.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from gedp.errors import InputError, stop_if_terminated
from gedp.release.format import (
    CONFIDENTIAL_PREFIX,
    IMPLICATES_SUMMARY,
    JOBS_FILE,
    MANIFEST_FILE,
    MANIFEST_KEYS,
    MEASUREMENTS_FILE,
    PART_FOLDERS,
    PROTECTED_FILE,
    RELEASE_FILES,
    REPORT_FILES,
    SUPPRESSION_FILES,
    TABLES_FILE,
    StateRelease,
    marker_content,
    release_holding,
)
from gedp.waits import awaited, submitted

if TYPE_CHECKING:  # what a release is written from; checking an output path needs neither (nor pandas)
    import pandas as pd

    from gedp.measure.answers import NoisyAnswer
    from gedp.measure.workflows import Measurements

#: Longest output name, in bytes: a file name holds 255, and staging adds ".partial-" and 8 hex digits.
MAX_NAME_BYTES = 200
#: Rows per row group of the measurements file (Arrow's default, which the file has always used).
MEASUREMENT_ROW_GROUP = 1 << 20
#: The kinds of staging folder a run keeps beside its output ``OUT``: ``.OUT.partial-<8 hex>``, the
#: output being written; ``.OUT.quarters-<8 hex>``, the quarters of a panel before they are joined.
STAGING_KINDS = ("partial", "quarters", "retired")


def check_output_path(out: Path) -> None:
    """Refuse an output path that cannot be created: a name longer than MAX_NAME_BYTES (room for
    the staging suffix within the 255 bytes of a file name) or a parent that is not a folder."""
    size = len(os.fsencode(out.name))
    if size > MAX_NAME_BYTES:
        raise InputError(f"output name is {size} bytes long; use at most {MAX_NAME_BYTES}")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"output '{out}' cannot be created: '{parent.name}' is not a folder")


def check_not_in_release(out: Path) -> None:
    """Refuse an output folder inside a gedp release (a folder above ``out``, links resolved, holding
    a release's manifest): a release written into another would be published with it, and its
    readers and ``gedp audit --release`` refuse a release holding anything but its files."""
    folder = release_holding(Path(out).resolve().parent)
    if folder is not None:
        raise InputError(f"output '{out}' is inside the gedp release '{folder}'; write a release outside any "
                         "other: choose another --out")


def _gedp_names(out: Path, marker: str) -> frozenset[str] | None:
    """The names gedp writes in an output folder of ``marker``'s kind, or None when ``marker`` is
    not gedp's: a regular JSON file holding an object with gedp's keys (a release's manifest; a
    report's summary, whose "figures" name its plots)."""
    content = marker_content(out / marker)
    if content is None:
        return None
    if marker == MANIFEST_FILE:
        return RELEASE_FILES if MANIFEST_KEYS <= content.keys() else None
    if marker == IMPLICATES_SUMMARY:
        files = content.get("files")
        if not (isinstance(files, list) and all(isinstance(f, str) and re.fullmatch(r"implicate-[0-9]+\.parquet", f)
                                                for f in files)):
            return None
        return frozenset({IMPLICATES_SUMMARY, *files})
    figures = content.get("figures")
    if not (isinstance(figures, list) and all(isinstance(f, str) and f.endswith(".png") for f in figures)):
        return None
    return REPORT_FILES | SUPPRESSION_FILES | {CONFIDENTIAL_PREFIX + name for name in SUPPRESSION_FILES} | set(figures)


def _is_gedp_entry(entry: os.DirEntry, names: frozenset[str]) -> bool:
    """A regular file gedp writes, or one of a release's folders holding only Parquet parts."""
    if entry.name not in names:
        return False
    if entry.is_file(follow_symlinks=False):
        return True
    return (entry.name in PART_FOLDERS and entry.is_dir(follow_symlinks=False)
            and all(part.is_file(follow_symlinks=False) and part.name.startswith("part-")
                    and part.name.endswith(".parquet") for part in os.scandir(entry.path)))


def _is_inner_report(entry: os.DirEntry, marker: str) -> bool:
    """A report's folder inside a report (``gedp evaluate accuracy --config PLAN`` writes the plan's
    and baseline's reports in their own folders), itself verifiably gedp's."""
    if marker == MANIFEST_FILE or not entry.is_dir(follow_symlinks=False):
        return False
    try:
        check_output_directory(Path(entry.path), marker)
    except InputError:
        return False
    return any(os.scandir(entry.path))


def check_output_directory(out: Path, marker: str = MANIFEST_FILE) -> None:
    """Refuse, before any work, an output folder that gedp cannot create or must not replace.

    An existing ``out`` is replaced only when it is an empty folder or verifiably an earlier output
    of the same kind: its ``marker`` (manifest.json of a release, summary.json of a report) is gedp's
    and every entry is a file gedp writes there. Anything else is left untouched.
    """
    check_output_path(out)
    if marker == MANIFEST_FILE:
        check_not_in_release(out)
    if os.path.lexists(out):
        refusal = _replace_refusal(out, out, marker)
        if refusal is not None:
            raise refusal


def _replace_refusal(folder: Path, out: Path, marker: str) -> InputError | None:
    """Why the existing ``folder`` (what is at the output ``out``, or it renamed aside) must not be
    replaced by an output of ``marker``'s kind, or None: an empty folder or verifiably an earlier
    output of that kind (``check_output_directory``)."""
    kind = "release" if marker == MANIFEST_FILE else "output"
    if folder.is_symlink() or not folder.is_dir():
        return InputError(f"output '{out}' exists and is not a gedp {kind}; choose another --out")
    entries = list(os.scandir(folder))
    if not entries:
        return None
    names = _gedp_names(folder, marker)
    if names is None:
        return InputError(f"output '{out}' exists and is not a gedp {kind}; choose another --out")
    foreign = next((entry.name for entry in entries
                    if not (_is_gedp_entry(entry, names) or _is_inner_report(entry, marker))), None)
    if foreign is not None:
        from gedp.synth.schema import shown

        return InputError(f"output '{out}': {shown(foreign)} is not part of a gedp {kind}; choose another --out")
    return None


@contextmanager
def staged_directory(out: str | Path, marker: str = MANIFEST_FILE) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; when the block completes, it replaces ``out``.

    An earlier output at ``out`` is replaced only after the new one is complete; on any error the
    temporary directory is removed and ``out`` is left as it was. Every file and folder of the output is dated
    the day's midnight (UTC), the manifest's ``created_date``: the times at which the parts were
    written would otherwise tell how long each state took (no timings).
    """
    out = Path(out).resolve()
    check_output_directory(out, marker)
    staging, hold = held_folder(out, "partial")
    try:
        yield staging
        _date_only(staging)
        _publish(staging, out, marker)
    except BaseException:
        if _in_place(hold, out):  # stopped once the new output was in place (removing the earlier one)
            _published_here(out)
        StateParts.close_all(staging)  # parts still being written into the folder (a state not finished)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    else:
        _published_here(out)
    finally:
        os.close(hold)


#: The outputs published inside the current ``published_outputs`` block (None outside one).
_published: ContextVar[list[Path] | None] = ContextVar("gedp_published_outputs", default=None)


@contextmanager
def published_outputs() -> Iterator[list[Path]]:
    """Yield the list of the outputs ``staged_directory`` publishes inside the block (resolved paths,
    in order): each is added once its new folder is in place, also when the run is stopped right
    after (while the earlier output is being removed). What a stopped run says it left is decided
    from it (``gedp.running.recorded_release.reserved``), not guessed from the folder."""
    published: list[Path] = []
    token = _published.set(published)
    try:
        yield published
    finally:
        _published.reset(token)


def _published_here(out: Path) -> None:
    published = _published.get()
    if published is not None:
        published.append(out)


def _in_place(hold: int, out: Path) -> bool:
    """Whether ``out`` is the staging folder ``hold`` holds, renamed into place (the same file)."""
    try:
        return os.path.samestat(os.fstat(hold), os.stat(out))
    except OSError:
        return False


@contextmanager
def work_folder(out: str | Path, kind: str) -> Iterator[Path]:
    """Yield a staging folder of ``kind`` beside ``out`` (``held_folder``) that is removed when the
    block ends, however it ends (and by the next run if this one is killed)."""
    folder, hold = held_folder(Path(out).resolve(), kind)
    try:
        yield folder
    finally:
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(hold)


def held_folder(out: Path, kind: str) -> tuple[Path, int]:
    """A new staging folder ``.OUT.KIND-<8 hex>`` beside ``out`` (``STAGING_KINDS``), after removing
    the stale ones of killed runs (``remove_stale_staging``); returns it and the open descriptor that
    holds its lock (close it when the folder is published or removed). The folder is made under
    another name and locked before it is given its own, so a run never sees one that is not held."""
    remove_stale_staging(out)
    made = out.parent / f".{out.name}.new-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        made.mkdir()  # the mode of any folder (the umask's): the published output keeps it
    except OSError as err:
        raise InputError(f"output '{out}' cannot be created ({err.strerror or type(err).__name__})") from None
    hold = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(hold, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder of this run's own: nobody else holds it
        folder = out.parent / f".{out.name}.{kind}-{uuid.uuid4().hex[:8]}"
        os.rename(made, folder)
    except BaseException:
        os.close(hold)
        shutil.rmtree(made, ignore_errors=True)
        raise
    return folder, hold


def _remove_unnamed(out: Path) -> None:
    """Remove the empty ``.OUT.new-*`` folders of runs killed in the instant between making a staging
    folder and naming it (``held_folder``); one younger than a minute may be a running process's."""
    old = dt.datetime.now().timestamp() - 60
    for entry in os.scandir(out.parent):
        if entry.name.startswith(f".{out.name}.new-") and entry.is_dir(follow_symlinks=False) \
                and entry.stat(follow_symlinks=False).st_mtime < old:
            try:
                os.rmdir(entry.path)  # empty only: a folder with anything in it is left alone
            except OSError:
                pass


def remove_stale_staging(out: Path) -> list[str]:
    """Remove the staging folders beside ``out`` (``STAGING_KINDS``) that no process holds: those of
    runs killed before they could remove them (a run stopped otherwise removes its own). A folder a
    running process holds is left alone. Returns the names removed."""
    prefixes = tuple(f".{out.name}.{kind}-" for kind in STAGING_KINDS)
    try:
        entries = [entry for entry in os.scandir(out.parent)
                   if entry.name.startswith(prefixes) and entry.is_dir(follow_symlinks=False)]
        _remove_unnamed(out)
    except OSError:
        return []
    removed = []
    for entry in entries:
        try:
            hold = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(hold, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a run in progress
            os.close(hold)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(hold)
        removed.append(entry.name)
    return removed


def _publish(staging: Path, out: Path, marker: str = MANIFEST_FILE) -> None:
    """Move a complete output into place, replacing an earlier one only once the new one is there; the
    earlier one is put back when the move is interrupted (Ctrl-C, SIGTERM) between its two renames, and
    left as ``.OUT.retired-*`` (removed by the next run, ``STAGING_KINDS``) when its removal is. What is
    at ``out`` is checked again once renamed aside (nothing can change it there): a folder that appeared
    at ``out`` while the output was made, or changed since ``check_output_directory``, is put back and
    refused, never removed (red team rt24 F2: a folder made at --out during a run was deleted)."""
    if not os.path.lexists(out):
        try:
            os.rename(staging, out)  # an empty folder made there meanwhile is replaced; anything else fails
            return
        except OSError:
            pass
    retired = out.parent / f".{out.name}.retired-{uuid.uuid4().hex[:8]}"
    os.replace(out, retired)
    refusal = _replace_refusal(retired, out, marker)
    if refusal is not None:
        if not os.path.lexists(out):
            os.replace(retired, out)
        raise InputError(f"{refusal} (it appeared at --out while gedp ran: it was left as it was, and nothing was "
                         "written)")
    try:
        os.replace(staging, out)
    except BaseException:
        if not out.exists():
            os.replace(retired, out)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _date_only(folder: Path) -> None:
    """Set the access and modification times of ``folder`` and everything in it to today's midnight, UTC."""
    midnight = dt.datetime.combine(dt.datetime.now(dt.timezone.utc).date(), dt.time(), tzinfo=dt.timezone.utc)
    stamp = midnight.timestamp()
    for path in [*folder.rglob("*"), folder]:  # the folder last: dating its entries does not change it
        os.utime(path, (stamp, stamp), follow_symlinks=False)


def table_part(staging: Path, state: str) -> Path:
    """Where a state's QCEW tables wait in the staging folder until ``join_tables``."""
    return staging / f".{TABLES_FILE}.part-{state}"


class StateParts:
    """One state's part of each output of a release, each written as soon as it exists, on a thread
    of the state's own (Arrow and Parquet encode outside the GIL, so writing overlaps the state's
    further computing): the measurements (Parquet, ``part-<part>.parquet`` in their folder) once
    measured, the protected microdata once final, the job frame and the QCEW tables (CSV at
    ``tables``, when built) at the end. Each file has the bytes of writing the parts one after the other.
    ``key``: columns of one value each added last to the protected microdata and measurements (a
    panel's quarter), whose values also lead the parts' names (``part-<values>-<part>.parquet``)."""

    _open: ClassVar[set[StateParts]] = set()  # the states' parts not finished nor closed, of every release
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, staging: Path, part: str, tables: Path, key: Mapping[str, str] | None = None):
        self.staging, self.tables, self.key = staging, tables, key
        self.name = "-".join([*(key or {}).values(), part])
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gedp-write-{part}")
        self._writing: dict[str, Future] = {}
        with StateParts._lock:
            StateParts._open.add(self)

    def _path(self, folder: str) -> Path:
        (self.staging / folder).mkdir(exist_ok=True)
        return self.staging / folder / f"part-{self.name}.parquet"

    def measurements(self, measurements: Measurements) -> None:
        """Start writing the state's measurements."""
        self._writing[MEASUREMENTS_FILE] = submitted(self._thread, write_measurements, measurements,
                                                     self._path(MEASUREMENTS_FILE), self.key)

    def protected(self, protected: pd.DataFrame) -> None:
        """Start writing the state's protected microdata."""
        # a frame of its own (no copy of the data): the caller's goes on being read while this one is
        frame = protected.copy(deep=False) if not self.key else protected.assign(**self.key)
        self._writing[PROTECTED_FILE] = submitted(self._thread, frame.to_parquet, self._path(PROTECTED_FILE),
                                                  index=False)

    def finish(self, contents: StateRelease) -> None:
        """Write what is not written yet of ``contents`` and wait for every part, raising what the
        writing raised."""
        try:
            if MEASUREMENTS_FILE not in self._writing:
                self.measurements(contents.measurements)
            if PROTECTED_FILE not in self._writing:
                self.protected(contents.protected)
            if contents.jobs is not None:
                contents.jobs.to_parquet(self._path(JOBS_FILE), index=False)
            if contents.tables is not None:
                contents.tables.to_csv(self.tables, index=False)
            for writing in self._writing.values():
                awaited(writing)  # Ctrl-C held back around each wait: none leaves the writing thread blocked
        finally:
            self.close()

    def close(self) -> None:
        """Wait for the part being written, if any, and write no further one (a failed state)."""
        self._thread.shutdown(wait=True, cancel_futures=True)
        with StateParts._lock:
            StateParts._open.discard(self)

    @classmethod
    def close_all(cls, staging: Path) -> None:
        """``close`` every state's parts that are written into ``staging`` (a failed release)."""
        with cls._lock:
            writing = [parts for parts in cls._open if parts.staging == staging]
        for parts in writing:
            parts.close()


def join_tables(staging: Path, states: list[str]) -> None:
    """The states' QCEW tables (``table_part``) joined in state order into one CSV with one header."""
    with (staging / TABLES_FILE).open("w") as tables:
        for index, state in enumerate(states):
            part = table_part(staging, state)
            lines = part.read_text().splitlines(keepends=True)
            tables.writelines(lines if index == 0 else lines[1:])
            part.unlink()


def write_manifest(staging: Path, manifest: Mapping[str, Any], extra_files: dict[str, dict],
                   before_publish: Callable[[], None] | None = None, name: str = MANIFEST_FILE) -> None:
    """Further JSON files computed from the staged release (e.g. accuracy.json), then the manifest.

    ``before_publish`` (the lifetime ledger's commit) runs before the manifest is written: a run
    stopped during the commit leaves a staging folder without a manifest, which no reader accepts.
    ``name``: the manifest's file name (a panel's quarter has ``QUARTER_MANIFEST_FILE``: no reader
    takes it for a release).
    """
    for file, content in extra_files.items():
        (staging / file).write_text(json.dumps(content, indent=2) + "\n")
    stop_if_terminated()  # nothing committed, nothing published after a SIGTERM or Ctrl-C
    if before_publish is not None:
        before_publish()
    (staging / name).write_text(json.dumps(manifest, indent=2, default=float) + "\n")


def answer_table(answer: NoisyAnswer, rows: slice = slice(None), key: Mapping[str, str] | None = None) -> pa.Table:
    """The ``rows`` of one answer in the measurements file: query, attribute, mechanism, group keys
    and the numbers (the label columns repeat one string per answer), then the ``key`` columns."""
    n = len(range(len(answer))[rows])

    def label(value: str) -> pa.Array:
        return pa.repeat(pa.scalar(value, pa.large_string()), n)

    keys = {column: pa.array(answer.keys[column].iloc[rows].reset_index(drop=True), type=pa.large_string())
            for column in answer.keys.columns}
    return pa.table({
        "query": label(answer.query.name), "attribute": label(answer.query.attribute),
        "mechanism": label(answer.mechanism), "mu": pa.repeat(pa.scalar(answer.mu, pa.float64()), n),
        "variance_kind": label(answer.variance_kind), **keys,
        "released": answer.released[rows], "estimate": answer.estimate[rows], "variance": answer.variance[rows],
        "sd": answer.sd[rows], "grid": pa.repeat(pa.scalar(answer.grid, pa.float64()), n),
        **{column: pa.repeat(pa.scalar(value, pa.string()), n) for column, value in (key or {}).items()},
    })


def write_measurements(measurements: Measurements, path: Path, key: Mapping[str, str] | None = None) -> None:
    """All noisy answers in one long Parquet table (a key column an answer lacks is null): the bytes
    of ``pq.write_table`` of the answers' tables concatenated, written one row group at a time so
    that only one answer's table and one row group are in memory; ``key`` as for ``answer_table``."""
    schema = pa.unify_schemas([answer_table(answer, slice(0), key).schema for answer in measurements.answers],
                              promote_options="default")

    def conformed(table: pa.Table) -> pa.Table:  # the columns of the schema, nulls for missing keys
        return pa.table({field.name: table[field.name] if field.name in table.column_names
                         else pa.nulls(table.num_rows, field.type) for field in schema}, schema=schema)

    with pq.ParquetWriter(path, schema) as writer:
        pending, count = [], 0
        for answer in measurements.answers:
            table = conformed(answer_table(answer, key=key))
            start = 0
            while start < table.num_rows:
                take = min(MEASUREMENT_ROW_GROUP - count, table.num_rows - start)
                pending.append(table.slice(start, take))
                start, count = start + take, count + take
                if count == MEASUREMENT_ROW_GROUP:
                    writer.write_table(pa.concat_tables(pending), row_group_size=MEASUREMENT_ROW_GROUP)
                    pending, count = [], 0
        if pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=MEASUREMENT_ROW_GROUP)
