"""The release pipeline of one state: validated microdata -> measurements -> protected microdata,
QCEW tables and job frame, handed to the release writer (``gedp.release``).

No mathematics lives here; this module wires measure and postprocess.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from gedp.config import Config
from gedp.measure.jobframe import EMPLOYMENT, FamilySpec, add_job_counts
from gedp.measure.queries import Groupings
from gedp.measure.workflows import Measurements, count_steps, measure
from gedp.postprocess.jobframe import job_table, protect_family
from gedp.postprocess.models import PostprocessOptions
from gedp.postprocess.protect import protect_microdata
from gedp.postprocess.rounding import Rounder
from gedp.postprocess.tabulate import qcew_tables
from gedp.postprocess.wls import WLSResult, combined_report
from gedp.release.format import StateRelease, release_order
from gedp.synth.schema import InputError, public_columns


def total_steps(config: Config) -> int:
    """Progress steps of ``protect``: one per mechanism call and one per attribute solved, plus tables
    (and the rounding of an integer release)."""
    return count_steps(config.plan) + len(config.plan.attributes) + 1 + config.integer


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
    rng_description: dict | None = None,
    on_step: Callable[[str], None] | None = None,
    jobs: pd.DataFrame | None = None,
    on_measured: Callable[[Measurements], None] | None = None,
    on_protected: Callable[[pd.DataFrame], None] | None = None,
    tables: bool = True,
) -> StateRelease:
    """Measure validated microdata with the config's plan and postprocess it into a release's contents.

    Rows are put in release order (public keys) first, so every output is in that order. A plan
    with job families needs ``jobs``, the job table of these establishments (``synth.jobs``).
    ``rng_description`` is not used: the release's manifest describes the generator
    (``gedp.release.manifest.release_manifest``). ``on_measured`` receives the measurements as soon
    as they are complete and ``on_protected`` the protected microdata once final (neither is changed
    afterwards), so a caller can write them while the rest is computed. ``tables=False``: no QCEW
    tables (``StateRelease.tables`` None), for a caller that reads only the other outputs (the
    pipeline audit); they are a function of the protected microdata alone.
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
    if on_measured is not None:
        on_measured(measurements)

    # each attribute is rounded as soon as it is solved, so the wage fit (last) takes the rounded
    # employment the release holds, and `gedp tabulate --moe` recomputes that very fit
    rounder = Rounder(public) if config.integer else None
    protected, solver_results = _postprocess(measurements, public, config, plan, step, rounder, groupings)
    rounding = None
    if rounder is not None:
        rounding = {attribute: rounder.report[attribute] for attribute in config.attributes}
        protected = protected.astype({attribute: np.int64 for attribute in rounding})
        step("controlled rounding")
    if on_protected is not None:
        on_protected(protected)
    published = qcew_tables(protected, groupings) if tables else None
    step("QCEW tables")
    job_frame = None
    if families:
        job_frame = _job_frame(families, measurements, public, protected, config, groupings, step, solver_results)
    return StateRelease(protected, measurements, solver_results, published, families, rounding, job_frame)


def _postprocess(measurements: Measurements, public: pd.DataFrame, config: Config, plan, step: Callable[[str], None],
                 rounder: Rounder | None, groupings: Groupings) -> tuple[pd.DataFrame, dict[str, WLSResult]]:
    """The protected microdata of the config's attributes and each attribute's solver result."""
    protected, solver_results = protect_microdata(
        {attribute: measurements.for_attribute(attribute) for attribute in config.attributes},
        public,
        PostprocessOptions.from_config(config),
        on_step=step,
        finish=rounder,
        groupings=groupings,
    )
    return protected, solver_results


def _job_frame(families: list[FamilySpec], measurements: Measurements, public: pd.DataFrame,
               protected: pd.DataFrame, config: Config, groupings: Groupings, step: Callable[[str], None],
               solver_results: dict[str, WLSResult]) -> pd.DataFrame:
    """The protected job frame of the plan's families; each family's solver result is added to
    ``solver_results``."""
    categories = [attribute for spec in families for attribute in spec.attributes]
    answers = {attribute: measurements.for_attribute(attribute) for attribute in categories}
    counts = []
    for spec in families:
        family_counts, results = protect_family(spec, answers, public, protected[EMPLOYMENT].to_numpy(dtype=float),
                                                solver=config.solver, integer=config.integer, groupings=groupings,
                                                on_step=step)
        counts.append((spec, family_counts))
        solver_results[spec.family] = family_result(list(results.values()))
    frame = job_table(protected["estab_id"], counts)
    step("job frame")
    return frame


def family_result(results: list[WLSResult]) -> WLSResult:
    """One solver result for a job family: its categories' ``combined_report``, summed objective and
    pinned establishments, largest negative clipped."""
    return WLSResult(values=np.empty(0), seconds=0.0, **combined_report([r.report() for r in results]),
                     objective=math.fsum(r.objective for r in results),
                     fixed_zero=sum(r.fixed_zero for r in results),
                     clipped_negative=max(r.clipped_negative for r in results))
