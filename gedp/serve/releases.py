"""Releases held by ``gedp serve``: each read once at start-up, checked as untrusted input, and kept
in memory read-only, so that a request is answered without touching a file.

A release of one quarter is held as its kept cell index and its margins' per-cell pieces
(``gedp.release.cells``, ``gedp.release.margins``), built once if the cache has none, and the cells
of its standard groupings computed from them (``gedp.release.lattice``; their margins, then the
implicates of its size-class tables, in a background thread once the server is ready): a request is answered by
``release.cells.index_tabulation``, the function ``gedp tabulate`` answers a further request with
(looking its rows up in the lattice where they are cells of it), so the numbers are the same bit
for bit. A panel release is held as each quarter's
protected microdata and variance functions, and answered by ``gedp.tabulation.panel_tables``'s tabulations of a
quarter or a change, given those (``loaded``). QCEW levels (tables ready to publish, the xlsx
workbook) are written by ``gedp.tabulation.request`` itself from the release's files.

Every field of a release that the server uses is checked before it is served: the reader checks
the manifest's states, quarter labels (a label names a cache folder), counts and files
(``release.validation``), the server the number of quarters and the budget it states; a release
that fails is refused at start-up with a message naming the field. A request never names a file:
it names a release by the id given at start-up.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gedp.errors import InputError
from gedp.tabulation.request import Tabulation, TabulationRequest, tabulate_request

if TYPE_CHECKING:
    import pandas as pd

    from gedp.release.cells import CellIndex
    from gedp.release.lattice import CellLattice

#: Most quarters a served panel may hold.
MAX_QUARTERS = 80
#: Most establishments of a release whose size-class tables a server answers (of a panel: summed over
#: its quarters): it draws their 20 implicates once it is ready and holds them (about 3.5 KiB and 0.5 ms
#: of processor time per establishment: New Jersey's 251,987 took 883 MiB and 729 s at load 13). A
#: panel's quarters were drawn at their first size-class request, each up to this many, held for
#: ever: any data user could make a server of 80 such quarters hold about 20 GB, hold its 4 worker
#: slots while the draws ran one after another, keep its Ctrl-C waiting for them, and tell by an
#: answer's time whether anyone had asked for a quarter before (red team rt25 F2, F3).
MAX_DERIVED_ESTABLISHMENTS = 50_000
#: Characters kept in a release's id (from its folder's name).
ID_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]+")
#: Names a request's keys and filters may use: the public columns but estab_id, and the filter words.
FILTER_WORDS = ("total", "and", "or", "not", "in")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


class Stopping(Exception):
    """The server began to stop while a size-class request waited for the warm-up's draw (answered 503)."""


@dataclass
class ServedRelease:
    """A release held in memory: its ``id``, ``folder``, manifest and quarters; of one quarter, its
    cell ``index`` and ``margins`` (per-cell pieces, or variance functions); of a panel, each
    quarter's protected microdata and variance functions (``quarters_held``)."""

    id: str
    folder: Path
    manifest: dict[str, Any]
    quarters: list[str]
    index: CellIndex | None = None
    margins: Mapping[str, Any] | None = None
    lattice: CellLattice | None = None
    quarters_held: dict[str, tuple[pd.DataFrame, Mapping[str, Any]]] = field(default_factory=dict)
    implicates_held: dict[str | None, pd.DataFrame] = field(default_factory=dict)
    #: Why the size-class implicates of a quarter could not be drawn at start-up (``_warm_up``): what
    #: its size-class requests are answered with.
    implicates_refused: dict[str | None, str] = field(default_factory=dict)
    drawing: threading.Lock = field(default_factory=threading.Lock, repr=False)
    warm: threading.Event = field(default_factory=threading.Event, repr=False)  # its background work done
    #: Told each time the warm-up has drawn a quarter (or failed to), and when it is done (``warmed``).
    progress: threading.Condition = field(default_factory=threading.Condition, repr=False)
    stopping: threading.Event = field(default_factory=threading.Event, repr=False)  # ``stop``
    #: Every file of the folder as the server found it before reading it (``folder_files``).
    files: list[list] = field(default_factory=list, repr=False)

    @property
    def public_columns(self) -> list[str]:
        """The public columns a request may group and filter by."""
        if self.index is not None:
            return [str(column) for column in self.index.cells.columns]
        frame = next(iter(self.quarters_held.values()))[0]
        return [column for column in public_names() if column in frame.columns]

    def own_codes(self) -> list[str]:
        """The ownership codes the release holds (public)."""
        frames = [self.index.cells] if self.index is not None else [frame for frame, _ in self.quarters_held.values()]
        return sorted({str(code) for frame in frames if "own" in frame.columns for code in frame["own"].unique()})

    def answer(self, request: TabulationRequest) -> Tabulation:
        """The tabulation of a request of this release (its ``source`` is this release's folder):
        what ``gedp tabulate`` answers for it."""
        from gedp.postprocess.keys import SIZE_CLASS, has_derived

        derived = request.by is not None and has_derived(request.by)
        check_public_names(request, [*self.public_columns, *([SIZE_CLASS] if derived else [])])
        if request.agglvl is not None:
            return self._written_by_the_library(request)
        if derived:
            return self._derived_answer(request)
        request = request.checked()
        if self.quarters:
            return self._panel_answer(request)
        return self._index_answer(request)

    def _index_answer(self, request: TabulationRequest) -> Tabulation:
        from gedp.release.cells import index_tabulation

        if request.quarter is not None or request.change is not None:
            raise InputError(f"release {self.id} holds one quarter: no quarter or change")
        index = self.index
        assert index is not None
        found = index_tabulation(index, request.by or "total", margins=self.margins if request.moe else None,
                                 where=request.where or None, level=request.level, lattice=self.lattice)
        if found is None:
            _refusal(index.cells, request)
        keys, table = found
        return Tabulation(request, keys, table)

    def _panel_answer(self, request: TabulationRequest) -> Tabulation:
        from gedp.tabulation.panel_tables import tabulate_change, tabulate_quarter

        if (request.quarter is None) == (request.change is None):
            raise InputError(f"release {self.id} holds the quarters {', '.join(self.quarters)}: give a quarter or a "
                             "change FIRST:SECOND")
        by, where = request.by or "total", request.where or None
        if request.quarter is not None:
            if request.quarter not in self.quarters_held:
                raise InputError(f"quarter {request.quarter} is not in release {self.id}, which holds the quarters "
                                 f"{', '.join(self.quarters)}")
            table = tabulate_quarter(self.folder, by, request.quarter, loaded=self._quarter, where=where,
                                     moe=request.moe, level=request.level)
        else:
            table = tabulate_change(self.folder, by, str(request.change), loaded=self._quarter, where=where,
                                    moe=request.moe, level=request.level)
        return Tabulation(request, None, table, panel=True)

    def _derived_answer(self, request: TabulationRequest) -> Tabulation:
        """A table by a derived column (``size_class``): ``gedp tabulate``'s, combined over the
        implicates this release holds (drawn at its first such request, ``implicates``)."""
        from gedp.postprocess.keys import DERIVED

        check_public_names(request, [*self.public_columns, *DERIVED])
        if request.change is not None or (self.quarters and request.quarter not in self.quarters_held):
            raise InputError(f"a size-class table is of one quarter: give quarter=, one of {', '.join(self.quarters)}"
                             if self.quarters else f"release {self.id} holds one quarter: no quarter or change")
        if not self.quarters and request.quarter is not None:
            raise InputError(f"release {self.id} holds one quarter: no quarter or change")
        return tabulate_request(request, implicates=self.implicates(request.quarter, drawn_ahead=True))

    def implicates(self, quarter: str | None, *, drawn_ahead: bool = False) -> pd.DataFrame:
        """The implicates tables by a derived column are combined over (of one ``quarter`` of a panel),
        drawn once and held; InputError for a release larger than ``MAX_DERIVED_ESTABLISHMENTS``.
        ``drawn_ahead`` (a request's): those the warm-up draws, waited for while it has not drawn them
        (the request answered 503 at its time meanwhile), never drawn by the request: one that drew a
        quarter the warm-up had not reached took the draw's time (4.2 s, then 0.0 s for everyone: an
        answer's time told whether anyone had asked that quarter before; red team rt26 G4, 80 quarters
        drawn over 2+ minutes after start-up). A wait's length depends on the warm-up alone. Refused
        when the folder's files are not those the server loaded, before or after the draw (``unchanged``)."""
        from gedp.release.implicates import tabulation_implicates

        if not self.size_classes:
            quarters = f" (summed over its {len(self.quarters)} quarters)" if self.quarters else ""
            what = f"establishments{quarters}"
            raise InputError(f"release {self.id}: size-class tables are combined over implicates of all its "
                             f"{self.establishments:,} {what}, more than this server draws "
                             f"({MAX_DERIVED_ESTABLISHMENTS:,}); gedp tabulate gives them")
        held = self.implicates_held.get(quarter)
        if held is not None:  # not waiting for the warm-up's draw of another quarter
            return held
        if drawn_ahead:
            with self.progress:
                self.progress.wait_for(lambda: quarter in self.implicates_held or quarter in self.implicates_refused
                                       or self.warm.is_set() or self.stopping.is_set())
            if quarter not in self.implicates_held and self.stopping.is_set():
                raise Stopping("the server is stopping")
        with self.drawing:
            if quarter in self.implicates_refused:
                raise InputError(self.implicates_refused[quarter])
            if quarter not in self.implicates_held:
                self.unchanged()  # drawn from the files the server loaded, as its tables ready to publish are
                drawn = tabulation_implicates(self.folder, quarter)
                self.unchanged()
                self.implicates_held[quarter] = drawn
            return self.implicates_held[quarter]

    def stop(self) -> None:
        """Answer the requests waiting for the warm-up's draws now (503): the server stops, and it waits
        for the requests in flight (up to their --timeout: 27 s with 8 waiting)."""
        with self.progress:
            self.stopping.set()
            self.progress.notify_all()

    def warmed(self) -> None:
        """Say the warm-up is done (``warm``), to the requests waiting for its draws too."""
        with self.progress:
            self.warm.set()
            self.progress.notify_all()

    @property
    def size_classes(self) -> bool:
        """Whether this server answers the release's tables by size class (``implicates``)."""
        return self.establishments <= MAX_DERIVED_ESTABLISHMENTS

    @property
    def establishments(self) -> int:
        """Establishments held (of a panel: summed over its quarters, whose implicates are each drawn)."""
        if self.index is not None:
            return len(self.index.codes)
        return sum(len(frame) for frame, _ in self.quarters_held.values())

    def _quarter(self, quarter: str) -> tuple[pd.DataFrame, Mapping[str, Any]]:
        return self.quarters_held[quarter]

    def _written_by_the_library(self, request: TabulationRequest) -> Tabulation:
        """A QCEW level (ready to publish, or the xlsx workbook): ``gedp tabulate``'s own path,
        reading the release's files; the table read back from the file written. Refused when the
        folder's files are not those the server loaded, before or after the read (``unchanged``)."""
        self.unchanged()
        with tempfile.TemporaryDirectory(prefix="gedp-serve-") as folder:
            out = Path(folder) / f"table.{'xlsx' if request.format == 'xlsx' else 'csv'}"
            answer = tabulate_request(dataclasses.replace(request, out=out))
            answer.write_table(out)
            answer.written = out.read_bytes()
        self.unchanged()
        return answer

    def unchanged(self) -> None:
        """InputError when the release's folder no longer holds the files the server loaded: a table
        read from its files again would not be the release served (red team rt28 J5: files replaced
        under a running server changed its tables ready to publish, its other tables and its stated
        guarantee kept)."""
        try:
            same = folder_files(self.folder) == self.files
        except OSError:
            same = False
        if not same:
            raise InputError(f"release {self.id} changed on disk since the server loaded it: restart the server "
                             "to serve it")


def folder_files(folder: Path) -> list[list]:
    """Each file under ``folder`` (sorted): its path, device, inode, size, modification and change times
    in ns (any write to a file or its replacement changes its change time or inode)."""
    found: list[list] = []
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        try:
            status = path.stat()
        except OSError:  # a link to nothing (not a file of the release: the reader reads none such)
            found.append([name])
            continue
        if not path.is_dir():
            found.append([name, status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns])
    return found


def public_names() -> tuple[str, ...]:
    """The public columns but ``estab_id``, and the columns carried with them."""
    from gedp.synth.schema import CARRIED, PUBLIC

    return tuple(column for column in (*PUBLIC, *CARRIED) if column != "estab_id")


def check_public_names(request: TabulationRequest, columns: list[str]) -> None:
    """Refuse keys or a filter naming anything but the release's public columns (text in quotes aside):
    the server answers tabulations by public columns; gedp tabulate answers the rest."""
    allowed = {*columns, *FILTER_WORDS}
    for option, text in (("by", request.by or ""), ("where", QUOTED.sub("", request.where or ""))):
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text):
            if name not in allowed:
                raise InputError(f"{option}: {name[:40]!r} is not a public column of this release; the explorer "
                                 f"groups and filters by {', '.join(columns)} (gedp tabulate answers the rest)")


def _refusal(cells: pd.DataFrame, request: TabulationRequest) -> NoReturn:
    """Raise what ``gedp tabulate`` says of a request the kept index does not answer (a key or
    filter the cells do not have, an empty selection): the same check run on the cells."""
    from gedp.postprocess.tabulate import tabulate

    try:
        tabulate(cells.assign(_one=1.0), request.by or "total", ["_one"], where=request.where or None)
    except ValueError as err:
        raise InputError(str(err)) from None
    raise InputError("this request is not a tabulation by public columns; gedp tabulate answers it")


def load_releases(folders: list[Path]) -> dict[str, ServedRelease]:
    """Each release folder read, checked and held (``load_release``), by id: the folder's name (other
    characters than letters, digits, ``_.-`` dropped), made unique with ``-2``, ``-3``, ..."""
    served: dict[str, ServedRelease] = {}
    for folder in folders:
        base = ID_CHARACTERS.sub("", folder.resolve().name)[:60] or "release"
        name, n = base, 1
        while name in served:
            n += 1
            name = f"{base}-{n}"
        served[name] = load_release(folder, name)
    return served


def load_release(folder: Path, id: str) -> ServedRelease:
    """A release read once and held (see the module), refused when a field the server uses is not
    what gedp writes."""
    from gedp.release.reader import read_manifest

    folder = folder.resolve()
    if not folder.is_dir():
        raise InputError(f"release '{folder}' is not a folder")
    files = folder_files(folder)  # before reading: a change while the server reads shows too
    manifest = dict(read_manifest(folder))
    quarters = check_manifest(manifest, folder)
    release = ServedRelease(id, folder, manifest, quarters, files=files)
    if quarters:
        _hold_quarters(release)
    else:
        _hold_index(release)
    return release


def check_manifest(manifest: dict[str, Any], folder: Path) -> list[str]:
    """The quarters of a release whose manifest the reader accepted (``release.validation``: states,
    quarters, counts, files), with what the server adds: at most ``MAX_QUARTERS`` quarters, and a
    budget that is a finite number > 0 (the page states it); InputError naming the field."""
    where = f"release '{folder.name}'"
    quarters = list(manifest.get("quarters", []))
    if len(quarters) > MAX_QUARTERS:
        raise InputError(f"{where}: {len(quarters)} quarters, more than the {MAX_QUARTERS} a server holds")
    value = manifest.get("mu_total")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{where}: mu_total must be a finite number > 0")
    return quarters


def _hold_index(release: ServedRelease) -> None:
    """Hold a release of one quarter: its margins built (or read) once, its kept index and pieces."""
    from gedp.release.cells import read_cell_index
    from gedp.release.lattice import build_lattice
    from gedp.release.margins import kept_path, kept_variances, read_pieces

    variances = kept_variances(release.folder)
    folder = kept_path(release.folder)
    index = read_cell_index(folder)
    pieces = read_pieces(folder)
    if index is None:
        raise InputError(f"release '{release.folder.name}': its cell index could not be kept (is the cache "
                         "folder writable? GEDP_CACHE_DIR)")
    release.index = index
    release.margins = pieces if pieces is not None and all(p is not None for p in pieces.values()) else variances
    release.lattice = build_lattice(index, release.margins)
    threading.Thread(target=_warm_up, args=(release,), name=f"margins of {release.id}", daemon=True).start()


def _warm_up(release: ServedRelease) -> None:
    """A release's work once the server is ready, in the background: its lattice's margins, then the
    implicates its size-class tables are combined over (``implicates``), so that no request pays for
    drawing them within its time (a first size-class request took longer than a request's 30 s at load
    17) and a size-class answer's time does not tell whether one was asked before. ``warm`` is set after.

    A failure is said on stderr in one line (``warm_up_failure``: no traceback, no value) and the server
    serves on: margins not computed ahead are computed by the requests that need them; implicates that
    could not be drawn are not drawn again, each size-class request answered with the error the draw
    gave (``implicates_refused``), every other table as before. The server is not refused instead: the
    draw runs after start-up so that a server is ready at once, and its failure concerns its size-class
    tables only; nor is the draw repeated per request: it reads the same files and would fail alike,
    spending up to a request's 30 s each time."""
    try:
        try:
            assert release.lattice is not None
            release.lattice.compute_all()
        except Exception as err:  # noqa: BLE001 (said; a request computes what it needs)
            warm_up_failure(release, "its margins were not computed ahead", err)
        _draw_implicates(release, [None])
    finally:
        release.warmed()


def _draw_implicates(release: ServedRelease, quarters: list[str | None]) -> None:
    """Draw the size-class implicates of each of ``quarters`` (None: the release of one quarter) when
    the server answers its size-class tables; a failure said (``warm_up_failure``) and held for the
    quarter's requests."""
    if not release.size_classes:
        return
    for quarter in quarters:
        try:
            release.implicates(quarter)
        except Exception as err:  # noqa: BLE001 (said, and held for its requests)
            what = "its size-class tables are refused" if quarter is None else \
                f"its size-class tables of {quarter} are refused"
            release.implicates_refused[quarter] = warm_up_failure(release, what, err)
        with release.progress:  # the requests waiting for this quarter
            release.progress.notify_all()


def warm_up_failure(release: ServedRelease, what: str, err: Exception) -> str:
    """A failure of ``release``'s warm-up said on stderr in one line with ``what`` it means: a gedp
    error's own one-line message (which names no value), of anything else its type only. Returns what
    a request it concerns is answered with: the gedp error's message, as the request's own draw would
    give it, or the line said."""
    import sys

    from gedp.errors import GedpError

    gedp_error = isinstance(err, GedpError)
    message = " ".join(str(err).split()) if gedp_error else f"{type(err).__name__} (its detail is not shown)"
    said = f"release {release.id}: {what}: {message}"
    print(f"warning: {said}", file=sys.stderr, flush=True)
    return message if gedp_error else said


def _hold_quarters(release: ServedRelease) -> None:
    """Hold a panel release: each quarter's protected microdata and variance functions."""
    from gedp.release.margins import kept_variances
    from gedp.release.reader import read_quarter

    for quarter in release.quarters:
        release.quarters_held[quarter] = (read_quarter(release.folder, quarter),
                                          kept_variances(release.folder, quarter))
    threading.Thread(target=_warm_up_quarters, args=(release,), name=f"implicates of {release.id}", daemon=True).start()


def _warm_up_quarters(release: ServedRelease) -> None:
    """A panel's work once the server is ready, in the background: every quarter's size-class implicates
    drawn (as ``_warm_up`` draws a release's of one quarter), so that no request draws them."""
    try:
        _draw_implicates(release, list(release.quarters))
    finally:
        release.warmed()
