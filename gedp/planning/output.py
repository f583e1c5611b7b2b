"""The planner's outputs: the plan as a config file, its printed comparison, its JSON summary."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gedp.planning.candidates import REFERENCE, Candidate
from gedp.planning.rule import EMPLOYMENT, WAGE, Errors, costs
from gedp.planning.search import PlanResult

ATTRIBUTE_NAMES = {EMPLOYMENT: "employment (month 1)", WAGE: "wages"}


def plan_yaml(result: PlanResult) -> str:
    """The plan's YAML with a header saying what it is and how it was made."""
    chosen = result.chosen
    header = [
        f"Plan made by `gedp plan` from the published file {result.source} (public data only: a stand-in",
        "state synthesized from it; never confidential microdata).",
        f"Shape: {chosen.shape.describe()}.",
        f"Wages get {chosen.wage_share:.0%} of mu^2; total mu {result.mu_total:.4f}.",
        *([f"(Simulated at a wage share of {chosen.scaled_from:.0%}; its errors scaled to {chosen.wage_share:.0%} as "
           "1 / mu.)"] if chosen.scaled_from is not None else []),
        *acceptance_lines(result),
        *reference_lines(result),
        *quarters_header(result),
        f"Predicted median relative error on the published cells (plan / base plan / {REFERENCE}):",
        *(f"  level {level}: " + ", ".join(f"{ATTRIBUTE_NAMES[a]} {100 * chosen.errors[level][a]:.2f}% / "
                                          f"{100 * result.base[level][a]:.2f}% / "
                                          f"{100 * result.recommended.errors[level][a]:.2f}%" for a in ATTRIBUTE_NAMES)
          for level in result.base),
    ]
    body = yaml.safe_dump(result.config, sort_keys=False, default_flow_style=None)
    # each line break in a line (a published file named "q.csv\ninteger: true") starts a comment line too: it
    # had ended the comment and written its rest as a key of the config (red team rt24 F5)
    return "".join(f"# {part}\n" for line in header for part in line.splitlines() or [""]) + body


def acceptance_lines(result: PlanResult) -> list[str]:
    """Whether the plan keeps every target level within the tolerance of the base plan's error, or is
    the least bad of the shapes searched when none does."""
    level, kind, ratio = result.worst()
    where = f"x{ratio:.2f} the base plan's error ({'wages' if kind == WAGE else kind}, level {level})"
    within = (f"within {result.tolerance:.0%} of the base plan's error (or {100 * result.rule.absolute:g} "
              "percentage point)")
    if result.acceptable:
        return [f"Every target level is predicted {within} or better; the worst ratio: {where}."]
    return [f"No shape searched is predicted {within} at every target level; this is the one",
            f"whose worst excess over that is smallest (x{result.chosen.judgement.excess:.2f}); worst ratio: {where}."]


def reference_lines(result: PlanResult) -> list[str]:
    """The plan against ``recommended``: what the rule guards (the levels that carry most cells), or,
    when the agency set its own weights or targets, what that choice costs."""
    if result.chosen is result.recommended:
        return [f"This is `{REFERENCE}` (no shape searched is predicted better on the levels that carry most cells)."]
    if not result.custom:
        levels = ", ".join(map(str, result.rule.major))
        return [f"Predicted at least {-result.rule.lead:.0%} better than `{REFERENCE}` at levels {levels} (the levels "
                "that carry most published cells), employment and wages."]
    worse = costs(result.chosen.errors, result.recommended.errors, list(result.base), tolerance=result.tolerance,
                  absolute=result.rule.absolute)
    if not worse:
        return [f"With the weights and targets set, predicted within {result.tolerance:.0%} (or "
                f"{100 * result.rule.absolute:g} percentage point) of `{REFERENCE}` at every published level."]
    shown = "; ".join(f"level {level} {'wages' if kind == 'wage' else kind} {100 * error:.2f}% against "
                      f"{100 * theirs:.2f}%" for level, kind, error, theirs in worse)
    return [f"What the weights and targets set cost against `{REFERENCE}` (worse by more than {result.tolerance:.0%} "
            f"and {100 * result.rule.absolute:g} percentage point): {shown}."]


def quarters_header(result: PlanResult) -> list[str]:
    """How a plan of several quarters spends its budget (nothing for one quarter)."""
    if result.quarters == 1:
        return []
    return [f"Budget over {result.quarters} quarters: mu {result.mu_annual:.4f}; each quarter's release is planned "
            f"at mu {result.mu_annual:.4f} / sqrt({result.quarters}) = {result.mu_total:.4f}",
            f"(Gaussian composition: sqrt({result.quarters} x {result.mu_total:.4f}^2) = {result.mu_annual:.4f}); an "
            "establishment in every quarter spends the whole budget, the plan's mu_cap (a panel of these quarters",
            "protected as one release fits it). Record each quarter in the ledger",
            f"with --annual-cap {result.mu_annual:.4f} (any 4 consecutive quarters) to have it enforced."
            if result.quarters == 4 else "with a --lifetime-cap or --annual-cap to have it enforced."]


def comparison_rows(result: PlanResult) -> list[list[str]]:
    """Rows level, published cells, attribute, plan, base, recommended (predicted median relative
    errors, %; employment: month 1's)."""
    rows = []
    for level in result.base:
        cells = result.rule.level_weights.get(level)
        for attribute, name in ATTRIBUTE_NAMES.items():
            rows.append([str(level), "-" if cells is None else f"{cells:.0f}", name,
                         _pct(result.chosen.errors, level, attribute), _pct(result.base, level, attribute),
                         _pct(result.recommended.errors, level, attribute)])
    return rows


def _pct(errors: Errors, level: int, attribute: str) -> str:
    return f"{100 * errors[level][attribute]:.2f}%"


def summary(result: PlanResult, frontier_file: str) -> dict:
    """The machine-readable summary written beside the plan."""
    def by_level(errors: Errors | None) -> dict | None:
        return None if errors is None else {str(level): dict(e) for level, e in errors.items()}

    return {
        "source": result.source, "mu_total": result.mu_total, "seconds": result.seconds,
        "quarters": result.quarters, "mu_over_quarters": result.mu_annual,
        "shape": result.chosen.shape.describe(), "wage_share": result.chosen.wage_share,
        "score": result.chosen.score, "worst_ratio_to_base": result.chosen.worst_ratio,
        "excess": result.chosen.judgement.excess, "acceptable": result.acceptable,
        "is_recommended": result.chosen is result.recommended,
        "rule": {"tolerance": result.tolerance, "absolute_tolerance": result.rule.absolute,
                 "weights": dict(result.rule.weights), "custom": result.custom,
                 "level_weights": {str(level): w for level, w in result.rule.level_weights.items()},
                 "guarded_levels": list(result.rule.major)},
        "predicted": {"plan": by_level(result.chosen.errors), "base": by_level(result.base),
                      REFERENCE: by_level(result.recommended.errors)},
        "predicted_analytic": {"plan": by_level(result.chosen.analytic),
                               REFERENCE: by_level(result.recommended.analytic)},
        "against_recommended": [{"level": level, "kind": kind, "plan": error, REFERENCE: theirs} for level, kind, error,
                                theirs in costs(result.chosen.errors, result.recommended.errors, list(result.base),
                                                tolerance=result.tolerance, absolute=result.rule.absolute)],
        "finalists": [_finalist(c) for c in (*result.finalists, result.recommended)],
        "chosen_scaled_from_wage_share": result.chosen.scaled_from,
        "frontier_plot": frontier_file,
    }


def _finalist(candidate: Candidate) -> dict:
    judgement = candidate.judgement
    return {"shape": candidate.shape.describe(), "wage_share": candidate.wage_share, "score": judgement.score,
            "worst_ratio_to_base": judgement.worst_ratio, "excess": judgement.excess,
            "behind_recommended": judgement.behind, "simulated": candidate.simulated,
            "scaled_from_wage_share": candidate.scaled_from,
            "errors": {str(level): errors for level, errors in candidate.errors.items()}}


def output_paths(out: Path) -> tuple[Path, Path]:
    """The summary JSON and the frontier plot written beside a plan ``out``."""
    return out.with_name(out.stem + ".summary.json"), out.with_name(out.stem + ".frontier.png")


def write_plan(result: PlanResult, out: Path) -> None:
    """The plan's YAML at ``out``, with its summary JSON and frontier plot beside it."""
    from gedp.evaluation.plan_frontier import draw_frontier

    json_path, plot_path = output_paths(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    level = 78 if 78 in result.base else next(iter(result.base))
    draw_frontier(result.frontier, (result.chosen.shape.describe(), result.chosen.wage_share), level, plot_path)
    json_path.write_text(json.dumps(summary(result, plot_path.name), indent=2), encoding="utf-8")
    out.write_text(plan_yaml(result), encoding="utf-8")
