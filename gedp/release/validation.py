"""A release read as untrusted input: its manifest's fields that name things (states, quarters, job
families and their columns, files) and count things (establishments), and the exact files of its
Parquet outputs, checked where a release is read.

Releases are files people download: a manifest or a part may have been written by anyone. Every
reader of a release goes through ``checked_manifest`` (``reader.read_manifest``) and reads the parts
``listed_parts`` names, so no later step builds a path, a column name or a count from an unchecked
field, and no reader silently includes a file the manifest does not account for:

* a state is two digits (``^[0-9]{2}$``, ASCII digits), a quarter a label like 2016Q1 (``^[0-9]{4}Q[1-4]$``), each
  listed once; a panel's ``per_quarter`` holds exactly its quarters, each checked as a release of
  one quarter; ``per_state`` holds exactly its states;
* ``establishments`` is a whole number >= 0: the sum of ``per_state``'s;
* ``files`` names gedp's files only; a job family and its worker columns are plain names;
* ``mu_total``, ``mu_planned_total``, ``mu_cap`` and every query's mu (``mu``) are finite numbers in
  [0, MAX_STATED_MU] (``gedp.accounting.mu_limits``, refused in a config at protect time); ``gammas``, ``zeta``
  and ``zeta_per_state`` finite numbers >= 0, each gamma named as an attribute (``ATTRIBUTE_PATTERN``);
  ``psi`` names a neighbor function and only its parameters, each a finite number, within the
  function's own rules; ``psi`` and ``gammas`` are present, and each quarter of a panel states its own, checked alike;
* ``tau`` maps exactly the states to a finite number >= 0 or null (as each ``per_state``'s tau),
  and each ``per_state`` section states its state's tau and ``zeta_per_state`` as its tau and zeta
  (present, equal: a null or missing one is refused, as the audit fails it);
  ``gedp_version`` a package version (``VERSION_PATTERN``); ``created_date`` is a calendar date
  YYYY-MM-DD; ``integer`` true or false; ``variance_mode`` a
  release's (``VARIANCE_MODES``); ``rng.kind`` a generator gedp names and ``rng.seed`` a whole
  number >= 0 (each where present; each quarter's of a panel alike);
* a panel states no job frame (``jobs``, nor a quarter's; its ``files`` no ``protected_jobs.parquet``):
  gedp protects a job table with a release of one quarter only;
* ``manifest.json`` is a regular file, not a symbolic link;
* a Parquet output (``protected.parquet``, ``measurements.parquet``, ``protected_jobs.parquet``) is
  a folder holding exactly one regular file per state (``part-<state>.parquet``) or per quarter and
  state (``part-<quarter>-<state>.parquet``) that the manifest lists: no other entry, no symbolic link
  (neither the folder nor a part), each a Parquet file by its first and last bytes (``PARQUET_MAGIC``)
  whose footer states sizes its file can hold (``part_sizes.check_footer``: its rows, the protected
  microdata's those the manifest states, its pages' uncompressed size and its rows' width), and whose
  page headers state no more than its footer (``page_headers``).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gedp.errors import InputError
from gedp.json_objects import REPEATED_KEY, unique_pairs
from gedp.release.format import JOBS_FILE, MANIFEST_FILE, MEASUREMENTS_FILE, PROTECTED_FILE, QUARTER_KEY, RELEASE_FILES
from gedp.release.part_sizes import check_parts, expected_rows
from gedp.release.spending import panel_spending_failures, refuse_plan, spending_failures

if TYPE_CHECKING:
    from gedp.release.manifest import Manifest

#: A state: its two-digit FIPS code.
STATE_PATTERN = re.compile(r"[0-9]{2}")
#: A quarter of a panel release: year and quarter, e.g. 2016Q1.
QUARTER_PATTERN = re.compile(r"[0-9]{4}Q[1-4]")
#: A job family or a worker column: a plain name.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: An attribute of a release's answers: a plain name, or a job family's category ("worker[1,E1]").
ATTRIBUTE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(\[[^\[\]/\\\x00-\x1f]{1,64}\])?")
#: The largest manifest.json read: a state's is about 20 KB, a panel's holds each quarter's whole.
MAX_MANIFEST_BYTES = 64 << 20
#: The most quarters a panel release may hold (100 years; each quarter's parts and manifest section
#: are read and checked wherever the release is opened).
MAX_QUARTERS = 400
#: The Parquet outputs of a release, each a folder of parts.
PART_OUTPUTS = (PROTECTED_FILE, MEASUREMENTS_FILE, JOBS_FILE)


def _refuse(release: str | Path, rule: str) -> InputError:
    return InputError(f"'{release}' is not a readable gedp release: {MANIFEST_FILE} {rule}")


def _shown(value: object) -> str:
    from gedp.synth.schema import shown  # the schema's cut repr: no message grows with a hostile value

    return shown(value)


def _labels(release: str | Path, values: object, field: str, pattern: re.Pattern) -> list[str]:
    """A non-empty list of distinct strings each matching ``pattern`` in full."""
    if not isinstance(values, list) or not values:
        raise _refuse(release, f"'{field}' must be a non-empty list")
    for value in values:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise _refuse(release, f"'{field}' holds {_shown(value)}, which is not of the form {pattern.pattern}")
    if len(set(values)) != len(values):
        raise _refuse(release, f"'{field}' lists a value twice")
    return values


def _count(release: str | Path, value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(release, f"'{field}' ({_shown(value)}) must be a whole number >= 0")
    return value


def _check_jobs(release: str | Path, jobs: object) -> None:
    """A job section's families and worker columns are plain names."""
    families = jobs.get("families") if isinstance(jobs, dict) else None
    if not isinstance(families, dict):
        raise _refuse(release, "'jobs' must hold its 'families'")
    for family, spec in families.items():
        columns = spec.get("columns") if isinstance(spec, dict) else None
        if not NAME_PATTERN.fullmatch(family) or not isinstance(columns, list) or not all(
                isinstance(column, str) and NAME_PATTERN.fullmatch(column) for column in columns):
            raise _refuse(release, f"job family {_shown(family)}: its name and worker columns must be plain names")


def _check_publishable(release: str | Path, manifest: Mapping, where: str) -> None:
    """'publishable' a boolean, and true only where the noise came from the secure generator (its 'rng'
    says so): a reader must never present a replayable release as publishable."""
    publishable = manifest.get("publishable", False)
    if not isinstance(publishable, bool):
        raise _refuse(release, f"'{where}publishable' ({_shown(publishable)}) must be true or false")
    rng = manifest.get("rng")
    if publishable and rng is not None and not (isinstance(rng, dict) and rng.get("kind") == "secure"):
        raise _refuse(release, f"'{where}publishable' is true but its noise is not the secure generator's "
                               f"('{where}rng.kind' {_shown(rng.get('kind') if isinstance(rng, dict) else rng)})")


def _check_quarter_release(release: str | Path, manifest: Mapping, where: str) -> None:
    """The fields of a release of one quarter (the release itself, or a quarter of a panel)."""
    _check_publishable(release, manifest, where)
    states = _labels(release, manifest.get("states"), f"{where}states", STATE_PATTERN)
    establishments = _count(release, manifest.get("establishments"), f"{where}establishments")
    if "tau" in manifest:
        taus = manifest["tau"]
        if not isinstance(taus, dict) or sorted(taus) != sorted(states):
            raise _refuse(release, f"'{where}tau' must map exactly the states {', '.join(states)} to their tau")
        for state, tau in taus.items():
            _tau(release, tau, f"{where}tau.{state}")
    per_state = manifest.get("per_state")
    if per_state is None:
        return
    if not isinstance(per_state, dict) or sorted(per_state) != sorted(states):
        raise _refuse(release, f"'{where}per_state' must hold exactly the states {', '.join(states)}")
    taus = manifest.get("tau") if isinstance(manifest.get("tau"), dict) else {}
    for state, section in per_state.items():
        if isinstance(section, dict) and "tau" in section:
            _tau(release, section["tau"], f"{where}per_state.{state}.tau")
        if not isinstance(section, dict) or any(
                key not in section or section[key] != value
                for key, value in (("tau", taus.get(state)), ("zeta", manifest.get("zeta_per_state")))):
            raise _refuse(release, f"'{where}per_state.{state}' must state the release's tau.{state} and "
                                   f"zeta_per_state as its tau and zeta")
    counts = [_count(release, section.get("establishments") if isinstance(section, dict) else None,
                     f"{where}per_state.{state}.establishments") for state, section in per_state.items()]
    if sum(counts) != establishments:
        raise _refuse(release, f"'{where}establishments' ({establishments}) is not the sum of its states' "
                               f"({sum(counts)})")


def _number(release: str | Path, value: object, field: str, high: float = math.inf) -> float:
    """A finite number in [0, high] (not a boolean)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= high):
        limit = f"<= {high:g}" if math.isfinite(high) else "finite"
        raise _refuse(release, f"'{field}' ({_shown(value)}) must be a number >= 0 and {limit}")
    return float(value)


def _tau(release: str | Path, value: object, field: str) -> None:
    """A state's tau: a finite number >= 0 (pnc: Phi^-1 of a probability >= 1/2, as zeta <= 1/2), or None (psi)."""
    if value is not None:
        _number(release, value, field)


#: The variances a release's postprocessing may use (``postprocess.wls.RELEASE_VARIANCE_MODES``, as
#: a config may choose them), kept here so that reading a manifest imports no postprocessing; tests
#: check it against the postprocessing's own.
VARIANCE_MODES = ("smoothed", "pooled", "estimated")
#: The generators a manifest's ``rng.kind`` may name (``measure.rng.make_rng``'s descriptions).
RNG_KINDS = ("secure", "seed", "os-entropy")
#: The gedp that wrote a release (``gedp_version``): a package version as Python writes one (PEP 440,
#: e.g. 0.1.0 or 1.2.dev3+g1a2b3c): the one text of a manifest shown on a page or sheet, so no control
#: character, markup or formula reaches it (a spreadsheet writer refuses control characters).
VERSION_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}")
#: The day a release was created (``created_date``): an ISO date, e.g. 2016-05-01.
DATE_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _is_date(value: object) -> bool:
    import datetime as dt

    if not isinstance(value, str) or not DATE_PATTERN.fullmatch(value):
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _check_run(release: str | Path, content: Mapping, where: str = "") -> None:
    """How the release was computed (of a quarter of a panel: ``where``), each where present:
    ``created_date`` a calendar date YYYY-MM-DD, ``integer`` true or false, ``variance_mode`` one of
    ``VARIANCE_MODES``, ``rng`` a generator of ``RNG_KINDS`` whose seed is a whole number >= 0 and
    whose descriptions are text; ``gedp_version`` a version (``VERSION_PATTERN``)."""
    version = content.get("gedp_version")
    if "gedp_version" in content and not (isinstance(version, str) and VERSION_PATTERN.fullmatch(version)):
        raise _refuse(release, f"'{where}gedp_version' ({_shown(version)}) must be a version such as 0.1.0")
    if "created_date" in content and not _is_date(content["created_date"]):
        raise _refuse(release, f"'{where}created_date' ({_shown(content['created_date'])}) must be a date "
                               "YYYY-MM-DD")
    if "integer" in content and not isinstance(content["integer"], bool):
        raise _refuse(release, f"'{where}integer' ({_shown(content['integer'])}) must be true or false")
    mode = content.get("variance_mode")
    if "variance_mode" in content and not (isinstance(mode, str) and mode in VARIANCE_MODES):
        raise _refuse(release, f"'{where}variance_mode' ({_shown(mode)}) must be one of {', '.join(VARIANCE_MODES)}")
    if "rng" not in content:
        return
    rng = content["rng"]
    kind = rng.get("kind") if isinstance(rng, dict) else None
    if not (isinstance(kind, str) and kind in RNG_KINDS):
        raise _refuse(release, f"'{where}rng' must name a generator: one of {', '.join(RNG_KINDS)}")
    seed = rng.get("seed")
    if "seed" in rng and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise _refuse(release, f"'{where}rng.seed' ({_shown(seed)}) must be a whole number >= 0")
    for key in ("bit_generator", "per_state"):
        if key in rng and not isinstance(rng[key], str):
            raise _refuse(release, f"'{where}rng.{key}' ({_shown(rng[key])}) must be text")


def _numbers(release: str | Path, values: object, field: str, high: float = math.inf, depth: int = 2) -> None:
    """A mapping of names to numbers (``_number``), nested mappings (per query, per attribute) allowed
    ``depth`` levels down (a deeper nesting would recurse as deep as the file nests)."""
    if not isinstance(values, dict):
        raise _refuse(release, f"'{field}' must map names to numbers")
    for name, value in values.items():
        if isinstance(value, dict) and depth > 0:
            _numbers(release, value, f"{field}.{name}", high, depth - 1)
        else:
            _number(release, value, f"{field}.{name}", high)


#: Each neighbor function's parameters with their rules, (whether 0 is allowed, largest value)
#: (``measure.neighbors``: a in [0, 1e13], d in (0, 1e13], gamma_sqrt > 0), kept here so that reading
#: a manifest imports no mathematics (a further request answers from the kept cells alone); tests
#: check it against the neighbor functions themselves.
PSI_PARAMETERS = {"sqrt": {"a": (True, 1e13)}, "log": {"a": (True, 1e13)}, "linear": {"d": (False, 1e13)},
                  "sqrt-linear": {"gamma_sqrt": (False, math.inf), "d": (False, 1e13)}}


def _check_psi(release: str | Path, psi: object) -> None:
    """``psi`` names a neighbor function and only its parameters, each a finite number within its rules."""
    if not isinstance(psi, dict) or psi.get("name") not in PSI_PARAMETERS:
        raise _refuse(release, f"'psi' must name one of {', '.join(PSI_PARAMETERS)}")
    allowed = PSI_PARAMETERS[psi["name"]]
    for key, value in psi.items():
        if key == "name":
            continue
        if key not in allowed:
            raise _refuse(release, f"'psi' holds {_shown(key)}, which is not a parameter of psi {psi['name']}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _refuse(release, f"'psi.{key}' ({_shown(value)}) must be a finite number")
        zero_allowed, largest = allowed[key]
        if not (0 <= value <= largest and (value > 0 or zero_allowed)):
            raise _refuse(release, f"'psi' is not a valid psi {psi['name']} (its parameters break its rules)")


#: The attribute models of the postprocessing (``postprocess.models``: each model's ``name``), as a
#: manifest's solver section records them (``solver.<attribute>.model``; several states' joined by commas),
#: kept here so that reading a manifest imports no model; tests check it against the models themselves.
MODELS = ("plain", "months", "wage prior")
#: The fields of a solve a manifest records (``postprocess.wls.combined_report``) and their types;
#: ``model`` may be absent only in a release of an earlier gedp (``reader.wage_model`` refuses its margins).
SOLVE_FIELDS = {"solver": (str,), "status": (str,), "kkt_residual": (int, float), "iterations": (int,)}


def _check_solver(release: str | Path, content: Mapping, where: str) -> None:
    """``solver`` maps each attribute to its solve: a known ``model`` (``MODELS``) and fields of their types
    (``SOLVE_FIELDS``), every establishment attribute the release measured (``mu``) among them: the wage
    model chooses how wages' margins of error are computed."""
    from gedp.synth.columns import CONFIDENTIAL

    solver = content.get("solver")
    if not isinstance(solver, dict):
        raise _refuse(release, f"'{where}solver' must map each attribute to its solve")
    measured = {attribute for by in content.get("mu", {}).values() if isinstance(by, dict) for attribute in by}
    lacking = [attribute for attribute in CONFIDENTIAL if attribute in measured and attribute not in solver]
    if lacking:
        raise _refuse(release, f"'{where}solver' lacks {lacking[0]}, which the release measured")
    for attribute, solve in solver.items():
        def field(attribute: object = attribute) -> str:  # shown only in a refusal: the schema loads pandas
            return f"'{where}solver' of {_shown(attribute)}"

        if not isinstance(solve, dict):
            raise _refuse(release, f"{field()} ({_shown(solve)}) must state its solve")
        model = solve.get("model", "plain")
        if not (isinstance(model, str) and all(name in MODELS for name in model.split(","))):
            raise _refuse(release, f"{field()}: model {_shown(model)} is not one of {', '.join(MODELS)}")
        for key, types in SOLVE_FIELDS.items():
            value = solve.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
                raise _refuse(release, f"{field()}: {key} {_shown(value)} must be "
                                       f"{'text' if types == (str,) else 'a number'}")


#: The fields every release (and each quarter of a panel) states, which its readers compute with.
BUDGET_FIELDS = ("psi", "gammas")


def _check_budget(release: str | Path, content: Mapping, where: str = "") -> None:
    """The numbers a reader computes with or states (of a quarter of a panel: ``where``): mu (finite,
    within MAX_STATED_MU), gammas, zeta, psi; psi and gammas present (``BUDGET_FIELDS``)."""
    from gedp.accounting.mu_limits import MAX_STATED_MU

    missing = [field for field in BUDGET_FIELDS if field not in content]
    if missing:
        raise _refuse(release, f"lacks '{where}{missing[0]}'")
    for field in ("mu_total", "mu_planned_total", "mu_cap"):
        if field in content and (field == "mu_total" or content[field] is not None):
            _number(release, content[field], f"{where}{field}", MAX_STATED_MU)
    if "mu" in content:
        _numbers(release, content["mu"], f"{where}mu", MAX_STATED_MU)
    _numbers(release, content["gammas"], f"{where}gammas")
    names = [name for name in content["gammas"] if not ATTRIBUTE_PATTERN.fullmatch(name)]
    if names:  # a workbook's notes sheet shows each gamma's name (rt27: ESC in one ended it in a traceback)
        raise _refuse(release, f"'{where}gammas' names {_shown(names[0])}, which is not an attribute's name")
    for field in ("zeta", "zeta_per_state"):
        if content.get(field) is not None:
            _number(release, content[field], f"{where}{field}")
    _check_psi(release, content["psi"])
    _check_solver(release, content, where)


def _check_spending(release: str | Path, failures: list[str]) -> None:
    if failures:
        raise refuse_plan(release, failures[0])


def checked_manifest(content: object, release: str | Path) -> dict:
    """``content`` (a parsed manifest.json of ``release``) once every field that names or counts
    something is checked (see the module); InputError naming the field and the rule otherwise."""
    from gedp.release.format import MANIFEST_KEYS

    if not isinstance(content, dict) or not MANIFEST_KEYS <= content.keys():
        raise InputError(f"'{release}' is not a gedp release ({MANIFEST_FILE} lacks gedp's keys)")
    files = content["files"]
    if not isinstance(files, dict) or not all(isinstance(name, str) and name in RELEASE_FILES | {QUARTER_KEY}
                                               for name in files.values()):
        raise _refuse(release, "'files' must name gedp's files only")
    if "jobs" in content:
        _check_jobs(release, content["jobs"])
    _check_budget(release, content)
    _check_run(release, content)
    if "quarters" not in content:
        _check_quarter_release(release, content, "")
        _check_spending(release, spending_failures(release, content))
        return content
    _check_publishable(release, content, "")
    jobs = [""] if "jobs" in content or JOBS_FILE in files.values() else []
    jobs += [f"per_quarter.{quarter}." for quarter, section in (content.get("per_quarter") or {}).items()
             if isinstance(section, dict) and "jobs" in section]
    if jobs:  # gedp protect refuses a job table with a panel (``gedp.api.protect``): no genuine panel holds one
        raise _refuse(release, f"'{jobs[0]}jobs' states a job frame, which no panel release holds (gedp protects a "
                               "job table with a release of one quarter)")
    quarters = _labels(release, content["quarters"], "quarters", QUARTER_PATTERN)
    if len(quarters) > MAX_QUARTERS:
        raise _refuse(release, f"'quarters' lists {len(quarters):,} quarters, more than {MAX_QUARTERS} (100 years)")
    _labels(release, content.get("states"), "states", STATE_PATTERN)
    _count(release, content.get("establishments"), "establishments")
    per_quarter = content.get("per_quarter")
    if not isinstance(per_quarter, dict) or list(per_quarter) != quarters:
        raise _refuse(release, "'per_quarter' must hold exactly the quarters, in their order")
    for quarter, section in per_quarter.items():
        if not isinstance(section, dict) or "quarters" in section:
            raise _refuse(release, f"'per_quarter.{quarter}' must be the manifest of one quarter")
        _check_quarter_release(release, section, f"per_quarter.{quarter}.")
        if section.get("publishable", False) is not content.get("publishable", False):
            raise _refuse(release, f"'per_quarter.{quarter}.publishable' is not the panel's (each quarter is "
                                   "published as the panel is)")
        _check_budget(release, section, f"per_quarter.{quarter}.")  # a quarter's readers compute with its own
        _check_run(release, section, f"per_quarter.{quarter}.")
        _check_spending(release, spending_failures(release, section, f"per_quarter.{quarter}."))
    _check_spending(release, panel_spending_failures(content))
    return content


def part_names(manifest: Mapping) -> list[str]:
    """The parts each Parquet output of a release holds, in name order: one per state
    (``part-<state>.parquet``), or per quarter and state of a panel (``part-<quarter>-<state>.parquet``)."""
    if "quarters" in manifest:
        labels = [f"{quarter}-{state}" for quarter in manifest["quarters"]
                  for state in manifest["per_quarter"][quarter]["states"]]
    else:
        labels = list(manifest["states"])
    return sorted(f"part-{label}.parquet" for label in labels)


def listed_parts(release: str | Path, output: str, manifest: Mapping) -> list[str]:
    """The files of ``output`` (one of ``PART_OUTPUTS``) of ``release`` that its ``manifest`` lists
    (``part_names``), in name order, after checking that the folder holds exactly them, each a
    regular file; InputError naming the first missing or unlisted entry otherwise."""
    folder = Path(release) / output
    expected = part_names(manifest)
    if folder.is_symlink():
        raise InputError(f"release '{release}': {output} is a symbolic link; a release holds its own folders")
    try:
        entries = {entry.name: entry for entry in os.scandir(folder)}
    except NotADirectoryError:
        raise InputError(f"release '{release}': {output} is not a folder of parts") from None
    except OSError:
        raise InputError(f"release '{release}' has no {output} (its manifest lists "
                         f"{len(expected)} part{'s' if len(expected) != 1 else ''})") from None
    unlisted = sorted(set(entries) - set(expected))
    if unlisted:
        raise InputError(f"release '{release}': {output} holds {_shown(unlisted[0])}, which its manifest does "
                         "not list; a release holds only the parts gedp wrote (check where this copy came from)")
    for name in expected:
        if name not in entries:
            raise InputError(f"release '{release}': {output} lacks {name}, which its manifest lists")
        if not entries[name].is_file(follow_symlinks=False):
            raise InputError(f"release '{release}': {output}/{name} is not a regular file")
        if not _is_parquet(folder / name):
            raise InputError(f"release '{release}': {output}/{name} is not a Parquet file (an edited or damaged copy)")
    parts = [str(folder / name) for name in expected]
    check_parts(release, output, parts, [expected_rows(manifest, output, name) for name in expected])
    return parts


#: The bytes a Parquet file starts and ends with.
PARQUET_MAGIC = b"PAR1"


def _is_parquet(path: Path) -> bool:
    """Whether ``path`` starts and ends with Parquet's magic bytes (around a footer length)."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(PARQUET_MAGIC))
            file.seek(0, os.SEEK_END)
            if file.tell() < 3 * len(PARQUET_MAGIC):
                return False
            file.seek(-len(PARQUET_MAGIC), os.SEEK_END)
            return head == PARQUET_MAGIC and file.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


def read_manifest(release: str | Path) -> Manifest:
    """The manifest of a release directory, checked to be gedp's and every field that names or counts
    something checked as untrusted input (this module)."""
    return checked_manifest(manifest_json(release), release)  # type: ignore[return-value]


def manifest_json(release: str | Path) -> object:
    """The JSON value of a release's manifest.json, read in bounded time and memory (a regular file,
    not a link nor a FIFO, of at most MAX_MANIFEST_BYTES, nested no deeper than json's recursion
    allows), its fields unchecked (``read_manifest`` checks them); InputError otherwise."""
    path = Path(release) / MANIFEST_FILE
    if path.is_symlink():
        raise InputError(f"'{release}' is not a readable gedp release: {MANIFEST_FILE} is a symbolic link")
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):  # a FIFO would block the read without end
            raise _refuse(release, "is not a regular file")
        if status.st_size > MAX_MANIFEST_BYTES:
            raise _refuse(release, f"holds {status.st_size:,} bytes, more than {MAX_MANIFEST_BYTES:,}")
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_pairs)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: nesting too deep
        if isinstance(err, InputError):
            raise
        if str(err) == REPEATED_KEY:  # each reader must see the values every other reader sees
            raise _refuse(release, "holds a key twice in one object (an edited copy)") from None
        raise InputError(f"'{release}' is not a gedp release (no readable {MANIFEST_FILE})") from None


def release_parts(release: str | Path, output: str = PROTECTED_FILE, manifest: Mapping | None = None) -> list[str]:
    """The parts of one Parquet output of a release (protected microdata, measurements, job frame)
    that its manifest lists, checked to be exactly what the folder holds (``listed_parts``):
    what every reader of the release reads, never a file the manifest does not account for."""
    return listed_parts(release, output, read_manifest(release) if manifest is None else manifest)
