"""The power of the pipeline audit's broken-build check (tests/test_audit.py), by runs a side (run on
demand, not a test).

For one statistic and threshold with rates p1 = P(score > t | D1) and p2 = P(score > t | D2) (measured
on runs of the broken build), the probability that the audit's bound at that threshold stays at or
below the claimed mu: the exact sum over both sides' binomial counts of the cases where
Phi^-1(TPR low) - Phi^-1(FPR high) <= claim, with the Clopper-Pearson levels of
``gedp.audit.bounds.mu_lower_bound_at`` (alpha 0.01 over 4 statistics and 3 thresholds). The broken
build goes unflagged only if every statistic and threshold stays below its claim, so each line bounds
that probability from above.

    python benchmarks/audit_broken_power.py
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from gedp.audit.pipeline import PIPELINE_ALPHA, STATISTICS, THRESHOLDS

#: The audit plan's total mu (configs/audit.yaml), claimed for the likelihood ratio and the protected value.
CLAIM = 1.3191
#: (statistic at threshold, P(D1 > t), P(D2 > t)) measured on 300 runs a side of the broken build.
RATES = (("likelihood ratio / protected value at 0", 0.13, 0.853), ("protected value at -0.5", 0.490, 0.997))


def unflagged(runs: int, p1: float, p2: float, claim: float = CLAIM) -> float:
    """P(bound at this threshold <= claim) with ``runs`` a side and rates ``p1``, ``p2``."""
    level = PIPELINE_ALPHA / len(STATISTICS) / len(THRESHOLDS)
    k = np.arange(runs + 1)
    fpr_high = np.where(k < runs, stats.beta.ppf(1 - level / 2, k + 1, runs - k), 1.0)
    tpr_low = np.where(k > 0, stats.beta.ppf(level / 2, k, runs - k + 1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = stats.norm.ppf(tpr_low)[None, :] - stats.norm.ppf(fpr_high)[:, None]
    bound = np.where((tpr_low[None, :] > 0) & (fpr_high[:, None] < 1), bound, 0.0)
    weight = stats.binom.pmf(k, runs, p1)[:, None] * stats.binom.pmf(k, runs, p2)[None, :]
    return float(weight[bound <= claim].sum())


if __name__ == "__main__":
    print("| runs a side | " + " | ".join(name for name, _, _ in RATES) + " |")
    print("|---|" + "---|" * len(RATES))
    for runs in (200, 300, 350, 400, 450, 500):
        print(f"| {runs} | " + " | ".join(f"{unflagged(runs, p1, p2):.1e}" for _, p1, p2 in RATES) + " |")
