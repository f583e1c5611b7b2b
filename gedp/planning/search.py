"""The planner's search: plan shapes scored by their predicted errors on a public stand-in.

1. The stand-in: a state synthesized from the published QCEW file (``synth.qcew``), and the
   published cells of the target levels.
2. Employment: allocations (``shapes.allocations``) are predicted at a reference budget, coarse
   to fine: every query set at the first identity share, then the best ``REFINED_SETS`` sets at
   the other shares, then the best sets with a county query at fine shares (``county_variants``).
   The group-by answers of allocations with the same identity mu come from one
   measurement, their pnc variances rescaled to each allocation's mu (exact: pnc's variance is
   (Delta_g / mu)^2 with Delta_g fixed by the identity answers). Wages: the wage allocations,
   likewise.
3. Errors scale as 1 / mu within an allocation, so every pair of allocations is scored at every
   wage share without new predictions (the grid judged at once); the best few are the finalists
   (and the best with months 2-3 measured apart, its employment predicted at its own budget).
4. The base plan, ``recommended`` and the finalists that could win are calibrated by simulated
   releases of the stand-in (``simulate``: the bounds and the wage prior's bias, which the analytic
   prediction leaves out; ``simulated_finalists``), judged again (a simulated finalist also at
   wage shares within SHARE_SHIFT of its own, ``shifted``), and the best of them is the plan.

Plans are judged by ``rule`` (the choice rule: levels weighted by their published cells, small
absolute losses tolerated, never behind ``recommended`` on the levels that carry most cells);
``recommended`` is itself a finalist, predicted and simulated like the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gedp.config import Config, load_config, parse_config
from gedp.errors import InputError
from gedp.evaluation.replicate import child_streams
from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import IDENTITY, Groupings
from gedp.measure.workflows import measure
from gedp.planning import shapes
from gedp.planning.predict import (
    QCEW_LEVELS,
    TargetCells,
    predicted_errors,
    prepared_answers,
    published_levels,
    target_cells,
)
from gedp.planning.rule import (
    EMPLOYMENT,
    REFERENCE_MARGIN,
    WAGE,
    Errors,
    Judgement,
    Rule,
    as_reference,
    kind_error,
    major_levels,
    preference,
    within,
)
from gedp.planning.shapes import Allocation, Shape
from gedp.planning.simulate import calibrated, pooled_medians, release_errors
from gedp.planning.workers import parallel_map
from gedp.synth.establishments import synthesize_state
from gedp.synth.qcew import PublishedState, read_qcew
from gedp.synth.schema import public_columns

#: The plan every search is measured against, and evaluated as a finalist.
REFERENCE = "recommended"
#: The wage share at which allocations are predicted first, and the shares searched.
REFERENCE_WAGE_SHARE = 0.15
WAGE_SHARES = tuple(np.round(np.arange(0.02, 0.501, 0.02), 2))
#: Pairs of allocations (at their best wage shares) that go on to the simulated releases, with the
#: best one measuring months 2-3 apart.
FINALISTS = 2
#: Query sets (per attribute) predicted at the other identity shares after the first pass, and the
#: sets without a county query given a small one.
REFINED_SETS = 2
#: Seed of the stand-in's synthesis and of its simulated measurements (public data only).
STANDIN_SEED = 1
#: The most quarters a budget is planned over (ten years).
MAX_QUARTERS = 40
#: Simulated releases of the stand-in per finalist and for the base plan (paired seeds), and their
#: seed: one of their own, apart from the evaluations' default (1), so that simulated releases that
#: check a prediction are independent of the releases that calibrated it.
SIMULATED_RELEASES = 3
SIMULATION_SEED = 2016
#: How far behind the best simulated finalist (in score, or in worst ratio) another finalist's proxy
#: errors may be and still be simulated (``simulated_finalists``).
SIMULATION_MARGIN = 0.03
#: How far a simulated finalist's wage share may be moved with its calibrated errors scaled as 1 / mu.
SHARE_SHIFT = 0.06


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


@dataclass(frozen=True)
class Candidate:
    shape: Shape
    wage_share: float
    judgement: Judgement
    errors: Errors
    analytic: Errors | None = None  # the analytic prediction, when ``errors`` is calibrated (or a proxy)
    simulated: bool = False  # whether ``errors`` is calibrated by simulated releases
    scaled_from: float | None = None  # the wage share whose calibrated errors were scaled to this one

    @property
    def score(self) -> float:
        return self.judgement.score

    @property
    def worst_ratio(self) -> float:
        """The largest predicted error / the base plan's, over the target levels and attributes."""
        return self.judgement.worst_ratio


@dataclass(frozen=True)
class PlanResult:
    """The chosen plan (a config mapping), its predictions beside the base plan's and ``recommended``'s
    (a finalist itself), the frontier of the finalists' shapes over the wage share, the rule that
    chose, and the search's figures. ``custom``: the agency set its own weights or targets."""

    config: dict[str, Any]
    chosen: Candidate
    base: Errors
    recommended: Candidate
    frontier: dict[str, list[tuple[float, float, float]]]  # label -> (wage share, employment, wage error)
    finalists: list[Candidate]
    mu_total: float
    source: str
    seconds: float
    rule: Rule
    quarters: int = 1
    custom: bool = False

    @property
    def tolerance(self) -> float:
        return self.rule.tolerance

    @property
    def acceptable(self) -> bool:
        """Whether the chosen plan is predicted within the rule's tolerances of the base plan at every
        target level and attribute (else no shape searched was: it is the least bad)."""
        return self.chosen.judgement.acceptable

    def worst(self) -> tuple[int, str, float]:
        """(level, "employment" or "wage", ratio): where the chosen plan is worst against the base plan."""
        (level, kind), ratio = max(ratios(self.chosen.errors, self.base, self.rule.kinds, self.rule.levels).items(),
                                   key=lambda item: item[1])
        return level, kind, ratio

    @property
    def mu_annual(self) -> float:
        """The budget the plan spreads over its quarters: sqrt(quarters) x the plan's mu per quarter."""
        return self.mu_total * math.sqrt(self.quarters)


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


def _config(shape: Shape, mu_total: float, wage_share: float, base: Config) -> Config:
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
        employment allocations at the reference wage share (module docstring, step 2)."""
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
        return _config(Shape(Allocation(shapes.query_sets()[0], 0.6), allocation), self.mu_total,
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
    """Month-1 errors of every allocation at the reference wage share (module docstring, step 2)."""
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


def best_allocations(errors: Mapping[Allocation, Errors], base: Errors, attribute: str,
                     count: int = REFINED_SETS, level_weights: Mapping[int, float] | None = None) -> list[Allocation]:
    """The best allocation of each of the ``count`` query sets whose best allocation has the lowest
    mean log error ratio to the base plan's for ``attribute``, levels weighted by ``level_weights``
    (default: the base plan's levels alike)."""
    rule = Rule(level_weights or dict.fromkeys(base, 1.0))
    kind = "wage" if attribute == WAGE else "employment"
    out: list[Allocation] = []
    for allocation in sorted(errors, key=lambda a: rule.attribute_score(errors[a], base, kind)):
        if all(allocation.groups != a.groups for a in out):
            out.append(allocation)
    return out[:count]


def best_sets(errors: Mapping[Allocation, Errors], base: Errors, attribute: str, count: int = REFINED_SETS,
              level_weights: Mapping[int, float] | None = None) -> list[tuple[tuple[str, ...], ...]]:
    """The ``count`` query sets whose best allocation is best (``best_allocations``)."""
    return [allocation.groups for allocation in best_allocations(errors, base, attribute, count, level_weights)]


def county_variants(errors: Mapping[Allocation, Errors], base: Errors, attribute: str,
                    county_shares: Sequence[float], level_weights: Mapping[int, float] | None = None
                    ) -> list[Allocation]:
    """The best allocations of the best sets without a county query and of the best set with one
    (each with NAICS-5 or county x NAICS-5 to take the county query's share from), with the county
    query at every share of ``county_shares`` below what the group-by queries other than the state
    query have."""
    finer = {a: e for a, e in errors.items() if any(g in a.groups for g in (shapes.NAICS5, shapes.CELL))}
    chosen = [*best_allocations({a: e for a, e in finer.items() if shapes.COUNTY not in a.groups}, base, attribute,
                                level_weights=level_weights),
              *best_allocations({a: e for a, e in finer.items() if shapes.COUNTY in a.groups}, base, attribute, 1,
                                level_weights)]
    return [allocation.with_county(share) for allocation in chosen for share in county_shares
            if share < allocation.group_share()]


def coarse_to_fine(predict: Callable[[list[Allocation]], dict[Allocation, Errors]],
                   sets: Sequence[tuple[tuple[str, ...], ...]], shares: Sequence[float],
                   state_shares: Sequence[float], base: Errors, attribute: str,
                   county_shares: Sequence[float] = (), level_weights: Mapping[int, float] | None = None
                   ) -> dict[Allocation, Errors]:
    """Every set at the first identity share, then the best sets at the other shares, then the best
    sets without a county query with a small one at each of ``county_shares`` (module docstring,
    step 2); sets ranked with levels weighted by ``level_weights``."""
    errors = predict(shapes.allocations(sets, shares[:1], state_shares))
    errors.update(predict(refined(errors, shares, state_shares, base, attribute, level_weights)))
    if county_shares:
        errors.update(predict(county_variants(errors, base, attribute, county_shares, level_weights)))
    return errors


def refined(errors: Mapping[Allocation, Errors], shares: Sequence[float], state_shares: Sequence[float],
            base: Errors, attribute: str, level_weights: Mapping[int, float] | None) -> list[Allocation]:
    """The best sets of ``errors`` at the identity shares after the first, those not predicted yet."""
    chosen = shapes.allocations(best_sets(errors, base, attribute, level_weights=level_weights), shares[1:],
                                state_shares)
    return [allocation for allocation in chosen if allocation not in errors]


def searched(predictor: Predictor, reference: Config, rule: Rule) -> tuple[Errors, Errors, dict, dict]:
    """The base plan's and the reference's analytic errors, and those of the employment and wage
    allocations searched coarse to fine (``coarse_to_fine``'s steps, both attributes in each batch):
    every set at the first identity share, then the best sets at the other shares, then the best
    employment sets with a small county query."""
    configs = [(predictor.base, [EMPLOYMENT, WAGE], "base plan"), (reference, [EMPLOYMENT, WAGE], REFERENCE)]
    wage_sets = (shapes.wage_sets(), shapes.WAGE_IDENTITY_SHARES, shapes.STATE_SHARES[:1])
    employment_sets = (shapes.query_sets(), shapes.IDENTITY_SHARES, shapes.STATE_SHARES)
    (base, reference_errors), wages, employment = predictor.run(
        configs, shapes.allocations(wage_sets[0], wage_sets[1][:1], wage_sets[2]),
        shapes.allocations(employment_sets[0], employment_sets[1][:1], employment_sets[2]))
    base = scaled(base, predictor.base.plan.budget().total / predictor.mu_total)
    weights = rule.level_weights
    _, more_wages, more_employment = predictor.run(
        wages=refined(wages, *wage_sets[1:], base, WAGE, weights),
        employment=refined(employment, *employment_sets[1:], base, EMPLOYMENT, weights))
    wages.update(more_wages)
    employment.update(more_employment)
    employment.update(predictor.run(employment=county_variants(employment, base, EMPLOYMENT, shapes.COUNTY_SHARES,
                                                                 weights))[2])
    return base, reference_errors, employment, wages


def scaled(errors: Errors, factor: float) -> Errors:
    return {level: {a: e * factor for a, e in by.items()} for level, by in errors.items()}


def ratios(errors: Errors, base: Errors, kinds: Sequence[str], levels: Sequence[int] | None = None
           ) -> dict[tuple[int, str], float]:
    """Error / the base plan's error per (level, kind) of ``kinds`` ("employment": month 1's, or the
    months' mean under a shape measuring them apart; "wage") at ``levels`` (default: the base's)."""
    return {(level, kind): kind_error(errors[level], kind) / kind_error(base[level], kind)
            for kind in kinds for level in (base if levels is None else levels)}


def ranked_by(candidates: Sequence[Candidate]) -> list[Candidate]:
    """``candidates`` in the rule's order (``rule.preference`` of their judgements)."""
    return sorted(candidates, key=lambda c: preference(c.judgement))


def combinations(employment: Mapping[Allocation, Errors], wages: Mapping[Allocation, Errors], base: Errors,
                 rule: Rule) -> list[Candidate]:
    """Every pair of allocations at every wage share, errors scaled from the reference share as
    1 / mu; in the rule's order (judged all at once)."""
    levels = list(base)
    shares = np.array(WAGE_SHARES, dtype=float)
    e_pairs, w_pairs = list(employment), list(wages)
    e_errors = np.array([[employment[a][level][EMPLOYMENT] for level in levels] for a in e_pairs])
    w_errors = np.array([[wages[a][level][WAGE] for level in levels] for a in w_pairs])
    e_scaled = e_errors[None, :, None, :] * np.sqrt((1 - REFERENCE_WAGE_SHARE) / (1 - shares))[:, None, None, None]
    w_scaled = w_errors[None, None, :, :] * np.sqrt(REFERENCE_WAGE_SHARE / shares)[:, None, None, None]
    grid = (len(shares), len(e_pairs), len(w_pairs), len(levels))
    e_rows = np.broadcast_to(e_scaled, grid).reshape(-1, len(levels))
    w_rows = np.broadcast_to(w_scaled, grid).reshape(-1, len(levels))
    judgements = rule.judge_all(e_rows, w_rows, base, levels)
    out = []
    for index, judgement in enumerate(judgements):
        s, e, w = np.unravel_index(index, grid[:3])
        errors = {level: {EMPLOYMENT: float(e_rows[index, k]), WAGE: float(w_rows[index, k])}
                  for k, level in enumerate(levels)}
        out.append(Candidate(Shape(e_pairs[e], w_pairs[w]), float(shares[s]), judgement, errors))
    return ranked_by(out)


def frontier(candidates: Sequence[Candidate], shapes_shown: Sequence[Shape], level: int) -> dict:
    """Per shape: (wage share, employment error, wage error) at ``level`` as the wage share moves."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for candidate in sorted(candidates, key=lambda c: c.wage_share):
        if candidate.shape in shapes_shown:
            out.setdefault(candidate.shape.describe(), []).append(
                (candidate.wage_share, candidate.errors[level][EMPLOYMENT], candidate.errors[level][WAGE]))
    return out


def search_steps() -> int:
    """Progress steps of ``make_plan``."""
    employment = shapes.allocations(shapes.query_sets(), shapes.IDENTITY_SHARES[:1])
    wages = shapes.allocations(shapes.wage_sets(), shapes.WAGE_IDENTITY_SHARES[:1], shapes.STATE_SHARES[:1])
    refined = REFINED_SETS * (len(shapes.IDENTITY_SHARES) - 1) * len(shapes.STATE_SHARES) + REFINED_SETS * (
        len(shapes.WAGE_IDENTITY_SHARES) - 1) + (REFINED_SETS + 1) * len(shapes.COUNTY_SHARES)
    return 3 + len(employment) + len(wages) + refined + 1 + (FINALISTS + 1) + 2


def _finalists(standin: StandIn, base: Config, ranked: Sequence[Candidate], mu_total: float, base_errors: Errors,
               rule: Rule, step: Callable[[str], None]) -> list[Candidate]:
    """The best FINALISTS shapes (their errors scaled from the search's predictions, which the
    simulated releases then calibrate), and the best with months 2-3 apart (its employment
    predicted at its own budget; its wages are the best's)."""
    chosen: list[Candidate] = []
    for candidate in ranked:
        if all(candidate.shape != c.shape for c in chosen):
            chosen.append(candidate)
        if len(chosen) == FINALISTS:
            break
    apart = replace(chosen[0], shape=replace(chosen[0].shape, months_apart=True))
    months = predict_config(standin, _config(apart.shape, mu_total, apart.wage_share, base), [EMPLOYMENT, "m2emp"])
    step(f"months apart: {apart.shape.describe()}")
    errors = {level: {**months[level], WAGE: apart.errors[level][WAGE]} for level in months}
    return [*chosen, replace(apart, judgement=rule.judge(errors, base_errors), errors=errors)]


def _predicted(standin: StandIn, asked: tuple[Config, Sequence[str]]) -> Errors:
    """``predict_config`` of one (config, attributes) pair."""
    return predict_config(standin, *asked)


def calibrated_errors(standin: StandIn, config: Config, analytic: Errors) -> Errors:
    """``analytic`` (predicted errors under ``config``) calibrated by simulated releases of the stand-in."""
    return calibrated_all(standin, [config], [analytic])[0]


def calibrated_all(standin: StandIn, configs: Sequence[Config], analytic: Sequence[Errors],
                   on_config: Callable[[int], None] | None = None) -> list[Errors]:
    """Each config's analytic errors calibrated by SIMULATED_RELEASES simulated releases of the stand-in
    (paired seeds: the same streams for every config); ``on_config(k)`` is told when config k's
    releases are done."""
    attributes = [sorted({a for by in errors.values() for a in by}) for errors in analytic]
    releases = [(config, chosen, rng) for config, chosen in zip(configs, attributes)
                for rng in child_streams(SIMULATION_SEED, SIMULATED_RELEASES)]

    def told(index: int, _: Any) -> None:
        if on_config is not None and (index + 1) % SIMULATED_RELEASES == 0:
            on_config(index // SIMULATED_RELEASES)

    done = parallel_map(_release_errors, standin, releases, on_result=told)
    out = []
    for k, errors in enumerate(analytic):
        simulated, counts = pooled_medians(done[k * SIMULATED_RELEASES:(k + 1) * SIMULATED_RELEASES])
        out.append(calibrated(errors, simulated, counts))
    return out


def _release_errors(standin: StandIn, release: tuple[Config, Sequence[str], np.random.Generator]) -> dict:
    """One simulated release's errors on every target cell of the stand-in (``simulate.release_errors``)."""
    config, attributes, rng = release
    return release_errors(standin.microdata, standin.all_cells or standin.cells, config, attributes, rng,
                          standin.groupings)


@dataclass(frozen=True)
class Simulated:
    """The outcome of ``simulated_finalists``: the base plan's calibrated errors, the reference and
    the finalists (calibrated or proxied), and the rule with the reference's calibrated errors."""

    base: Errors
    reference: Candidate
    finalists: list[Candidate]
    rule: Rule


def simulated_finalists(standin: StandIn, base_config: Config, base_errors: Errors, finalists: Sequence[Candidate],
                        reference: Candidate, mu_total: float, rule: Rule, step: Callable[[str], None]) -> Simulated:
    """The base plan's errors, the reference's and the finalists' calibrated by simulated releases of
    the stand-in (module docstring, step 4): the base plan's, the reference's and the first
    finalist's always; another's only where its analytic errors times the base plan's calibration
    ratios come within SIMULATION_MARGIN of the best simulated one (``close``); the others keep those
    proxy errors (not simulated)."""
    base_total = base_config.plan.budget().total
    finalists = ranked_by(finalists)
    first = [finalists[0], reference]
    base_calibrated, *calibrations = calibrated_all(
        standin, [base_config, *(parse_config(plan_mapping(c, mu_total, base_config), "<plan>") for c in first)],
        [scaled(base_errors, mu_total / base_total), *(c.errors for c in first)],
        on_config=lambda k: step("base plan simulated" if k == 0 else f"simulated: {first[k - 1].shape.describe()}"))
    calibrated_base = scaled(base_calibrated, base_total / mu_total)
    if rule.reference is not None:
        rule = replace(rule, reference=calibrations[1])
    best, reference = (_rescored(c, errors, calibrated_base, rule, simulated=True)
                       for c, errors in zip(first, calibrations))
    reference = replace(reference, judgement=as_reference(reference.judgement))
    proxies = [_rescored(c, _proxy(c.errors, base_errors, calibrated_base), calibrated_base, rule)
               for c in finalists[1:]]
    leader = min((best, reference), key=lambda c: preference(c.judgement))
    chosen = [c for c in proxies if close(c, leader, rule, calibrated_base)]
    for candidate in proxies:
        if candidate not in chosen:
            step(f"not simulated (predicted behind): {candidate.shape.describe()}")
    calibrations = calibrated_all(standin, [_config(c.shape, mu_total, c.wage_share, base_config) for c in chosen],
                                  [_analytic(c) for c in chosen],
                                  on_config=lambda k: step(f"simulated: {chosen[k].shape.describe()}"))
    simulated = {id(c): _rescored(c, errors, calibrated_base, rule, simulated=True)
                 for c, errors in zip(chosen, calibrations)}
    return Simulated(calibrated_base, reference, [best, *(simulated.get(id(c), c) for c in proxies)], rule)


def shifted(candidate: Candidate, base: Errors, rule: Rule) -> list[Candidate]:
    """A simulated finalist at the other searched wage shares within SHARE_SHIFT of its own, its
    calibrated errors scaled as 1 / mu (employment by sqrt((1 - s) / (1 - s')), wages by sqrt(s / s')):
    the simulated releases calibrate a shape, and a small move of its wage share keeps what they found."""
    out = []
    for share in WAGE_SHARES:
        if share == candidate.wage_share or abs(share - candidate.wage_share) > SHARE_SHIFT + 1e-9:
            continue
        factors = {WAGE: math.sqrt(candidate.wage_share / share),
                   EMPLOYMENT: math.sqrt((1 - candidate.wage_share) / (1 - share))}
        errors = {level: {a: e * factors.get(a, factors[EMPLOYMENT]) for a, e in by.items()}
                  for level, by in candidate.errors.items()}
        out.append(replace(candidate, wage_share=float(share), judgement=rule.judge(errors, base), errors=errors,
                           analytic=None, scaled_from=candidate.wage_share))
    return out


def _proxy(errors: Errors, analytic_base: Errors, calibrated_base: Errors) -> Errors:
    """``errors`` times the base plan's calibration ratio (calibrated / analytic) per level and attribute
    (month 1's for month 2)."""
    def ratio(level: int, attribute: str) -> float:
        key = attribute if attribute in analytic_base[level] else EMPLOYMENT
        analytic = analytic_base[level][key]
        return calibrated_base[level][key] / analytic if analytic > 0 else 1.0

    return {level: {a: e * ratio(level, a) for a, e in by.items()} for level, by in errors.items()}


def close(candidate: Candidate, best: Candidate, rule: Rule, base: Errors) -> bool:
    """Whether ``candidate`` comes within SIMULATION_MARGIN of ``best`` in the rule's order, judged
    leniently (SIMULATION_MARGIN more tolerance, and as much lead on the reference)."""
    return within(rule.lenient(SIMULATION_MARGIN).judge(candidate.errors, base), best.judgement, SIMULATION_MARGIN)


def _rescored(candidate: Candidate, errors: Errors, base_errors: Errors, rule: Rule,
              simulated: bool = False) -> Candidate:
    """A finalist with calibrated (``simulated``) or proxy errors, judged again; its analytic errors
    kept beside them."""
    return replace(candidate, judgement=rule.judge(errors, base_errors), errors=errors, analytic=_analytic(candidate),
                   simulated=simulated)


def _analytic(candidate: Candidate) -> Errors:
    """A candidate's analytic errors (kept beside calibrated or proxy ones)."""
    return candidate.errors if candidate.analytic is None else candidate.analytic


def reference_mapping(mu_total: float, base: Config, quarters: int = 1, name: str = REFERENCE) -> dict[str, Any]:
    """The shipped plan ``name`` at ``mu_total`` under ``base``'s psi, gammas, zeta and options: its
    queries in its own order (the order noise is drawn in), every mu scaled by mu_total / its total
    and rounded down to 4 decimals, and the cap of ``quarters`` quarters, as ``shapes.config_mapping``
    makes them."""
    shipped = load_config(name)
    factor = mu_total / shipped.plan.budget().total
    mus = {tuple(q["by"]) if q["by"] != "identity" else (): {a: m * factor for a, m in q["mu"].items()}
           for q in shipped.raw["queries"]}
    return shapes.mapping_of(mus, base.raw, math.ceil(math.sqrt(quarters) * mu_total * 1e3) / 1e3)


def plan_mapping(candidate: Candidate, mu_total: float, base: Config, quarters: int = 1) -> dict[str, Any]:
    """The config mapping of a candidate: the shipped plan's own (``reference_mapping``) for the
    reference, its shape's at its wage share otherwise (capped at ``quarters`` quarters' budget)."""
    if candidate.shape.label == REFERENCE:
        return reference_mapping(mu_total, base, quarters)
    return shapes.config_mapping(candidate.shape, mu_total, candidate.wage_share, base.raw, quarters)


def reference_shape(name: str = REFERENCE) -> tuple[Shape, float]:
    """The shape and wage share of the shipped plan ``name``, labelled with its name."""
    return shapes.shape_of(load_config(name).plan, name)


def make_plan(published_qcew: str | Path, *, mu_total: float | None = None,
              targets: Sequence[int] | None = None, base: str | Path | Config = "baseline",
              weights: Mapping[str, float] | None = None, tolerance: float = 0.10,
              on_step: Callable[[str], None] | None = None, quarters: int = 1) -> PlanResult:
    """A plan chosen on a public stand-in of the published QCEW file ``published_qcew`` (module
    docstring); ``base``'s psi, gammas, zeta and options, total ``mu_total`` (default the base's);
    ``targets``: the QCEW levels judged (default: every level the published file has); ``weights``:
    of employment and wages (default 1 and 1). Without ``targets`` and ``weights`` the plan is never
    predicted worse than ``recommended`` on the levels that carry most published cells; with either,
    the agency's choice is honoured (``PlanResult.custom``). Every published level is predicted.
    With ``quarters`` > 1, ``mu_total`` is the budget of that many quarters of equal cost: each
    quarter's plan gets mu_total / sqrt(quarters) (Gaussian composition)."""
    start = time.perf_counter()
    step = on_step or (lambda description: None)
    base_config = base if isinstance(base, Config) else load_config(base)
    custom = targets is not None or weights is not None
    weights = dict(weights or {"employment": 1.0, "wage": 1.0})
    base_total = base_config.plan.budget().total
    mu_total = base_total if mu_total is None else float(mu_total)
    if not mu_total > 0:
        raise InputError(f"mu_total ({mu_total}) must be > 0")
    if isinstance(quarters, bool) or not isinstance(quarters, int) or not 1 <= quarters <= MAX_QUARTERS:
        raise InputError(f"quarters ({quarters!r}) must be a whole number of quarters from 1 to {MAX_QUARTERS}")
    mu_total /= math.sqrt(quarters)
    published = read_qcew(published_qcew)
    levels = published_levels(published)
    targets = levels if targets is None else tuple(targets)
    _check(base_config, weights, targets, tolerance, levels)
    standin = stand_in(published, Path(published_qcew).name, levels)
    step("stand-in synthesized")
    rule = _rule(standin, targets, weights, tolerance, custom)
    reference_shape_, reference_share = reference_shape()
    base_errors, reference_errors, employment, wages = searched(
        Predictor(standin, base_config, mu_total, step),
        parse_config(reference_mapping(mu_total, base_config), "<plan>"), rule)
    if not custom:
        rule = replace(rule, reference=reference_errors)
    reference = Candidate(reference_shape_, reference_share,
                          as_reference(rule.judge(reference_errors, base_errors)), reference_errors)
    ranked = combinations(employment, wages, base_errors, rule)
    finalists = _finalists(standin, base_config, ranked, mu_total, base_errors, rule, step)
    done = simulated_finalists(standin, base_config, base_errors, finalists, reference, mu_total, rule, step)
    moved = [other for c in done.finalists if c.simulated for other in shifted(c, done.base, done.rule)]
    chosen = min((c for c in (*done.finalists, *moved, done.reference) if c.simulated),
                 key=lambda c: preference(c.judgement))
    shown = [c.shape for c in done.finalists if not c.shape.months_apart]
    level = 78 if 78 in targets else targets[0]
    config = plan_mapping(chosen, mu_total, base_config, quarters)
    return PlanResult(config, chosen, done.base, done.reference, frontier(ranked, shown, level), done.finalists,
                      mu_total, standin.source, time.perf_counter() - start, done.rule, quarters, custom)


def _rule(standin: StandIn, targets: Sequence[int], weights: Mapping[str, float], tolerance: float,
          custom: bool) -> Rule:
    """The choice rule: target levels weighted by their published cells; the major levels (guarded
    against the reference when the agency chose neither targets nor weights) among them."""
    cells = {target.level: target.n_cells for target in standin.all_cells or standin.cells}
    level_weights = {level: float(cells[level]) for level in targets}
    if custom:
        return Rule(level_weights, weights, tolerance)
    return Rule(level_weights, weights, tolerance, major=major_levels(level_weights), lead=-REFERENCE_MARGIN)


def _check(base: Config, weights: Mapping[str, float], targets: Sequence[int], tolerance: float,
           published: Sequence[int]) -> None:
    """Refuse a base config without the months and wages, unknown weights, no targets or targets the
    published file has no cell of."""
    missing = [a for a in (*shapes.MONTHS, WAGE) if a not in base.plan.attributes]
    if missing:
        raise InputError(f"the base config measures no '{missing[0]}'; the planner shares mu between the three "
                         "months of employment and wages")
    unknown = sorted(set(weights) - {"employment", "wage"})
    if unknown or not weights or min(weights.values()) < 0 or not sum(weights.values()) > 0:
        raise InputError(f"weights {dict(weights)} must be employment=W,wage=W with W >= 0, not both 0")
    if not targets:
        raise InputError("targets is empty: name at least one QCEW level (51-58, 71-78)")
    unpublished = [level for level in targets if level not in published]
    if unpublished:
        known = "is not a QCEW level (51-58, 71-78)" if unpublished[0] not in QCEW_LEVELS else \
            "has no published cell in the file"
        raise InputError(f"target level {unpublished[0]} {known}; the plan is judged on published cells")
    if not tolerance >= 0:
        raise InputError(f"tolerance ({tolerance}) must be >= 0")
