"""The release pipeline: validated microdata -> measurements -> protected microdata -> release directory.

No mathematics lives here; this module wires synth, measure, postprocess and evaluation and writes
the release atomically (a temporary directory renamed into place only when complete).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import secrets
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from randomgen import ChaCha

from gedp.config import Config
from gedp.measure.answers import NoisyAnswer
from gedp.measure.budget import compose
from gedp.measure.jobframe import EMPLOYMENT, FamilySpec, add_job_counts
from gedp.measure.queries import IDENTITY, Groupings, Query
from gedp.measure.workflows import Measurements, count_steps, measure
from gedp.postprocess.jobframe import job_table, protect_family
from gedp.postprocess.rounding import Rounder
from gedp.postprocess.tabulate import qcew_tables
from gedp.postprocess.wls import WLSResult, combined_report, protect_microdata
from gedp.synth.io import sorted_by
from gedp.synth.schema import InputError, public_columns, shown

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
REPORT_FILES = frozenset({"summary.json", "report.md"})
MAX_MARKER_BYTES = 64 << 20
#: Longest output name, in bytes: a file name holds 255, and staging adds ".partial-" and 8 hex digits.
MAX_NAME_BYTES = 200
VERSIONED_PACKAGES = ("gedp", "numpy", "scipy", "pandas", "pyarrow", "cvxpy", "osqp", "clarabel")


@dataclass
class Release:
    """Everything a release publishes, in memory."""

    protected: pd.DataFrame
    measurements: Measurements
    solver_results: dict[str, WLSResult]
    tables: pd.DataFrame
    manifest: dict
    jobs: pd.DataFrame | None = None  # the protected job frame (long), for a plan with job families


RNG_KINDS = ("secure", "pcg64")
SECURE_DESCRIPTION = {"kind": "secure", "bit_generator": "ChaCha20 (randomgen), 256-bit key from the OS (secrets)"}
#: Columns a release's rows are sorted by: public keys only, whatever the input order.
RELEASE_ORDER = ("state", "county", "naics", "estab_id")


def secure_generator() -> np.random.Generator:
    """A cryptographically secure generator: ChaCha20 with a 256-bit key drawn from the OS.

    The key is set directly (``key=``), not through a SeedSequence, whose 128-bit pool would cap
    its entropy at 128 bits.
    """
    return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=20))


def is_publishable(rng_description: dict) -> bool:
    """Only noise from the secure generator may be published: a seeded or PCG64 stream can be
    replayed or predicted, and replaying it subtracts the noise."""
    return rng_description.get("kind") == "secure"


def check_publication(seed: int | None, rng: str | None, not_for_publication: bool) -> None:
    """Refuse replayable noise (a seed, or PCG64) unless the release is marked not for publication."""
    if (seed is not None or rng == "pcg64") and not not_for_publication:
        raise InputError("a seeded or pcg64 release can be replayed: whoever learns or guesses the seed subtracts "
                         "the noise; add --not-for-publication for a test release, or drop --seed/--rng")


def release_order(microdata: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by public keys (state, county, naics, estab_id) so that no output keeps the
    input's order, which may follow confidential values."""
    return sorted_by(microdata, RELEASE_ORDER)


def make_rng(seed: int | None, kind: str | None = None) -> tuple[np.random.Generator, dict]:
    """The release's generator and how the manifest describes it.

    Without a seed, releases use the secure generator (the key is never recorded); a seed gives the
    reproducible PCG64 stream meant for experiments and for releases marked not for publication.
    """
    kind = kind or ("pcg64" if seed is not None else "secure")
    if kind not in RNG_KINDS:
        raise InputError(f"--rng '{kind}' is unknown; choose one of {', '.join(RNG_KINDS)}")
    if seed is not None and seed < 0:
        raise InputError(f"seed ({seed}) must be >= 0")
    if kind == "secure":
        if seed is not None:
            raise InputError("--rng secure draws its key from the operating system and takes no --seed")
        return secure_generator(), dict(SECURE_DESCRIPTION)
    if seed is None:
        return np.random.default_rng(np.random.SeedSequence()), {"kind": "os-entropy", "bit_generator": "PCG64"}
    return np.random.default_rng(seed), {"kind": "seed", "seed": seed, "bit_generator": "PCG64"}


def total_steps(config: Config) -> int:
    """Progress steps of ``protect``: one per mechanism call and one per attribute solved, plus tables
    (and the rounding of an integer release)."""
    return count_steps(config.plan) + len(config.plan.attributes) + 1 + config.integer


#: Rows per row group of the measurements file (Arrow's default, which the file has always used).
MEASUREMENT_ROW_GROUP = 1 << 20


def answer_table(answer: NoisyAnswer, rows: slice = slice(None)) -> pa.Table:
    """The ``rows`` of one answer in the measurements file: query, attribute, mechanism, group keys
    and the numbers (the label columns repeat one string per answer)."""
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
    })


def write_measurements(measurements: Measurements, path: Path) -> None:
    """All noisy answers in one long Parquet table (a key column an answer lacks is null): the bytes
    of ``pq.write_table`` of the answers' tables concatenated, written one row group at a time so
    that only one answer's table and one row group are in memory."""
    schema = pa.unify_schemas([answer_table(answer, slice(0)).schema for answer in measurements.answers],
                              promote_options="default")

    def conformed(table: pa.Table) -> pa.Table:  # the columns of the schema, nulls for missing keys
        return pa.table({field.name: table[field.name] if field.name in table.column_names
                         else pa.nulls(table.num_rows, field.type) for field in schema}, schema=schema)

    with pq.ParquetWriter(path, schema) as writer:
        pending, count = [], 0
        for answer in measurements.answers:
            table = conformed(answer_table(answer))
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


def versions() -> dict[str, str]:
    """Versions of gedp and the packages its numbers depend on."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, str]:
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def check_job_table(config: Config, given: bool) -> None:
    """Refuse a job table without a config with job families, and such a config without its job
    table (``given``: whether a job table was given); one message for both."""
    if (config.jobs is not None) != given:
        has = (f"measures job families ({', '.join(config.jobs.families)})" if config.jobs is not None
               else "has no job families")
        raise InputError(f"config {config.name} {has} and {'a' if given else 'no'} job table was given: a job "
                         "table (--jobs) goes with a config with job families (e.g. --config jobs), and such a "
                         "config needs one")


def protect(
    microdata: pd.DataFrame,
    config: Config,
    *,
    rng: np.random.Generator,
    rng_description: dict,
    on_step: Callable[[str], None] | None = None,
    jobs: pd.DataFrame | None = None,
) -> Release:
    """Measure validated microdata with the config's plan and postprocess it into a release.

    Rows are put in release order (public keys) first, so every output is in that order. A plan
    with job families needs ``jobs``, the job table of these establishments (``synth.jobs``).
    """
    step = on_step or (lambda description: None)
    plan = config.plan
    families: list[FamilySpec] = []
    check_job_table(config, jobs is not None)
    if config.jobs is not None and jobs is not None:
        microdata, plan, families = add_job_counts(microdata, jobs, config.jobs, plan)
    microdata = release_order(microdata)
    public = microdata[public_columns(microdata)]
    groupings = Groupings(public)  # the public columns' groups, shared by measurement, solves and tables
    measurements = measure(microdata, plan, rng=rng, on_step=step, groupings=groupings)
    if not measurements.budget.complete:
        raise RuntimeError("a planned query was not charged")  # a bug, not an input error

    categories = {attribute: spec.family for spec in families for attribute in spec.attributes}
    # each attribute is rounded as soon as it is solved, so the wage fit (last) takes the rounded
    # employment the release holds, and `gedp tabulate --moe` recomputes that very fit
    rounder = Rounder(public) if config.integer else None

    protected, solver_results = protect_microdata(
        {attribute: measurements.for_attribute(attribute) for attribute in config.attributes},
        public,
        variance_mode=config.variance_mode,
        solver=config.solver,
        wages=config.wages,
        psi=plan.psi,
        on_step=step,
        finish=rounder,
        groupings=groupings,
    )

    rounding = None
    if rounder is not None:
        rounding = {attribute: rounder.report[attribute] for attribute in config.attributes}
        protected = protected.astype({attribute: np.int64 for attribute in rounding})
        step("controlled rounding")
    tables = qcew_tables(protected, groupings)
    step("QCEW tables")

    job_frame = None
    if families:
        answers = {attribute: measurements.for_attribute(attribute) for attribute in categories}
        counts = []
        for spec in families:
            family_counts, results = protect_family(spec, answers, public, protected[EMPLOYMENT].to_numpy(dtype=float),
                                                    solver=config.solver, integer=config.integer, groupings=groupings,
                                                    on_step=step)
            counts.append((spec, family_counts))
            solver_results[spec.family] = family_result(list(results.values()))
        job_frame = job_table(protected["estab_id"], counts)
        step("job frame")

    mu_by_query: dict[str, dict[str, list[float]]] = {}
    for entry in measurements.budget.ledger:
        attribute = categories.get(entry["attribute"], entry["attribute"])
        mu_by_query.setdefault(entry["query"], {}).setdefault(attribute, []).append(entry["mu"])
    grids: dict[str, dict[str, float]] = {}
    for answer in measurements.answers:
        attribute = categories.get(answer.query.attribute, answer.query.attribute)
        grids.setdefault(answer.query.name, {})[attribute] = answer.grid
    manifest = {
        "gedp_version": versions()["gedp"],
        "created_date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "publishable": is_publishable(rng_description),
        "config_name": config.name,
        "config": config.raw,
        "establishments": int(len(microdata)),
        "states": sorted(microdata["state"].unique().tolist()),
        "workflow": plan.workflow,
        "psi": plan.psi.params(),
        "gammas": dict(plan.gammas),
        "zeta": plan.zeta,
        "tau": {state: measurements.tau for state in sorted(microdata["state"].unique())},
        "mu_total": measurements.budget.spent,
        "mu_planned_total": measurements.budget.total,
        "mu_cap": plan.cap,
        "mu": {query: {attribute: mus[0] if len(mus) == 1 else compose(mus) for attribute, mus in by.items()}
               for query, by in mu_by_query.items()},
        "grid": grids,
        "ledger": measurements.budget.ledger,
        "rng": rng_description,
        "variance_mode": config.variance_mode,
        "solver": {attribute: result.report() for attribute, result in solver_results.items()},
        "integer": config.integer,
        **({"rounding": rounding} if rounding is not None else {}),
        "versions": versions(),
        "files": {
            "protected_microdata": PROTECTED_FILE,
            "measurements": MEASUREMENTS_FILE,
            "qcew_tables": TABLES_FILE,
            **({"protected_jobs": JOBS_FILE} if families else {}),
        },
        **({"jobs": job_manifest(families)} if families else {}),
    }
    return Release(protected, measurements, solver_results, tables, manifest, job_frame)


def family_result(results: list[WLSResult]) -> WLSResult:
    """One solver result for a job family: its categories' ``combined_report``, summed objective and
    pinned establishments, largest negative clipped."""
    return WLSResult(values=np.empty(0), seconds=0.0, **combined_report([r.report() for r in results]),
                     objective=math.fsum(r.objective for r in results),
                     fixed_zero=sum(r.fixed_zero for r in results),
                     clipped_negative=max(r.clipped_negative for r in results))


def job_manifest(families: list[FamilySpec]) -> dict:
    """The manifest's job section: each family's worker columns and number of categories (public)."""
    return {"file": JOBS_FILE, "adds_up_to": EMPLOYMENT,
            "families": {spec.family: {"columns": list(spec.columns), "categories": len(spec.categories)}
                         for spec in families}}


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


def _gedp_names(out: Path, marker: str) -> frozenset[str] | None:
    """The names gedp writes in an output folder of ``marker``'s kind, or None when ``marker`` is
    not gedp's: a regular JSON file holding an object with gedp's keys (a release's manifest; a
    report's summary, whose "figures" name its plots)."""
    try:
        info = (out / marker).lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MARKER_BYTES:
            return None
        content = json.loads((out / marker).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict):
        return None
    if marker == MANIFEST_FILE:
        return RELEASE_FILES if MANIFEST_KEYS <= content.keys() else None
    from gedp.evaluation.suppression_report import AUDIT_FILE, PUBLISHED_FILE, SHARES_FILE  # imported late: matplotlib

    figures = content.get("figures")
    if not (isinstance(figures, list) and all(isinstance(f, str) and f.endswith(".png") for f in figures)):
        return None
    return REPORT_FILES | {PUBLISHED_FILE, AUDIT_FILE, SHARES_FILE, *figures}


def _is_gedp_entry(entry: os.DirEntry, names: frozenset[str]) -> bool:
    """A regular file gedp writes, or one of a release's folders holding only Parquet parts."""
    if entry.name not in names:
        return False
    if entry.is_file(follow_symlinks=False):
        return True
    return (entry.name in PART_FOLDERS and entry.is_dir(follow_symlinks=False)
            and all(part.is_file(follow_symlinks=False) and part.name.startswith("part-")
                    and part.name.endswith(".parquet") for part in os.scandir(entry.path)))


def check_output_directory(out: Path, marker: str = MANIFEST_FILE) -> None:
    """Refuse, before any work, an output folder that gedp cannot create or must not replace.

    An existing ``out`` is replaced only when it is an empty folder or verifiably an earlier output
    of the same kind: its ``marker`` (manifest.json of a release, summary.json of a report) is gedp's
    and every entry is a file gedp writes there. Anything else is left untouched.
    """
    kind = "release" if marker == MANIFEST_FILE else "output"
    check_output_path(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise InputError(f"output '{out}' exists and is not a gedp {kind}; choose another --out")
    entries = list(os.scandir(out))
    if not entries:
        return
    names = _gedp_names(out, marker)
    if names is None:
        raise InputError(f"output '{out}' exists and is not a gedp {kind}; choose another --out")
    foreign = next((entry.name for entry in entries if not _is_gedp_entry(entry, names)), None)
    if foreign is not None:
        raise InputError(f"output '{out}': {shown(foreign)} is not part of a gedp {kind}; choose another --out")


@contextmanager
def staged_directory(out: str | Path, marker: str = MANIFEST_FILE,
                     before_publish: Callable[[], None] | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; when the block completes, it replaces ``out``.

    An earlier output at ``out`` is replaced only after the new one is complete; on any error the
    temporary directory is removed and ``out`` is left as it was. ``before_publish`` runs when the
    output is complete, just before it is moved into place (e.g. to record a release in the
    lifetime ledger); if it raises, nothing is moved. Every file and folder of the output is dated
    the day's midnight (UTC), the manifest's ``created_date``: the times at which the parts were
    written would otherwise tell how long each state took (SPEC section 8: no timings).
    """
    out = Path(out).resolve()
    check_output_directory(out, marker)
    staging = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as err:
        raise InputError(f"output '{out}' cannot be created ({err.strerror or type(err).__name__})") from None
    try:
        yield staging
        _date_only(staging)
        if before_publish is not None:
            before_publish()
        if out.exists():
            retired = out.parent / f".{out.name}.retired-{uuid.uuid4().hex[:8]}"
            os.replace(out, retired)
            os.replace(staging, out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _date_only(folder: Path) -> None:
    """Set the access and modification times of ``folder`` and everything in it to today's midnight, UTC."""
    midnight = dt.datetime.combine(dt.datetime.now(dt.timezone.utc).date(), dt.time(), tzinfo=dt.timezone.utc)
    stamp = midnight.timestamp()
    for path in [*folder.rglob("*"), folder]:  # the folder last: dating its entries does not change it
        os.utime(path, (stamp, stamp), follow_symlinks=False)


def write_parts(release: Release, staging: Path, part: str, tables: Path) -> None:
    """Write one part of each output of a release: protected microdata and measurements as
    Parquet files ``part-<part>.parquet`` in their folders, and the QCEW tables as CSV at ``tables``."""
    for folder in (PROTECTED_FILE, MEASUREMENTS_FILE):
        (staging / folder).mkdir(exist_ok=True)
    release.protected.to_parquet(staging / PROTECTED_FILE / f"part-{part}.parquet", index=False)
    if release.jobs is not None:
        (staging / JOBS_FILE).mkdir(exist_ok=True)
        release.jobs.to_parquet(staging / JOBS_FILE / f"part-{part}.parquet", index=False)
    write_measurements(release.measurements, staging / MEASUREMENTS_FILE / f"part-{part}.parquet")
    release.tables.to_csv(tables, index=False)


def parse_query_name(name: str) -> tuple[str, ...]:
    """Inverse of measure.queries.query_name."""
    if name == "identity":
        return IDENTITY
    return () if name == "total" else tuple(name.split(","))


def read_release(release: str | Path) -> tuple[pd.DataFrame, dict[str, list[NoisyAnswer]]]:
    """A release's protected microdata and its noisy answers by attribute (all public)."""
    release = Path(release)
    answers = read_answers(release)
    return pd.read_parquet(release / PROTECTED_FILE), answers


def read_answers(release: str | Path) -> dict[str, list[NoisyAnswer]]:
    """A release's noisy answers by attribute (without reading its protected microdata)."""
    release = Path(release)
    if not (release / MANIFEST_FILE).is_file():
        raise InputError(f"'{release}' is not a gedp release (no {MANIFEST_FILE})")
    frame = pd.read_parquet(release / MEASUREMENTS_FILE)
    answers: dict[str, list[NoisyAnswer]] = {}
    for (name, attribute), rows in frame.groupby(["query", "attribute"], sort=False):
        by = parse_query_name(name)
        keys = rows[list(by)].reset_index(drop=True) if by else pd.DataFrame(index=range(1))
        answers.setdefault(attribute, []).append(NoisyAnswer(
            query=Query(by, attribute), keys=keys, released=rows["released"].to_numpy(),
            estimate=rows["estimate"].to_numpy(), variance=rows["variance"].to_numpy(),
            variance_kind=rows["variance_kind"].iloc[0], mechanism=rows["mechanism"].iloc[0],
            mu=float(rows["mu"].iloc[0]), sd=rows["sd"].to_numpy(),
            grid=float(rows["grid"].iloc[0]) if "grid" in rows else 0.0,
        ))
    return answers
