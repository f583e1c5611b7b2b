"""High-confidence lower bounds on the mu a release path achieves, from its outputs on two datasets.

mu-GDP means every test of D1 against D2 has TPR <= Phi(Phi^-1(FPR) + mu) (Dong, Roth & Su, JRSS-B
2022, the Gaussian trade-off function G_mu). A threshold test on any statistic of the outputs
therefore gives mu >= Phi^-1(TPR) - Phi^-1(FPR). With thresholds fixed before the runs, every run
counts: Clopper-Pearson intervals bound each threshold's rates, and Bonferroni over the thresholds
keeps the largest bound valid with probability at least 1 - alpha whatever the statistic's
distribution.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval of a binomial proportion."""
    low = stats.beta.ppf(alpha / 2, successes, trials - successes + 1) if successes > 0 else 0.0
    high = stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return float(low), float(high)


def mu_lower_bound_at(outputs_1: np.ndarray, outputs_2: np.ndarray, thresholds: tuple[float, ...],
                      alpha: float) -> float:
    """A lower bound on the mu separating a statistic's draws under D1 (``outputs_1``) and D2
    (``outputs_2``, larger under D2), holding with probability >= 1 - alpha: the largest over
    ``thresholds`` (fixed before the runs) of Phi^-1(TPR low) - Phi^-1(FPR high), each rate bounded
    on one side at level alpha / (2 x thresholds). 0 when no threshold separates anything."""
    outputs_1, outputs_2 = np.asarray(outputs_1, dtype=float), np.asarray(outputs_2, dtype=float)
    level = alpha / len(thresholds)
    bounds = [0.0]
    for threshold in thresholds:
        _, fpr_high = clopper_pearson(int(np.sum(outputs_1 > threshold)), len(outputs_1), level)
        tpr_low, _ = clopper_pearson(int(np.sum(outputs_2 > threshold)), len(outputs_2), level)
        if tpr_low > 0 and fpr_high < 1:
            bounds.append(float(stats.norm.ppf(tpr_low) - stats.norm.ppf(fpr_high)))
    return max(bounds)
