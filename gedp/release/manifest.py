"""The release manifest: one type and one builder, for every command that writes a release.

Every value is public: configuration, counts of establishments and states (public), what the
mechanisms charged, grids, tau, and solver figures computed from noisy answers only. It holds no
path, no timing and no clock time finer than the date.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypedDict

from gedp.config import Config
from gedp.measure.budget import compose
from gedp.measure.conversions import privacy_statement
from gedp.measure.design import QuarterDesign
from gedp.measure.jobframe import EMPLOYMENT, FamilySpec
from gedp.measure.rng import is_publishable
from gedp.measure.workflows import MeasurementPlan
from gedp.postprocess.wls import combined_report
from gedp.release.format import JOBS_FILE, MEASUREMENTS_FILE, PROTECTED_FILE, QUARTER_KEY, TABLES_FILE, StateRelease
from gedp.release.versions import versions

#: The wage models of the postprocessing: wages informed by the protected employment
#: (postprocess.wages), or the weighted least squares every attribute gets.


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
    privacy: dict[str, Any]  # mu_total and each attribute's mu as mu, rho and epsilon(delta) (psi-neighbours)
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
    quarters: list[str]  # a panel release's quarters, e.g. ["2016Q1", "2016Q2"] (its rows carry a quarter key)
    design: dict[str, Any]  # a panel release's noise design across quarters (measure.design)
    mu_quarter: float  # a panel release: the most any quarter spent (mu_total: an establishment in every quarter)
    over_cap: str  # a panel release whose mu_total is over mu_cap: how the user allowed it
    per_quarter: dict[str, dict[str, Any]]  # a panel release: each quarter's own manifest


def state_section(state: str, contents: StateRelease, zeta: float) -> dict:
    """One state's section of the manifest (``per_state``): what its mechanisms charged per query and
    attribute (a job family's categories under the family's name), its grids, solvers and charges."""
    categories = {attribute: spec.family for spec in contents.families for attribute in spec.attributes}
    budget = contents.measurements.budget
    mu_by_query: dict[str, dict[str, list[float]]] = {}
    for entry in budget.ledger:
        attribute = categories.get(entry["attribute"], entry["attribute"])
        mu_by_query.setdefault(entry["query"], {}).setdefault(attribute, []).append(entry["mu"])
    grids: dict[str, dict[str, float]] = {}
    for answer in contents.measurements.answers:
        attribute = categories.get(answer.query.attribute, answer.query.attribute)
        grids.setdefault(answer.query.name, {})[attribute] = answer.grid
    return {
        "state": state,
        "establishments": int(len(contents.protected)),
        "tau": contents.measurements.tau,
        "zeta": zeta,
        "mu_total": budget.spent,
        "mu": {query: {attribute: mus[0] if len(mus) == 1 else compose(mus) for attribute, mus in by.items()}
               for query, by in mu_by_query.items()},
        "grid": grids,
        "solver": {attribute: result.report() for attribute, result in contents.solver_results.items()},
        "ledger": budget.ledger,
        **({"rounding": contents.rounding} if contents.rounding is not None else {}),
        **({"jobs": job_section(contents.families)} if contents.families else {}),
    }


def job_section(families: list[FamilySpec]) -> dict:
    """A state's job section: each family's worker columns and number of categories (public)."""
    return {"file": JOBS_FILE, "adds_up_to": EMPLOYMENT,
            "families": {spec.family: {"columns": list(spec.columns), "categories": len(spec.categories)}
                         for spec in families}}


def release_manifest(config: Config, pieces: list[dict], rng_description: dict, engine: str,
                     scheduler: str | None) -> Manifest:
    """The manifest of a release protected state by state: ``pieces`` are the states' sections
    (``state_section``)."""
    return {
        **_release_identity(config, rng_description),
        **_plan_section(config.plan, pieces),
        **_budget_section(config.plan, pieces),
        **_run_section(config, pieces, rng_description, engine if scheduler is None else f"{engine} ({scheduler})"),
        **_files_section(config, pieces),
    }


def _release_identity(config: Config, rng_description: dict) -> dict:
    """Version, date, publishability and the config as loaded."""
    return {
        "gedp_version": versions()["gedp"],
        "created_date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "publishable": is_publishable(rng_description),
        "config_name": config.name,
        "config": config.raw,
    }


def _plan_section(plan: MeasurementPlan, pieces: list[dict]) -> dict:
    """The establishments and states measured, and the plan's neighbor function and error bounds."""
    return {
        "establishments": sum(piece["establishments"] for piece in pieces),
        "states": [piece["state"] for piece in pieces],
        "workflow": plan.workflow,
        "psi": plan.psi.params(),
        "gammas": dict(plan.gammas),
        "zeta": plan.zeta,
        "zeta_per_state": pieces[0]["zeta"],
        "tau": {piece["state"]: piece["tau"] for piece in pieces},
    }


def _budget_section(plan: MeasurementPlan, pieces: list[dict]) -> dict:
    """What the release spent: parallel composition across states, so the largest state's charges."""
    # Each state's records are measured by its own mechanisms only, so the release spends the
    # largest of the states' charges (each composed from what its noise cost).
    mu_by_query: dict[str, dict[str, float]] = {}
    for piece in pieces:
        for query, by_attribute in piece["mu"].items():
            for attribute, mu in by_attribute.items():
                current = mu_by_query.setdefault(query, {}).get(attribute, 0.0)
                mu_by_query[query][attribute] = max(current, mu)
    mu_total = max(piece["mu_total"] for piece in pieces)
    return {
        "mu_total": mu_total,
        "mu_planned_total": plan.budget().total,
        "mu_cap": plan.cap,
        "mu": mu_by_query,
        "privacy": privacy_statement(mu_total, attribute_mu(mu_by_query)),
        "grid": pieces[0]["grid"],
        "ledger": {piece["state"]: piece["ledger"] for piece in pieces},
        "composition": "parallel across states (every query includes state); each state spends mu_total",
    }


def attribute_mu(mu_by_query: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each attribute's (or job family's) mu: its queries' charges composed as sqrt(sum of mu^2),
    the guarantee for that attribute of an establishment over its own queries."""
    charges: dict[str, list[float]] = {}
    for by_attribute in mu_by_query.values():
        for attribute, mu in by_attribute.items():
            charges.setdefault(attribute, []).append(mu)
    return {attribute: compose(mus) for attribute, mus in charges.items()}


def _run_section(config: Config, pieces: list[dict], rng_description: dict, engine: str) -> dict:
    """How the release was computed: generator, engine, variances, solvers, rounding, states, versions."""
    per_state = ("its own secure generator" if rng_description["kind"] == "secure"
                 else "SeedSequence([seed or OS entropy, *ASCII bytes of the state code])")
    return {
        "rng": rng_description | {"per_state": per_state},
        "engine": engine,
        "variance_mode": config.variance_mode,
        "solver": {attribute: combined_report([piece["solver"][attribute] for piece in pieces])
                   for attribute in config.plan.attributes},
        "integer": config.integer,
        "per_state": {piece["state"]: piece for piece in pieces},
        "versions": versions(),
    }


def _files_section(config: Config, pieces: list[dict]) -> dict:
    """The release's files, and its job section (releases with a job frame)."""
    files = {"protected_microdata": PROTECTED_FILE, "measurements": MEASUREMENTS_FILE, "qcew_tables": TABLES_FILE}
    if config.jobs is None:
        return {"files": files}
    return {"files": {**files, "protected_jobs": JOBS_FILE}, "jobs": _jobs_section(pieces)}


def _jobs_section(pieces: list[dict]) -> dict:
    """The job section of a release protected state by state: the families' worker columns and, per
    state, their numbers of categories."""
    first = pieces[0]["jobs"]
    return {**first, "families": {family: {"columns": spec["columns"],
                                           "categories": {p["state"]: p["jobs"]["families"][family]["categories"]
                                                          for p in pieces}}
                                  for family, spec in first["families"].items()}}


def panel_manifest(quarters: dict[str, Manifest], design: QuarterDesign, establishments: int,
                   over_cap: bool = False) -> Manifest:
    """The manifest of a panel release from its quarters' manifests (kept whole under
    ``per_quarter``): the panel's spending by the ``design`` (``QuarterDesign.panel_mu`` of the
    largest quarter's), for an establishment present in every quarter of the panel, and the config's
    cap on it (``mu_cap``; ``over_cap``: the panel spends more, as the user allowed); ``establishments``
    is the number of distinct establishments over the quarters."""
    first = next(iter(quarters.values()))
    count = len(quarters)
    mu_quarter = max(manifest["mu_total"] for manifest in quarters.values())
    attributes = {attribute: design.panel_mu(max(m["privacy"]["attributes"][attribute]["mu"]
                                                 for m in quarters.values()), count)
                  for attribute in first["privacy"]["attributes"]}
    mu_total = design.panel_mu(mu_quarter, count)
    shared = ("gedp_version", "created_date", "config_name", "config", "workflow", "psi", "gammas", "zeta",
              "variance_mode", "engine", "integer", "versions")
    return {
        **{key: first[key] for key in shared},  # type: ignore[literal-required, typeddict-item]
        "publishable": all(manifest["publishable"] for manifest in quarters.values()),
        "establishments": establishments,
        "states": sorted({state for manifest in quarters.values() for state in manifest["states"]}),
        "solver": {attribute: combined_report([m["solver"][attribute] for m in quarters.values()])
                   for attribute in first["solver"]},
        "quarters": list(quarters),
        "design": design.describe(),
        "mu_quarter": mu_quarter,
        "mu_total": mu_total,
        "mu_cap": first["mu_cap"],
        **({"over_cap": "allowed (--allow-over-cap)"} if over_cap else {}),
        "privacy": privacy_statement(mu_total, attributes),
        "composition": f"{design.name} quarters: an establishment in every one of the {count} quarters spends "
                       f"mu_total; one in k quarters spends sqrt(k) * mu_quarter",
        "files": {**first["files"], "quarter_key": QUARTER_KEY},
        "per_quarter": dict(quarters),
    }
