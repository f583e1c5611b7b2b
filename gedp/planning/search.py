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

This module holds the search over allocations and ``make_plan``; the stand-in and its predictions are
in ``gedp.planning.predictor``, the candidates' scoring and config mappings in ``gedp.planning.candidates``,
the finalists' choice and simulated calibration in ``gedp.planning.finalists``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gedp.config import Config, load_config, parse_config
from gedp.errors import InputError
from gedp.planning import shapes
from gedp.planning.candidates import (
    REFERENCE,
    Candidate,
    combinations,
    frontier,
    plan_mapping,
    ratios,
    reference_mapping,
    reference_shape,
    scaled,
)
from gedp.planning.finalists import FINALISTS, choose_finalists, shifted, simulated_finalists
from gedp.planning.predict import QCEW_LEVELS, published_levels
from gedp.planning.predictor import Predictor, StandIn, stand_in
from gedp.planning.rule import (
    EMPLOYMENT,
    REFERENCE_MARGIN,
    WAGE,
    Errors,
    Rule,
    as_reference,
    major_levels,
    preference,
)
from gedp.planning.shapes import Allocation
from gedp.synth.qcew import read_qcew

#: Query sets (per attribute) predicted at the other identity shares after the first pass, and the
#: sets without a county query given a small one.
REFINED_SETS = 2
#: The most quarters a budget is planned over (ten years).
MAX_QUARTERS = 40


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


def search_steps() -> int:
    """Progress steps of ``make_plan``."""
    employment = shapes.allocations(shapes.query_sets(), shapes.IDENTITY_SHARES[:1])
    wages = shapes.allocations(shapes.wage_sets(), shapes.WAGE_IDENTITY_SHARES[:1], shapes.STATE_SHARES[:1])
    refined = REFINED_SETS * (len(shapes.IDENTITY_SHARES) - 1) * len(shapes.STATE_SHARES) + REFINED_SETS * (
        len(shapes.WAGE_IDENTITY_SHARES) - 1) + (REFINED_SETS + 1) * len(shapes.COUNTY_SHARES)
    return 3 + len(employment) + len(wages) + refined + 1 + (FINALISTS + 1) + 2


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
    finalists = choose_finalists(standin, base_config, ranked, mu_total, base_errors, rule, step)
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
    if (unknown or not weights or not all(isinstance(w, (int, float)) and math.isfinite(w) for w in weights.values())
            or min(weights.values()) < 0 or not sum(weights.values()) > 0):
        raise InputError(f"weights {dict(weights)} must be employment=W,wage=W with W >= 0 finite, not both 0")
    if not targets:
        raise InputError("targets is empty: name at least one QCEW level (51-58, 71-78)")
    unpublished = [level for level in targets if level not in published]
    if unpublished:
        known = "is not a QCEW level (51-58, 71-78)" if unpublished[0] not in QCEW_LEVELS else \
            "has no published cell in the file"
        raise InputError(f"target level {unpublished[0]} {known}; the plan is judged on published cells")
    if not tolerance >= 0:
        raise InputError(f"tolerance ({tolerance}) must be >= 0")
