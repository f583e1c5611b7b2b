"""Measurement workflows: the identity query by the psi-mechanism, then the group-by queries by pnc
(workflow "pnc") or by the psi-mechanism as well (workflow "psi")."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd

from gedp.measure.answers import NoisyAnswer
from gedp.measure.budget import BudgetPlan
from gedp.measure.mechanisms import MAX_ZETA, MIN_ZETA, pnc_mechanism, pnc_tau, pnc_upper_bounds, psi_mechanism
from gedp.measure.neighbors import NeighborFunction, check_gamma
from gedp.measure.queries import IDENTITY, Groupings, query_name
from gedp.synth.schema import shown

WORKFLOWS = ("pnc", "psi")
#: Largest noise sd on the psi scale a plan may ask for (beyond it variances overflow double precision);
#: a psi may allow less (``NeighborFunction.max_noise_sd``).
MAX_NOISE_SD = 1e6
#: Smallest gamma: the psi-mechanism's release grid is about gamma / 2^12, and psi of a total must
#: stay within 2^62 grid steps (at gamma 1e-6 the grid is 2^-32: sqrt of totals up to 1e18).
MIN_GAMMA = 1e-6


@dataclass(frozen=True)
class QueryPlan:
    """One group-by query and its mu per attribute (attributes absent here are not measured by it)."""

    by: tuple[str, ...]
    mu: Mapping[str, float]

    def __post_init__(self) -> None:
        repeated = next((c for i, c in enumerate(self.by) if c in self.by[:i]), None)
        if repeated is not None:
            raise ValueError(f"column '{repeated}' appears twice in query {self.name}")

    @property
    def name(self) -> str:
        return query_name(self.by)


@dataclass(frozen=True)
class MeasurementPlan:
    """What to measure and how: psi, gamma per attribute, queries with budgets, workflow, zeta, cap.

    ``states`` is the number of states of a release measured state by state: each state's pnc
    bounds then hold with probability (1 - zeta)^(1 / states), so all of them hold with 1 - zeta.
    """

    psi: NeighborFunction
    gammas: Mapping[str, float]
    queries: tuple[QueryPlan, ...]
    workflow: Literal["pnc", "psi"] = "pnc"
    zeta: float = 0.01
    cap: float | None = None
    states: int = 1

    def __post_init__(self) -> None:
        if self.workflow not in WORKFLOWS:
            raise ValueError(f"workflow {shown(self.workflow)} is unknown; choose one of {', '.join(WORKFLOWS)}")
        if not self.psi.releasable:
            raise ValueError(f"psi {self.psi.name} cannot be used in a release (no float error bound); use sqrt, log, "
                             "linear, sqrt-linear, or combined with rule min of sqrt (a = 0) and linear")
        for attribute, gamma in self.gammas.items():
            check_gamma(gamma)
            if not gamma >= MIN_GAMMA:
                raise ValueError(f"gamma of {attribute} ({gamma}) must be >= {MIN_GAMMA:g}: gamma 0 adds no noise "
                                 "and would release exact confidential values, and a smaller gamma's release grid "
                                 "cannot hold psi of large totals")
        largest_sd = min(MAX_NOISE_SD, self.psi.max_noise_sd)
        for q in self.queries:
            for attribute, mu in q.mu.items():
                if attribute in self.gammas and mu > 0 and self.gammas[attribute] / mu > largest_sd:
                    raise ValueError(
                        f"query {q.name} on {attribute}: noise sd gamma / mu ({self.gammas[attribute] / mu:.3g}) "
                        f"exceeds {largest_sd:g}, the most psi {self.psi.name} allows; beyond it the noise hides "
                        "everything and the estimates or variances overflow"
                    )
        names = [q.name for q in self.queries]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"query {repeated[0]} appears more than once in the plan")
        for q in self.queries:
            unknown = sorted(set(q.mu) - set(self.gammas))
            if unknown:
                raise ValueError(f"query {q.name} has a budget for '{unknown[0]}', which has no gamma")
        if self.workflow == "pnc":
            identity = self.identity_plan
            lacking = [a for a in self.attributes if identity is None or a not in identity.mu]
            if lacking:
                raise ValueError(
                    f"workflow pnc needs the identity query for every attribute; '{lacking[0]}' has none"
                )
        if not MIN_ZETA <= self.zeta <= MAX_ZETA:
            raise ValueError(f"zeta ({self.zeta}) must be in [{MIN_ZETA:g}, {MAX_ZETA:g}]")
        if isinstance(self.states, bool) or not isinstance(self.states, int) or self.states < 1:
            raise ValueError(f"states ({self.states}) must be a whole number >= 1")

    @property
    def zeta_per_state(self) -> float:
        """Each state's zeta, 1 - (1 - zeta)^(1 / states), computed without cancellation."""
        return -math.expm1(math.log1p(-self.zeta) / self.states)

    @property
    def attributes(self) -> tuple[str, ...]:
        """Attributes measured by at least one query."""
        return tuple(a for a in self.gammas if any(a in q.mu for q in self.queries))

    @property
    def identity_plan(self) -> QueryPlan | None:
        return next((q for q in self.queries if q.by == IDENTITY), None)

    def restrict(self, attributes: tuple[str, ...]) -> MeasurementPlan:
        """The same plan measuring only ``attributes`` (queries left without any are dropped)."""
        unknown = [a for a in attributes if a not in self.attributes]
        if unknown:
            raise ValueError(f"the plan does not measure '{unknown[0]}'")
        queries = tuple(QueryPlan(q.by, {a: mu for a, mu in q.mu.items() if a in attributes}) for q in self.queries)
        return replace(self, gammas={a: self.gammas[a] for a in attributes},
                       queries=tuple(q for q in queries if q.mu))

    def budget(self) -> BudgetPlan:
        """A fresh budget plan (checked against the cap) for one run of this plan."""
        planned = {(q.name, a): mu for q in self.queries for a, mu in q.mu.items()}
        return BudgetPlan(planned, cap=self.cap)


@dataclass
class Measurements:
    """All noisy answers of one run, with the budget ledger and the public pnc quantities."""

    answers: list[NoisyAnswer]
    budget: BudgetPlan
    tau: float | None = None
    upper_bounds: dict[str, np.ndarray] = field(default_factory=dict)

    def for_attribute(self, attribute: str) -> list[NoisyAnswer]:
        return [a for a in self.answers if a.query.attribute == attribute]


def count_steps(plan: MeasurementPlan) -> int:
    """Number of mechanism calls of ``measure`` (for progress display)."""
    return sum(len(q.mu) for q in plan.queries)


def measure(
    microdata: pd.DataFrame,
    plan: MeasurementPlan,
    *,
    rng: np.random.Generator,
    on_step: Callable[[str], None] | None = None,
    groupings: Groupings | None = None,
) -> Measurements:
    """Answer every query of ``plan`` on validated microdata with the plan's workflow.

    The budget plan is checked against its cap before any noise is drawn. In workflow "pnc" all
    identity answers come first; tau counts one upper bound per establishment and measured
    attribute; every other query is answered by pnc with clip levels from those identity answers.
    ``groupings``: of the microdata's public columns, shared with postprocessing.
    """
    budget = plan.budget()
    step = on_step or (lambda description: None)
    grouping = groupings or Groupings(microdata)
    groupings_of = {q.by: grouping(q.by) for q in plan.queries}
    answers: list[NoisyAnswer] = []
    identity = plan.identity_plan
    identity_answers: dict[str, NoisyAnswer] = {}
    if identity is not None:
        for attribute in identity.mu:
            answer = psi_mechanism(
                microdata[attribute].to_numpy(),
                groupings_of[IDENTITY],
                attribute=attribute,
                psi=plan.psi,
                gamma=plan.gammas[attribute],
                mu=budget.spend(identity.name, attribute),
                rng=rng,
            )
            budget.charge(identity.name, attribute, answer.mu)
            identity_answers[attribute] = answer
            answers.append(answer)
            step(f"identity on {attribute}")

    tau = None
    upper_bounds: dict[str, np.ndarray] = {}
    if plan.workflow == "pnc":
        tau = pnc_tau(plan.zeta_per_state, len(plan.attributes) * len(microdata))
        upper_bounds = {a: pnc_upper_bounds(identity_answers[a], plan.psi, tau=tau) for a in plan.attributes}

    for q in plan.queries:
        if q.by == IDENTITY:
            continue
        for attribute in q.mu:
            common = dict(attribute=attribute, psi=plan.psi, gamma=plan.gammas[attribute],
                          mu=budget.spend(q.name, attribute), rng=rng)
            values = microdata[attribute].to_numpy()
            if plan.workflow == "pnc":
                answer = pnc_mechanism(values, groupings_of[q.by], upper_bounds[attribute], **common)
            else:
                answer = psi_mechanism(values, groupings_of[q.by], **common)
            budget.charge(q.name, attribute, answer.mu)
            answers.append(answer)
            step(f"{q.name} on {attribute}")
    return Measurements(answers=answers, budget=budget, tau=tau, upper_bounds=upper_bounds)
