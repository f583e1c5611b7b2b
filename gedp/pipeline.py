"""The release pipeline: validated microdata -> measurements -> protected microdata -> release directory.

No mathematics lives here; this module wires synth, measure, postprocess and evaluation and writes
the release atomically (a temporary directory renamed into place only when complete).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
from randomgen import ChaCha

from evaluation.tabulate import qcew_tables
from gedp.config import Config
from measure.answers import NoisyAnswer
from measure.queries import IDENTITY, Query
from measure.workflows import Measurements, count_steps, measure
from postprocess.wls import WLSResult, protect_microdata
from synth.schema import InputError, public_columns

PROTECTED_FILE = "protected.parquet"
MEASUREMENTS_FILE = "measurements.parquet"
TABLES_FILE = "qcew_tables.csv"
MANIFEST_FILE = "manifest.json"
VERSIONED_PACKAGES = ("gedp", "numpy", "scipy", "pandas", "pyarrow", "cvxpy", "osqp", "clarabel")


@dataclass
class Release:
    """Everything a release publishes, in memory."""

    protected: pd.DataFrame
    measurements: Measurements
    solver_results: dict[str, WLSResult]
    tables: pd.DataFrame
    manifest: dict


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


def release_order(microdata: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by public keys (state, county, naics, estab_id) so that no output keeps the
    input's order, which may follow confidential values."""
    return microdata.sort_values(list(RELEASE_ORDER), kind="stable", ignore_index=True)


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
    """Progress steps of ``protect``: one per mechanism call and one per attribute solved, plus tables."""
    return count_steps(config.plan) + len(config.plan.attributes) + 1


def measurements_frame(measurements: Measurements) -> pd.DataFrame:
    """All noisy answers in one long table: query, attribute, mechanism, group keys and the numbers."""
    parts = []
    for answer in measurements.answers:
        part = answer.keys.reset_index(drop=True).copy()
        part.insert(0, "query", answer.query.name)
        part.insert(1, "attribute", answer.query.attribute)
        part.insert(2, "mechanism", answer.mechanism)
        part.insert(3, "mu", answer.mu)
        part.insert(4, "variance_kind", answer.variance_kind)
        part["released"] = answer.released
        part["estimate"] = answer.estimate
        part["variance"] = answer.variance
        part["sd"] = answer.sd
        part["grid"] = answer.grid
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def versions() -> dict[str, str]:
    """Versions of gedp and the packages its numbers depend on."""
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def protect(
    microdata: pd.DataFrame,
    config: Config,
    *,
    rng: np.random.Generator,
    rng_description: dict,
    on_step: Callable[[str], None] | None = None,
) -> Release:
    """Measure validated microdata with the config's plan and postprocess it into a release.

    Rows are put in release order (public keys) first, so every output is in that order.
    """
    step = on_step or (lambda description: None)
    plan = config.plan
    microdata = release_order(microdata)
    measurements = measure(microdata, plan, rng=rng, on_step=step)
    if not measurements.budget.complete:
        raise RuntimeError("a planned query was not charged")  # a bug, not an input error

    protected, solver_results = protect_microdata(
        {attribute: measurements.for_attribute(attribute) for attribute in plan.attributes},
        microdata[public_columns(microdata)],
        variance_mode=config.variance_mode,
        solver=config.solver,
        on_step=step,
    )

    tables = qcew_tables(protected)
    step("QCEW tables")

    mu_by_query: dict[str, dict[str, float]] = {}
    for entry in measurements.budget.ledger:
        mu_by_query.setdefault(entry["query"], {})[entry["attribute"]] = entry["mu"]
    grids: dict[str, dict[str, float]] = {}
    for answer in measurements.answers:
        grids.setdefault(answer.query.name, {})[answer.query.attribute] = answer.grid
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
        "mu": mu_by_query,
        "grid": grids,
        "ledger": measurements.budget.ledger,
        "rng": rng_description,
        "variance_mode": config.variance_mode,
        "solver": {attribute: result.report() for attribute, result in solver_results.items()},
        "versions": versions(),
        "files": {
            "protected_microdata": PROTECTED_FILE,
            "measurements": MEASUREMENTS_FILE,
            "qcew_tables": TABLES_FILE,
        },
    }
    return Release(protected, measurements, solver_results, tables, manifest)


def check_output_directory(out: Path, marker: str = MANIFEST_FILE) -> None:
    """Refuse an output path that exists and is not an earlier output of the same kind (its marker
    file is present): checked before any work."""
    if out.exists() and not (out.is_dir() and (out / marker).is_file()):
        raise InputError(f"output '{out}' exists and is not a gedp {'release' if marker == MANIFEST_FILE else 'output'}"
                         "; choose another --out")


@contextmanager
def staged_directory(out: str | Path, marker: str = MANIFEST_FILE,
                     before_publish: Callable[[], None] | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; when the block completes, it replaces ``out``.

    An earlier output at ``out`` is replaced only after the new one is complete; on any error the
    temporary directory is removed and ``out`` is left as it was. ``before_publish`` runs when the
    output is complete, just before it is moved into place (e.g. to record a release in the
    lifetime ledger); if it raises, nothing is moved.
    """
    out = Path(out).resolve()
    check_output_directory(out, marker)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
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


def write_parts(release: Release, staging: Path, part: str, tables: Path) -> None:
    """Write one part of each output of a release: protected microdata and measurements as
    Parquet files ``part-<part>.parquet`` in their folders, and the QCEW tables as CSV at ``tables``."""
    for folder in (PROTECTED_FILE, MEASUREMENTS_FILE):
        (staging / folder).mkdir(exist_ok=True)
    release.protected.to_parquet(staging / PROTECTED_FILE / f"part-{part}.parquet", index=False)
    measurements_frame(release.measurements).to_parquet(staging / MEASUREMENTS_FILE / f"part-{part}.parquet", index=False)
    release.tables.to_csv(tables, index=False)


def write_release(release: Release, out: str | Path, extra_files: dict[str, dict] | None = None) -> Path:
    """Write the release completely into a temporary directory, then move it into place."""
    with staged_directory(out) as staging:
        # Same layout as a state-by-state release: a folder of Parquet parts per file.
        write_parts(release, staging, "-".join(release.manifest["states"]), staging / TABLES_FILE)
        for name, content in (extra_files or {}).items():
            (staging / name).write_text(json.dumps(content, indent=2, default=float) + "\n")
        (staging / MANIFEST_FILE).write_text(json.dumps(release.manifest, indent=2, default=float) + "\n")
    return Path(out).resolve()


def parse_query_name(name: str) -> tuple[str, ...]:
    """Inverse of measure.queries.query_name."""
    if name == "identity":
        return IDENTITY
    return () if name == "total" else tuple(name.split(","))


def read_release(release: str | Path) -> tuple[pd.DataFrame, dict[str, list[NoisyAnswer]]]:
    """A release's protected microdata and its noisy answers by attribute (all public)."""
    release = Path(release)
    if not (release / MANIFEST_FILE).is_file():
        raise InputError(f"'{release}' is not a gedp release (no {MANIFEST_FILE})")
    protected = pd.read_parquet(release / PROTECTED_FILE)
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
    return protected, answers
