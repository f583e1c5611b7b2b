"""The planner's finalists (``gedp.planning.search``, steps 3-4): the best shapes of the ranked
candidates, calibrated by simulated releases of the stand-in where they could win (the others keep
proxy errors), and a simulated finalist moved a little in wage share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gedp.config import Config, parse_config
from gedp.evaluation.replicate import child_streams
from gedp.planning.candidates import WAGE_SHARES, Candidate, plan_mapping, ranked_by, scaled
from gedp.planning.predictor import StandIn, predict_config, shape_config
from gedp.planning.rule import EMPLOYMENT, WAGE, Errors, Rule, as_reference, preference, within
from gedp.planning.simulate import calibrated, pooled_medians, release_errors
from gedp.planning.workers import parallel_map

#: Pairs of allocations (at their best wage shares) that go on to the simulated releases, with the
#: best one measuring months 2-3 apart.
FINALISTS = 2
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


def choose_finalists(standin: StandIn, base: Config, ranked: Sequence[Candidate], mu_total: float, base_errors: Errors,
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
    months = predict_config(standin, shape_config(apart.shape, mu_total, apart.wage_share, base), [EMPLOYMENT, "m2emp"])
    step(f"months apart: {apart.shape.describe()}")
    errors = {level: {**months[level], WAGE: apart.errors[level][WAGE]} for level in months}
    return [*chosen, replace(apart, judgement=rule.judge(errors, base_errors), errors=errors)]


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
    the stand-in (``gedp.planning.search``, step 4): the base plan's, the reference's and the first
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
    calibrations = calibrated_all(standin, [shape_config(c.shape, mu_total, c.wage_share, base_config) for c in chosen],
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
