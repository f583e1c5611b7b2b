"""The planner's candidates (``gedp.planning.search``): a pair of allocations at a wage share with its
predicted errors and judgement; every pair scored at every searched wage share at once (step 3),
ranked, their frontier over the wage share, and the config mapping of a candidate or of the shipped
reference plan."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gedp.configs as configs
from gedp.config import Config, load_config
from gedp.planning import shapes
from gedp.planning.predictor import REFERENCE_WAGE_SHARE
from gedp.planning.rule import EMPLOYMENT, WAGE, Errors, Judgement, Rule, kind_error, preference
from gedp.planning.shapes import Allocation, Shape

#: The plan every search is measured against, and evaluated as a finalist.
REFERENCE = "recommended"
#: The wage shares searched.
WAGE_SHARES = tuple(np.round(np.arange(0.02, 0.501, 0.02), 2))


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


def reference_mapping(mu_total: float, base: Config, quarters: int = 1, name: str = REFERENCE) -> dict[str, Any]:
    """The shipped plan ``name`` at ``mu_total`` under ``base``'s psi, gammas, zeta and options: its
    queries in its own order (the order noise is drawn in), every mu scaled by mu_total / its total
    and rounded down to 4 decimals, and the cap of ``quarters`` quarters, as ``shapes.config_mapping``
    makes them."""
    shipped = load_config(configs.path(name))  # the shipped file, never a file of that name here
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
    return shapes.shape_of(load_config(configs.path(name)).plan, name)
