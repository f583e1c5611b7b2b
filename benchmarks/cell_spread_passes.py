"""The wage fit's cell spread pass by pass (run on demand, not a test; docs/evaluation/margins-coverage.md,
"the cell spread").

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000, ...)
with a shipped config scaled to ``--mu``; per release and pass, the first state's squared relative cell
spread as the shipped fit estimates it (``wages._cell_priors``: a moment weighed by each cell's prior
squared), the share of that weight the 10 largest cells carry, and the corrected moment of the rate
query's answers (``cell_spread.layout_cell_spread``, what ``wages.CELL_SPREAD_CORRECTED`` uses in every
pass; printed for pass 1, where its inputs are those answers).

    nice -n 10 python benchmarks/cell_spread_passes.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --mu 2.3065 --config baseline --releases 5
"""

from __future__ import annotations

import numpy as np
from level_coverage import each_release, state_and_config, state_parser

from gedp.postprocess import wages
from gedp.postprocess.cell_spread import layout_cell_spread


def recorder() -> list[str]:
    """Wrap ``wages._cell_priors``; per pass, record the shipped estimate, the top cells' weight and
    (pass 1) the corrected one, for state 0."""
    seen: list[str] = []
    original = wages._cell_priors

    def recorded(p: wages._Problem, last: wages._Pass, observed: np.ndarray, detail_variance: np.ndarray
                 ) -> tuple[np.ndarray, ...]:
        out = original(p, last, observed, detail_variance)
        cell_rates, direct_variance, county_variance, _, spread2, (b, _) = out
        prior = cell_rates * p.cell_employment
        weight = np.where(p.theta.cell_state == 0, prior**2, 0.0)
        top = np.sort(weight)[::-1][:10].sum() / weight.sum()
        text = f"{spread2[0]:.4f} (10 cells {top:.0%})"
        if last.totals is None:
            employee = (cell_rates**2 * (b[p.theta.cell_state] * p.cell_employment + p.cell_employment_variance)
                        + 1.0 + p.cell_idle_variance)
            corrected = layout_cell_spread(p.theta, p.direct, prior, p.cell_employment, direct_variance, employee,
                                           last.rate_variance, detail_variance, county_variance)
            text += f" [corrected {corrected[0]:.4f}]"
        seen.append(text)
        return out

    wages._cell_priors = recorded
    return seen


def main() -> None:
    args = state_parser(__doc__).parse_args()
    truth, config = state_and_config(args)
    seen = recorder()
    for seed in each_release(truth, config, args.releases, seen):
        print(seed, " -> ".join(seen[:wages.PASSES]), flush=True)


if __name__ == "__main__":
    main()
