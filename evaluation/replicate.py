"""Protected copies of a state for experiments: measure and postprocess in memory, one child random
stream per replication (reproducible from one seed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from gedp.measure.workflows import MeasurementPlan, QueryPlan, measure
from gedp.postprocess.protect import protect_microdata
from gedp.synth.schema import public_columns


def child_streams(seed: int, count: int) -> list[np.random.Generator]:
    """Independent generators for ``count`` replications, all derived from ``seed``."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def protected_copy(microdata: pd.DataFrame, plan: MeasurementPlan, *, rng: np.random.Generator) -> pd.DataFrame:
    """One protected release of ``microdata`` under ``plan`` (estimated variances, auto solver)."""
    measurements = measure(microdata, plan, rng=rng)
    protected, _ = protect_microdata(
        {a: measurements.for_attribute(a) for a in plan.attributes}, microdata[public_columns(microdata)]
    )
    return protected


def scaled_plan(plan: MeasurementPlan, factor: float) -> MeasurementPlan:
    """The same shares of the budget, total mu multiplied by ``factor`` (no cap)."""
    queries = tuple(QueryPlan(q.by, {a: mu * factor for a, mu in q.mu.items()}) for q in plan.queries)
    return dataclasses.replace(plan, queries=queries, cap=None)
