"""The margin structure of a release, built once and kept in a cache folder keyed by the release's
content, so that every further tabulation with margins of error only applies it.

The structure is each attribute's variance function (``postprocess.moe.variance_functions``): the
least squares' per-establishment variances and cell operator inputs, and the wage fit; with it, the
release's cell index (``release.cells``) and each variance function's per-cell pieces
(``postprocess.cellmargins``: sums over the finest public cells and the rows of factors of the
models' low-rank parts), through which every tabulation by public columns gets its margins, the
first request (reading the release) and every further one (reading only the index and the pieces)
alike, so they give the same bytes. All of it is a function of the release's files alone (its
manifest, noisy answers and protected microdata), never of the confidential input, so it is rebuilt
bit for bit from any copy of the release and tells nothing the release does not.

It is kept as a folder of NumPy arrays (``.npy``, no pickle) and a JSON skeleton, named by the
SHA-256 digest of the release's manifest, measurements and protected microdata (every byte of every
part) and of the structure's format, in ``$GEDP_CACHE_DIR`` (default ``$XDG_CACHE_HOME/gedp`` or ``~/.cache/gedp``)
under ``margins/``. A release changed in any byte has another digest and gets its own structure;
the release folder itself is never written (it may be read-only or shared). The digest of a
release's files is remembered (``margins/.digests``, named by a digest of the release's path) with
their file-system identity: device, inode, size, modification and change times. Any write to a
file or its replacement changes its change time or inode, so a further request reads the files'
bytes again only when one may have changed.

Nothing of the cache is named from a release's content: a structure's folder is the digest (of
one quarter of a panel: the digest of the release's digest and the quarter), its pieces' files the
digests of their attributes' names. A structure is built in a temporary folder whose last file,
``complete.json``, lists every file with its size and the digest the structure was computed for;
the folder is then renamed into place. A kept structure is used only when its files are those
``complete.json`` lists (one deleted or cut short: rebuilt, never a column silently dropped) and its
digest is its folder's name (another release's structure copied into it: rebuilt). Requests
sharing a cache hold a shared lock on ``margins/.lock`` (``fcntl.flock``) while they open a kept
structure's files; putting a structure into place and removing the least recently used hold it
exclusively, and only ever remove folders named as gedp names them, directly inside ``margins/``,
not symbolic links. The lock is waited for
with a deadline (``gedp.accounting.lock_wait``): a process that holds it and hangs makes the others
fail with a one-line ``LockTimeout``, not wait for ever.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gedp.accounting.lock_wait import LockWait, open_lock_file
from gedp.errors import InputError
from gedp.postprocess.cellmargins import CellPieces, IndexedVariances, pieces_arrays, pieces_from
from gedp.release.cells import CELL_CODES_FILE, indexed_tabulation, write_cell_index
from gedp.release.format import MANIFEST_FILE, MEASUREMENTS_FILE, PROTECTED_FILE
from gedp.release.versions import package_version

if TYPE_CHECKING:
    import pandas as pd

    from gedp.postprocess.models import VarianceFunction

#: Bumped whenever what the structure holds, or how it is applied, changes (13: built on one BLAS thread).
STRUCTURE_FORMAT = 13
CACHE_ENV = "GEDP_CACHE_DIR"
#: Structures kept at most (the least recently used are removed first).
KEPT_STRUCTURES = 4
#: Where the digests of releases' files are remembered (a dot folder beside the structures), and how many.
DIGESTS_FOLDER = ".digests"
KEPT_DIGESTS = 64
SKELETON_FILE = "skeleton.json"
#: The per-cell pieces of the variance functions (``postprocess.cellmargins``): their skeleton, and
#: the prefix of their arrays' files.
PIECES_FILE = "pieces.json"
PIECES_PREFIX = "pieces-"
#: Written last into a structure's folder: each of its files and its size.
COMPLETE_FILE = "complete.json"
#: The lock requests sharing the cache take (``shared_cache``, ``exclusive_cache``).
LOCK_FILE = ".lock"
#: The names of the structures' folders (SHA-256 digests): the only entries pruning removes, with
#: those an earlier format named (``<digest>-<quarter>``) and folders a stopped request left
#: (``.partial-*``, ``.retired-*``) an hour after they were last written.
STRUCTURE_NAME = re.compile(r"[0-9a-f]{64}")
EARLIER_NAME = re.compile(r"[0-9a-f]{64}-[0-9]{4}Q[1-4]")
LEFT_NAME = re.compile(r"\.(partial|retired)-[0-9A-Za-z_]+")
LEFT_AGE_NS = 3600 * 10**9


def _kinds() -> dict[str, type]:
    """The classes a kept structure's skeleton names (imported when a structure is read)."""
    from gedp.postprocess.models import WageVariances
    from gedp.postprocess.structured import DenseFactor, DenseInverse, GroupFactorizations
    from gedp.postprocess.variances import EstablishmentVariances
    from gedp.postprocess.wage_rates import SharedRates
    from gedp.postprocess.wages import WageFit

    return {kind.__name__: kind for kind in (EstablishmentVariances, WageVariances, WageFit, SharedRates,
                                             GroupFactorizations, DenseFactor, DenseInverse)}


def cache_folder() -> Path:
    """Where margin structures are kept: ``$GEDP_CACHE_DIR``, else ``$XDG_CACHE_HOME/gedp``, else
    ``~/.cache/gedp``; their files are under ``margins/``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gedp"


def margins_folder() -> Path:
    """The cache's ``margins/`` folder, the cache folder and it created private (mode 0700) when
    missing (nothing where they cannot be created: nothing is kept then), and refused when either is
    not private (``check_private``)."""
    root = cache_folder()
    for folder in (root, root / "margins"):
        try:
            folder.mkdir(mode=0o700, parents=folder == root, exist_ok=True)
        except OSError:
            pass
        check_private(folder)
    return root / "margins"


def check_private(folder: Path) -> None:
    """Refuse a cache folder owned by another user or writable by its group or others: whoever can
    write it could change every value and margin of error read from it (a missing folder passes)."""
    try:
        status = folder.stat()
    except OSError:
        return
    if status.st_uid != os.geteuid() or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InputError(f"the margin cache '{folder}' is not private: it must be owned by you and not writable by "
                         f"group or others (chmod go-w), since whoever can write it could change every value and "
                         f"margin of error read from it; or set {CACHE_ENV} to a folder of your own")


def release_digest(release: str | Path) -> str:
    """SHA-256 of the release's manifest, measurements and protected microdata (each part's name,
    size and bytes), the gedp version and the structure's format; remembered for files whose
    file-system identity (``_identity``) has not changed since it was computed."""
    release = Path(release)
    key = f"gedp {package_version('gedp')} margins {STRUCTURE_FORMAT}\n"
    parts = _release_parts(release)
    identity = _identity(release, parts)
    remembered = margins_folder() / DIGESTS_FOLDER / hashlib.sha256(
        str(release.resolve()).encode()).hexdigest()
    try:
        known = json.loads(remembered.read_text(encoding="utf-8"))
        if known["identity"] == identity and known["key"] == key:
            return str(known["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = hashlib.sha256(key.encode())
    for part in parts:
        with part.open("rb") as file:
            digest.update(f"{part.relative_to(release).as_posix()} {part.stat().st_size}\n".encode())
            digest.update(hashlib.file_digest(file, "sha256").digest())
    write_kept(remembered, json.dumps({"identity": identity, "key": key, "digest": digest.hexdigest()}), KEPT_DIGESTS)
    return digest.hexdigest()


def _release_parts(release: Path) -> list[Path]:
    """The files a release's digest reads, in order: its manifest, then the parts of its measurements
    and protected microdata its manifest lists (sorted by name; a folder holding anything else is
    refused, ``validation.release_parts``)."""
    from gedp.release.validation import read_manifest, release_parts

    manifest = read_manifest(release)
    return [release / MANIFEST_FILE, *(Path(part) for name in (MEASUREMENTS_FILE, PROTECTED_FILE)
                                       for part in release_parts(release, name, manifest))]


def _identity(release: Path, parts: list[Path]) -> list[list]:
    """Each file's name, device, inode, size, modification and change times (in ns): any write to a
    file, or its replacement, changes its change time or its inode (git's index trusts the same)."""
    found = []
    for part in parts:
        status = part.stat()
        found.append([part.relative_to(release).as_posix(), status.st_dev, status.st_ino, status.st_size,
                      status.st_mtime_ns, status.st_ctime_ns])
    return found


def write_kept(path: Path, text: str, kept: int) -> None:
    """Write ``text`` to ``path`` in the private cache (atomically, mode 0600, never through a link;
    nothing where the cache cannot be written), keeping the ``kept`` most recent files of its folder."""
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        staged = path.with_name(f".partial-{path.name}-{os.getpid()}")
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        staged.replace(path)
        newest = sorted(path.parent.iterdir(), key=lambda entry: entry.lstat().st_mtime_ns, reverse=True)
        for stale in newest[kept:]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass


def kept_path(release: str | Path, quarter: str | None = None) -> Path:
    """The file a release's margin structure (of one ``quarter`` of a panel release) is kept in
    (present or not)."""
    digest = release_digest(release)
    if quarter is not None:  # named by a digest: nothing of the cache's paths comes from a release's content
        digest = hashlib.sha256(f"{digest} quarter {quarter}".encode()).hexdigest()
    return margins_folder() / digest


@contextmanager
def _cache_lock(kind: int) -> Iterator[None]:
    """Hold ``kind`` (``fcntl.LOCK_SH`` or ``LOCK_EX``) on the cache's lock file; nothing where it
    cannot be opened (a cache that cannot be written: nobody prunes it). Waited for with a deadline
    (``gedp.accounting.lock_wait``: a ``LockTimeout`` when a process holding it is hung)."""
    root = margins_folder()
    try:
        handle = open_lock_file(root / LOCK_FILE)
    except OSError:
        yield
        return
    try:
        LockWait(root / LOCK_FILE, "the margin cache's lock", f"if a gedp process using the cache is hung, stop it; "
                 f"or set {CACHE_ENV} to another folder").take(handle, kind)
        yield
    finally:
        os.close(handle)  # releases the lock


def shared_cache() -> AbstractContextManager[None]:
    """The lock a request holds while it opens a kept structure's files (many at once)."""
    return _cache_lock(fcntl.LOCK_SH)


def exclusive_cache() -> AbstractContextManager[None]:
    """The lock held while a structure is put into place or removed (one at a time, no reader)."""
    return _cache_lock(fcntl.LOCK_EX)


def is_complete(path: Path) -> bool:
    """Whether the structure kept at ``path`` was computed from the files its name is the digest of
    (``complete.json``'s ``digest``: a structure of another release copied or renamed to ``path`` is
    not) and holds every file its ``complete.json`` lists, each a regular file of the size listed."""
    check_private(path)
    try:
        listed = json.loads((path / COMPLETE_FILE).read_text(encoding="utf-8"))
        if listed.get("format") != STRUCTURE_FORMAT or listed.get("digest") != path.name:
            return False
        for name, size in listed["files"].items():
            status = (path / name).lstat()
            if not (os.path.basename(name) == name and os.path.isfile(path / name)
                    and not os.path.islink(path / name) and status.st_size == size):
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def seal(folder: Path, digest: str) -> None:
    """Write ``complete.json`` (atomically, last) listing each file of ``folder`` and its size, and the
    ``digest`` of the files it was computed from (``kept_path``'s name for it)."""
    files = {entry.name: entry.stat(follow_symlinks=False).st_size for entry in os.scandir(folder)
             if entry.is_file(follow_symlinks=False) and entry.name != COMPLETE_FILE}
    staged = folder / f".{COMPLETE_FILE}.partial"
    staged.write_text(json.dumps({"format": STRUCTURE_FORMAT, "digest": digest, "files": dict(sorted(files.items()))}),
                      encoding="utf-8")
    staged.replace(folder / COMPLETE_FILE)


def kept_variances(release: str | Path, quarter: str | None = None) -> dict[str, VarianceFunction]:
    """The release's variance functions by attribute of its protected microdata (of one ``quarter`` of a
    panel release; a job family's categories, one state's home counties among them, are not: red team rt24
    F7, a two-state job release's county margins had failed on a category of one state), which
    answer tabulations by public columns from their per-cell pieces (``cellmargins.IndexedVariances``):
    read from the kept structure when there is one for exactly these files, else built from the
    release's files (its protected microdata read and validated here) and kept for the next request
    (nothing is kept where the cache cannot be written)."""
    from gedp.release.reader import check_quarter

    check_quarter(release, quarter)
    path = kept_path(release, quarter)
    kept = _read_kept(path)
    if kept is not None:
        return kept
    from gedp.postprocess.moe import variance_functions
    from gedp.release.reader import read_validated, release_answers, release_wage_psi

    protected = read_validated(release, quarter)
    answers = {attribute: answered for attribute, answered in release_answers(release, protected, quarter).items()
               if attribute in protected.columns}  # a job family's categories: the job frame's own margins
    built = variance_functions(answers, protected, release_wage_psi(release, quarter))
    structure = {attribute: variance.exact if isinstance(variance, IndexedVariances) else variance
                 for attribute, variance in built.items()}
    pieces = {attribute: variance.pieces if isinstance(variance, IndexedVariances) else None
              for attribute, variance in built.items()}
    try:
        write_structure(structure, path, protected, pieces)
    except OSError:
        pass  # a read-only cache: the margins are the same, only not kept
    return built


def _read_kept(path: Path) -> dict[str, VarianceFunction] | None:
    """The variance functions of the complete structure kept at ``path``, its files opened under the
    shared lock (None when there is none, it is incomplete or was removed meanwhile: rebuilt)."""
    with shared_cache():
        if not is_complete(path):
            return None
        kept, pieces = read_structure(path), read_pieces(path)
        try:
            codes = np.load(path / CELL_CODES_FILE, mmap_mode="r", allow_pickle=False)
            os.utime(path)  # most recently used
        except (OSError, ValueError):
            return None
    return None if kept is None or pieces is None else _indexed(kept, pieces, codes)


def _indexed(structure: Mapping[str, VarianceFunction], pieces: Mapping[str, CellPieces | None],
             codes: np.ndarray) -> dict[str, VarianceFunction]:
    """Each variance function, answering from its pieces where it has them (``codes``: each
    establishment's finest cell)."""
    return {attribute: variance if pieces.get(attribute) is None
            else IndexedVariances(pieces[attribute], codes, variance)
            for attribute, variance in structure.items()}


def kept_tabulation(release: str | Path, by: str, *, where: str | None = None, moe: bool = False,
                    level: float = 0.95) -> tuple[list[str], pd.DataFrame] | None:
    """A tabulation of the release by public columns answered from its kept cell index and, with
    ``moe``, its kept margin structure's per-cell pieces (``release.cells.indexed_tabulation``); None
    when nothing for exactly these files is kept, or the request cannot be answered from the index
    (a first request reads the release, with the same pieces: ``kept_variances``)."""
    folder = kept_path(release)
    with shared_cache():
        if not is_complete(folder):
            return None
        if not moe:
            return indexed_tabulation(folder, by, where=where, level=level)
        pieces = read_pieces(folder)
        if pieces is None:
            return None
        if all(kept is not None for kept in pieces.values()):
            return indexed_tabulation(folder, by, margins=pieces, where=where, level=level)
    # some attribute without pieces: all through the variance functions, those with pieces still from them
    margins = kept_variances(release)  # outside the shared lock: it may put a structure into place
    with shared_cache():
        return indexed_tabulation(folder, by, margins=margins, where=where, level=level) if is_complete(folder) \
            else None


def write_structure(structure: Mapping[str, VarianceFunction], path: Path, protected: pd.DataFrame | None = None,
                    pieces: Mapping[str, CellPieces | None] | None = None) -> None:
    """Write a structure (atomically) as a folder of arrays (``.npy``) and their skeleton (JSON), with
    the cell index of the release's ``protected`` microdata when given (``release.cells``) and the
    per-cell ``pieces`` of its variance functions (by attribute; None for one without), then
    remove the least recently used structures beyond ``KEPT_STRUCTURES``."""
    arrays: dict[str, np.ndarray] = {}
    skeleton = {attribute: _encode(value, arrays) for attribute, value in structure.items()}
    margins_folder()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=path.parent, prefix=".partial-"))
    for name, array in arrays.items():
        np.save(staged / f"{name}.npy", array, allow_pickle=False)
    if protected is not None:
        write_cell_index(protected, staged)
    if pieces is not None:
        _write_pieces(pieces, staged)
    (staged / SKELETON_FILE).write_text(json.dumps(skeleton), encoding="utf-8")
    seal(staged, path.name)
    with exclusive_cache():
        _put_in_place(staged, path)
        _prune(path.parent)


def _put_in_place(staged: Path, path: Path) -> None:
    """Rename the complete ``staged`` folder to ``path`` (under the exclusive lock): one kept there
    already and complete is the same structure (``staged`` removed); an incomplete one is replaced."""
    retired = None
    if os.path.lexists(path) and not is_complete(path):
        retired = path.with_name(f".retired-{uuid.uuid4().hex}")
        os.replace(path, retired)  # a broken one (a file deleted, a full disk)
    try:
        staged.rename(path)
    except OSError:  # kept meanwhile by another request: the same structure
        shutil.rmtree(staged, ignore_errors=True)
    if retired is not None:
        _remove(retired)


def _remove(folder: Path) -> None:
    """Remove a folder of the cache: never a symbolic link, never anything outside ``margins/``."""
    root = margins_folder().resolve()
    if folder.is_symlink() or not folder.is_dir() or folder.resolve().parent != root:
        return
    shutil.rmtree(folder, ignore_errors=True)


def _prune(root: Path) -> None:
    """Remove the least recently used structures beyond ``KEPT_STRUCTURES`` (under the exclusive
    lock): only folders named as structures are (``STRUCTURE_NAME``), directly in ``root``."""
    kept, stale = [], []
    now = time.time_ns()
    for entry in os.scandir(root):
        if not entry.is_dir(follow_symlinks=False):
            continue
        written = entry.stat(follow_symlinks=False).st_mtime_ns
        if STRUCTURE_NAME.fullmatch(entry.name) or EARLIER_NAME.fullmatch(entry.name):
            kept.append((written, entry.name))
        elif LEFT_NAME.fullmatch(entry.name) and now - written > LEFT_AGE_NS:
            stale.append(entry.name)
    for name in [*stale, *(name for _, name in sorted(kept, reverse=True)[KEPT_STRUCTURES:])]:
        _remove(root / name)


def _write_pieces(pieces: Mapping[str, CellPieces | None], folder: Path) -> None:
    """Write the per-cell pieces of each attribute (None: it has none) into ``folder``."""
    skeleton: dict[str, dict | None] = {}
    for attribute, kept in pieces.items():
        skeleton[attribute] = None
        if kept is not None:
            skeleton[attribute], arrays = pieces_arrays(kept)
            for name, array in arrays.items():
                np.save(folder / _pieces_file(attribute, name), array, allow_pickle=False)
    (folder / PIECES_FILE).write_text(json.dumps(skeleton), encoding="utf-8")


def _pieces_file(attribute: str, name: str) -> str:
    """The file of an attribute's piece ``name``: named by the digest of the attribute's name (which
    a release's measurements give), so no release content reaches a path."""
    if not re.fullmatch(r"[a-z_]+", name):
        raise ValueError(f"a piece's name ({name!r}) must be lower-case letters")
    return f"{PIECES_PREFIX}{hashlib.sha256(attribute.encode()).hexdigest()[:32]}-{name}.npy"


def read_pieces(path: Path) -> dict[str, CellPieces | None] | None:
    """The per-cell pieces kept in a structure's folder, by attribute (None for one without; None
    when there are none kept, or they cannot be read). Their arrays are mapped from the files, not
    copied (a request reads the factors' rows in blocks)."""
    try:
        skeleton = json.loads((path / PIECES_FILE).read_text(encoding="utf-8"))
        return {attribute: None if kept is None else pieces_from(kept, lambda name, attribute=attribute: np.asarray(
                    np.load(path / _pieces_file(attribute, name), mmap_mode="r", allow_pickle=False)))
                for attribute, kept in skeleton.items()}  # plain arrays over the mapping: no memmap per slice
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_structure(path: Path) -> dict[str, VarianceFunction] | None:
    """A kept structure (None when there is none, or it cannot be read as one). Its arrays are mapped
    from the files, not copied (a request touches each once)."""
    try:
        skeleton = json.loads((path / SKELETON_FILE).read_text(encoding="utf-8"))

        def array(name: str) -> np.ndarray:
            return np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False)

        return {attribute: _decode(value, array) for attribute, value in skeleton.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _encode(value, arrays: dict[str, np.ndarray]):
    """JSON for a structure's value, its arrays put in ``arrays`` under their content's digest (the
    months share their cells: each array is kept once)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"kind": type(value).__name__,
                "fields": {f.name: _encode(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}}
    import scipy.sparse as sp

    if sp.issparse(value):
        value = value.tocsr() if value.format != "csr" else value
        return {"csr": [_encode(part, arrays) for part in (value.data, value.indices, value.indptr)],
                "shape": list(value.shape)}
    if isinstance(value, np.ndarray):
        name = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode() + value.tobytes()).hexdigest()
        arrays[name] = value
        return {"array": name}
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, arrays) for item in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a margin structure cannot keep a {type(value).__name__}")


def _decode(value, array: Callable[[str], np.ndarray]):
    """The inverse of ``_encode``, the arrays read by ``array`` (name -> array)."""
    if not isinstance(value, dict):
        return value
    if "kind" in value:
        return _kinds()[value["kind"]](**{name: _decode(item, array) for name, item in value["fields"].items()})
    if "csr" in value:  # copied: scipy may sort a matrix's indices in place
        import scipy.sparse as sp

        parts = tuple(np.array(_decode(part, array)) for part in value["csr"])
        return sp.csr_matrix(parts, shape=tuple(value["shape"]))
    if "tuple" in value:
        return tuple(_decode(item, array) for item in value["tuple"])
    return array(value["array"])
