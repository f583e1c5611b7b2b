"""The months of a quarter smoothed across each other (postprocessing of the identity answers).

An establishment's employment barely moves between the months of a quarter, while each month's
identity answer carries its own psi-mechanism noise (at the baseline plan, sd about sqrt(2x)). Each
establishment's month answers y_t (unbiased, noise variance v_t) are therefore replaced by the best
linear unbiased predictor of its months m_t under the model

    m_t = L + d_t,   d_t independent with mean 0 and variance tau^2,   L free (flat prior),

    L^ = sum_t y_t / V_t / sum_t 1 / V_t,   V_t = tau^2 + v_t,   k_t = tau^2 / V_t,
    m^_t = L^ + k_t (y_t - L^),
    E(m^_t - m_t)^2 = (1 - k_t)^2 / sum_s 1 / V_s + tau^2 v_t / V_t,

and the weighted least squares then weighs each m^_t by that mean squared error (the margins of
error follow). All of this runs on y_t / g_t (noise variance v_t / g_t^2) and is scaled back: g_t is
the answers' common month pattern (each month's sum over the establishments over the months' mean sum),
so the months are shrunk toward the state's movement within the quarter, not toward flat months.
The noise variances are the psi-mechanism's releasable variances at max(L0, 0), L0 the plain mean of
the answers, the same for each month of equal noise; tau^2 = c (max(L0, 0) + 1)^p is fitted by moments
(``deviation_variance``): with establishments in bands that double in size by one month's answer, the
other months' spread about their mean, less their noise variance at that mean, estimates the band's
mean tau^2 without bias (the noise variance formula is linear in x for sqrt; the band does not select
on the noise of the moment), and log tau^2 is fitted to log size over the bands with a positive
estimate, each weighted by its estimate's precision. It takes three months; with fewer the answers
are left as they are.

The stated MSE is evaluated at a level estimated from the same answers, so it is smallest exactly
where the noise pulled them down (at 1-10 employees, 95% intervals from it covered 91% of cells on
Rhode Island). Each smoothed answer therefore also carries how its MSE moves with the level
(``variance_slope``: d MSE / d level through the noise variances), from which the margins of error
take the half-width of the score interval (``postprocess.moe``).

Why this is postprocessing (no privacy cost): its inputs are released identity answers and their
public noise scales; every constant is fixed here. The module also holds the ``pooled`` mode
(``pool_month_variances``: each month weighted at the other months' answers) and ``month_answers``,
which turns a release's answers by its variance mode before the least squares and the margins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.wages import EMPLOYMENT as MONTHS  # the months smoothed across each other, in order

#: Variance modes that turn the months' identity answers before the least squares (``month_answers``).
MONTH_MODES = ("smoothed", "pooled")


def deviation_variance(y: np.ndarray, noise: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """tau^2 per establishment: c (level+ + 1)^p fitted by moments over size bands (module docstring).
    ``y``: answers (establishments x months, at least 3); ``noise(x)``: each month's noise variance
    at levels ``x`` (same shape), linear in x for an unbiased moment. Each month t in turn sorts the
    establishments into bands by its answer y_t while the other months give the moment, so the band
    a establishment falls in is independent of the noise in its moment. 0 everywhere when no band
    shows months that move more than their noise."""
    n, months = y.shape
    keys, levels, excesses, spreads = [], [], [], []
    for t in range(months):
        others = np.delete(y, t, axis=1)
        mean = others.mean(axis=1, keepdims=True)
        spread = ((others - mean) ** 2).sum(axis=1) / (months - 2)
        keys.append(y[:, t])
        levels.append(mean[:, 0])
        spreads.append(spread)
        excesses.append(spread - np.delete(noise(np.repeat(mean, months, axis=1)), t, axis=1).mean(axis=1))
    band = _size_band(np.concatenate(keys))
    n_bands = int(band.max(initial=0)) + 1
    count = np.bincount(band, minlength=n_bands)
    seen = np.maximum(count, 1)
    excess = np.bincount(band, np.concatenate(excesses), n_bands) / seen
    second_moment = np.bincount(band, np.concatenate(spreads) ** 2, n_bands) / seen
    # each band's size: the mean of the other months' answers (unbiased for the level: not selected on)
    log_size = np.log(_scale(np.bincount(band, np.concatenate(levels), n_bands) / seen))
    fitted = (count > 0) & (excess > 0) & (second_moment > 0)
    if not fitted.any():
        return np.zeros(n)
    if np.ptp(log_size[fitted]) == 0:  # one size only (one band, or levels all at or below 0): no slope
        return np.full(n, excess[fitted] @ count[fitted] / count[fitted].sum())
    # var(log estimate) ~ second moment / (count * estimate^2): weights are its inverse
    weight = count[fitted] * excess[fitted] ** 2 / second_moment[fitted]
    power, intercept = np.polyfit(log_size[fitted], np.log(excess[fitted]), 1, w=np.sqrt(weight))
    level = y.mean(axis=1)
    return np.exp(intercept) * _scale(level) ** power


def _scale(level: np.ndarray) -> np.ndarray:
    return np.maximum(level, 0.0) + 1.0


def _size_band(level: np.ndarray) -> np.ndarray:
    """Bands that double in size: 0 for levels below 1, then [1, 3), [3, 7), ..."""
    return np.floor(np.log2(_scale(level))).astype(np.int64)


def blup(y: np.ndarray, v: np.ndarray, tau2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """m^_t and E(m^_t - m_t)^2 (module docstring) for answers ``y`` (establishments x months) of noise
    variances ``v`` and month deviations of variance ``tau2`` (establishments x 1)."""
    total = tau2 + v
    precision = (1.0 / total).sum(axis=1, keepdims=True)
    level = (y / total).sum(axis=1, keepdims=True) / precision
    k = tau2 / total
    return level + k * (y - level), (1.0 - k) ** 2 / precision + tau2 * v / total


def month_identity_answers(answers_by_attribute: Mapping[str, Sequence[NoisyAnswer]]) -> dict[str, NoisyAnswer]:
    """Each month's identity answer (months without one left out), checked to be over the same
    establishments in the same order."""
    identity = {month: next((a for a in answers_by_attribute.get(month, []) if a.query.is_identity), None)
                for month in MONTHS}
    identity = {month: answer for month, answer in identity.items() if answer is not None}
    keys = next(iter(identity.values())).keys if identity else None
    if not all(answer.keys.equals(keys) for answer in identity.values()):
        raise ValueError("the months' identity answers are not over the same establishments in the same order")
    return identity


def smooth_months(answers_by_attribute: Mapping[str, Sequence[NoisyAnswer]],
                  psi: NeighborFunction) -> dict[str, list[NoisyAnswer]]:
    """The answers with the months' identity answers smoothed across the months (module docstring):
    estimates m^_t, variances their mean squared errors. Fewer than three months with identity answers,
    other attributes and other queries are returned as they are."""
    identity = month_identity_answers(answers_by_attribute)
    out = {attribute: list(answers) for attribute, answers in answers_by_attribute.items()}
    if len(identity) < 3:
        return out
    y = np.column_stack([answer.estimate for answer in identity.values()])
    sd = np.column_stack([np.broadcast_to(answer.sd, len(y)) for answer in identity.values()])
    # the months' common movement, from the sums of the answers: smoothing works on y_t / g_t
    sums = y.sum(axis=0)
    pattern = np.where(sums > 0, sums / sums.mean(), 1.0) if sums.mean() > 0 else np.ones(len(sums))
    scaled = y / pattern

    def noise(variance: Callable[[np.ndarray, np.ndarray], np.ndarray], level: np.ndarray) -> np.ndarray:
        return variance(level * pattern, sd) / pattern**2  # on the pattern's scale

    tau2 = deviation_variance(scaled, lambda x: noise(psi.estimate_variance, x))[:, None]
    at = np.maximum(scaled.mean(axis=1), 0.0)[:, None]
    smoothed, mse = blup(scaled, noise(psi.releasable_variance, at), tau2)
    # d mse / d level through the noise variances (forward difference; exact for sqrt's linear v)
    step = 1e-3 * (1.0 + at)
    slope = (blup(scaled, noise(psi.releasable_variance, at + step), tau2)[1] - mse) / step * pattern
    smoothed, mse = smoothed * pattern, mse * pattern**2
    for t, (month, answer) in enumerate(identity.items()):
        replaced = dataclasses.replace(answer, estimate=smoothed[:, t], variance=mse[:, t],
                                       variance_slope=slope[:, t])
        out[month] = [replaced if a is answer else a for a in out[month]]
    return out


def pool_month_variances(measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]],
                         psi: NeighborFunction) -> dict[str, list[NoisyAnswer]]:
    """The answers with each month's identity variances evaluated at the mean of the establishment's
    other months' identity estimates (floored at 0), not at the month's own estimate.

    The releasable variance at a month's own estimate grows with that answer's noise, so weighting by
    it pulls totals down (the E3 effect); the other months' answers carry independent noise, so
    weights taken from them are independent of the answer weighted. Postprocessing: released values
    only. Months without identity answers, and other attributes, are returned as they are.
    """
    identity = month_identity_answers(measurements_by_attribute)
    out = {attribute: list(answers) for attribute, answers in measurements_by_attribute.items()}
    if len(identity) < 2:
        return out
    for month, answer in identity.items():
        others = np.mean([other.estimate for name, other in identity.items() if name != month], axis=0)
        pooled = dataclasses.replace(answer, variance=psi.releasable_variance(np.maximum(others, 0.0), answer.sd))
        out[month] = [pooled if a is answer else a for a in out[month]]
    return out


def month_answers(measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]], variance_mode: str,
                  psi: NeighborFunction | None) -> dict[str, list[NoisyAnswer]]:
    """The answers as the least squares of ``variance_mode`` weighs them: the months' identity answers
    smoothed across the months (``smoothed``: ``postprocess.months``) or weighted at the other months
    (``pooled``); as they are otherwise."""
    if variance_mode not in MONTH_MODES:
        return {attribute: list(answers) for attribute, answers in measurements_by_attribute.items()}
    if psi is None:
        raise ValueError(f"variance mode '{variance_mode}' needs the plan's psi")
    transform = smooth_months if variance_mode == "smoothed" else pool_month_variances
    return transform(measurements_by_attribute, psi)
