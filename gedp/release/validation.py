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
  and ``zeta_per_state`` finite numbers >= 0; ``psi`` names a neighbor function and only its
  parameters, each a finite number, within the function's own rules;
* ``manifest.json`` is a regular file, not a symbolic link;
* a Parquet output (``protected.parquet``, ``measurements.parquet``, ``protected_jobs.parquet``) is
  a folder holding exactly one regular file per state (``part-<state>.parquet``) or per quarter and
  state (``part-<quarter>-<state>.parquet``) that the manifest lists: no other entry, no symbolic link
  (neither the folder nor a part).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gedp.errors import InputError
from gedp.release.format import JOBS_FILE, MANIFEST_FILE, MEASUREMENTS_FILE, PROTECTED_FILE, QUARTER_KEY, RELEASE_FILES

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


def _check_quarter_release(release: str | Path, manifest: Mapping, where: str) -> None:
    """The fields of a release of one quarter (the release itself, or a quarter of a panel)."""
    states = _labels(release, manifest.get("states"), f"{where}states", STATE_PATTERN)
    establishments = _count(release, manifest.get("establishments"), f"{where}establishments")
    per_state = manifest.get("per_state")
    if per_state is None:
        return
    if not isinstance(per_state, dict) or sorted(per_state) != sorted(states):
        raise _refuse(release, f"'{where}per_state' must hold exactly the states {', '.join(states)}")
    counts = [_count(release, section.get("establishments") if isinstance(section, dict) else None,
                     f"{where}per_state.{state}.establishments") for state, section in per_state.items()]
    if sum(counts) != establishments:
        raise _refuse(release, f"'{where}establishments' ({establishments}) is not the sum of its states' "
                               f"({sum(counts)})")


def _number(release: str | Path, value: object, field: str, high: float = math.inf) -> float:
    """A finite number in [0, high] (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
        limit = f"<= {high:g}" if math.isfinite(high) else "finite"
        raise _refuse(release, f"'{field}' ({_shown(value)}) must be a number >= 0 and {limit}")
    return float(value)


def _numbers(release: str | Path, values: object, field: str, high: float = math.inf) -> None:
    """A mapping of names to numbers (``_number``), nested mappings (per query, per attribute) allowed."""
    if not isinstance(values, dict):
        raise _refuse(release, f"'{field}' must map names to numbers")
    for name, value in values.items():
        if isinstance(value, dict):
            _numbers(release, value, f"{field}.{name}", high)
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


def _check_budget(release: str | Path, content: Mapping) -> None:
    """The numbers a reader computes with or states: mu (finite, within MAX_STATED_MU), gammas, zeta, psi."""
    from gedp.accounting.mu_limits import MAX_STATED_MU

    for field in ("mu_total", "mu_planned_total", "mu_cap"):
        if field in content and (field == "mu_total" or content[field] is not None):
            _number(release, content[field], field, MAX_STATED_MU)
    if "mu" in content:
        _numbers(release, content["mu"], "mu", MAX_STATED_MU)
    if "gammas" in content:
        _numbers(release, content["gammas"], "gammas")
    for field in ("zeta", "zeta_per_state"):
        if content.get(field) is not None:
            _number(release, content[field], field)
    if "psi" in content:
        _check_psi(release, content["psi"])


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
    if "quarters" not in content:
        _check_quarter_release(release, content, "")
        return content
    quarters = _labels(release, content["quarters"], "quarters", QUARTER_PATTERN)
    _labels(release, content.get("states"), "states", STATE_PATTERN)
    _count(release, content.get("establishments"), "establishments")
    per_quarter = content.get("per_quarter")
    if not isinstance(per_quarter, dict) or list(per_quarter) != quarters:
        raise _refuse(release, "'per_quarter' must hold exactly the quarters, in their order")
    for quarter, section in per_quarter.items():
        if not isinstance(section, dict) or "quarters" in section:
            raise _refuse(release, f"'per_quarter.{quarter}' must be the manifest of one quarter")
        _check_quarter_release(release, section, f"per_quarter.{quarter}.")
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
    return [str(folder / name) for name in expected]


def read_manifest(release: str | Path) -> Manifest:
    """The manifest of a release directory, checked to be gedp's and every field that names or counts
    something checked as untrusted input (this module)."""
    path = Path(release) / MANIFEST_FILE
    if path.is_symlink():
        raise InputError(f"'{release}' is not a readable gedp release: {MANIFEST_FILE} is a symbolic link")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise InputError(f"'{release}' is not a gedp release (no readable {MANIFEST_FILE})") from None
    return checked_manifest(content, release)  # type: ignore[return-value]


def release_parts(release: str | Path, output: str = PROTECTED_FILE, manifest: Mapping | None = None) -> list[str]:
    """The parts of one Parquet output of a release (protected microdata, measurements, job frame)
    that its manifest lists, checked to be exactly what the folder holds (``listed_parts``):
    what every reader of the release reads, never a file the manifest does not account for."""
    return listed_parts(release, output, read_manifest(release) if manifest is None else manifest)


# --- the noisy answers (measurements.parquet) -------------------------------------------------
#: The numbers of a noisy answer that readers compute with.
ANSWER_NUMBERS = ("released", "estimate", "variance", "sd", "mu", "grid")
#: The columns of measurements that describe an answer rather than key it.
ANSWER_FIELDS = frozenset({"query", "attribute", "mechanism", "variance_kind", *ANSWER_NUMBERS})
#: A mechanism releases noise of sd below 2^55 grid steps only: ``measure.grid.check_grid_range``
#: refuses at protect time any query whose draws (up to 64 sd) could leave 2^61 grid steps.
MAX_SD_STEPS = 2.0**55
#: Relative tolerance of a recomputed estimate or variance (the release computed them the same way).
ANSWER_RTOL = 1e-9


#: The columns of measurements that name an answer, each text.
ANSWER_TEXT = ("query", "attribute", "mechanism", "variance_kind")
#: The longest key (an establishment's id, a group's label) a release's measurements may hold: gedp's
#: keys are FIPS codes, NAICS codes, size classes and establishment ids of a few characters; a longer one
#: is an edited copy (a 60 KB key repeated on every row decompresses to gigabytes).
MAX_KEY_CHARS = 64


def _refuse_answers(release: str | Path, rule: str) -> InputError:
    return InputError(f"release '{release}': {MEASUREMENTS_FILE} {rule} (an edited or damaged copy)")


def _where(release: str | Path, frame, bad, rule: str) -> None:
    """Refuse when any row is ``bad``: the first such answer named (its query and attribute)."""
    import numpy as np

    if bad.any():
        row = frame.iloc[int(np.argmax(bad))]
        answer = f"query {_shown(row.get('query'))} on {_shown(row.get('attribute'))}"
        raise _refuse_answers(release, f"hold {int(bad.sum()):,} row(s) whose {rule} ({answer} first)")


def _numbers_of(release: str | Path, frame) -> dict:
    """Each number column as float64 (present and numeric: ``measurement_columns`` checked the parts'
    schemas), refused unless every value is finite."""
    import numpy as np

    numbers = {}
    for column in ANSWER_NUMBERS:
        values = frame[column].to_numpy(dtype=np.float64)
        _where(release, frame, ~np.isfinite(values), f"{column} is not a finite number")
        numbers[column] = values
    return numbers


def _is_text(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_number(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def measurement_columns(release: str | Path, parts: list[str], quarter: str | None = None) -> list[str]:
    """The columns of a release's measurement ``parts`` that a reader reads, after checking each part's
    schema (its footer only): every column of ``ANSWER_TEXT`` (and the quarter key of a panel) held as
    text, every column of ``ANSWER_NUMBERS`` as numbers, every other column (a key) as text; the keys
    read are those some query groups by (and ``estab_id``), any other column left unread."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    required = {**dict.fromkeys(ANSWER_TEXT, "text"), **dict.fromkeys(ANSWER_NUMBERS, "numbers")}
    if quarter is not None:
        required[QUARTER_KEY] = "text"
    first: list[str] = []
    for part in parts:
        schema = pq.read_schema(part)
        first = first or schema.names  # what a read of the parts reads: the first part's columns
        for column, kind in required.items():
            if column not in schema.names:
                raise _refuse_answers(release, f"lack the column {column} ({Path(part).name})")
            if not (_is_number if kind == "numbers" else _is_text)(schema.field(column).type):
                raise _refuse_answers(release, f"hold the column {column} as {schema.field(column).type}, not as "
                                               f"{kind} ({Path(part).name})")
        for field in schema:
            if field.name not in required and not _is_text(field.type):
                raise _refuse_answers(release, f"hold a key column {_shown(field.name)} as {field.type}, not as "
                                               f"text ({Path(part).name})")
    queries = pq.ParquetDataset(parts).read(columns=["query"]).column("query")
    queries = set(queries.cast(pa.large_string()).unique().to_pylist())
    named = {column for name in queries if isinstance(name, str) and name not in ("identity", "total")
             for column in name.split(",")} | ({"estab_id"} if "identity" in queries else set())
    return [name for name in first if name in required or name in named]  # in the order gedp wrote them


def _check_key_lengths(release: str | Path, frame) -> None:
    """Every key at most MAX_KEY_CHARS characters long."""
    import pandas as pd

    for column in frame.columns:
        if column not in ANSWER_FIELDS and column != QUARTER_KEY:
            keys = frame[column]
            longest = (keys if isinstance(keys.dtype, pd.StringDtype) else keys.astype("string")).str.len().max()
            if longest == longest and longest > MAX_KEY_CHARS:  # NaN when every key is null
                raise _refuse_answers(release, f"hold a key of {_shown(column)} longer than {MAX_KEY_CHARS} "
                                               "characters (gedp's keys are codes and ids of a few characters)")


def checked_attribute(release: str | Path, attribute: object) -> str:
    """An attribute named by a release's measurements: a plain name, or a job family's category
    (``worker[1,E1]``)."""
    if not isinstance(attribute, str) or not ATTRIBUTE_PATTERN.fullmatch(attribute):
        raise InputError(f"release '{release}': the measurements name an attribute {_shown(attribute)}, which is "
                         "not an attribute's name (an edited or damaged copy)")
    return attribute


def _check_grids(release: str | Path, frame, numbers: dict, psi_rows, psi_grids) -> None:
    """Every grid step the mechanism's own (pnc: VALUE_GRID; psi: ``psi_grids``, that of the row's
    attribute's gamma), and every released value a multiple of it within the grid's range."""
    import numpy as np

    from gedp.measure.grid import MAX_GRID_UNITS, VALUE_GRID

    grid = numbers["grid"]
    expected = np.where(psi_rows, psi_grids, VALUE_GRID)
    _where(release, frame, grid != expected, "grid is not the step its mechanism and gamma release on")
    if "released" in numbers:
        units = numbers["released"] / grid
        _where(release, frame, (units != np.rint(units)) | (np.abs(units) >= MAX_GRID_UNITS),
               "released value is not a multiple of its grid step within the grid's range")


def _check_noise(release: str | Path, frame, numbers: dict, psi_rows, gamma) -> None:
    """sd and mu: mu in (0, MAX_STATED_MU]; sd at least the grid's rounding (grid / sqrt(12); pnc: or
    0, a group whose clip level is 0) and below MAX_SD_STEPS grid steps; a psi answer's sd times its
    mu at least its ``gamma`` (the noise the mechanism adds is its sensitivity over mu)."""
    from gedp.accounting.mu_limits import MAX_STATED_MU

    if "mu" in numbers:
        mu = numbers["mu"]  # pnc's is 0 when every group's clip level is 0 (no noise, nothing spent)
        _where(release, frame, ~(((mu > 0) | (~psi_rows & (mu == 0))) & (mu <= MAX_STATED_MU)),
               f"mu is not in (0, {MAX_STATED_MU:g}]")
    if "sd" not in numbers:
        return
    sd = numbers["sd"]
    grid = numbers.get("grid")
    rounding = 0.0 if grid is None else grid / math.sqrt(12) * (1 - ANSWER_RTOL)
    top = math.inf if grid is None else MAX_SD_STEPS * grid
    low = ((sd >= rounding) & (sd > 0)) | (~psi_rows & (sd == 0))
    _where(release, frame, ~(low & (sd < top)),
           "sd is not between the grid's rounding (grid / sqrt(12)) and 2^55 grid steps")
    if "released" in numbers:  # no noise: the group's clip level, hence its released value, is 0
        _where(release, frame, ~psi_rows & (sd == 0) & (numbers["released"] != 0),
               "pnc sd is 0 (no noise) but the released value is not 0")
    if "mu" in numbers:
        _where(release, frame, psi_rows & (sd * numbers["mu"] < gamma * (1 - ANSWER_RTOL)),
               "sd is below the psi mechanism's gamma / mu")


def _check_psi_sd(release: str | Path, frame, numbers: dict, psi_rows, gamma, manifest: Mapping) -> None:
    """A psi answer's sd at most the one its mechanism draws (``measure.mechanisms.psi_mechanism``):
    the rounded noise sd (``rounded_noise_sd``) of (gamma + grid + 2 psi.float_error(T)) / mu, T the
    largest group total the manifest allows (its establishments times MAX_VALUE)."""
    import numpy as np

    from gedp.measure.grid import rounded_noise_sd
    from gedp.measure.neighbors import make_psi
    from gedp.synth.schema import MAX_VALUE

    if not psi_rows.any():
        return
    widest = 2 * float(make_psi(**manifest["psi"]).float_error(max(int(manifest["establishments"]), 1) * MAX_VALUE))
    sd, mu, grid = (numbers[name][psi_rows] for name in ("sd", "mu", "grid"))
    bad = np.zeros(len(frame), dtype=bool)
    bad[psi_rows] = sd > rounded_noise_sd((gamma[psi_rows] + grid + widest) / mu, grid) * (1 + ANSWER_RTOL)
    _where(release, frame, bad, "sd is above the psi mechanism's (gamma + grid + float error) / mu")


def _check_estimates(release: str | Path, frame, numbers: dict, psi_rows, manifest: Mapping) -> None:
    """The estimates and variances the mechanisms compute from the released values and sd: pnc's the
    released value and sd^2; the psi mechanism's its unbiased estimate and releasable variance under
    the manifest's psi (recomputed, to ANSWER_RTOL)."""
    import numpy as np

    if not {"released", "estimate", "variance", "sd"} <= numbers.keys():
        return
    released, estimate, variance, sd = (numbers[name] for name in ("released", "estimate", "variance", "sd"))
    pnc = np.flatnonzero(~psi_rows)
    bad = np.zeros(len(frame), dtype=bool)
    bad[pnc] = (estimate[pnc] != released[pnc]) | (variance[pnc] != sd[pnc] * sd[pnc])
    _where(release, frame, bad, "pnc estimate or variance is not its released value and sd^2")
    if not len(pnc) < len(frame):
        return
    from gedp.measure.neighbors import make_psi

    psi = make_psi(**manifest["psi"])
    every = not len(pnc)  # psi answers only (the identity-only plans): no copies
    released, estimate, variance, sd = (values if every else values[psi_rows]
                                        for values in (released, estimate, variance, sd))
    with np.errstate(all="ignore"):
        expected = psi.unbiased_estimate(released, sd)
        spread = psi.releasable_variance(expected, sd)
        wrong = (np.abs(estimate - expected) > ANSWER_RTOL * np.abs(expected)) | ~(
            np.abs(variance - spread) <= ANSWER_RTOL * spread)
    bad[:] = False
    bad[psi_rows] = wrong
    _where(release, frame, bad, "psi estimate or variance is not the one its released value and sd give")


def _identity_ids(release: str | Path, frame, rows, attributes, names, stated: int) -> None:
    """The identity answers of each attribute in ``rows`` (a mask; ``attributes`` the rows' codes in
    ``names``): as many as the manifest ``stated``, of the same establishments in the same order for
    every attribute (the protected rows', as gedp writes them), each establishment once."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    column = frame["estab_id"].array
    ids = column.__arrow_array__() if hasattr(column, "__arrow_array__") else pa.array(column, pa.large_string())
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    first = None
    for code in np.unique(attributes[rows]):
        mine = pc.filter(ids, pa.array(rows & (attributes == code)))
        if first is None and len(pc.unique(mine)) != len(mine):  # the others are checked equal to the first
            _where(release, frame, rows & frame.duplicated(["attribute", "estab_id"]).to_numpy(),
                   "keys repeat those of another row of the same answer")
        if len(mine) != stated:
            raise _refuse_answers(release, f"hold {len(mine):,} identity answers of {_shown(names[code])}, the "
                                           f"manifest states {stated:,} establishments")
        if first is None:
            first = mine
        elif not mine.equals(first):
            raise _refuse_answers(release, f"hold identity answers of {_shown(names[code])} for other "
                                           "establishments (or in another order) than those of the other attributes")


def _check_keys(release: str | Path, frame, manifest: Mapping, attributes, names) -> None:
    """Each answer's groups once (its keys unique), and the identity answers of each attribute one per
    establishment the manifest states. The identity answers of the attributes (most rows) are checked
    as ``_identity_ids``, the others by their key columns."""
    import numpy as np

    from gedp.synth.schema import CONFIDENTIAL

    identity = (frame["query"] == "identity").to_numpy()
    fast = identity & np.isin(attributes, [k for k, name in enumerate(names) if name in CONFIDENTIAL])
    if "estab_id" not in frame.columns:
        fast[:] = False
    keys = [column for column in frame.columns if column not in ANSWER_FIELDS]
    repeated = np.zeros(len(frame), dtype=bool)
    repeated[~fast] = frame.loc[~fast, ["query", "attribute", *keys]].duplicated().to_numpy()
    _where(release, frame, repeated, "keys repeat those of another row of the same answer")
    if fast.any():
        _identity_ids(release, frame, fast, attributes, names, int(manifest["establishments"]))


def _mechanism_rows(release: str | Path, frame):
    """Whether each row is the psi mechanism's (else pnc's; every row psi without the column)."""
    import numpy as np
    import pandas as pd

    if "mechanism" not in frame.columns:
        return np.ones(len(frame), dtype=bool)
    codes, uniques = pd.factorize(frame["mechanism"], use_na_sentinel=False)
    known = np.array([name in ("psi", "pnc") for name in uniques], dtype=bool)
    _where(release, frame, ~known[codes], "mechanism is not psi or pnc")
    return np.array([name == "psi" for name in uniques], dtype=bool)[codes]


def _gammas(release: str | Path, names, manifest: Mapping, psi_names):
    """The manifest's gamma of each attribute named (a job family's for its categories), 0 where it
    has none; refused for an attribute answered by the psi mechanism without a gamma > 0."""
    import numpy as np

    gammas = manifest.get("gammas", {})
    found = np.zeros(len(names))
    for k, name in enumerate(names):
        gamma = gammas.get(str(name).split("[", 1)[0]) if isinstance(gammas, dict) else None
        if isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and gamma > 0:
            found[k] = gamma
        elif psi_names[k]:
            raise _refuse_answers(release, f"answer {_shown(name)} with the psi mechanism, which the manifest's "
                                           "gammas do not give a gamma > 0")
    return found


def checked_measurements(release: str | Path, frame, manifest: Mapping, quarter: str | None = None):
    """``frame`` (measurements read from ``release``, of one ``quarter`` of a panel) once every row and
    number is checked as untrusted input (its parts' schemas by ``measurement_columns`` before they
    were read): every column readers use present; keys at most MAX_KEY_CHARS long; attributes named
    as ``checked_attribute`` says; finite numbers; mu in (0, MAX_STATED_MU]; each grid step its
    mechanism's and each released value on it; sd between the grid's rounding and MAX_SD_STEPS grid
    steps, for the psi mechanism between gamma / mu and the most it draws (``_check_psi_sd``), for
    pnc 0 only on a released value of 0; estimates and variances those the mechanisms compute from
    the released values and sd; each answer's keys once; one identity answer per establishment the
    manifest states. InputError naming the rule and the first answer breaking it otherwise."""
    import numpy as np
    import pandas as pd

    if quarter is not None:
        manifest = manifest["per_quarter"][quarter]
    missing = {*ANSWER_TEXT, *ANSWER_NUMBERS} - set(frame.columns)
    if missing:
        raise _refuse_answers(release, f"lack the column {sorted(missing)[0]}")
    _check_key_lengths(release, frame)
    attributes, names = pd.factorize(frame["attribute"], use_na_sentinel=False)
    for name in names:
        checked_attribute(release, name)
    psi_rows = _mechanism_rows(release, frame)
    psi_names = np.bincount(attributes[psi_rows], minlength=len(names)) > 0
    gammas = _gammas(release, names, manifest, psi_names)
    gamma = gammas[attributes]
    numbers = _numbers_of(release, frame)
    if "grid" in numbers:
        from gedp.measure.grid import psi_grid

        grids = np.array([psi_grid(value) if value > 0 else 0.0 for value in gammas])
        _check_grids(release, frame, numbers, psi_rows, grids[attributes])
    _check_noise(release, frame, numbers, psi_rows, gamma)
    _check_psi_sd(release, frame, numbers, psi_rows, gamma, manifest)
    _check_estimates(release, frame, numbers, psi_rows, manifest)
    _check_keys(release, frame, manifest, attributes, names)
    return frame
