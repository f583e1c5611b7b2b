"""One tabulation path for the command line and the server: a request (``TabulationRequest``, the
options of ``gedp tabulate`` as one value), its checks, the table and its summary (``tabulate_request``)
and the files written of it (``Tabulation.write``: CSV, Parquet, a QCEW CSV or an xlsx workbook, and
the JSON summary beside it). ``gedp tabulate`` translates its flags into a request and shows what it
gives; ``gedp serve`` answers the same requests, so the two cannot disagree.

A request of a release is answered, in order of cost: from the release's kept cell index without
pandas (``release.quick``: a further CSV request by public columns without a filter), from the kept
index with pandas (``release.margins.kept_tabulation``), or by reading the release (a first request,
a QCEW level, worker columns, a panel release). Each gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from gedp.errors import InputError
from gedp.release.format import check_outside
from gedp.tabulation.output_files import summary_path, write_atomically, write_summary

if TYPE_CHECKING:  # pandas and the stages are loaded by the requests that need them
    import pandas as pd

    from gedp.postprocess.publication import PublishedLevels
    from gedp.synth.titles import Titles

TABLE_FORMATS = ("csv", "parquet", "qcew", "xlsx")
#: Formats of QCEW tables ready to publish (titles, whole numbers, average weekly wage).
PUBLICATION_FORMATS = ("qcew", "xlsx")
#: Said when gains and losses are summed from protected microdata.
GAINS_BIAS_WARNING = ("gains and losses summed from protected microdata are biased upward by the noise (see the "
                      "gains and losses page)")
#: Said of a table ready to publish made of confidential microdata (``unprotected``).
UNPROTECTED_WARNING = ("NOT PROTECTED: this table of {source} holds confidential values (no noise); every row's "
                       "disclosure_code says so. Never publish it.")


@dataclass(frozen=True)
class TabulationRequest:
    """What to tabulate (the options of ``gedp tabulate``, named after its flags): a release directory
    or a microdata file (``source``), by public columns (``by``) or a QCEW level (``agglvl``), over
    the establishments matching ``where``, with margins of error at ``level`` (``moe``), in an output
    ``format`` (None: from ``out``'s name, else csv) with the ``titles`` of a published QCEW CSV,
    written to ``out`` (None: not written); of a panel release, one ``quarter``, a ``change``
    FIRST:SECOND or the gross job ``gains_losses`` FROM:TO. A table by ``size_class`` is combined
    over the folder ``implicates`` (``gedp implicates`` output of the release) when it is given. A
    table ready to publish (formats qcew and xlsx) is of a release only, unless ``unprotected``
    allows one of confidential microdata, marked ``NOT PROTECTED`` in every row. ``flags``: whether
    messages name the options as gedp tabulate's flags (``--level``), or as the parameters of the
    server's requests (``level``)."""

    source: Path
    by: str | None = None
    agglvl: int | None = None
    where: str | None = None
    moe: bool = False
    level: float = 0.95
    format: str | None = None
    titles: Path | None = None
    out: Path | None = None
    quarter: str | None = None
    change: str | None = None
    gains_losses: str | None = None
    unprotected: bool = False
    implicates: Path | None = None
    flags: bool = True

    def option(self, name: str) -> str:
        """How a message names the option ``name`` to this request's caller (``flags``)."""
        return f"--{name.replace('_', '-')}" if self.flags else name

    def checked(self) -> TabulationRequest:
        """The request with its output format settled; InputError for options that do not go together."""
        return dataclasses.replace(self, format=_tabulation_format(self))

    @property
    def is_release(self) -> bool:
        """Whether the source is a release directory (else a microdata file)."""
        from gedp.release.format import MANIFEST_FILE

        return self.source.is_dir() and (self.source / MANIFEST_FILE).is_file()

    @property
    def moe_level(self) -> float | None:
        """The confidence level of the margins of error (None without them)."""
        return self.level if self.moe else None

    @property
    def margins_note(self) -> str:
        """What a summary line adds about margins of error."""
        from gedp.postprocess.combine import level_percent

        return f"; margins of error at {level_percent(self.level)}" if self.moe else ""


@dataclass
class Tabulation:
    """A request's answer: the keys grouped by, the table (a pandas frame, or ``columns`` by name as
    Python lists where it was answered without pandas), a publication's levels (formats qcew and
    xlsx) and the warnings said of it."""

    request: TabulationRequest
    keys: Any
    table: pd.DataFrame | None = None
    columns: dict[str, list] | None = None
    published: PublishedLevels | None = None
    warnings: list[str] = field(default_factory=list)
    panel: bool = False
    #: The bytes of the file written of it, where a caller kept them (a server's download).
    written: bytes | None = None
    #: The notes of a table ready to publish, once made (``_notes``).
    notes: pd.DataFrame | None = None
    #: The implicates of the folder a size-class table was combined over (``DrawnImplicates.described``).
    drawn: dict[str, Any] | None = None


    @property
    def n_rows(self) -> int:
        if self.columns is not None:
            return len(next(iter(self.columns.values())))
        return len(cast("pd.DataFrame", self.table))

    def frame(self) -> pd.DataFrame:
        """The table as a pandas frame."""
        if self.table is not None:
            return self.table
        import pandas

        return pandas.DataFrame(self.columns)

    def write_csv(self, target: str | Path | TextIO) -> None:
        """The table as CSV (pandas' bytes, ``gedp.tabulation.csvtable``) to a file path or an open text stream."""
        from gedp.tabulation.csvtable import write_columns, write_csv

        if self.columns is not None:
            write_columns(self.columns, target)
        else:
            write_csv(cast("pd.DataFrame", self.table), target)

    def write_table(self, path: Path) -> None:
        """The table at ``path`` in the request's format: CSV, Parquet or (xlsx) the workbook of the
        levels and the notes."""
        if self.request.format == "xlsx" and self.published is not None:
            from gedp.postprocess.publication import write_workbook

            write_workbook(self.published.levels, self._notes(), path)
        elif self.request.format == "parquet":
            cast("pd.DataFrame", self.table).to_parquet(path, index=False)
        else:
            self.write_csv(path)

    def summary(self) -> dict[str, Any]:
        """The machine-readable summary written beside the table (``out``.json)."""
        request = self.request
        if self.panel:
            return {"source": str(request.source), "quarter": request.quarter, "change": request.change,
                    "gains_losses": request.gains_losses, "rows": self.n_rows}
        summary = {"source": str(request.source), "by": self.keys, "agglvl": request.agglvl, "where": request.where,
                   "moe_level": request.moe_level, "rows": self.n_rows, "table": str(request.out)}
        if self.drawn is not None:
            summary["implicates"] = self.drawn
        return summary if self.published is None else summary | self._publication_summary()

    def write(self) -> None:
        """Write the table to the request's ``out`` (complete or not at all) and its summary beside it."""
        out = cast(Path, self.request.out)
        summary = self.summary()
        write_atomically(out, self.write_table)
        write_summary(out, summary)

    def _notes(self) -> pd.DataFrame:
        """The notes sheet of a table ready to publish, whose privacy statement comes from the
        release's manifest once its answers confirmed the budget it states (``confirmed_manifest``:
        a forged mu is refused, never restated); made once."""
        from gedp.postprocess.publication import publication_notes
        from gedp.release.reader import confirmed_manifest

        if self.notes is None:
            request = self.request
            titles = cast("Titles", cast("PublishedLevels", self.published).titles)  # ready to publish: titled
            self.notes = publication_notes(confirmed_manifest(request.source) if request.is_release else None,
                                           titles, str(request.source), request.moe_level)
        return self.notes

    def _publication_summary(self) -> dict[str, Any]:
        """What a table ready to publish adds to its JSON: levels, titles' sources, untitled codes, the notes."""
        published = cast("PublishedLevels", self.published)
        titles = cast("Titles", published.titles)
        table = cast("pd.DataFrame", self.table)
        notes = self._notes()
        return {"levels": list(published.levels), "titles": titles.sources,
                "untitled_codes": titles.untitled(table["area_fips"], table["industry_code"]),
                "notes": dict(zip(notes["topic"], notes["note"]))}


def tabulate_request(request: TabulationRequest, *, frame: bool = False,
                     implicates: pd.DataFrame | None = None) -> Tabulation:
    """The answer to a tabulation request (checked here; nothing written: ``Tabulation.write``).
    Without ``frame``, a further CSV request of a release may be answered as columns without pandas;
    ``implicates``: a request by a derived column's implicates, drawn already (a server holds them)."""
    if request.out is not None and request.is_release:  # refused before anything is read or written
        check_outside(request.source, request.out, summary_path(request.out))
    if request.by is not None and request.is_release and _has_derived_keys(request.by):
        return _derived_tabulation(request, implicates)
    if request.implicates is not None:
        raise InputError(f"{request.option('implicates')} goes with a table of a release by size_class (--by "
                         "...,size_class): tables by public columns come from the release's answers, not implicates")
    request = request.checked()
    release = request.is_release
    plain = all(option is None for option in (request.where, request.agglvl, request.quarter, request.change,
                                              request.gains_losses))
    if release and plain and request.format == "csv" and not frame:
        quick = _quick_tabulation(request)
        if quick is not None:
            return quick
    from gedp.release.reader import release_quarters

    if request.gains_losses is not None and (request.agglvl is not None or request.where
                                             or request.format in PUBLICATION_FORMATS
                                             or (request.moe and not release)):
        raise InputError("--gains-losses goes with --by, --out and --format csv or parquet only, and --moe with a "
                         "panel release (margins and corrected sums need the release's noise)")
    if request.quarter is not None or request.change is not None or (release and release_quarters(request.source)):
        return _panel_tabulation(request)
    return _tabulation(request, release)


def _has_derived_keys(by: str) -> bool:
    """Whether a tabulation's keys hold a derived column (size_class), tabulated over implicates."""
    from gedp.postprocess.keys import has_derived

    return has_derived(by)


def _derived_tabulation(request: TabulationRequest, implicates: pd.DataFrame | None = None) -> Tabulation:
    """A release tabulated by a derived column (``gedp.release.implicates.tabulate_derived``), as csv or
    parquet; ``--format qcew``: BLS's size-class layout, written as CSV."""
    from gedp.postprocess.combine import checked_level
    from gedp.postprocess.keys import by_columns
    from gedp.release.implicates import tabulate_derived

    layout = "qcew" if request.format == "qcew" else "table"
    written = _table_format(None if layout == "qcew" else request.format, request.out, None)
    if written == "xlsx" or request.agglvl is not None or request.titles is not None:
        raise InputError("a size-class table goes with --by, --where, --moe and --format csv, parquet or qcew")
    if request.change is not None or request.gains_losses is not None:  # red team rt23 F6
        raise InputError("a size-class table is of one quarter: give --quarter, not a change or gains and losses")
    checked_level(request.level, request.option("level"))
    request = dataclasses.replace(request, format=written)
    drawn = None
    if request.implicates is not None:
        from gedp.release.implicates_folder import open_implicates

        if request.out is not None and _inside(request.out, request.implicates):
            raise InputError(f"output '{request.out}' is inside the implicates folder it reads: give a path outside it")
        drawn = open_implicates(request.source, request.implicates, request.quarter)
    table = tabulate_derived(request.source, cast(str, request.by), where=request.where or None, moe=request.moe,
                             level=request.level, format=layout, quarter=request.quarter, implicates=implicates,
                             drawn=drawn)
    return Tabulation(request, by_columns(cast(str, request.by)), table,
                      drawn=None if drawn is None else drawn.described())


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is at or inside ``folder`` (symbolic links resolved, as a file would be written)."""
    target, folder = path.resolve(), folder.resolve()
    return target == folder or folder in target.parents


def _table_format(table_format: str | None, out: Path | None, agglvl: int | None) -> str:
    """The output format: --format, else from the --out name; refused when it cannot be told."""
    if out is not None and out.is_dir():
        raise InputError(f"--out '{out}' is a folder; give a file name, e.g. {out / 'tabulation.csv'}")
    if table_format is None and out is not None:
        table_format = out.suffix.lower().lstrip(".")
        if table_format not in TABLE_FORMATS:
            raise InputError(f"--out '{out}': the name does not tell the format; end it in .csv, .parquet or .xlsx, "
                             f"or give --format ({', '.join(TABLE_FORMATS)})")
    table_format = table_format or "csv"
    if table_format not in TABLE_FORMATS:
        raise InputError(f"--format '{table_format}': choose one of {', '.join(TABLE_FORMATS)}")
    if table_format == "qcew" and agglvl is None:
        raise InputError("--format qcew needs --agglvl (a QCEW aggregation level)")
    if table_format in ("parquet", "xlsx") and out is None:
        raise InputError(f"--format {table_format} needs --out FILE")
    return table_format


def _tabulation_format(request: TabulationRequest) -> str:
    """Refuse a tabulation's options that do not go together; returns the output format."""
    from gedp.postprocess.combine import checked_level

    table_format, out, by = request.format, request.out, request.by
    if request.titles is not None and table_format not in PUBLICATION_FORMATS and not (out and out.suffix == ".xlsx"):
        raise InputError("--titles goes with --format qcew or xlsx (tables ready to publish)")
    if request.unprotected and request.is_release:
        raise InputError("--unprotected goes with a confidential microdata file, not a release")
    name = request.option
    if table_format == "xlsx" and by is not None:
        raise InputError(f"{name('format')} xlsx writes QCEW levels: give {name('agglvl')} (or neither, for every "
                         f"level), not {name('by')}")
    if request.moe and not request.is_release:
        raise InputError("--moe needs a release directory (it reads the release's measurements)")
    if request.agglvl is not None and by is not None:
        raise InputError(f"give {name('by')} or {name('agglvl')}, not both ({name('agglvl')} sets the groups of a "
                         "QCEW level)")
    checked_level(request.level, request.option("level"))
    chosen = _table_format(table_format, out, request.agglvl)
    if chosen in PUBLICATION_FORMATS and not request.is_release and not request.unprotected:
        raise InputError(f"--format {chosen} writes a table ready to publish, but this input is not a gedp release: "
                         "its values are confidential, not protected. Tabulate a release (gedp protect first), or "
                         "give --unprotected for a table marked NOT PROTECTED in every row, for internal use")
    return chosen


def _quick_tabulation(request: TabulationRequest) -> Tabulation | None:
    """A further CSV request of a release answered from its kept index without pandas
    (``gedp.release.quick``); None when it cannot be."""
    from gedp.release.quick import quick_tabulation

    table = quick_tabulation(request.source, request.by or "total", moe=request.moe, level=request.level)
    if table is None:
        return None
    return Tabulation(request, table.keys, columns=table.columns)


def _panel_tabulation(request: TabulationRequest) -> Tabulation:
    """A tabulation of a panel release (a quarter, a change or gains and losses)."""
    from gedp.tabulation.panel_tables import tabulate_panel

    table = tabulate_panel(request.source, request.by, quarter=request.quarter, change=request.change,
                           gains_losses=request.gains_losses, agglvl=request.agglvl,
                           format=request.format if request.format in PUBLICATION_FORMATS else "table",
                           titles=request.titles, where=request.where or None, moe=request.moe, level=request.level)
    return Tabulation(request, None, table, panel=True)


def _tabulation(request: TabulationRequest, release: bool) -> Tabulation:
    """A tabulation that is not of a panel release: from the kept index where it can be, else of the
    microdata read (worker columns: of the release's job frame); the warnings it raised collected."""
    import pandas

    from gedp.postprocess.tabulate import SelectionWarning
    from gedp.release.margins import kept_tabulation, kept_variances

    by, where = request.by, request.where
    indexed = (kept_tabulation(request.source, by or "total", where=where or None, moe=request.moe,
                               level=request.level)
               if release and request.gains_losses is None and request.agglvl is None
               and request.format not in PUBLICATION_FORMATS else None)
    jobs = not indexed and request.agglvl is None and _has_worker_keys(by)
    ids = jobs or request.gains_losses is not None or not _names_only_columns(f"{by or ''} {where or ''}")
    data = pandas.DataFrame() if indexed else _microdata_to_tabulate(request.source, release, ids,
                                                                     panel=request.gains_losses is not None)
    if jobs and not release:
        raise InputError("worker columns need a release directory with a job frame")
    options = {"where": where or None, "moe": request.moe, "level": request.level,
               "margins": kept_variances(request.source) if request.moe and not jobs and not indexed else None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SelectionWarning)
        answer = _tabulated(request, data, indexed, jobs, options)
    answer.warnings += [str(warning.message) for warning in caught]
    return answer


def _tabulated(request: TabulationRequest, data: pd.DataFrame, indexed: Any, jobs: bool,
               options: dict[str, Any]) -> Tabulation:
    """The keys, the table and (publication formats) the published levels of a tabulation request
    that is not of a panel release; a ValueError of the tabulation becomes an InputError."""
    import pandas

    from gedp.postprocess.tabulate import group_keys, qcew_keys, qcew_level, tabulate

    by, agglvl = request.by, request.agglvl
    published, said = None, []
    try:
        if indexed:
            keys, table = indexed
        elif request.format in PUBLICATION_FORMATS:
            from gedp.postprocess.publication import publish_levels

            release = request.is_release
            published = publish_levels(data, agglvl, str(request.format), request.titles, protected=release,
                                       **options)
            if not release:
                said.append(UNPROTECTED_WARNING.format(source=request.source))
            table = pandas.concat(published.levels.values(), ignore_index=True)
            keys = qcew_keys(data, agglvl) if agglvl is not None else None
        elif agglvl is not None:
            keys = qcew_keys(data, agglvl)
            table = qcew_level(data, agglvl, **options)
        elif request.gains_losses is not None:
            from gedp.postprocess.gains import panel_gains_losses

            table = panel_gains_losses(data, request.gains_losses, by or "total")
            keys = [c for c in table.columns if c in data.columns]
            said.append(GAINS_BIAS_WARNING)
        elif jobs:
            from gedp.tabulation.job_frame_tables import tabulate_job_frame

            table = tabulate_job_frame(request.source, data, by or "", where=options["where"], moe=options["moe"],
                                       level=options["level"])
            keys = [c for c in table.columns if c not in ("estabs", "jobs", "jobs_moe")]
        else:
            keys = group_keys(data, by or "total")
            table = tabulate(data, keys, **options)
    except ValueError as err:
        raise InputError(str(err)) from None
    return Tabulation(request, keys, table, published=published, warnings=said)


def _has_worker_keys(by: str | None) -> bool:
    """Whether a tabulation's keys hold worker columns (of a job frame)."""
    from gedp.postprocess.keys import worker_keys

    return bool(worker_keys(by or ""))


def _microdata_to_tabulate(microdata: Path, release: bool, ids: bool, panel: bool = False) -> pd.DataFrame:
    """A release's protected microdata (``estab_id`` only with ``ids``), or a microdata file, validated
    (a ``panel`` file: one row per establishment and quarter, read as stored)."""
    from gedp.release.reader import read_protected
    from gedp.synth.io import read_columns, read_microdata

    if release:
        return read_protected(microdata, without=() if ids else ("estab_id",))
    return read_columns(microdata) if panel else read_microdata(microdata, attributes=None)


def _names_only_columns(text: str) -> bool:
    """Whether every name in a tabulation's --by and --where is a public column other than estab_id
    (or total, and, or, not, in): then a release's ids need not be read (anything else, e.g. a
    text literal or a name an error message lists the columns for, reads them all)."""
    from gedp.synth.schema import CARRIED, PUBLIC

    allowed = {*PUBLIC, *CARRIED, "total", "and", "or", "not", "in"} - {"estab_id"}
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) <= allowed
