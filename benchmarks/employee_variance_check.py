"""The wage fit's per-employee variance b estimated from releases, against the synthesized truth's
(run on demand, not a test; docs/method/wages.md, ``postprocess/employee_variance.py``).

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000, ...)
with a shipped config scaled to ``--mu``, with ``wages.EMPLOYEE_VARIANCE_ESTIMATED`` on; per release,
the first state's b and its standard error at each pass. Beside them, the truth's b (for diagnosis
only): s^2 + b / E fitted to the synthesized state's county x NAICS-6 cells of 4+ employees as
``tests/test_wages.py`` fits the published ones (``truth_employee_variance``), for all cells and for
the published ones alone (those the synthesizer copies).

    nice -n 10 python benchmarks/employee_variance_check.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --mu 2.3065 --config baseline --releases 2
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from level_coverage import each_release, state_and_config, state_parser

from gedp.postprocess import wages
from gedp.postprocess.employee_variance import LEAST_EMPLOYMENT, spread_and_employee_variance


def fitted_b(wage: np.ndarray, employment: np.ndarray, prior: np.ndarray) -> tuple[float, float]:
    """s^2 and b of s^2 + b / E fitted to ((wage - prior) / prior)^2 by least squares weighted by the
    inverse squared fit (three steps), as ``tests/test_wages.published_employee_variance``."""
    squared = ((wage - prior) / prior) ** 2
    x = np.column_stack([np.ones(len(wage)), 1.0 / employment])
    weight = np.ones(len(wage))
    for _ in range(3):
        coefficients = np.linalg.lstsq(x * np.sqrt(weight)[:, None], squared * np.sqrt(weight), rcond=None)[0]
        weight = 1.0 / np.maximum(x @ coefficients, 1e-3) ** 2
    return float(coefficients[0]), float(coefficients[1])


def truth_employee_variance(truth: pd.DataFrame) -> tuple[float, float]:
    """s^2 and b of the truth's county x NAICS-6 cells of 4+ employees (mean of the months) around
    their employment times the statewide NAICS-6 wage per employee, times their county's ratio."""
    frame = truth.assign(employment=truth[["m1emp", "m2emp", "m3emp"]].mean(axis=1))
    cells = frame.groupby(["county", "naics"], as_index=False)[["wage", "employment"]].sum()
    industry = frame.groupby("naics")[["wage", "employment"]].sum()
    cells["prior"] = cells["naics"].map(industry["wage"] / industry["employment"]) * cells["employment"]
    cells = cells[(cells["prior"] > 0) & (cells["employment"] >= 4)]
    county = cells.groupby("county")[["wage", "prior"]].sum()
    prior = cells["prior"] * cells["county"].map(county["wage"] / county["prior"])
    return fitted_b(cells["wage"].to_numpy(), cells["employment"].to_numpy(), prior.to_numpy())


def recorder(true_wages: np.ndarray) -> list[str]:
    """Wrap ``wages._employee_variance``; per pass, record state 0's b and its standard error, and the
    same estimate with the cells' true wages in place of their summed answers (no noise: what the
    estimator would give without the mechanism's noise; ``true_wages`` in the fit's establishment order)."""
    seen: list[str] = []
    original = wages._employee_variance

    def recorded(p, prior, cell_rates, direct_variance, known):
        b, error = original(p, prior, cell_rates, direct_variance, known)
        free = ~p.cells.fixed_cells & (prior > 0) & (p.cell_employment >= LEAST_EMPLOYMENT)
        true = np.bincount(p.cells.codes, weights=true_wages, minlength=len(prior))[free]
        squared = (true - prior[free]) ** 2 - known[free]
        _, oracle, oracle_error = spread_and_employee_variance(
            p.theta.cell_state[free], squared, squared, prior[free], cell_rates[free] ** 2 * p.cell_employment[free],
            known[free], p.theta.n_states, wages.CELL_SPREAD_BOUNDS, wages.EMPLOYEE_VARIANCE)
        seen.append(f"{b[0]:.3f} +- {error[0]:.3f} (true wages: {oracle[0]:.3f} +- {oracle_error[0]:.3f})")
        return b, error

    wages._employee_variance = recorded
    return seen


def main() -> None:
    args = state_parser(__doc__, releases=2).parse_args()
    truth, config = state_and_config(args)
    spread2, b = truth_employee_variance(truth)
    print(f"truth, all cells of 4+ employees: s^2 {spread2:.3f}, b {b:.3f}", flush=True)
    wages.EMPLOYEE_VARIANCE_ESTIMATED = True
    seen = recorder(truth["wage"].to_numpy())
    for seed in each_release(truth, config, args.releases, seen):
        print(seed, " -> ".join(seen[:wages.PASSES]), flush=True)


if __name__ == "__main__":
    main()
