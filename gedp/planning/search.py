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
   wage share without new predictions; the best few are predicted again at their own budgets (and
   the best with months 2-3 measured apart).
4. The base plan and the finalists that could win are calibrated by simulated releases of the
   stand-in (``simulate``: the bounds and the wage prior's bias, which the analytic prediction
   leaves out; ``simulated_finalists``), scored again, and the best of them is the plan.

The score is a weighted mean, over the target levels (default: every level the published file
has), of log(predicted error / the base plan's), employment (month 1; the months' mean for a shape
that measures them apart) and wages weighted as ``weights`` says. Shapes are chosen in the order of
``preference``: those predicted worse than the base plan by at most ``tolerance`` at every level
and attribute by score, then the others by their worst ratio to the base plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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
from gedp.planning.predict import TargetCells, predicted_errors, prepared_answers, published_levels, target_cells
from gedp.planning.shapes import Allocation, Shape
from gedp.planning.simulate import calibrated, pooled_medians, release_errors
from gedp.planning.workers import parallel_map
from gedp.synth.establishments import synthesize_state
from gedp.synth.qcew import PublishedState, read_qcew
from gedp.synth.schema import public_columns

EMPLOYMENT = "m1emp"
WAGE = "wage"
#: The wage share at which allocations are predicted first, and the shares searched.
REFERENCE_WAGE_SHARE = 0.15
WAGE_SHARES = tuple(np.round(np.arange(0.02, 0.501, 0.02), 2))
#: Pairs of allocations predicted again at their own budgets (and the best with months 2-3 apart).
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

Errors = dict[int, dict[str, float]]


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
    score: float
    worst_ratio: float  # largest predicted error / the base plan's, over levels and attributes
    errors: Errors
    analytic: Errors | None = None  # the analytic prediction, when ``errors`` is calibrated (or a proxy)
    simulated: bool = False  # whether ``errors`` is calibrated by simulated releases


@dataclass(frozen=True)
class PlanResult:
    """The chosen plan (a config mapping), its predictions beside the base plan's and uniform's,
    the frontier of the finalists' shapes over the wage share, and the search's figures."""

    config: dict[str, Any]
    chosen: Candidate
    base: Errors
    uniform: Errors | None
    frontier: dict[str, list[tuple[float, float, float]]]  # label -> (wage share, employment, wage error)
    finalists: list[Candidate]
    mu_total: float
    source: str
    seconds: float
    quarters: int = 1
    tolerance: float = 0.10

    @property
    def acceptable(self) -> bool:
        """Whether the chosen plan is predicted worse than the base plan by at most ``tolerance`` at
        every target level and attribute (else no shape searched was: it is the least bad)."""
        return self.chosen.worst_ratio <= 1 + self.tolerance

    def worst(self) -> tuple[int, str, float]:
        """(level, "employment" or "wage", ratio): where the chosen plan is worst against the base plan."""
        (level, kind), ratio = max(ratios(self.chosen.errors, self.base, ["employment", "wage"]).items(),
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


def employment_errors(standin: StandIn, base: Config, mu_total: float, allocations: Sequence[Allocation],
                      step: Callable[[str], None]) -> dict[Allocation, Errors]:
    """Month-1 errors of every allocation at the reference wage share (module docstring, step 2)."""
    month_mu = mu_total * np.sqrt((1 - REFERENCE_WAGE_SHARE) / len(shapes.MONTHS))
    by_identity: dict[float, list[Allocation]] = {}
    for allocation in allocations:
        by_identity.setdefault(round(allocation.shares()[()], 9), []).append(allocation)
    out = {}
    for identity_share, group in by_identity.items():
        # the identity query at this share, every group-by query once (at a nominal mu, rescaled below)
        mus = {(): {m: month_mu * np.sqrt(identity_share) for m in shapes.MONTHS},
               **{by: {m: month_mu / 2 for m in shapes.MONTHS} for by in shapes.query_sets()[0]}}
        # a measurement of the public stand-in, never a release: capped at its own total
        total = math.sqrt(sum(mu**2 for by_attribute in mus.values() for mu in by_attribute.values()))
        config = parse_config(shapes.mapping_of(mus, base.raw, math.ceil(total * 1e4) / 1e4), "<measurement>")
        measured = (standin, _answers(standin, config, smoothed=True), month_mu)
        errors = parallel_map(_allocation_errors, measured, group,
                              on_result=lambda index, _: step(f"employment: {group[index].label}"))
        out.update(zip(group, errors))
    return out


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
    configs = [_config(Shape(Allocation(shapes.query_sets()[0], 0.6), allocation), mu_total, REFERENCE_WAGE_SHARE,
                       base) for allocation in allocations]
    errors = parallel_map(_wage_errors, standin, configs,
                          on_result=lambda index, _: step(f"wages: {allocations[index].label}"))
    return dict(zip(allocations, errors))


def _wage_errors(standin: StandIn, config: Config) -> Errors:
    """Wage errors under ``config``, from its measurement as measured (which the wage fit needs)."""
    wage_psi = config.plan.psi if config.wages == "employment" else None
    return predicted_errors(_answers(standin, config, smoothed=False), standin.microdata, standin.cells, [WAGE],
                            wage_psi)


def best_allocations(errors: Mapping[Allocation, Errors], base: Errors, attribute: str,
                     count: int = REFINED_SETS) -> list[Allocation]:
    """The best allocation of each of the ``count`` query sets whose best allocation has the lowest
    mean log error ratio to the base plan's for ``attribute``."""
    def value(allocation: Allocation) -> float:
        return float(np.mean([np.log(errors[allocation][level][attribute] / base[level][attribute]) for level in base]))

    out: list[Allocation] = []
    for allocation in sorted(errors, key=value):
        if all(allocation.groups != a.groups for a in out):
            out.append(allocation)
    return out[:count]


def best_sets(errors: Mapping[Allocation, Errors], base: Errors, attribute: str,
              count: int = REFINED_SETS) -> list[tuple[tuple[str, ...], ...]]:
    """The ``count`` query sets whose best allocation is best (``best_allocations``)."""
    return [allocation.groups for allocation in best_allocations(errors, base, attribute, count)]


def county_variants(errors: Mapping[Allocation, Errors], base: Errors, attribute: str,
                    county_shares: Sequence[float]) -> list[Allocation]:
    """The best allocations of the best sets without a county query and of the best set with one
    (each with NAICS-5 or county x NAICS-5 to take the county query's share from), with the county
    query at every share of ``county_shares`` below what the group-by queries other than the state
    query have."""
    finer = {a: e for a, e in errors.items() if any(g in a.groups for g in (shapes.NAICS5, shapes.CELL))}
    chosen = [*best_allocations({a: e for a, e in finer.items() if shapes.COUNTY not in a.groups}, base, attribute),
              *best_allocations({a: e for a, e in finer.items() if shapes.COUNTY in a.groups}, base, attribute, 1)]
    return [allocation.with_county(share) for allocation in chosen for share in county_shares
            if share < allocation.group_share()]


def coarse_to_fine(predict: Callable[[list[Allocation]], dict[Allocation, Errors]],
                   sets: Sequence[tuple[tuple[str, ...], ...]], shares: Sequence[float],
                   state_shares: Sequence[float], base: Errors, attribute: str,
                   county_shares: Sequence[float] = ()) -> dict[Allocation, Errors]:
    """Every set at the first identity share, then the best sets at the other shares, then the best
    sets without a county query with a small one at each of ``county_shares`` (module docstring,
    step 2)."""
    errors = predict(shapes.allocations(sets, shares[:1], state_shares))
    refined = shapes.allocations(best_sets(errors, base, attribute), shares[1:], state_shares)
    errors.update(predict([a for a in refined if a not in errors]))
    if county_shares:
        errors.update(predict(county_variants(errors, base, attribute, county_shares)))
    return errors


def scaled(errors: Errors, factor: float) -> Errors:
    return {level: {a: e * factor for a, e in by.items()} for level, by in errors.items()}


def ratios(errors: Errors, base: Errors, kinds: Sequence[str]) -> dict[tuple[int, str], float]:
    """Error / the base plan's error per (level, kind) of ``kinds`` ("employment": month 1's, or the
    months' mean under a shape measuring them apart; "wage")."""
    return {(level, kind): (_employment(errors[level]) / base[level][EMPLOYMENT] if kind == "employment"
                            else errors[level][WAGE] / base[level][WAGE]) for kind in kinds for level in base}


def score(errors: Errors, base: Errors, weights: Mapping[str, float]) -> tuple[float, float]:
    """(the weighted mean over levels of log(error / base error), the largest error / base error).

    ``errors`` has the month-1 error under "m1emp" (or the months' mean under "employment"); the
    weights are by "employment" and "wage"."""
    by = ratios(errors, base, list(weights))
    total = sum(weight * float(np.mean(np.log([r for (_, k), r in by.items() if k == kind])))
                for kind, weight in weights.items())
    return total / sum(weights.values()), max(by.values())


def preference(candidate: Candidate, tolerance: float) -> tuple[bool, float]:
    """The order shapes are chosen in: the acceptable ones (no target level and attribute predicted
    worse than the base plan by more than ``tolerance``) first, best score first; then the others,
    smallest worst ratio to the base plan first."""
    acceptable = candidate.worst_ratio <= 1 + tolerance
    return not acceptable, candidate.score if acceptable else candidate.worst_ratio


def _employment(errors: Mapping[str, float]) -> float:
    """Employment's error: month 1's, or the mean of months 1 and 2 (= 3) of a shape measuring them apart."""
    return float(np.mean([errors[m] for m in (EMPLOYMENT, "m2emp") if m in errors]))


def combinations(employment: Mapping[Allocation, Errors], wages: Mapping[Allocation, Errors], base: Errors,
                 weights: Mapping[str, float], tolerance: float) -> list[Candidate]:
    """Every pair of allocations at every wage share, errors scaled from the reference share as
    1 / mu; in the order of ``preference``."""
    out = []
    for share in WAGE_SHARES:
        employment_factor = np.sqrt((1 - REFERENCE_WAGE_SHARE) / (1 - share))
        wage_factor = np.sqrt(REFERENCE_WAGE_SHARE / share)
        for e_allocation, e_errors in employment.items():
            for w_allocation, w_errors in wages.items():
                errors = {level: {EMPLOYMENT: e_errors[level][EMPLOYMENT] * employment_factor,
                                  WAGE: w_errors[level][WAGE] * wage_factor} for level in base}
                value, worst = score(errors, base, weights)
                out.append(Candidate(Shape(e_allocation, w_allocation), float(share), value, worst, errors))
    return sorted(out, key=lambda c: preference(c, tolerance))


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
    return 3 + len(employment) + len(wages) + refined + 2 * (FINALISTS + 1) + 1


def _finalists(standin: StandIn, base: Config, ranked: Sequence[Candidate], mu_total: float, base_errors: Errors,
               weights: Mapping[str, float], step: Callable[[str], None]) -> list[Candidate]:
    """The best FINALISTS shapes, and the best with months 2-3 apart, predicted at their own budgets."""
    chosen: list[Candidate] = []
    for candidate in ranked:
        if all(candidate.shape != c.shape for c in chosen):
            chosen.append(candidate)
        if len(chosen) == FINALISTS:
            break
    chosen.append(replace(chosen[0], shape=replace(chosen[0].shape, months_apart=True)))
    asked = [(_config(c.shape, mu_total, c.wage_share, base),
              [EMPLOYMENT, "m2emp", WAGE] if c.shape.months_apart else [EMPLOYMENT, WAGE]) for c in chosen]
    predictions = parallel_map(_predicted, standin, asked, on_result=lambda index, _: step(
        f"again at its budget: {chosen[index].shape.describe()}"))
    out = []
    for candidate, errors in zip(chosen, predictions):
        value, worst = score(errors, base_errors, weights)
        out.append(replace(candidate, score=value, worst_ratio=worst, errors=errors))
    return out


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


def simulated_finalists(standin: StandIn, base_config: Config, base_errors: Errors, finalists: Sequence[Candidate],
                        mu_total: float, weights: Mapping[str, float], tolerance: float,
                        step: Callable[[str], None]) -> tuple[Errors, list[Candidate]]:
    """The base plan's errors and the finalists' calibrated by simulated releases of the stand-in
    (module docstring, step 4): the base plan's and the first finalist's always; another's only where
    its analytic errors times the base plan's calibration ratios come within SIMULATION_MARGIN of
    the best simulated finalist (``close``); the others keep those proxy errors (not simulated)."""
    base_total = base_config.plan.budget().total
    finalists = sorted(finalists, key=lambda c: preference(c, tolerance))
    base_calibrated, first = calibrated_all(
        standin, [base_config, _config(finalists[0].shape, mu_total, finalists[0].wage_share, base_config)],
        [scaled(base_errors, mu_total / base_total), finalists[0].errors],
        on_config=lambda k: step(("base plan simulated", f"simulated: {finalists[0].shape.describe()}")[k]))
    calibrated_base = scaled(base_calibrated, base_total / mu_total)
    best = _rescored(finalists[0], first, calibrated_base, weights, simulated=True)
    proxies = [_rescored(c, _proxy(c.errors, base_errors, calibrated_base), calibrated_base, weights)
               for c in finalists[1:]]
    chosen = [c for c in proxies if close(c, best, tolerance)]
    for candidate in proxies:
        if candidate not in chosen:
            step(f"not simulated (predicted behind): {candidate.shape.describe()}")
    calibrations = calibrated_all(standin, [_config(c.shape, mu_total, c.wage_share, base_config) for c in chosen],
                                  [_analytic(c) for c in chosen],
                                  on_config=lambda k: step(f"simulated: {chosen[k].shape.describe()}"))
    simulated = {id(c): _rescored(c, errors, calibrated_base, weights, simulated=True)
                 for c, errors in zip(chosen, calibrations)}
    return calibrated_base, [best, *(simulated.get(id(c), c) for c in proxies)]


def _proxy(errors: Errors, analytic_base: Errors, calibrated_base: Errors) -> Errors:
    """``errors`` times the base plan's calibration ratio (calibrated / analytic) per level and attribute
    (month 1's for month 2)."""
    def ratio(level: int, attribute: str) -> float:
        key = attribute if attribute in analytic_base[level] else EMPLOYMENT
        analytic = analytic_base[level][key]
        return calibrated_base[level][key] / analytic if analytic > 0 else 1.0

    return {level: {a: e * ratio(level, a) for a, e in by.items()} for level, by in errors.items()}


def close(candidate: Candidate, best: Candidate, tolerance: float) -> bool:
    """Whether ``candidate`` comes within SIMULATION_MARGIN of ``best`` in the order of ``preference``
    (its acceptability judged at ``tolerance`` + SIMULATION_MARGIN)."""
    lenient, bar = preference(candidate, tolerance + SIMULATION_MARGIN), preference(best, tolerance)
    return lenient[0] < bar[0] or (lenient[0] == bar[0] and lenient[1] <= bar[1] + SIMULATION_MARGIN)


def _rescored(candidate: Candidate, errors: Errors, base_errors: Errors, weights: Mapping[str, float],
              simulated: bool = False) -> Candidate:
    """A finalist with calibrated (``simulated``) or proxy errors, scored again; its analytic errors
    kept beside them."""
    value, worst = score(errors, base_errors, weights)
    return replace(candidate, score=value, worst_ratio=worst, errors=errors, analytic=_analytic(candidate),
                   simulated=simulated)


def _analytic(candidate: Candidate) -> Errors:
    """A candidate's analytic errors (kept beside calibrated or proxy ones)."""
    return candidate.errors if candidate.analytic is None else candidate.analytic


def make_plan(published_qcew: str | Path, *, mu_total: float | None = None,
              targets: Sequence[int] | None = None, base: str | Path | Config = "baseline",
              weights: Mapping[str, float] | None = None, tolerance: float = 0.10,
              on_step: Callable[[str], None] | None = None, quarters: int = 1) -> PlanResult:
    """A plan chosen on a public stand-in of the published QCEW file ``published_qcew`` (module
    docstring); ``base``'s psi, gammas, zeta and options, total ``mu_total`` (default the base's);
    ``targets``: the QCEW levels judged (default: every level the published file has).
    With ``quarters`` > 1, ``mu_total`` is the budget of that many quarters of equal cost: each
    quarter's plan gets mu_total / sqrt(quarters) (Gaussian composition)."""
    start = time.perf_counter()
    step = on_step or (lambda description: None)
    base_config = base if isinstance(base, Config) else load_config(base)
    weights = dict(weights or {"employment": 1.0, "wage": 1.0})
    base_total = base_config.plan.budget().total
    mu_total = base_total if mu_total is None else float(mu_total)
    if not mu_total > 0:
        raise InputError(f"mu_total ({mu_total}) must be > 0")
    if isinstance(quarters, bool) or not isinstance(quarters, int) or not 1 <= quarters <= MAX_QUARTERS:
        raise InputError(f"quarters ({quarters!r}) must be a whole number of quarters from 1 to {MAX_QUARTERS}")
    mu_total /= math.sqrt(quarters)
    published = read_qcew(published_qcew)
    targets = published_levels(published) if targets is None else tuple(targets)
    _check(base_config, weights, targets, tolerance)
    standin = stand_in(published, Path(published_qcew).name, targets)
    step("stand-in synthesized")
    uniform_config = load_config("uniform")
    base_errors, uniform = parallel_map(_predicted, standin, [(base_config, [EMPLOYMENT, WAGE]),
                                                              (uniform_config, [EMPLOYMENT, WAGE])],
                                        on_result=lambda index, _: step(("base plan", "uniform plan")[index]))
    base_errors = scaled(base_errors, base_total / mu_total)
    uniform = scaled(uniform, uniform_config.plan.budget().total / mu_total)
    employment = coarse_to_fine(lambda chosen: employment_errors(standin, base_config, mu_total, chosen, step),
                                shapes.query_sets(), shapes.IDENTITY_SHARES, shapes.STATE_SHARES, base_errors,
                                EMPLOYMENT, shapes.COUNTY_SHARES)
    wages = coarse_to_fine(lambda chosen: wage_errors(standin, base_config, mu_total, chosen, step),
                           shapes.wage_sets(), shapes.WAGE_IDENTITY_SHARES, shapes.STATE_SHARES[:1], base_errors, WAGE)
    ranked = combinations(employment, wages, base_errors, weights, tolerance)
    finalists = _finalists(standin, base_config, ranked, mu_total, base_errors, weights, step)
    base_errors, finalists = simulated_finalists(standin, base_config, base_errors, finalists, mu_total, weights,
                                                 tolerance, step)
    chosen = min((c for c in finalists if c.simulated), key=lambda c: preference(c, tolerance))
    shown = [c.shape for c in finalists if not c.shape.months_apart]
    level = 78 if 78 in targets else targets[0]
    config = shapes.config_mapping(chosen.shape, mu_total, chosen.wage_share, base_config.raw, quarters)
    return PlanResult(config, chosen, base_errors, uniform, frontier(ranked, shown, level), finalists, mu_total,
                      standin.source, time.perf_counter() - start, quarters, tolerance)


def _check(base: Config, weights: Mapping[str, float], targets: Sequence[int], tolerance: float) -> None:
    """Refuse a base config without the months and wages, unknown weights, or no targets."""
    missing = [a for a in (*shapes.MONTHS, WAGE) if a not in base.plan.attributes]
    if missing:
        raise InputError(f"the base config measures no '{missing[0]}'; the planner shares mu between the three "
                         "months of employment and wages")
    unknown = sorted(set(weights) - {"employment", "wage"})
    if unknown or not weights or min(weights.values()) < 0 or not sum(weights.values()) > 0:
        raise InputError(f"weights {dict(weights)} must be employment=W,wage=W with W >= 0, not both 0")
    if not targets:
        raise InputError("targets is empty: name at least one QCEW level (51-58, 71-78)")
    if not tolerance >= 0:
        raise InputError(f"tolerance ({tolerance}) must be >= 0")
