"""Protect a multi-state input state by state, locally or as tasks on a dask.distributed cluster.

Every group-by query of the plan includes ``state``, so each establishment is measured only by its
own state's mechanisms and the states compose in parallel: the release spends the plan's mu once.
Each state's noise comes from its own secure generator, or, in a release not for publication,
from a generator derived from the seed and the state code, so the ``local`` and ``dask`` engines
give the same release. zeta is split among the states so the whole release keeps 1 - zeta. Only one state's working set is in memory at
a time per worker: a state is read from the input (Parquet: with a filter, so only its rows are
loaded), protected, written as one part of each output, and dropped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from gedp.config import Config
from gedp.ledger import dataset_digest, records_digest
from gedp.pipeline import (
    MANIFEST_FILE,
    MEASUREMENTS_FILE,
    PROTECTED_FILE,
    TABLES_FILE,
    is_publishable,
    make_rng,
    protect,
    secure_generator,
    staged_directory,
    versions,
    write_parts,
)
from synth.io import read_microdata
from synth.schema import CONFIDENTIAL, InputError, normalize_code, validate_microdata

ENGINES = ("local", "dask")


def _is_parquet(path: Path) -> bool:
    return path.is_dir() or path.suffix.lower() in (".parquet", ".pq")


def input_states(path: str | Path) -> list[str]:
    """The state codes of an input, reading only its ``state`` column."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"input '{path}' does not exist")
    try:
        if _is_parquet(path):
            column = ds.dataset(path, format="parquet").to_table(columns=["state"]).column("state").to_pandas()
        else:
            column = pd.read_csv(path, usecols=["state"], dtype=str)["state"]
    except (KeyError, ValueError) as err:
        raise InputError(f"input '{path}': cannot read its 'state' column ({str(err).splitlines()[0]})") from None
    if len(column) == 0:
        raise InputError(f"input '{path}' has zero establishments (no data rows)")
    return sorted(normalize_code(pd.DataFrame({"state": column}), "state", 2).unique())


def input_attributes(path: str | Path, attributes) -> list[str]:
    """``attributes`` and every other confidential attribute the input has (read from its header or
    Parquet schema): the columns that identify its records in the lifetime ledger."""
    path = Path(path)
    try:
        if _is_parquet(path):
            columns = ds.dataset(path, format="parquet").schema.names
        else:
            columns = pd.read_csv(path, nrows=0, encoding="utf-8").columns
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"input '{path}': cannot read its columns ({type(err).__name__})") from None
    return [c for c in CONFIDENTIAL if c in attributes or c in columns]


def input_digest(path: str | Path, states: list[str], attributes,
                 on_state: Callable[[str], None] | None = None) -> str:
    """SHA-256 of the input's validated records (gedp.ledger.records_digest), read one state at a
    time: ``attributes`` and every other confidential column present, whatever the files' names,
    format or order."""
    columns = input_attributes(path, attributes)
    digests = {}
    for state in states:
        digests[state] = records_digest(read_state(path, state, columns))
        if on_state is not None:
            on_state(state)
    return dataset_digest(digests)


def read_state(path: str | Path, state: str, attributes) -> pd.DataFrame:
    """Validated microdata of one state (Parquet inputs are filtered while reading)."""
    path = Path(path)
    if not _is_parquet(path):
        frame = read_microdata(path, attributes)
        return frame[frame["state"] == state].reset_index(drop=True)
    dataset = ds.dataset(path, format="parquet")
    field = ds.field("state")
    kind = dataset.schema.field("state").type
    wanted = int(state) if str(kind).startswith(("int", "uint")) else state
    return validate_microdata(dataset.to_table(filter=field == wanted).to_pandas(), attributes)


def state_rng(entropy: int, state: str) -> np.random.Generator:
    """The generator of one state's noise: derived from the run's entropy and the exact state code
    (its ASCII bytes, so two different codes never share a stream)."""
    return np.random.default_rng(np.random.SeedSequence([entropy, *state.encode("ascii")]))


def state_zeta(zeta: float, states: int) -> float:
    """Each state's zeta so that all states' bounds hold together with probability 1 - zeta:
    1 - (1 - zeta)^(1 / states), computed without cancellation."""
    return -math.expm1(math.log1p(-zeta) / states)


def check_request(config: Config, states: list[str], *, seed: int | None, rng: str | None, engine: str) -> dict:
    """Refuse a bad engine, seed and generator, or a plan that spans states, before anything is
    read or reserved; returns how the manifest describes the generator."""
    if engine not in ENGINES:
        raise InputError(f"engine '{engine}' is unknown; choose one of {', '.join(ENGINES)}")
    _, rng_description = make_rng(seed, rng)  # checks --seed and --rng together
    if len(states) > 1:
        check_state_by_state(config)
    return rng_description


def check_state_by_state(config: Config) -> None:
    """Refuse plans with a query that spans states (parallel composition needs state in every query)."""
    for query in config.plan.queries:
        if query.by != ("estab_id",) and "state" not in query.by:
            raise InputError(
                f"query {query.name} spans states; add 'state' to its columns to protect a multi-state input"
            )


def protect_one_state(path: str, state: str, config: Config, entropy: int | None, staging: str,
                      states: int = 1) -> dict:
    """Protect one state and write its parts into the staging release; returns its manifest entry.

    ``entropy=None`` draws the state's noise from its own secure generator (ChaCha20, OS key).
    ``states`` is the number of states of the release, among which zeta is split.
    """
    microdata = read_state(path, state, config.plan.attributes)
    rng = secure_generator() if entropy is None else state_rng(entropy, state)
    plan = dataclasses.replace(config.plan, zeta=state_zeta(config.plan.zeta, states))
    release = protect(microdata, dataclasses.replace(config, plan=plan), rng=rng, rng_description={})
    staging = Path(staging)
    write_parts(release, staging, state, staging / f".{TABLES_FILE}.part-{state}")
    manifest = release.manifest
    return {
        "state": state,
        "establishments": manifest["establishments"],
        "tau": manifest["tau"][state],
        "zeta": plan.zeta,
        "mu_total": manifest["mu_total"],
        "mu": manifest["mu"],
        "grid": manifest["grid"],
        "solver": manifest["solver"],
        "ledger": manifest["ledger"],
    }


def protect_input(
    path: str | Path,
    config: Config,
    out: str | Path,
    *,
    seed: int | None,
    rng: str | None = None,
    engine: str = "local",
    scheduler: str | None = None,
    on_state: Callable[[str], None] | None = None,
    lifetime: dict | None = None,
    before_publish: Callable[[], None] | None = None,
) -> dict:
    """Protect every state of ``path`` into the release directory ``out``; returns the manifest.

    ``lifetime`` is the manifest's lifetime-budget section; ``before_publish`` runs when the release
    is complete in its staging directory, before it is moved into place (the ledger's commit).
    """
    states = input_states(path)
    rng_description = check_request(config, states, seed=seed, rng=rng, engine=engine)
    if rng_description["kind"] == "secure":
        entropy = None
    else:
        entropy = seed if seed is not None else int(np.random.SeedSequence().entropy)
    with staged_directory(out, before_publish=before_publish) as staging:
        arguments = (str(path), config, entropy, str(staging), len(states))
        if engine == "local":
            pieces = []
            for state in states:
                pieces.append(protect_one_state(arguments[0], state, *arguments[1:]))
                if on_state is not None:
                    on_state(state)
        else:
            pieces = _run_on_dask(states, arguments, scheduler, on_state)
        with (staging / TABLES_FILE).open("w") as tables:
            for index, state in enumerate(states):
                part = staging / f".{TABLES_FILE}.part-{state}"
                lines = part.read_text().splitlines(keepends=True)
                tables.writelines(lines if index == 0 else lines[1:])
                part.unlink()
        manifest = _manifest(config, pieces, rng_description, engine, scheduler)
        if lifetime is not None:
            manifest["lifetime"] = lifetime
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=float) + "\n")
    return manifest


def _run_on_dask(states, arguments, scheduler, on_state) -> list[dict]:
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None if scheduler else LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                   dashboard_address=None)
    try:
        with Client(scheduler or cluster) as client:
            futures = [client.submit(protect_one_state, arguments[0], state, *arguments[1:], key=f"gedp-state-{state}",
                                     pure=False) for state in states]
            for future in as_completed(futures):
                if on_state is not None:
                    on_state(future.key.removeprefix("gedp-state-"))
            return client.gather(futures)
    finally:
        if cluster is not None:
            cluster.close()


def _manifest(config: Config, pieces: list[dict], rng_description: dict, engine, scheduler) -> dict:
    plan = config.plan
    solver = {}
    for attribute in plan.attributes:
        reports = [piece["solver"][attribute] for piece in pieces]
        statuses = {r["status"] for r in reports}
        solver[attribute] = {
            "solver": ",".join(sorted({r["solver"] for r in reports})),
            "status": statuses.pop() if len(statuses) == 1 else "mixed: " + ",".join(sorted(statuses)),
            "kkt_residual": max(r["kkt_residual"] for r in reports),
            "iterations": max((r["iterations"] or 0) for r in reports),
        }
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
        "per_state": {piece["state"]: piece for piece in pieces},
        "versions": versions(),
        "files": {"protected_microdata": PROTECTED_FILE, "measurements": MEASUREMENTS_FILE, "qcew_tables": TABLES_FILE},
    }
