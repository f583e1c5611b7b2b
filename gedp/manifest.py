"""The release manifest: one type, one builder, one reader, for every command that writes a release.

Every value is public: configuration, counts of establishments and states (public), what the
mechanisms charged, grids, tau, and solver figures computed from noisy answers only. It holds no
path, no timing and no clock time finer than the date (SPEC section 8).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd
import pyarrow.parquet as pq

from gedp.config import Config
from gedp.errors import InputError
from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction, make_psi
from gedp.pipeline import (
    JOBS_FILE,
    MANIFEST_FILE,
    MANIFEST_KEYS,
    MEASUREMENTS_FILE,
    PROTECTED_FILE,
    TABLES_FILE,
    is_publishable,
    read_answers,
    versions,
)
from gedp.postprocess.months import PATTERN_CELL, PATTERN_GROUP, month_answers
from gedp.postprocess.wls import combined_report


class Manifest(TypedDict, total=False):
    """manifest.json. ``lifetime`` appears only for releases recorded in a ledger."""

    gedp_version: str
    created_date: str  # UTC date only
    publishable: bool  # False for seeded / PCG64 noise (--not-for-publication)
    config_name: str  # a shipped config's name, or "custom"
    config: dict[str, Any]  # the config as loaded
    establishments: int
    states: list[str]
    workflow: str  # pnc or psi
    psi: dict[str, Any]
    gammas: dict[str, float]
    zeta: float  # for the whole release
    zeta_per_state: float
    tau: dict[str, float]  # per state
    mu_total: float  # composed from what the mechanisms charged (the largest state's: parallel composition)
    mu_planned_total: float
    mu_cap: float | None
    mu: dict[str, dict[str, float]]  # per query and attribute (largest over states)
    grid: dict[str, dict[str, float]]  # output grid step per query and attribute
    ledger: dict[str, list[dict[str, Any]]]  # per state: every charge
    composition: str
    rng: dict[str, Any]  # kind (secure, seed, os-entropy), bit generator, per-state derivation; never a key
    engine: str
    variance_mode: str
    solver: dict[str, dict[str, Any]]  # per attribute: solver, status, KKT residual, iterations
    integer: bool  # values rounded to whole numbers by controlled rounding (per_state[...]["rounding"]: what changed)
    per_state: dict[str, dict[str, Any]]
    versions: dict[str, str]
    files: dict[str, str]
    lifetime: dict[str, Any]  # lifetime_cap, spent_before, spent_after, mu, release_id
    jobs: dict[str, Any]  # job families: worker columns, categories per state (releases with a job frame)


def read_manifest(release: str | Path) -> Manifest:
    """The manifest of a release directory, checked to be gedp's."""
    path = Path(release) / MANIFEST_FILE
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise InputError(f"'{release}' is not a gedp release (no readable {MANIFEST_FILE})") from None
    if not isinstance(content, dict) or not MANIFEST_KEYS <= content.keys():
        raise InputError(f"'{release}' is not a gedp release ({MANIFEST_FILE} lacks gedp's keys)")
    return content  # type: ignore[return-value]


def release_answers(release: str | Path, protected: pd.DataFrame | None = None) -> dict[str, list[NoisyAnswer]]:
    """A release's answers as its postprocessing weighed them (what its margins of error take): the
    months' identity answers turned by ``month_answers`` under the release's variance mode, over
    its protected microdata (``protected``, or read from the release: the public columns the month
    patterns are shared in)."""
    manifest = read_manifest(release)
    answers = read_answers(release)
    mode = manifest.get("variance_mode", "estimated")
    if protected is None and mode == "smoothed":
        dataset = pq.ParquetDataset(Path(release) / PROTECTED_FILE)
        protected = dataset.read(columns=[column for column in dict.fromkeys(
            ("estab_id", *PATTERN_CELL, *PATTERN_GROUP)) if column in dataset.schema.names]).to_pandas()
    return month_answers(answers, mode, make_psi(**manifest["psi"]), protected)


def release_wage_psi(release: str | Path) -> NeighborFunction | None:
    """The release's psi when its wages were informed by its protected employment (their margins of
    error then follow ``postprocess.wages``), else None."""
    manifest = read_manifest(release)
    if "employment" not in str(manifest["solver"].get("wage", {}).get("solver", "")):
        return None
    return make_psi(**manifest["psi"])


def release_manifest(config: Config, pieces: list[dict], rng_description: dict, engine: str,
                     scheduler: str | None) -> Manifest:
    """The manifest of a release protected state by state: ``pieces`` are the states' entries
    (``gedp.engine.protect_one_state``)."""
    plan = config.plan
    solver = {attribute: combined_report([piece["solver"][attribute] for piece in pieces])
              for attribute in plan.attributes}
    # Parallel composition: each state's records are measured by its own mechanisms only, so the
    # release spends the largest of the states' charges (each composed from what its noise cost).
    mu_by_query: dict[str, dict[str, float]] = {}
    for piece in pieces:
        for query, by_attribute in piece["mu"].items():
            for attribute, mu in by_attribute.items():
                current = mu_by_query.setdefault(query, {}).get(attribute, 0.0)
                mu_by_query[query][attribute] = max(current, mu)
    return {
        "gedp_version": versions()["gedp"],
        "created_date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "publishable": is_publishable(rng_description),
        "config_name": config.name,
        "config": config.raw,
        "establishments": sum(piece["establishments"] for piece in pieces),
        "states": [piece["state"] for piece in pieces],
        "workflow": plan.workflow,
        "psi": plan.psi.params(),
        "gammas": dict(plan.gammas),
        "zeta": plan.zeta,
        "zeta_per_state": pieces[0]["zeta"],
        "tau": {piece["state"]: piece["tau"] for piece in pieces},
        "mu_total": max(piece["mu_total"] for piece in pieces),
        "mu_planned_total": plan.budget().total,
        "mu_cap": plan.cap,
        "mu": mu_by_query,
        "grid": pieces[0]["grid"],
        "ledger": {piece["state"]: piece["ledger"] for piece in pieces},
        "composition": "parallel across states (every query includes state); each state spends mu_total",
        "rng": rng_description | {"per_state": "its own secure generator" if rng_description["kind"] == "secure"
                                  else "SeedSequence([seed or OS entropy, *ASCII bytes of the state code])"},
        "engine": engine if scheduler is None else f"{engine} ({scheduler})",
        "variance_mode": config.variance_mode,
        "solver": solver,
        "integer": config.integer,
        "per_state": {piece["state"]: piece for piece in pieces},
        "versions": versions(),
        "files": {"protected_microdata": PROTECTED_FILE, "measurements": MEASUREMENTS_FILE, "qcew_tables": TABLES_FILE,
                  **({"protected_jobs": JOBS_FILE} if config.jobs is not None else {})},
        **({"jobs": jobs_section(pieces)} if config.jobs is not None else {}),
    }


def jobs_section(pieces: list[dict]) -> dict:
    """The manifest's job section of a release protected state by state: the families' worker columns
    and, per state, their numbers of categories."""
    first = pieces[0]["jobs"]
    return {**first, "families": {family: {"columns": spec["columns"],
                                           "categories": {p["state"]: p["jobs"]["families"][family]["categories"]
                                                          for p in pieces}}
                                  for family, spec in first["families"].items()}}


def release_families(release: str | Path) -> dict[str, list[str]]:
    """A release's job families and their worker columns ({} without a job frame)."""
    jobs = read_manifest(release).get("jobs", {})
    return {family: list(spec["columns"]) for family, spec in jobs.get("families", {}).items()}
