"""The planner's public stand-in (a state synthesized from the published QCEW file, with its published
target cells) and the search's analytic predictions on it (``gedp.planning.search``, step 2): whole
configs, and the employment and wage allocations, in batches on the machine's cores."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from gedp.config import Config, parse_config
from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import IDENTITY, Groupings
from gedp.measure.workflows import measure
from gedp.planning import shapes
from gedp.planning.predict import TargetCells, predicted_errors, prepared_answers, target_cells
from gedp.planning.rule import EMPLOYMENT, WAGE, Errors
from gedp.planning.shapes import Allocation, Shape
from gedp.planning.workers import parallel_map
from gedp.synth.establishments import synthesize_state
from gedp.synth.qcew import PublishedState
from gedp.synth.schema import public_columns

#: The wage share at which allocations are predicted first.
REFERENCE_WAGE_SHARE = 0.15
#: Seed of the stand-in's synthesis and of its simulated measurements (public data only).
STANDIN_SEED = 1


@dataclass(frozen=True)
class StandIn:
    """A public stand-in for the state: synthesized from its published file, with the target cells
    (``cells``: a sample for the analytic prediction; ``all_cells``: every one, for simulated
    releases, whose cost hardly grows with the cells; None: the sample)."""

    microdata: pd.DataFrame
    cells: list[TargetCells]
    source: str
    all_cells: list[TargetCells] | None = None

    @cached_property
    def groupings(self) -> Groupings:
        """The groupings of the stand-in's public columns, shared by its measurements and solves."""
        return Groupings(self.microdata[public_columns(self.microdata)])


def stand_in(published: PublishedState, source: str, levels: Sequence[int], seed: int = STANDIN_SEED) -> StandIn:
    """The stand-in state synthesized from ``published`` and its published target cells."""
    microdata = synthesize_state(published, rng=np.random.default_rng(seed))
    attributes = [EMPLOYMENT, "m2emp", WAGE]
    standin = StandIn(microdata, target_cells(microdata, published, levels, attributes, seed=seed), source,
                      target_cells(microdata, published, levels, attributes, max_cells=None))
    for by in (IDENTITY, *shapes.QUERY_LABELS):  # grouped once, before the workers that share them start
        standin.groupings(by)
    return standin


def _answers(standin: StandIn, config: Config, *, smoothed: bool) -> dict[str, list[NoisyAnswer]]:
    """One seeded measurement of the stand-in under ``config``, prepared as the margins take it
    (``smoothed``: months smoothed as the config says; else as measured, which the wage fit needs)."""
    measurements = measure(standin.microdata, config.plan, rng=np.random.default_rng(STANDIN_SEED),
                           groupings=standin.groupings)
    answers = {a: measurements.for_attribute(a) for a in config.plan.attributes}
    if not smoothed:
        return answers
    public = standin.microdata[public_columns(standin.microdata)]
    return prepared_answers(answers, config.variance_mode, config.plan.psi, public)


def predict_config(standin: StandIn, config: Config, attributes: Sequence[str]) -> Errors:
    """Predicted median relative errors per target level of ``attributes`` under ``config``."""
    wage_psi = config.plan.psi if config.wages == "employment" else None
    return predicted_errors(_answers(standin, config, smoothed=True), standin.microdata, standin.cells, attributes,
                            wage_psi)


def _rescaled(answer: NoisyAnswer, mu: float) -> NoisyAnswer:
    """A pnc answer as if measured at ``mu``: its variance is (Delta_g / mu)^2."""
    ratio = answer.mu / mu
    return replace(answer, variance=answer.variance * ratio**2, sd=answer.sd * ratio, mu=mu)


def shape_config(shape: Shape, mu_total: float, wage_share: float, base: Config) -> Config:
    return parse_config(shapes.config_mapping(shape, mu_total, wage_share, base.raw), "<plan>")


Measured = tuple[dict[str, list[NoisyAnswer]], float]  # prepared answers at one identity share, a month's mu


@dataclass
class Predictor:
    """The search's predictions, run in batches on the machine's cores: whole configs (the base plan,
    ``recommended``), wage allocations and employment allocations mixed in one pool, largest first.
    Employment allocations with the same identity mu share one measurement (``measured``, made in
    this process before the workers fork)."""

    standin: StandIn
    base: Config
    mu_total: float
    step: Callable[[str], None]
    measured: dict[float, Measured] = field(default_factory=dict)

    def run(self, configs: Sequence[tuple[Config, Sequence[str], str]] = (), wages: Sequence[Allocation] = (),
            employment: Sequence[Allocation] = ()) -> tuple[list[Errors], dict[Allocation, Errors],
                                                            dict[Allocation, Errors]]:
        """Errors of ``configs`` ((config, attributes, label)), of the wage allocations and of the
        employment allocations at the reference wage share (``gedp.planning.search``, step 2)."""
        jobs = [("config", (config, attributes)) for config, attributes, _ in configs]
        jobs += [("wage", self.wage_config(allocation)) for allocation in wages]
        jobs += [("allocation", (self._measure(allocation), allocation)) for allocation in employment]
        labels = [label for *_, label in configs] + [f"wages: {a.label}" for a in wages] + [
            f"employment: {a.label}" for a in employment]
        done = parallel_map(_job, (self.standin, self.measured), jobs,
                            on_result=lambda index, _: self.step(labels[index]))
        count = len(configs)
        return (done[:count], dict(zip(wages, done[count:count + len(wages)])),
                dict(zip(employment, done[count + len(wages):])))

    def wage_config(self, allocation: Allocation) -> Config:
        """The config a wage allocation is predicted under: employment by the shipped five queries."""
        return shape_config(Shape(Allocation(shapes.query_sets()[0], 0.6), allocation), self.mu_total,
                            REFERENCE_WAGE_SHARE, self.base)

    def _measure(self, allocation: Allocation) -> float:
        """The key of the measurement of ``allocation``'s identity share, made once."""
        key = round(allocation.shares()[()], 9)
        if key not in self.measured:
            month_mu = self.mu_total * np.sqrt((1 - REFERENCE_WAGE_SHARE) / len(shapes.MONTHS))
            # the identity query at this share, every group-by query once (at a nominal mu, rescaled later)
            mus = {(): {m: month_mu * np.sqrt(key) for m in shapes.MONTHS},
                   **{by: {m: month_mu / 2 for m in shapes.MONTHS} for by in shapes.query_sets()[0]}}
            # a measurement of the public stand-in, never a release: capped at its own total
            total = math.sqrt(sum(mu**2 for by_attribute in mus.values() for mu in by_attribute.values()))
            config = parse_config(shapes.mapping_of(mus, self.base.raw, math.ceil(total * 1e4) / 1e4), "<measurement>")
            self.measured[key] = (_answers(self.standin, config, smoothed=True), month_mu)
        return key


def _job(context: tuple[StandIn, Mapping[float, Measured]], job: tuple[str, Any]) -> Errors:
    """One prediction of ``Predictor.run`` in a worker."""
    standin, measured = context
    kind, item = job
    if kind == "allocation":
        key, allocation = item
        return _allocation_errors((standin, *measured[key]), allocation)
    if kind == "wage":
        return _wage_errors(standin, item)
    return _predicted(standin, item)


def employment_errors(standin: StandIn, base: Config, mu_total: float, allocations: Sequence[Allocation],
                      step: Callable[[str], None]) -> dict[Allocation, Errors]:
    """Month-1 errors of every allocation at the reference wage share (``gedp.planning.search``, step 2)."""
    return Predictor(standin, base, mu_total, step).run(employment=allocations)[2]


def _allocation_errors(measured: tuple[StandIn, dict[str, list[NoisyAnswer]], float], allocation: Allocation) -> Errors:
    """Month-1 errors of one allocation from the measurement of its identity share (every group-by
    query's answers rescaled to the allocation's mu, the others left out)."""
    standin, answers, month_mu = measured
    shares = allocation.shares()
    chosen = {month: [a if a.query.is_identity else _rescaled(a, month_mu * np.sqrt(shares[tuple(a.query.by)]))
                      for a in month_answers if a.query.is_identity or shares.get(tuple(a.query.by), 0) > 0]
              for month, month_answers in answers.items()}
    return predicted_errors(chosen, standin.microdata, standin.cells, [EMPLOYMENT], None)


def wage_errors(standin: StandIn, base: Config, mu_total: float, allocations: Sequence[Allocation],
                step: Callable[[str], None]) -> dict[Allocation, Errors]:
    """Wage errors of every wage allocation at the reference wage share (employment measured by the
    shipped five queries)."""
    return Predictor(standin, base, mu_total, step).run(wages=allocations)[1]


def _wage_errors(standin: StandIn, config: Config) -> Errors:
    """Wage errors under ``config``, from its measurement as measured (which the wage fit needs)."""
    wage_psi = config.plan.psi if config.wages == "employment" else None
    return predicted_errors(_answers(standin, config, smoothed=False), standin.microdata, standin.cells, [WAGE],
                            wage_psi)


def _predicted(standin: StandIn, asked: tuple[Config, Sequence[str]]) -> Errors:
    """``predict_config`` of one (config, attributes) pair."""
    return predict_config(standin, *asked)
