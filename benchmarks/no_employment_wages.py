"""Wage cells with no true employment: truth, estimate and margin, cell by cell (run on demand, not a test).

A state is synthesized from its published QCEW file (``level_coverage``'s truth) and protected once
(``--seed``) under ``--config`` scaled to ``--mu``. For every county x NAICS-6 cell (level 78) whose
true employment is 0 in all three months and whose true wages are positive: its true wages, the
release's estimate and 95% margin, its establishments, their protected employment and identity wage
answers, and the release's county x NAICS-5 wage answer of its plan cell (when it measures one) with
that cell's truth; and the state's estimated variance of the wages of establishments without
protected employment (``spread_moments.idle_wage_variance``), per class (idle establishments among
employed ones; those of cells without protected employment), with what the synthesized truth says it
should be (the mean squared deviation of those establishments' true wages from their prior).

    nice -n 10 python benchmarks/no_employment_wages.py --qcew ../shared/data/qcew_2016q1_34.csv \\
        --mu 2.3065 --config baseline --seed 1000 --out nj-baseline.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.measure.queries import IDENTITY, Groupings, group_establishments
from gedp.postprocess import wages as wage_fit
from gedp.postprocess.moe import half_widths, variance_functions
from gedp.postprocess.wages import EMPLOYMENT_FLOOR, fit_wages, protected_employment
from gedp.release.reader import release_answers, release_wage_psi
from gedp.synth.schema import public_columns

sys.path.insert(0, str(Path(__file__).parent))
from level_coverage import state_and_config, state_parser  # noqa: E402

MONTHS = ("m1emp", "m2emp", "m3emp")


def captured_idle_variance() -> dict:
    """Wraps the wage fit's idle variance so that its inputs (prior, idle, classes) and its per
    establishment result can be read after a fit."""
    seen: dict = {}
    original = wage_fit.idle_wage_variance

    def wrapped(answer, prior, noise, weighing, idle, classes, n_classes):
        result = original(answer, prior, noise, weighing, idle, classes, n_classes)
        seen.update(prior=prior, idle=idle, classes=classes, variance=result)
        return result

    wage_fit.idle_wage_variance = wrapped
    return seen


def idle_classes(seen: dict, wage: np.ndarray, true_employment: np.ndarray, idle: np.ndarray) -> dict:
    """Per class of the idle variance (even: idle among employed establishments; odd: in cells
    without protected employment): its establishments, how many have no true employment, the
    estimated variance, and the truth's mean squared deviation from the prior (what it estimates)."""
    out = {}
    for code in np.unique(seen["classes"][seen["idle"]]):
        mask = seen["idle"] & (seen["classes"] == code)
        out[f"class {code}"] = {
            "estabs": int(mask.sum()), "no_true_employment": int(np.sum(mask & (true_employment == 0))),
            "estimated_variance": float(seen["variance"][mask][0]),
            "true_mean_squared_deviation": float(np.mean((wage[mask] - seen["prior"][mask]) ** 2)),
            "mean_wage": float(np.mean(wage[mask])), "max_wage": float(np.max(wage[mask]))}
    out["idle as this script counts them"] = int(idle.sum())
    return out


def plan_cell_answers(answers, public: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each establishment's county x NAICS-5 group, and that query's wage answers and variances (None:
    the release measures no such query)."""
    found = [a for a in answers["wage"] if tuple(a.query.by) == ("state", "county", "naics5")]
    if not found:
        return None
    return group_establishments(public, ["state", "county", "naics5"]).codes, found[0].estimate, found[0].variance


def main() -> None:
    parser = state_parser(__doc__, releases=None)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    truth, config = state_and_config(args)
    release = gedp.protect(truth, config, seed=args.seed, not_for_publication=True)
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    public = protected[public_columns(protected)]
    answers = release_answers(release.folder, protected)
    psi = release_wage_psi(release.folder)
    seen = captured_idle_variance()
    fit = fit_wages(answers, protected, psi)
    assert np.array_equal(fit.values, protected["wage"].to_numpy()), "the fit does not recompute the release"
    groupings = Groupings(public)
    [identity] = [a for a in answers["wage"] if a.query.is_identity]
    identity_codes = groupings(IDENTITY).codes
    answer = identity.estimate[identity_codes]
    noise_sd = np.sqrt(psi.estimate_variance(np.maximum(truth["wage"].to_numpy(), 0.0),
                                             np.broadcast_to(identity.sd, (identity_codes.max() + 1,))[identity_codes]))
    employment, _ = protected_employment(protected, answers, identity_codes, psi)
    true_employment = truth[list(MONTHS)].sum(axis=1).to_numpy()
    idle = employment < EMPLOYMENT_FLOOR
    wage = truth["wage"].to_numpy()
    groups = group_establishments(public, ["state", "county", "naics"])
    margin = half_widths(variance_functions(answers, protected, psi), groups.codes, groups.n_groups, 0.95)["wage"]
    cell_truth, cell_estimate = groups.sum(wage), groups.sum(protected["wage"].to_numpy())
    no_employment = (groups.sum(true_employment) == 0) & (cell_truth > 0)
    plan = plan_cell_answers(answers, public)
    rows = []
    for cell in np.flatnonzero(no_employment):
        members = np.flatnonzero(groups.codes == cell)
        first = public.iloc[members[0]]
        plan_code = plan[0][members[0]] if plan else -1
        plan_members = np.flatnonzero(plan[0] == plan_code) if plan else members
        rows.append({
            "county": str(first["county"]), "naics": str(first["naics"]), "truth": float(cell_truth[cell]),
            "estimate": float(cell_estimate[cell]), "margin": float(margin[cell]),
            "z": float((cell_estimate[cell] - cell_truth[cell]) / (margin[cell] / 1.959964)),
            "estabs": len(members), "protected_employment": employment[members].round(2).tolist(),
            "identity_answers": answer[members].round(0).tolist(), "true_wages": wage[members].tolist(),
            "identity_noise_sd": float(np.sqrt(np.sum(noise_sd[members] ** 2))),
            "plan_cell_answer": float(plan[1][plan_code]) if plan else None,
            "plan_cell_sd": float(np.sqrt(plan[2][plan_code])) if plan else None,
            "plan_cell_truth": float(wage[plan_members].sum()),
            "plan_cell_estimate": float(protected["wage"].to_numpy()[plan_members].sum()),
            "plan_cell_true_employment": float(true_employment[plan_members].sum()),
            "plan_cell_estabs": len(plan_members)})
    cells = pd.DataFrame(rows)
    summary = {"qcew": args.qcew.name, "config": args.config, "mu": args.mu, "seed": args.seed,
               "idle_classes": idle_classes(seen, wage, true_employment, idle), "cells": len(cells),
               "coverage": float((cells["z"].abs() <= 1.959964).mean()) if len(cells) else None,
               "median_estimate_over_truth": float((cells["estimate"] / cells["truth"]).median())
               if len(cells) else None}
    cells_text = ",\n".join(json.dumps(row) for row in rows)  # a cell a line
    args.out.write_text(f'{{"summary": {json.dumps(summary, indent=1)},\n"cells": [\n{cells_text}\n]}}\n')
    print(json.dumps(summary, indent=1))
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(cells[["county", "naics", "truth", "estimate", "margin", "z", "estabs", "identity_noise_sd",
                     "plan_cell_answer", "plan_cell_sd", "plan_cell_truth", "plan_cell_estimate",
                     "plan_cell_true_employment", "plan_cell_estabs"]].round(1).to_string())


if __name__ == "__main__":
    main()
