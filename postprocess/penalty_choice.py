"""The smooth priors' penalty chosen from the answers: K-fold cross-validation of the penalized fit
(``deconvolve.SmoothFit``, ``whole_changes.LevelFit`` with SMOOTH_LEVEL) and the rule that picks one of
``deconvolve.SMOOTH_PENALTIES`` from the folds' held-out log-likelihoods.

The rule is the one-standard-error rule (Hastie, Tibshirani and Friedman, The Elements of Statistical
Learning, 7.10): the smoothest penalty whose summed held-out log-likelihood is within one standard error
of the best's. The largest sum alone chose a small penalty on 2 of 6 simulated bands whose truth was
smooth, its held-out scores a fraction of a nat from the smoother penalties' (``benchmarks/
smooth_penalty_rules.py`` measures both rules on simulated bands).
"""

from __future__ import annotations

import numpy as np

from gedp.postprocess import deconvolve
from gedp.postprocess.deconvolve import smooth_log_weights, softmax

#: Folds of the cross-validation that chooses the penalty, and the seed of the answers' split into them
#: (a fixed split: the fit is a function of the answers).
SMOOTH_FOLDS = 5
SMOOTH_SPLIT_SEED = 0
#: How the folds' held-out log-likelihoods choose the penalty: "one-se", the largest penalty whose summed
#: score is within one standard error of the best's (that of the folds' paired differences, times
#: sqrt(folds)), or "best", the largest sum.
SMOOTH_RULE = "one-se"


def held_out_fold_scores(matrix: np.ndarray, counts: np.ndarray, differences: np.ndarray,
                         penalties: np.ndarray | None = None) -> np.ndarray:
    """Each fold's held-out log-likelihood under each penalty (SMOOTH_FOLDS x ``penalties``, default
    ``deconvolve.SMOOTH_PENALTIES``; each answer of a bin of c given to a fold at random: a multinomial
    split of c)."""
    penalties = deconvolve.SMOOTH_PENALTIES if penalties is None else penalties
    rng = np.random.default_rng(SMOOTH_SPLIT_SEED)
    folds = np.array([rng.multinomial(int(c), np.full(SMOOTH_FOLDS, 1.0 / SMOOTH_FOLDS)) for c in np.rint(counts)]).T
    scores = np.zeros((SMOOTH_FOLDS, len(penalties)))
    for f, held in enumerate(folds):
        alpha = None
        for j in np.argsort(penalties):  # from the least smooth, each fit starting from the last (started from
            # the smoothest instead, a fit kept far tails of a smoother one: held-out scores 4 nats lower)
            alpha = smooth_log_weights(matrix, counts - held, differences, float(penalties[j]), alpha)
            scores[f, j] = float(held @ np.log(matrix @ softmax(alpha)))
    return scores


def chosen_penalty(fold_scores: np.ndarray, penalties: np.ndarray | None = None, rule: str | None = None) -> float:
    """The penalty that the folds' held-out scores (folds x ``penalties``) choose by ``rule``
    (default SMOOTH_RULE)."""
    penalties = deconvolve.SMOOTH_PENALTIES if penalties is None else np.asarray(penalties)
    total = fold_scores.sum(axis=0)
    best = int(np.argmax(total))
    if (rule or SMOOTH_RULE) == "best":
        return float(penalties[best])
    lost = fold_scores[:, [best]] - fold_scores  # each fold's loss against the best penalty, paired
    error = np.sqrt(len(fold_scores)) * lost.std(axis=0, ddof=1)  # the summed loss's standard error
    within = (lost.sum(axis=0) <= error) & (penalties >= penalties[best])
    within[best] = True
    return float(penalties[within].max())
