"""The wage fit's sibling rate spread pass by pass (run on demand, not a test; docs/evaluation/margins-coverage.md,
"the sibling spread of passes 2-3").

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000, ...)
with a shipped config scaled to ``--mu``; per release, the first state's squared relative spread of the
NAICS-5 rates around their NAICS-3 parent as each pass of the fit estimates it
(``spread_moments.sibling_spread``): as shipped (passes 2-3 from the last fit's totals less the rates'
posterior variance), and with that variance added instead ("add"). With ``wages.RATE_SPREAD_KEPT`` the
fit uses pass 1's in every pass; the estimates printed are the same as shipped up to pass 2.

    nice -n 10 python benchmarks/sibling_spread_passes.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --mu 2.3065 --config baseline --releases 5
"""

from __future__ import annotations

import numpy as np
from level_coverage import each_release, state_and_config, state_parser

from gedp.postprocess import spread_moments, wages


def recorder(added: bool) -> list[float]:
    """Wrap the fit's sibling spread (``wages.sibling_spread``); record each call's estimate (state 0)."""
    seen: list[float] = []
    original = spread_moments.sibling_spread

    def recorded(parent, rate_state, totals, employment, noise, n_parents, n_states, least):
        observed, parent_rate, spread2 = original(parent, rate_state, totals, employment, noise, n_parents,
                                                  n_states, least)
        if added and len(seen) % wages.PASSES:  # passes 2-3: + the posterior variance
            spread2, _ = spread_moments.weighted_squared_spread(
                rate_state, (observed - parent_rate[parent]) ** 2 + noise, parent_rate[parent] ** 2, noise,
                n_states, least**2)
            spread2 = np.maximum(spread2, least**2)
        seen.append(float(spread2[0]))
        return observed, parent_rate, spread2

    wages.sibling_spread = recorded
    return seen


def main() -> None:
    args = state_parser(__doc__).parse_args()
    truth, config = state_and_config(args)
    for variant in ("shipped", "add"):
        seen = recorder(variant == "add")
        for seed in each_release(truth, config, args.releases, seen):
            print(variant, seed, " -> ".join(f"{value:.3f}" for value in seen[:wages.PASSES]), flush=True)


if __name__ == "__main__":
    main()
