"""Empirical privacy audit: a high-confidence lower bound on the mu a mechanism actually achieves.

For a worst-case pair of psi-neighboring datasets D1, D2, the mechanism runs many times on each.
Half of the runs choose the best threshold test on the released value (the likelihood ratio of a
Gaussian shift is monotone, so a threshold is optimal); the other half estimate its false positive
rate on D1 and true positive rate on D2 with Clopper-Pearson bounds. mu-GDP implies
TPR <= Phi(Phi^-1(FPR) + mu), so mu_low = Phi^-1(TPR lower bound) - Phi^-1(FPR upper bound) is a
lower bound on the privacy loss, holding with probability at least 1 - alpha. An audit passes when
mu_low <= the claimed mu; a mechanism whose noise is too small is caught (the power check).

One case attacks the released bytes rather than the values: the low-bit distinguisher
(``measure.grid.low_bits_flag``) flags released floats below 16 whose bits reach below 2^-47,
which a float64 sum psi(x) + z shows only when x = 0. Its broken variant releases that float64
sum instead of the gridded value, and the audit catches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from gedp.measure.grid import low_bits_flag
from gedp.measure.mechanisms import pnc_mechanism, pnc_sensitivity, psi_mechanism
from gedp.measure.neighbors import SqrtPsi
from gedp.measure.queries import Grouping

ALPHA = 0.001  # per case; six cases give a family-wise false-failure rate <= 0.6%


def estab_gaussian(values: np.ndarray, *, sensitivity: float, mu: float, rng: np.random.Generator) -> np.ndarray:
    """Estab-Gaussian: q(D) + N(0, (Delta_psi(q) / mu)^2 I) for a query q with L2 sensitivity
    ``sensitivity`` over psi-neighbors (SPEC section 4). mu-gedp by the Gaussian mechanism theorem."""
    if not (sensitivity > 0 and mu > 0):
        raise ValueError(f"sensitivity ({sensitivity}) and mu ({mu}) must be > 0")
    values = np.asarray(values, dtype=float)
    return values + rng.normal(0.0, sensitivity / mu, size=values.shape)


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    case: str
    claimed_mu: float
    audited_mu_low: float
    trials: int
    passed: bool

    def row(self) -> dict:
        return dict(self.__dict__)


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval of a binomial proportion."""
    low = stats.beta.ppf(alpha / 2, successes, trials - successes + 1) if successes > 0 else 0.0
    high = stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return float(low), float(high)


def mu_lower_bound(outputs_1: np.ndarray, outputs_2: np.ndarray, alpha: float = ALPHA) -> float:
    """Lower bound on mu from draws of the released value under D1 and D2 (D2 shifted upward)."""
    half = len(outputs_1) // 2
    choose_1, test_1 = outputs_1[:half], outputs_1[half:]
    choose_2, test_2 = outputs_2[:half], outputs_2[half:]
    # Thresholds at quantiles of D1's choice half; keep the one with the largest empirical mu.
    candidates = np.quantile(choose_1, np.linspace(0.5, 0.999, 60))
    best, best_score = candidates[0], -np.inf
    for threshold in candidates:
        fpr = np.clip(np.mean(choose_1 > threshold), 1 / half, 1 - 1 / half)
        tpr = np.clip(np.mean(choose_2 > threshold), 1 / half, 1 - 1 / half)
        score = stats.norm.ppf(tpr) - stats.norm.ppf(fpr)
        if score > best_score:
            best, best_score = threshold, score
    # Bonferroni over the two rates: each interval at alpha / 2.
    _, fpr_high = clopper_pearson(int(np.sum(test_1 > best)), len(test_1), alpha)
    tpr_low, _ = clopper_pearson(int(np.sum(test_2 > best)), len(test_2), alpha)
    if tpr_low <= 0 or fpr_high >= 1:
        return 0.0
    return max(0.0, float(stats.norm.ppf(tpr_low) - stats.norm.ppf(fpr_high)))


def _grouping(by: tuple[str, ...], codes: np.ndarray) -> Grouping:
    """A grouping by codes alone (the audit needs no key values)."""
    return Grouping(by, codes, pd.DataFrame(index=range(int(codes.max()) + 1)))


def _upper_neighbor(psi, x: float, gamma: float) -> float:
    """The largest value psi-close to x: the upper end of x's uncertainty interval."""
    return float(psi.inverse(psi(np.array([x])) + gamma)[0])


def audit_cases(mu: float, *, noise_factor: float = 1.0) -> dict[str, Callable[[int, np.random.Generator], tuple]]:
    """Worst-case neighbor pairs per mechanism; each case returns released values under D1 and D2.

    ``noise_factor`` < 1 breaks the mechanism (its noise sd is scaled down) for the power check.
    """
    psi, gamma = SqrtPsi(), 0.5
    broken_mu = mu / noise_factor  # a mechanism drawing sd x noise_factor acts as this mu

    def psi_case(x: float):
        def run(trials, rng):
            y = _upper_neighbor(psi, x, gamma)
            grouping = _grouping(("estab_id",), np.arange(trials))
            d1 = psi_mechanism(
                np.full(trials, x), grouping, attribute="m1emp", psi=psi, gamma=gamma, mu=broken_mu, rng=rng
            )
            d2 = psi_mechanism(
                np.full(trials, y), grouping, attribute="m1emp", psi=psi, gamma=gamma, mu=broken_mu, rng=rng
            )
            return d1.released, d2.released
        return run

    def pnc_case(dominant: float, others: int):
        def run(trials, rng):
            # One group per trial; the clip level u* is fixed (pnc conditions on released identity answers).
            clip = dominant
            low = float(clip - pnc_sensitivity(np.array([clip]), psi, gamma)[0])  # lower end of u*'s interval
            group = np.repeat(np.arange(trials), others + 1)
            grouping = _grouping(("county",), group)
            small = np.tile(np.r_[0.0, np.full(others, 3.0)], trials)
            d1_values, d2_values = small.copy(), small.copy()
            d1_values[::others + 1], d2_values[::others + 1] = low, clip
            upper = np.full(len(group), clip)
            d1 = pnc_mechanism(
                d1_values, grouping, upper, attribute="m1emp", psi=psi, gamma=gamma, mu=broken_mu, rng=rng
            )
            d2 = pnc_mechanism(
                d2_values, grouping, upper, attribute="m1emp", psi=psi, gamma=gamma, mu=broken_mu, rng=rng
            )
            return d1.released, d2.released
        return run

    def low_bits_case(trials, rng):
        # Wages: gamma 50, so x = 0 and x = 2,500 (sqrt 50) are psi-neighbors. The statistic is the
        # flag itself (0 or 1), larger under x = 0; D1 is x = 2,500.
        wage_psi, wage_gamma = SqrtPsi(), 50.0
        grouping = _grouping(("estab_id",), np.arange(trials))
        outputs = []
        for x in (2_500.0, 0.0):
            if noise_factor == 1.0:
                released = psi_mechanism(np.full(trials, x), grouping, attribute="wage", psi=wage_psi,
                                         gamma=wage_gamma, mu=mu, rng=rng).released
            else:  # the float64 sum psi(x) + z that gedp released before its grid
                released = wage_psi(np.full(trials, x)) + rng.normal(0.0, wage_gamma / mu, size=trials)
            outputs.append(low_bits_flag(released).astype(float))
        return tuple(outputs)

    def gaussian_case(run_sensitivity: float):
        def run(trials, rng):
            # A psi-scale query of one record: q = psi(x); neighbors move it by gamma = the sensitivity.
            x = np.full(trials, psi(np.array([400.0]))[0])
            d1 = estab_gaussian(x, sensitivity=run_sensitivity, mu=broken_mu, rng=rng)
            d2 = estab_gaussian(x + gamma, sensitivity=run_sensitivity, mu=broken_mu, rng=rng)
            return d1, d2
        return run

    return {
        "psi / small establishment (x = 0 vs upper neighbor)": psi_case(0.0),
        "psi / large establishment (x = 10,000 vs upper neighbor)": psi_case(10_000.0),
        "pnc / group dominated by one establishment": pnc_case(5_000.0, 4),
        "pnc / group of small establishments": pnc_case(12.0, 20),
        "gaussian / psi-scale query": gaussian_case(gamma),
        "psi / low bits of released floats (wage, x = 0 vs 2,500)": low_bits_case,
    }


def run_audit(mu: float = 1.0, *, trials: int = 200_000, seed: int = 0, noise_factor: float = 1.0,
              alpha: float = ALPHA, mechanisms: tuple[str, ...] = ("psi", "pnc", "gaussian")) -> list[AuditResult]:
    """Audit every case of the chosen mechanisms; each claims ``mu``."""
    results = []
    streams = np.random.SeedSequence(seed).spawn(len(audit_cases(mu)))
    for (case, run), stream in zip(audit_cases(mu, noise_factor=noise_factor).items(), streams):
        mechanism = case.split(" /")[0]
        if mechanism not in mechanisms:
            continue
        outputs_1, outputs_2 = run(trials, np.random.default_rng(stream))
        low = mu_lower_bound(np.asarray(outputs_1), np.asarray(outputs_2), alpha)
        results.append(AuditResult(mechanism, case, mu, low, trials, low <= mu))
    return results
