"""A release's noisy answers (``measurements.parquet``) read as untrusted input: each part's footer
before any row is read, then every answer against the plan the manifest states and every row and
number against the rules of the mechanism that released it.

Every reader of a release's answers (``reader.read_measurements``: ``gedp tabulate --moe``, ``gedp
implicates``, the Python API, ``gedp serve``) reads them through ``measurement_parts`` and
``checked_measurements``, so an edited copy is refused in one line naming the rule and the first
answer (query, attribute, state, quarter) breaking it, never a value of it nor a server path:

* each part's schema: the columns readers use present as text or numbers, every key as text (not
  a dictionary), each key's chunk no larger than keys of MAX_KEY_CHARS characters make it and every
  key at most MAX_KEY_CHARS long, read as the parts' dictionaries before the rows are; a panel's part
  holding rows of its own quarter only (its footer's statistics);
* the answers: exactly those the manifest's plan implies, each query on each attribute (a job
  family's categories) once per state and quarter, each of one mechanism (identity: psi; other
  queries: the workflow's), of one variance kind (psi: estimated; pnc: exact), one grid step and
  the mu the manifest's ledger charged it, the ledgers agreeing with the manifest's mu per query;
* the rows and numbers: finite numbers, grids, sds, estimates and variances as each mechanism
  releases them, each answer's keys once, one identity answer per establishment stated;
* the noise stated: nested answers' spread against their stated variances (``nesting_checks``);
  each answer's total against the protected microdata's (``answer_checks``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gedp.errors import InputError
from gedp.release.format import MEASUREMENTS_FILE, QUARTER_KEY
from gedp.release.part_sizes import open_part
from gedp.release.spending import ledger_charges, refuse_plan
from gedp.release.validation import ATTRIBUTE_PATTERN
from gedp.synth.schema import MAX_ID_CHARS, shown

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
MAX_KEY_CHARS = MAX_ID_CHARS  # input refuses longer ids, so no honest release holds one
#: The longest label of an answer (its query's name, attribute, mechanism, variance kind): a query
#: names a few columns, an attribute a job family's category of a few codes.
MAX_LABEL_CHARS = 256
#: What a column chunk may hold beyond its values (page headers, levels, statistics), in bytes.
PAGE_ROOM = 1 << 20


def refuse_answers(release: str | Path, rule: str) -> InputError:
    return InputError(f"release '{release}': {MEASUREMENTS_FILE} {rule} (an edited or damaged copy)")


def refuse_rows(release: str | Path, frame, bad, rule: str) -> None:
    """Refuse when any row is ``bad``: the first such answer named (its query and attribute)."""
    import numpy as np

    if bad.any():
        row = frame.iloc[int(np.argmax(bad))]
        answer = f"query {shown(row.get('query'))} on {shown(row.get('attribute'))}"
        count = int(bad.sum())
        rows = f"{count:,} row whose" if count == 1 else f"{count:,} rows whose"
        raise refuse_answers(release, f"hold {rows} {rule} ({answer} first)")


def _numbers_of(release: str | Path, frame) -> dict:
    """Each number column as float64 (present and numeric: ``measurement_parts`` checked the parts'
    schemas), refused unless every value is finite."""
    import numpy as np

    numbers = {}
    for column in ANSWER_NUMBERS:
        values = frame[column].to_numpy(dtype=np.float64)
        refuse_rows(release, frame, ~np.isfinite(values), f"{column} is not a finite number")
        numbers[column] = values
    return numbers


def _is_text(kind) -> bool:
    """Text as gedp writes it (string or large string; a dictionary, pandas' categorical, is not)."""
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_number(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


@dataclass(frozen=True)
class MeasurementParts:
    """The parts of a release's measurements a reader reads (of one quarter of a panel: its parts),
    in order, each part's state and number of rows, and the columns read (``measurement_parts``)."""

    paths: list[str]
    states: list[str]
    rows: list[int]
    columns: list[str]


def part_label(path: str) -> tuple[str | None, str]:
    """The quarter (None for a release of one quarter) and state of a part named as
    ``validation.part_names`` names it (``part-44.parquet``, ``part-2016Q1-44.parquet``)."""
    label = Path(path).name[len("part-"):-len(".parquet")]
    quarter, _, state = label.rpartition("-")
    return quarter or None, state


def measurement_parts(release: str | Path, parts: list[str], quarter: str | None = None) -> MeasurementParts:
    """What a reader reads of a release's measurement ``parts`` (those of ``quarter`` for a panel),
    checked from each part's footer and dictionaries before any row is read: its schema
    (``_check_schema``); a panel's part holding rows of its own quarter only; its answers' labels and
    the keys some query groups by (and ``estab_id``) no longer than ``_check_lengths`` allows. The
    keys no query groups by are left unread."""

    chosen = [path for path in parts if part_label(path)[0] == quarter]
    required = {**dict.fromkeys(ANSWER_TEXT, "text"), **dict.fromkeys(ANSWER_NUMBERS, "numbers")}
    if quarter is not None:
        required[QUARTER_KEY] = "text"
    files = []
    for path in chosen:
        metadata = open_part(path).metadata
        schema = metadata.schema.to_arrow_schema()
        _check_schema(release, path, schema, required)
        files.append(open_part(path, metadata=metadata, read_dictionary=[
            field.name for field in schema if _is_text(field.type)]))
    queries: set = set()
    for path, file in zip(chosen, files):
        labels = _check_lengths(release, path, file, [*ANSWER_TEXT, *([QUARTER_KEY] if quarter else [])],
                                MAX_LABEL_CHARS)
        queries |= {name for chunk in labels.column("query").chunks for name in chunk.dictionary.to_pylist()}
        if quarter is not None:
            _check_part_quarter(release, path, file, quarter)
    named = {column for name in queries if isinstance(name, str) and name not in ("identity", "total")
             for column in name.split(",")} | ({"estab_id"} if "identity" in queries else set())
    first = files[0].schema_arrow.names if files else []  # what a read of the parts reads: the first part's columns
    columns = [name for name in first if name in required or name in named]  # in the order gedp wrote them
    for path, file in zip(chosen, files):
        _check_lengths(release, path, file, [key for key in columns if key not in required
                                             and key in file.schema_arrow.names], MAX_KEY_CHARS)
    return MeasurementParts(chosen, [part_label(path)[1] for path in chosen],
                            [file.metadata.num_rows for file in files], columns)


def _check_schema(release: str | Path, path: str, schema, required: dict[str, str]) -> None:
    """Every ``required`` column present as text or numbers, every other column (a key) as text."""
    for column, kind in required.items():
        if column not in schema.names:
            raise refuse_answers(release, f"lack the column {column} ({Path(path).name})")
        if not (_is_number if kind == "numbers" else _is_text)(schema.field(column).type):
            raise refuse_answers(release, f"hold the column {column} as {schema.field(column).type}, not as "
                                           f"{kind} ({Path(path).name})")
    for field in schema:
        if field.name not in required and not _is_text(field.type):
            raise refuse_answers(release, f"hold a key column {shown(field.name)} as {field.type}, not as "
                                           f"text ({Path(path).name})")


def _check_lengths(release: str | Path, path: str, file, columns: list[str], longest: int):
    """Each of the text ``columns`` of a part no longer than ``longest`` characters: first from the
    footer (each chunk's uncompressed size at most that of its values at ``longest`` characters, twice
    over for a dictionary page, and a page's room), then from the values read as dictionaries (Arrow
    keeps a dictionary-encoded column's values once, however many rows repeat them), before any row
    of them is read as plain text. Returns the columns read as dictionaries."""
    import pyarrow.compute as pc

    metadata, names = file.metadata, file.schema_arrow.names
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        room = row_group.num_rows * 2 * (4 + 4 * longest) + PAGE_ROOM
        for column in columns:
            if row_group.column(names.index(column)).total_uncompressed_size > room:
                raise refuse_answers(release, _too_long(column, longest, path))
    table = file.read(columns=columns)
    for column in columns:
        for chunk in table.column(column).chunks:
            size = pc.max(pc.utf8_length(chunk.dictionary)).as_py()
            if size is not None and size > longest:
                raise refuse_answers(release, _too_long(column, longest, path))
    return table


def _too_long(column: str, longest: int, path: str) -> str:
    what = "a key" if longest == MAX_KEY_CHARS else "a label"
    return (f"hold {what} of {shown(column)} longer than {longest} characters ({Path(path).name}; gedp's keys are "
            "codes and ids of a few characters, its labels names of queries and attributes)")


def _check_part_quarter(release: str | Path, path: str, file, quarter: str) -> None:
    """A panel's part (``part-<quarter>-<state>.parquet``) holds rows of its own quarter only: from its
    row groups' statistics, or its quarter column read as a dictionary where they are missing."""
    metadata, position = file.metadata, file.schema_arrow.names.index(QUARTER_KEY)
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(position).statistics
        if statistics is not None and statistics.has_min_max and statistics.has_null_count:
            held = {statistics.min, statistics.max} | ({None} if statistics.null_count else set())
        else:
            column = file.read_row_group(group, columns=[QUARTER_KEY]).column(QUARTER_KEY)
            held = {value for chunk in column.chunks for value in chunk.dictionary.to_pylist()}
            held |= {None} if column.null_count else set()
        if held - {quarter}:
            raise refuse_answers(release, f"hold rows of another quarter in {Path(path).name}, which holds those of "
                                           f"{quarter} (a quarter relabelled)")


def checked_attribute(release: str | Path, attribute: object) -> str:
    """An attribute named by a release's measurements: a plain name, or a job family's category
    (``worker[1,E1]``)."""
    if not isinstance(attribute, str) or not ATTRIBUTE_PATTERN.fullmatch(attribute):
        raise InputError(f"release '{release}': the measurements name an attribute {shown(attribute)}, which is "
                         "not an attribute's name (an edited or damaged copy)")
    return attribute


def _check_grids(release: str | Path, frame, numbers: dict, psi_rows, psi_grids, establishments: int) -> None:
    """Every grid step the mechanism's own (pnc: VALUE_GRID; psi: ``psi_grids``, that of the row's
    attribute's gamma), and every released value a multiple of it within the grid's range (a psi
    answer's: MAX_GRID_UNITS; a pnc group sum's: ``largest_sum_units`` of the manifest's establishments,
    the range its exact sum is written in)."""
    import numpy as np

    from gedp.measure.grid import MAX_GRID_UNITS, VALUE_GRID, largest_sum_units

    grid = numbers["grid"]
    expected = np.where(psi_rows, psi_grids, VALUE_GRID)
    refuse_rows(release, frame, grid != expected, "grid is not the step its mechanism and gamma release on")
    if "released" in numbers:
        units = numbers["released"] / grid
        refuse_rows(release, frame, (units != np.rint(units)) | (np.abs(units) >= np.where(psi_rows, MAX_GRID_UNITS,
                                                                                          largest_sum_units(establishments))),
               "released value is not a multiple of its grid step within the grid's range")


def _check_noise(release: str | Path, frame, numbers: dict, psi_rows, gamma) -> None:
    """sd and mu: mu in (0, MAX_STATED_MU]; sd at least the grid's rounding (grid / sqrt(12); pnc: or
    0, a group whose clip level is 0) and below MAX_SD_STEPS grid steps; a psi answer's sd times its
    mu at least its ``gamma`` (the noise the mechanism adds is its sensitivity over mu)."""
    from gedp.accounting.mu_limits import MAX_STATED_MU

    if "mu" in numbers:
        mu = numbers["mu"]  # pnc's is 0 when every group's clip level is 0 (no noise, nothing spent)
        refuse_rows(release, frame, ~(((mu > 0) | (~psi_rows & (mu == 0))) & (mu <= MAX_STATED_MU)),
               f"mu is not in (0, {MAX_STATED_MU:g}]")
    if "sd" not in numbers:
        return
    sd = numbers["sd"]
    grid = numbers.get("grid")
    rounding = 0.0 if grid is None else grid / math.sqrt(12) * (1 - ANSWER_RTOL)
    top = math.inf if grid is None else MAX_SD_STEPS * grid
    low = ((sd >= rounding) & (sd > 0)) | (~psi_rows & (sd == 0))
    refuse_rows(release, frame, ~(low & (sd < top)),
           "sd is not between the grid's rounding (grid / sqrt(12)) and 2^55 grid steps")
    if "released" in numbers:  # no noise: the group's clip level, hence its released value, is 0
        refuse_rows(release, frame, ~psi_rows & (sd == 0) & (numbers["released"] != 0),
               "pnc sd is 0 (no noise) but the released value is not 0")
    if "mu" in numbers:
        refuse_rows(release, frame, psi_rows & (sd * numbers["mu"] < gamma * (1 - ANSWER_RTOL)),
               "sd is below the psi mechanism's gamma / mu")


def _check_psi_sd(release: str | Path, frame, numbers: dict, psi_rows, gamma, manifest: Mapping,
                  parts: MeasurementParts, attributes) -> None:
    """A psi answer's sd the one its mechanism draws (``measure.mechanisms.psi_mechanism``): one sd for
    every group of an answer (of one part, query and attribute), between the rounded noise sd
    (``rounded_noise_sd``) of (gamma + grid) / mu and of (gamma + grid + 2 psi.float_error(T)) / mu, T the
    largest group total the manifest allows (its establishments times MAX_VALUE). Row by row sds inside
    that window had let an identity answer's upper bound psi^-1(omega + sd tau + grid) be set to any
    value, and every pnc group's sd be matched to a budget restated lower (red team rt24 F1)."""
    import numpy as np
    import pandas as pd

    from gedp.measure.grid import rounded_noise_sd
    from gedp.measure.neighbors import make_psi
    from gedp.synth.schema import MAX_VALUE

    if not psi_rows.any():
        return
    widest = 2 * float(make_psi(**manifest["psi"]).float_error(max(int(manifest["establishments"]), 1) * MAX_VALUE))
    sd, mu, grid = (numbers[name][psi_rows] for name in ("sd", "mu", "grid"))
    bad = np.zeros(len(frame), dtype=bool)
    bad[psi_rows] = sd > rounded_noise_sd((gamma[psi_rows] + grid + widest) / mu, grid) * (1 + ANSWER_RTOL)
    refuse_rows(release, frame, bad, "sd is above the psi mechanism's (gamma + grid + float error) / mu")
    bad[psi_rows] = sd < rounded_noise_sd((gamma[psi_rows] + grid) / mu, grid) * (1 - ANSWER_RTOL)
    refuse_rows(release, frame, bad, "sd is below the psi mechanism's (gamma + grid) / mu")
    # Each row's answer: its part, query and attribute codes in one integer (a MultiIndex of the strings
    # costs about 2 s per million rows).
    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)[psi_rows]
    query = pd.factorize(frame["query"], use_na_sentinel=False)[0][psi_rows]
    attribute = attributes[psi_rows].astype(np.int64)
    answer = pd.factorize((part * (int(query.max()) + 1) + query) * (int(attribute.max()) + 1) + attribute)[0]
    first = np.full(int(answer.max(initial=-1)) + 1, np.nan)
    first[answer[::-1]] = sd[::-1]  # each answer's first row's sd
    bad[psi_rows] = sd != first[answer]
    refuse_rows(release, frame, bad, "sd is not its psi answer's one sd (the mechanism draws one per answer)")


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
    refuse_rows(release, frame, bad, "pnc estimate or variance is not its released value and sd^2")
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
    refuse_rows(release, frame, bad, "psi estimate or variance is not the one its released value and sd give")


#: Most |z| of an answer's total against its identity answers' (``_check_psi_totals``): a normal
#: deviate passes it with probability 1 - 2e-9.
MAX_TOTAL_Z = 6.0


def _check_psi_totals(release: str | Path, frame, numbers: dict, psi_rows, parts: MeasurementParts) -> None:
    """Each psi answer of a group query (the psi workflow's) estimating, summed over its groups, the total
    its state's identity answers of the attribute estimate: both unbiased for it, their difference noise of
    variance the sum of their variances; refused beyond MAX_TOTAL_Z. A pnc release relabelled psi (its
    answers' sds then state a mu a fraction of what they spent: mu 1.70 for 2.31, red team rt25 F6) is off
    by z 9 to 98: its released sums of values read as psi of sums estimate their squares."""
    import numpy as np
    import pandas as pd

    identity = (frame["query"] == "identity").to_numpy()
    grouped = psi_rows & ~identity
    if not grouped.any():
        return
    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)
    sums = pd.DataFrame({"part": part, "query": frame["query"].to_numpy(), "attribute": frame["attribute"].to_numpy(),
                         "estimate": numbers["estimate"], "variance": numbers["variance"]})
    held = sums[identity & psi_rows].groupby(["part", "attribute"])[["estimate", "variance"]].sum()
    answers = sums[grouped].groupby(["part", "query", "attribute"])[["estimate", "variance"]].sum()
    keys = pd.MultiIndex.from_arrays([answers.index.get_level_values("part"),
                                      answers.index.get_level_values("attribute")])
    known = keys.isin(held.index)
    if not known.any():
        return
    ident = held.reindex(keys[known])
    with np.errstate(all="ignore"):
        z = (answers["estimate"].to_numpy()[known] - ident["estimate"].to_numpy()) / np.sqrt(
            answers["variance"].to_numpy()[known] + ident["variance"].to_numpy())
    if (~(np.abs(z) <= MAX_TOTAL_Z)).any():
        part_, query, attribute = answers.index[known][int(np.argmax(~(np.abs(z) <= MAX_TOTAL_Z)))]
        raise refuse_answers(release, f"hold an answer of query {shown(query)} on {shown(attribute)} (state "
                                       f"{parts.states[part_]}) whose groups' total is not the one its identity "
                                       f"answers give (|z| > {MAX_TOTAL_Z:g}: not the psi mechanism's sums)")


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
            refuse_rows(release, frame, rows & frame.duplicated(["attribute", "estab_id"]).to_numpy(),
                   "keys repeat those of another row of the same answer")
        if len(mine) != stated:
            raise refuse_answers(release, f"hold {len(mine):,} identity answers of {shown(names[code])}, the "
                                           f"manifest states {stated:,} establishments")
        if first is None:
            first = mine
        elif not mine.equals(first):
            raise refuse_answers(release, f"hold identity answers of {shown(names[code])} for other "
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
    refuse_rows(release, frame, repeated, "keys repeat those of another row of the same answer")
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
    refuse_rows(release, frame, ~known[codes], "mechanism is not psi or pnc")
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
            raise refuse_answers(release, f"answer {shown(name)} with the psi mechanism, which the manifest's "
                                           "gammas do not give a gamma > 0")
    return found


def _check_plan(release: str | Path, frame, manifest: Mapping, parts: MeasurementParts, quarter: str | None,
                psi_rows, attributes, names) -> None:
    """The answers are exactly those the manifest's plan implies (``_plan_mu``): every query on every
    attribute its ledger of each state charged, none other; each row of the mechanism of its query
    (identity: psi; the others: the workflow's), of that mechanism's variance kind (psi: estimated;
    pnc: exact) and of the mu its state's ledger charged (so no answer mixes mechanisms or mu)."""
    import numpy as np
    import pandas as pd

    if sum(parts.rows) != len(frame):
        raise refuse_answers(release, f"hold {len(frame):,} rows of {quarter or 'the release'}, their parts "
                                       f"{sum(parts.rows):,}")
    queries, query_names = pd.factorize(frame["query"], use_na_sentinel=False)
    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)
    code = (part * len(query_names) + queries) * len(names) + attributes
    held, answer_of_row = np.unique(code, return_inverse=True)  # the (part, query, attribute) answers held
    mu_held, lacking = _plan_mu(release, manifest, parts, quarter, held, list(query_names), list(names))
    mu = mu_held[answer_of_row]
    if np.isnan(mu).any():
        row = int(np.argmax(np.isnan(mu)))
        raise refuse_answers(release, f"name a query {shown(query_names[queries[row]])} on "
                                       f"{shown(names[attributes[row]])} (state {parts.states[part[row]]}"
                                       f"{'' if quarter is None else f', quarter {quarter}'}) that the manifest's "
                                       "plan does not state")
    if lacking is not None:
        raise lacking
    refuse_rows(release, frame, ~np.isclose(frame["mu"].to_numpy(dtype=np.float64), mu, rtol=ANSWER_RTOL, atol=0),
           "mu is not the one the manifest's ledger charged its answer (an answer of mixed mu)")
    workflow = manifest.get("workflow")
    if workflow not in ("psi", "pnc"):
        raise refuse_plan(release, "workflow must be psi or pnc")
    identity = np.array([name == "identity" for name in query_names], dtype=bool)[queries]
    refuse_rows(release, frame, psi_rows != (identity | (workflow == "psi")),
           f"mechanism is not its query's (identity: psi; the others: {workflow}, the workflow; an answer of "
           "mixed mechanisms)")
    kinds, kind_names = pd.factorize(frame["variance_kind"], use_na_sentinel=False)
    estimated = np.array([name == "estimated" for name in kind_names], dtype=bool)[kinds]
    known = np.array([name in ("estimated", "exact") for name in kind_names], dtype=bool)[kinds]
    refuse_rows(release, frame, ~known | (estimated != psi_rows),
           "variance_kind is not its mechanism's (psi: estimated; pnc: exact)")


def _plan_mu(release: str | Path, manifest: Mapping, parts: MeasurementParts, quarter: str | None,
             held, queries: list, attributes: list):
    """The mu the ledger of each part's state charged each answer ``held`` (codes of (part, query,
    attribute) as ``_check_plan`` makes them, each once; NaN: not charged), after checking the manifest's
    mu per query against the ledgers; and the refusal of the first answer charged that no part of its
    state holds (None when there is none). Sized by the answers held and the ledgers, never by the
    product of the labels a file names."""
    import numpy as np

    where = "" if quarter is None else f" of {quarter}"
    ledgers = [ledger_charges(release, manifest, state, f"state {state}{where}")
               for state in dict.fromkeys(parts.states)]
    by_state = dict(zip(dict.fromkeys(parts.states), ledgers))
    part, rest = np.divmod(held, len(queries) * len(attributes))
    query, attribute = np.divmod(rest, len(attributes))
    answers = [(int(p), queries[q], attributes[a]) for p, q, a in zip(part, query, attribute)]
    mu = np.array([by_state[parts.states[p]].get((q, a), np.nan) for p, q, a in answers], dtype=np.float64)
    present = set(answers)
    for number, state in enumerate(parts.states):
        for query_name, attribute_name in by_state[state]:
            if (number, query_name, attribute_name) not in present:
                return mu, _lacking(release, query_name, attribute_name, state, quarter)
    return mu, None


def _lacking(release: str | Path, query: object, attribute: object, state: str, quarter: str | None) -> InputError:
    where = "" if quarter is None else f", quarter {quarter}"
    return refuse_answers(release, f"lack the answers of query {shown(query)} on {shown(attribute)} (state "
                                    f"{state}{where}), which the manifest's plan states")


def checked_measurements(release: str | Path, frame, manifest: Mapping, parts: MeasurementParts,
                         quarter: str | None = None):
    """``frame`` (measurements read from ``release``'s ``parts``, of one ``quarter`` of a panel) once
    every answer, row and number is checked as untrusted input (the parts' footers and dictionaries by
    ``measurement_parts`` before they were read): every column readers use present; attributes named
    as ``checked_attribute`` says; finite numbers; mu in (0, MAX_STATED_MU]; each grid step its
    mechanism's and each released value on it; sd between the grid's rounding and MAX_SD_STEPS grid
    steps, for the psi mechanism one sd per answer between the least and the most it draws
    (``_check_psi_sd``), for
    pnc 0 only on a released value of 0; estimates and variances those the mechanisms compute from
    the released values and sd; each answer's keys once; one identity answer per establishment the
    manifest states; the answers exactly those of the manifest's plan, each of its query's mechanism
    and the mu its ledger charged (``_check_plan``). InputError naming the rule and the first answer
    breaking it otherwise."""
    import numpy as np
    import pandas as pd

    if quarter is not None:
        manifest = manifest["per_quarter"][quarter]
    missing = {*ANSWER_TEXT, *ANSWER_NUMBERS} - set(frame.columns)
    if missing:
        raise refuse_answers(release, f"lack the column {sorted(missing)[0]}")
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
        _check_grids(release, frame, numbers, psi_rows, grids[attributes], int(manifest["establishments"]))
    _check_noise(release, frame, numbers, psi_rows, gamma)
    _check_psi_sd(release, frame, numbers, psi_rows, gamma, manifest, parts, attributes)
    _check_estimates(release, frame, numbers, psi_rows, manifest)
    _check_psi_totals(release, frame, numbers, psi_rows, parts)
    _check_keys(release, frame, manifest, attributes, names)
    _check_plan(release, frame, manifest, parts, quarter, psi_rows, attributes, names)
    from gedp.release.nesting_checks import check_nesting
    from gedp.release.pnc_checks import check_pnc_sd

    check_pnc_sd(release, frame, numbers, psi_rows, attributes, gamma, manifest, parts)
    check_nesting(release, frame, numbers, psi_rows, manifest, parts)
    from gedp.release.answer_checks import check_answer_totals

    check_answer_totals(release, frame, numbers, parts, quarter)
    return frame
