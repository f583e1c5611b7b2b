"""Reading a release: its manifest, protected microdata, noisy answers and job families."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pandas as pd

from gedp.errors import InputError
from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import IDENTITY, Query
from gedp.postprocess.attributes import WAGE, WAGE_PRIOR
from gedp.release.format import JOBS_FILE, MEASUREMENTS_FILE, PROTECTED_FILE, QUARTER_KEY, TABLES_FILE
from gedp.release.measurement_checks import checked_attribute, checked_measurements, measurement_parts, part_label
from gedp.release.part_sizes import check_decoded, open_part, read_parts
from gedp.release.validation import read_manifest, release_parts
from gedp.synth.columns import CARRIED, CONFIDENTIAL
from gedp.synth.schema import PUBLIC

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from gedp.measure.neighbors import NeighborFunction
    from gedp.release.manifest import Manifest


#: The types the release writer gives the protected microdata's columns (``synth.schema.validate_microdata``'s
#: canonical form, as Arrow stores it): the public codes and ids (and a panel's quarter) text, the carried
#: year and quarter int64, the attributes numbers (an integer release's whole numbers may be int64).
TEXT_TYPES = frozenset({"string", "large_string"})
COLUMN_TYPES = {**dict.fromkeys((*PUBLIC, QUARTER_KEY), TEXT_TYPES), **dict.fromkeys(CARRIED, frozenset({"int64"})),
                **dict.fromkeys(CONFIDENTIAL, frozenset({"int64", "double"}))}


#: The types the release writer gives the job frame's columns (``postprocess.jobframe.job_table``): the
#: establishment's id, the family and the families' worker columns text, the jobs numbers (an integer
#: release's whole numbers may be int64).
JOB_COLUMN_TYPES = {"estab_id": TEXT_TYPES, "family": TEXT_TYPES, "jobs": frozenset({"int64", "double"})}


def output_columns(manifest: Manifest, output: str) -> tuple[dict[str, frozenset[str] | None], str]:
    """The columns a Parquet output's parts must hold, each with the types gedp writes it as (None: any
    listed in ``COLUMN_TYPES``), and how messages name the output. The protected microdata: every public
    column validated microdata hold (``PUBLIC``: the release's keys, and the sector and cell columns its
    smoothed months' margins share patterns in, ``postprocess.months``), and every establishment attribute
    it measured (its manifest's gammas; each quarter's in a panel; a job family's are in the job frame).
    The job frame: its id, family, jobs and its families' worker columns (the manifest's ``jobs`` section,
    checked by ``read_manifest``), exactly those."""
    if output == JOBS_FILE:
        families = manifest.get("jobs", {}).get("families", {})
        workers = dict.fromkeys((column for spec in families.values() for column in spec["columns"]), TEXT_TYPES)
        return {"estab_id": TEXT_TYPES, "family": TEXT_TYPES, **workers, "jobs": JOB_COLUMN_TYPES["jobs"]}, \
            "job frame's parts"
    sections = manifest["per_quarter"].values() if "per_quarter" in manifest else [manifest]
    measured = (name for section in sections for name in section["gammas"] if name in CONFIDENTIAL)
    return {name: COLUMN_TYPES.get(name) for name in [*PUBLIC, *measured]}, "protected microdata"


def check_columns(release: str | Path, schema: pa.Schema, manifest: Manifest, output: str = PROTECTED_FILE) -> None:
    """The columns of a part of ``output`` (the protected microdata or the job frame; the part's ``schema``)
    refused unless they hold those its manifest states (``output_columns``), each of the type the release
    writer gives it (``COLUMN_TYPES``, ``JOB_COLUMN_TYPES``), and, in the job frame, no other: a reader must
    not tabulate a copy with an attribute dropped as if it had never been released, nor a county stored
    as the number 1 as if it were county "001", nor jobs stored as text."""
    from gedp.synth.schema import shown

    wanted, what = output_columns(manifest, output)
    missing = [name for name in wanted if name not in schema.names]
    if missing:
        raise InputError(f"release '{release}': its {what} lack the column {shown(missing[0])} gedp writes "
                         "for this release (an edited or damaged copy)")
    types = wanted if output == JOBS_FILE else COLUMN_TYPES
    for field in schema:
        if output == JOBS_FILE and field.name not in wanted:
            raise InputError(f"release '{release}': its {what} hold a column {shown(field.name)} gedp does not "
                             "write (an edited or damaged copy)")
        allowed = types.get(field.name)
        if allowed is not None and str(field.type) not in allowed:
            kind = "text" if allowed is TEXT_TYPES else " or ".join(sorted(allowed))
            raise InputError(f"release '{release}': its {what} hold the column {shown(field.name)} as "
                             f"{str(field.type)[:40]}, not as {kind} as gedp writes it (an edited or damaged copy)")


def part_schemas(release: str | Path, parts: list[str], manifest: Manifest, output: str = PROTECTED_FILE) -> list[str]:
    """The column names of ``output``'s ``parts`` (the protected microdata's or the job frame's; the first
    part's: a read's), each part's schema checked from its footer (``check_columns``) before any row is read."""
    names: list[str] = []
    for path in parts:
        schema = open_part(path).schema_arrow
        check_columns(release, schema, manifest, output)
        names = names or schema.names
    return names


def check_count(release: str | Path, frame: pd.DataFrame, expected: int, what: str = "") -> pd.DataFrame:
    """``frame`` (a release's protected rows), refused when it does not hold the ``expected`` number
    of establishments its manifest states."""
    if len(frame) != expected:
        raise InputError(f"release '{release}': its protected microdata{what} hold {len(frame):,} rows, its "
                         f"manifest states {expected:,} establishments (an edited or damaged copy)")
    return frame


def manifest_count(manifest: Manifest, quarter: str | None = None) -> int:
    """The protected rows a manifest states: its establishments (of one ``quarter`` of a panel; of a
    whole panel, one row per establishment and quarter)."""
    if quarter is not None:
        return int(manifest["per_quarter"][quarter]["establishments"])
    if "quarters" in manifest:
        return sum(int(section["establishments"]) for section in manifest["per_quarter"].values())
    return int(manifest["establishments"])


@contextmanager
def parts_read(release: str | Path, output: str) -> Iterator[None]:
    """Reads of ``output``'s parts of ``release``: what Arrow raises on a part that is not the Parquet gedp
    wrote (a damaged or edited copy: a footer or page that does not decode) refused in one line."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"release '{release}': a part of {output} cannot be read as the Parquet gedp writes "
                         f"({type(err).__name__}; an edited or damaged copy)") from None


#: The key columns of a release's QCEW tables (BLS layout) with the types they are read as: codes as
#: text, the aggregation level a whole number; every other column is a number.
TABLE_KEYS = {"area_fips": str, "own_code": str, "industry_code": str, "agglvl_code": "int64"}


def read_tables(release: str | Path) -> pd.DataFrame:
    """A release's QCEW tables (``qcew_tables.csv``: levels 51-58 and 71-78 in BLS layout), read as
    untrusted input: listed by its manifest, a regular file, ``TABLE_KEYS`` of their types and every
    other column numbers; InputError naming the file otherwise (a missing, edited or damaged copy)."""
    import stat

    manifest = read_manifest(release)
    if TABLES_FILE not in manifest["files"].values():
        raise InputError(f"release '{release}' has no QCEW tables: its manifest lists no {TABLES_FILE}")
    path = Path(release) / TABLES_FILE
    try:
        if not stat.S_ISREG(path.lstat().st_mode):  # a link, a folder, a FIFO (whose read would block)
            raise InputError(f"release '{release}': {TABLES_FILE} is not a regular file")
    except FileNotFoundError:
        raise InputError(f"release '{release}' has no {TABLES_FILE}, which its manifest lists") from None
    try:
        tables = pd.read_csv(path, dtype=TABLE_KEYS)
    except (OSError, ValueError, UnicodeDecodeError) as err:  # pandas' parser and type errors are ValueErrors
        raise InputError(f"release '{release}': {TABLES_FILE} cannot be read as the tables gedp writes "
                         f"({type(err).__name__}; an edited or damaged copy)") from None
    missing = [column for column in TABLE_KEYS if column not in tables.columns]
    wrong = [column for column in tables.columns if column not in TABLE_KEYS
             and not pd.api.types.is_numeric_dtype(tables[column])]
    if missing or wrong:
        from gedp.synth.schema import shown

        what = f"lacks the column {missing[0]}" if missing else f"holds a column {shown(wrong[0])} not of numbers"
        raise InputError(f"release '{release}': {TABLES_FILE} {what} (an edited or damaged copy)")
    return tables


def parse_query_name(name: str) -> tuple[str, ...]:
    """Inverse of measure.queries.query_name."""
    if name == "identity":
        return IDENTITY
    return () if name == "total" else tuple(name.split(","))


def read_release(release: str | Path) -> tuple[pd.DataFrame, dict[str, list[NoisyAnswer]]]:
    """A release's protected microdata and its noisy answers by attribute (all public)."""
    answers = read_answers(release)
    return read_stored(release), answers


def read_stored(release: str | Path, output: str = PROTECTED_FILE) -> pd.DataFrame:
    """One Parquet output of a release as stored (its listed parts: ``release_parts``); the protected
    microdata refused unless their parts' schemas hold the columns and types gedp writes
    (``part_schemas``, before any row is read) and they hold the establishments the manifest states."""
    manifest = read_manifest(release)
    parts = release_parts(release, output, manifest)
    with parts_read(release, output):
        if output in (PROTECTED_FILE, JOBS_FILE):
            part_schemas(release, parts, manifest, output)
        check_decoded(release, output, parts)
        frame = read_parts(parts)
    if output == JOBS_FILE:
        check_jobs(release, frame, manifest)
    if output != PROTECTED_FILE:
        return frame
    check_codes(release, check_count(release, frame, manifest_count(manifest)))
    return frame


def read_protected(release: str | Path, without: tuple[str, ...] = ()) -> pd.DataFrame:
    """A release's protected microdata as gedp wrote it (validated before it was written), its
    attributes as float64 (as validation gives them; an integer release stores whole numbers),
    without the columns ``without`` (a tabulation by public columns needs no ``estab_id``: reading a
    large release's ids takes longer than the rest)."""
    manifest = read_manifest(release)
    parts = release_parts(release, PROTECTED_FILE, manifest)
    with parts_read(release, PROTECTED_FILE):
        names = part_schemas(release, parts, manifest)
        columns = [name for name in names if name not in without]
        check_decoded(release, PROTECTED_FILE, parts, columns)
        frame = read_parts(parts, columns)
    return checked_protected(release, frame, manifest)


def checked_protected(release: str | Path, frame: pd.DataFrame, manifest: Manifest) -> pd.DataFrame:
    """A release's protected rows (``frame``, read from its parts whose schemas and sizes were checked)
    once they hold the establishments its manifest states and codes gedp writes, attributes as float64:
    what ``read_protected`` gives."""
    check_count(release, frame, manifest_count(manifest))
    check_codes(release, frame)
    return frame.astype({column: "float64" for column in CONFIDENTIAL if column in frame.columns})


def read_answers(release: str | Path, quarter: str | None = None) -> dict[str, list[NoisyAnswer]]:
    """A release's noisy answers by attribute (of its protected microdata, only the totals the answers
    are checked against are read); of one ``quarter`` of a panel release (``release_quarters``), which
    needs one."""
    return answers_of_frame(release, read_measurements(release, quarter))


def read_measurements(release: str | Path, quarter: str | None = None) -> pd.DataFrame:
    """A release's measurements (of one ``quarter`` of a panel release), every row and number checked
    as untrusted input (``measurement_checks.checked_measurements``) and the protected microdata
    checked to be their postprocessing (``resolved.check_resolved``, once per release's bytes): what
    every reader of its answers reads. Of a panel, the parts of ``quarter`` only, each checked to hold
    that quarter's rows only."""
    release = Path(release)
    check_quarter(release, quarter)
    filters = None if quarter is None else [(QUARTER_KEY, "==", quarter)]
    manifest = read_manifest(release)
    with parts_read(release, MEASUREMENTS_FILE):
        parts = measurement_parts(release, release_parts(release, MEASUREMENTS_FILE, manifest), quarter)
        check_decoded(release, MEASUREMENTS_FILE, parts.paths, parts.columns)
        frame = read_parts(parts.paths, parts.columns, filters)  # footers checked before
    checked_measurements(release, frame, manifest, parts, quarter)
    from gedp.release.resolved import check_resolved

    check_resolved(release, frame, manifest, parts, quarter)
    return frame


def confirmed_manifest(release: str | Path) -> Manifest:
    """A release's manifest once the answers of each of its quarters are read through every reader's
    checks (``read_measurements``: the mu it states against the noise they drew): what a statement of
    its privacy (``Release.privacy``, the notes of a table ready to publish) may restate."""
    quarters: list[str | None] = [*release_quarters(release)]
    for quarter in quarters or [None]:
        read_measurements(release, quarter)
    return read_manifest(release)


def answers_of_frame(release: str | Path, frame: pd.DataFrame) -> dict[str, list[NoisyAnswer]]:
    """The noisy answers by attribute of measurements read from ``release`` (named in messages)."""
    answers: dict[str, list[NoisyAnswer]] = {}
    for (name, attribute), rows in frame.groupby(["query", "attribute"], sort=False):
        by = checked_query(release, name, frame.columns)
        attribute = checked_attribute(release, attribute)
        keys = rows[list(by)].reset_index(drop=True) if by else pd.DataFrame(index=range(1))
        answers.setdefault(attribute, []).append(NoisyAnswer(
            query=Query(by, attribute), keys=keys, released=rows["released"].to_numpy(),
            estimate=rows["estimate"].to_numpy(), variance=rows["variance"].to_numpy(),
            variance_kind=rows["variance_kind"].iloc[0], mechanism=rows["mechanism"].iloc[0],
            mu=float(rows["mu"].iloc[0]), sd=rows["sd"].to_numpy(),
            grid=float(rows["grid"].iloc[0]) if "grid" in rows else 0.0,
        ))
    return answers


def checked_query(release: str | Path, name: object, columns: pd.Index) -> tuple[str, ...]:
    """The group-by columns of a query name read from a release's measurements, each a column of them."""
    by = parse_query_name(str(name))
    missing = [column for column in by if column not in columns]
    if not isinstance(name, str) or missing:
        from gedp.synth.schema import shown

        raise InputError(f"release '{release}': the measurements name a query {shown(name)} by columns they do "
                         "not hold (an edited or damaged copy)")
    return by


def release_quarters(release: str | Path) -> list[str]:
    """The quarters of a panel release, e.g. ["2016Q1", "2016Q2"] ([] for a release of one quarter)."""
    return list(read_manifest(release).get("quarters", []))


def check_quarter(release: str | Path, quarter: str | None) -> None:
    """Refuse a quarter for a release of one quarter, a panel release without one, or a quarter it lacks."""
    quarters = release_quarters(release)
    if quarter is None and quarters:
        raise InputError(f"'{release}' holds the quarters {', '.join(quarters)}: give a quarter (or a change)")
    if quarter is not None and quarter not in quarters:
        held = f"the quarters {', '.join(quarters)}" if quarters else "one quarter (no quarter key)"
        raise InputError(f"quarter {quarter} is not in '{release}', which holds {held}")


def check_one_quarter(release: str | Path, what: str) -> None:
    """Refuse a panel release where ``what`` (e.g. "gedp report") reads a release of one quarter."""
    quarters = release_quarters(release)
    if quarters:
        raise InputError(f"'{release}' is a panel release (quarters {', '.join(quarters)}); {what} reads a release "
                         "of one quarter (tabulate a panel with a quarter or a change)")


def quarter_manifest(release: str | Path, quarter: str | None = None) -> Manifest:
    """The manifest a quarter of a panel release was protected with (the release's own without a quarter)."""
    check_quarter(release, quarter)
    manifest = read_manifest(release)
    return manifest if quarter is None else cast("Manifest", manifest["per_quarter"][quarter])


def read_quarter(release: str | Path, quarter: str | None = None, without: tuple[str, ...] = ()) -> pd.DataFrame:
    """``read_protected`` of one quarter of a panel release (its rows, without the quarter key), or
    of a release of one quarter."""
    check_quarter(release, quarter)
    if quarter is None:
        return read_protected(release, without)
    manifest = read_manifest(release)
    parts = quarter_parts(release_parts(release, PROTECTED_FILE, manifest), quarter)
    with parts_read(release, PROTECTED_FILE):
        names = part_schemas(release, parts, manifest)
        columns = [name for name in names if name not in (*without, QUARTER_KEY)]
        check_decoded(release, PROTECTED_FILE, parts, [*columns, QUARTER_KEY])
        frame = read_parts(parts, columns, [(QUARTER_KEY, "==", quarter)])
    check_count(release, frame, manifest_count(manifest, quarter), f" of {quarter}")
    check_codes(release, frame)
    return frame.astype({column: "float64" for column in CONFIDENTIAL if column in frame.columns})


def quarter_parts(parts: list[str], quarter: str | None) -> list[str]:
    """The parts of ``quarter`` of a panel release's ``parts`` (named ``part-<quarter>-<state>``; all
    of them without a quarter): a reader of one quarter reads and checks no other quarter's part."""
    return parts if quarter is None else [path for path in parts if part_label(path)[0] == quarter]


def check_codes(release: str | Path, frame: pd.DataFrame) -> None:
    """Every public code of a release's protected microdata (``frame``, as read) one gedp writes: as
    validation gives it (``synth.schema.canonical_codes``, what ``read_validated`` and so gedp serve read),
    an industry code the one its naics derives. A code no release holds (a formula, a county of other
    width, a sector not of its naics) is refused in one line naming its column and row, never its value:
    every table written from a release carries only codes gedp wrote."""
    from gedp.synth.schema import canonical_codes

    try:
        codes = canonical_codes(frame.reset_index(drop=True))
    except InputError as err:
        raise InputError(f"release '{release}': {PROTECTED_FILE} {err} (an edited or damaged copy)") from None
    for column in codes.columns.intersection(frame.columns):
        other = frame[column].to_numpy(dtype=object) != codes[column].to_numpy(dtype=object)
        if other.any():
            raise InputError(f"release '{release}': {PROTECTED_FILE} column '{column}' holds a code gedp does not "
                             f"write (first at row {int(other.argmax()) + 1}; an edited or damaged copy)")


def job_domains() -> dict[str, pd.Index]:
    """The public code list of each QWI worker column of a release's job frame (``synth.jobs.WORKER_DOMAINS``);
    a home county's is its establishment's state's (``home_domain``, checked by ``check_adds_up``)."""
    from gedp.synth.jobs import WORKER_DOMAINS

    return {column: pd.Index(codes) for column, codes in WORKER_DOMAINS.items()}


def check_jobs(release: str | Path, frame: pd.DataFrame, manifest: Manifest) -> None:
    """Every row of a release's job frame (``frame``, as read) one gedp writes
    (``postprocess.jobframe.job_table``): a family of its manifest, each of the family's worker columns
    a code of its public list (``job_domains``; a home county: present, its list checked against the
    protected microdata by ``check_adds_up``) and the others empty, jobs finite and > 0 (whole in an
    integer release). Otherwise refused in one line naming the column and row, never the value: a
    formula, a sex 3 or negative jobs must not reach a table."""
    import numpy as np

    from gedp.measure.jobframe import FAMILY_COLUMNS

    families = manifest.get("jobs", {}).get("families", {})
    family = _as_text(frame["family"])
    bad: dict[str, np.ndarray] = {"family": ~family.isin(list(families)).to_numpy()}
    domains = job_domains()
    for column in frame.columns.intersection(list(FAMILY_COLUMNS)):
        member = family.isin([name for name, spec in families.items() if column in spec["columns"]]).to_numpy()
        values = _as_text(frame[column])
        coded = (values.isin(domains[column]) if column in domains else values.notna()).to_numpy()
        bad[column] = np.where(member, ~coded, values.notna().to_numpy())
    jobs = frame["jobs"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad["jobs"] = ~(np.isfinite(jobs) & (jobs > 0))
        if manifest.get("integer"):
            bad["jobs"] |= jobs != np.round(jobs)
    for column, rows in bad.items():
        _refuse_job_values(release, column, rows)


def _as_text(values: pd.Series) -> pd.Series:
    """A column as read, for comparing with codes: pandas' text as it is (its own ``isin``, without a
    Python string per row), anything else as objects (a number is never a code)."""
    return values if isinstance(values.dtype, pd.StringDtype) else values.astype(object)


def _refuse_job_values(release: str | Path, column: str, rows: np.ndarray) -> None:
    """Refuse a job frame whose ``rows`` (a mask) hold a value of ``column`` gedp does not write."""
    if rows.any():
        raise InputError(f"release '{release}': {JOBS_FILE} column '{column}' holds a value gedp does not "
                         f"write (first at row {int(rows.argmax()) + 1}; an edited or damaged copy)")


def check_adds_up(folder: str | Path, jobs: pd.DataFrame, protected: pd.DataFrame) -> None:
    """Each row's establishment one of the protected microdata, its home county (where its family has
    one) one of the list ``gedp protect`` measures for its establishment's state
    (``measure.jobframe.home_domain`` of that state's protected rows: their workplace counties and
    "other"), and each family's jobs of each establishment adding up to its protected employment, as
    gedp writes them (``postprocess.jobframe``, to rounding): otherwise the job frame (``jobs``, checked
    row by row by ``reader.check_jobs``) is refused in one line naming the row, never a value."""
    import numpy as np

    from gedp.measure.jobframe import EMPLOYMENT

    ids = pd.Index(protected["estab_id"].astype(str))
    employment = protected[EMPLOYMENT].to_numpy(dtype=float)
    family, families = pd.factorize(jobs["family"].astype(str))
    position = ids.get_indexer(jobs["estab_id"].astype(str))
    if (position < 0).any():
        row = int((position < 0).argmax()) + 1
        raise InputError(f"release '{folder}': its job frame names an establishment its protected microdata lack "
                         f"(row {row}; an edited or damaged copy)")
    if "home_county" in jobs.columns:
        _refuse_job_values(folder, "home_county", _foreign_homes(jobs, protected, position))
    sums = np.zeros((len(families), len(ids)))
    np.add.at(sums, (family, position), jobs["jobs"].to_numpy(dtype=float))
    off = ~np.isclose(sums, employment[None, :], rtol=1e-9, atol=1e-6)
    if off.any():
        row = ids[int(off.argmax() % len(ids))]
        raise InputError(f"release '{folder}': its job frame's jobs of establishment {row!r} do not add up to its "
                         "protected employment as gedp writes them (an edited or damaged copy)")


def _foreign_homes(jobs: pd.DataFrame, protected: pd.DataFrame, position: np.ndarray) -> np.ndarray:
    """The rows of ``jobs`` holding a home county outside the list of their establishment's state
    (``home_domain``; ``position``: each row's establishment in ``protected``), by codes: a job frame
    of millions of rows is never turned into text keys."""
    import numpy as np

    from gedp.measure.jobframe import home_domain

    state, states = pd.factorize(protected["state"].astype(str))
    home, homes = pd.factorize(jobs["home_county"], use_na_sentinel=True)
    allowed = np.zeros((len(states), len(homes) + 1), dtype=bool)  # the last column: no home county
    for number in range(len(states)):
        allowed[number, :-1] = pd.Index(homes.astype(str)).isin(home_domain(protected[state == number]))
    return ~allowed[state[position], home] & (home >= 0)


def read_validated(release: str | Path, quarter: str | None = None) -> pd.DataFrame:
    """A release's protected microdata as stored (of one ``quarter`` of a panel: ``read_quarter``),
    validated as microdata are (``synth.schema.validate_microdata``, its attributes those present)."""
    from gedp.synth.schema import validate_microdata

    frame = read_stored(release) if quarter is None else read_quarter(release, quarter)
    return validate_microdata(frame, [column for column in CONFIDENTIAL if column in frame.columns])


def release_answers(release: str | Path, protected: pd.DataFrame | None = None,
                    quarter: str | None = None) -> dict[str, list[NoisyAnswer]]:
    """A release's answers as its postprocessing weighed them (what its margins of error take): the
    months' identity answers turned by ``month_answers`` under the release's variance mode, over
    its protected microdata (``protected``, or read from the release: the public columns the month
    patterns are shared in); of one ``quarter`` of a panel release."""
    from gedp.measure.neighbors import make_psi  # the stages' modules: loaded by what reads answers only
    from gedp.postprocess.months import month_answers

    manifest = quarter_manifest(release, quarter)
    answers = read_answers(release, quarter)
    mode = manifest.get("variance_mode", "estimated")
    if protected is None and mode == "smoothed":  # the public columns its patterns are shared in, checked
        protected = read_validated(release, quarter)
    return month_answers(answers, mode, make_psi(**manifest["psi"]), protected)


def release_wage_psi(release: str | Path, quarter: str | None = None) -> NeighborFunction | None:
    """The release's psi when its wages were informed by its protected employment (the manifest's
    wage model is "employment": their margins of error then follow ``postprocess.wages``), else None;
    of one ``quarter`` of a panel release."""
    from gedp.measure.neighbors import make_psi

    manifest = quarter_manifest(release, quarter)
    if wage_model(manifest) != WAGE_PRIOR:
        return None
    return make_psi(**manifest["psi"])


def wage_model(manifest: Manifest) -> str | None:
    """The model the release's wages were postprocessed with, as its manifest records it
    (``solver.wage.model``): "wage prior" (``postprocess.wages``, informed by protected employment),
    "plain", or None without wages. A manifest written before the field existed is refused."""
    solver = manifest.get("solver", {})
    if WAGE not in solver:
        return None
    if "model" not in solver[WAGE]:
        raise InputError("this release's manifest does not record its wage model (solver.wage.model); it was "
                         "written by an earlier gedp: protect the data again to tabulate it with margins")
    return solver[WAGE]["model"]


def release_families(release: str | Path) -> dict[str, list[str]]:
    """A release's job families and their worker columns ({} without a job frame)."""
    jobs = read_manifest(release).get("jobs", {})
    return {family: list(spec["columns"]) for family, spec in jobs.get("families", {}).items()}


def change_quarters(release: str | Path, change: str) -> tuple[str, str, int]:
    """The two quarters of a change "FIRST:SECOND" of a panel release, and how many quarters apart they are."""
    if change.count(":") != 1:
        raise InputError(f"change '{change}' must be FIRST:SECOND, e.g. 2016Q1:2017Q1")
    from gedp.synth.panel import parse_quarter  # with the panel readers: a request of one quarter needs none

    first, second = (part.strip() for part in change.split(":"))
    apart = [year * 4 + qtr for year, qtr in (parse_quarter(first), parse_quarter(second))]
    for quarter in (first, second):
        check_quarter(release, quarter)
    if apart[1] <= apart[0]:
        raise InputError(f"change '{change}': the second quarter must come after the first")
    return first, second, apart[1] - apart[0]
