"""The planner's choice rule: the plan that serves what the agency publishes.

* **Levels weigh what they publish.** A plan's score is the mean of log(predicted error / the base
  plan's) over the target levels, each level weighted by its number of published cells (the state
  total is one cell, county x NAICS-6 thousands), employment and wages as ``weights`` says. Weighting
  levels alike let a level of one to ten cells, already at 0.03-0.3% error, decide the plan for
  thousands of county cells.
* **Small losses in absolute terms are tolerated.** A plan is *acceptable* when at every target level
  and attribute its predicted error is at most the base plan's times 1 + ``tolerance`` (10%), or at most
  the base plan's plus ``absolute`` (0.05 percentage point of relative error): a level already within a
  few hundredths of a percent may lose a few more.
* **Never behind the reference on the levels that carry most cells.** A plan not predicted at least
  ``REFERENCE_MARGIN`` (3%) better than the reference plan (``recommended``, evaluated like every
  finalist) on every *major* level (the fewest levels, largest first, that hold at least half the
  published cells: 78 and 77 on New Jersey), employment and wages, is *behind* it (``lead`` =
  -REFERENCE_MARGIN). The reference is never behind itself (``as_reference``), so the rule never
  picks a plan predicted worse than it there. An agency that sets its own weights or targets gets no reference
  (its choice is honoured; the planner says what it costs against ``recommended``).

The order (``preference``): plans not behind the reference first; among them the acceptable ones,
best score first; then the others, smallest ``excess`` (the largest ratio of a predicted error to the
error the base plan allows there) first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

EMPLOYMENT = "m1emp"
WAGE = "wage"
KINDS = ("employment", "wage")
#: The absolute loss tolerated at any level: 0.05 percentage point of median relative error (half the
#: 0.1 point the issue's target allows, so that a prediction's error does not carry a plan past it).
ABSOLUTE_TOLERANCE = 0.0005
#: The major levels hold at least this share of the target levels' published cells.
MAJOR_SHARE = 0.5
#: How much better than the reference a plan must be predicted on every major level and attribute:
#: the calibrated predictions of two plans differ from their measured medians by a few percent each
#: (three simulated releases), and a plan predicted a hair better may be measured 5% worse.
REFERENCE_MARGIN = 0.03

Errors = dict[int, dict[str, float]]


def kind_error(errors: Mapping[str, float], kind: str) -> float:
    """An attribute's error at one level: wages', or employment's (month 1's, or the mean of months 1
    and 2 (= 3) of a shape measuring them apart)."""
    if kind == "wage":
        return errors[WAGE]
    return float(np.mean([errors[m] for m in (EMPLOYMENT, "m2emp") if m in errors]))


def major_levels(cells: Mapping[int, int], share: float = MAJOR_SHARE) -> tuple[int, ...]:
    """The fewest levels, most published cells first (the finer level first on a tie), holding at
    least ``share`` of all the levels' cells."""
    total = sum(cells.values())
    out: list[int] = []
    held = 0
    for level in sorted(cells, key=lambda lv: (-cells[lv], -lv)):
        if total > 0 and held >= share * total:
            break
        out.append(level)
        held += cells[level]
    return tuple(out)


@dataclass(frozen=True)
class Judgement:
    """What the rule says of one plan's predicted errors."""

    score: float  # weighted mean of log(error / the base plan's); lower is better
    worst_ratio: float  # largest error / the base plan's over the target levels and attributes
    excess: float  # largest error / the error the base plan allows (<= 1: acceptable)
    behind: bool  # predicted worse than the reference on a major level

    @property
    def acceptable(self) -> bool:
        return self.excess <= 1.0


@dataclass(frozen=True)
class Rule:
    """The choice rule (module docstring): level weights (published cells per target level), the
    weights of employment and wages, the tolerances, and the reference plan's errors with the major
    levels it guards (None: no guard)."""

    level_weights: Mapping[int, float]
    weights: Mapping[str, float] = field(default_factory=lambda: {"employment": 1.0, "wage": 1.0})
    tolerance: float = 0.10
    absolute: float = ABSOLUTE_TOLERANCE
    reference: Errors | None = None
    major: tuple[int, ...] = ()
    lead: float = 0.0  # how much worse than the reference a plan may be on a major level

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(self.level_weights)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind in KINDS if self.weights.get(kind, 0) > 0)

    def allowed(self, base: Mapping[str, float], kind: str) -> float:
        """The error the base plan allows at a level: its own times 1 + tolerance, or plus ``absolute``."""
        error = kind_error(base, kind)
        return max(error * (1 + self.tolerance), error + self.absolute)

    def attribute_score(self, errors: Errors, base: Errors, kind: str) -> float:
        """The level-weighted mean of log(error / the base plan's) of one attribute (its levels in
        ``errors`` and the rule)."""
        levels = [level for level in self.levels if level in errors]
        logs = np.array([math.log(kind_error(errors[level], kind) / kind_error(base[level], kind)) for level in levels])
        weights = np.array([self.level_weights[level] for level in levels], dtype=float)
        return float(np.sum(weights * logs) / np.sum(weights))

    def judge(self, errors: Errors, base: Errors) -> Judgement:
        """Score, worst ratio, excess and whether behind the reference, of ``errors``."""
        rows = {kind: np.array([[kind_error(errors[level], kind) for level in self.levels]]) for kind in KINDS}
        return self.judge_all(rows["employment"], rows["wage"], base, self.levels)[0]

    def judge_all(self, employment: np.ndarray, wage: np.ndarray, base: Errors, levels: Sequence[int]
                  ) -> list[Judgement]:
        """``judge`` of n plans at once: ``employment`` and ``wage`` (n x len(levels), ``levels``
        holding the rule's) are their errors, employment's as ``kind_error`` takes it."""
        columns = [list(levels).index(level) for level in self.levels]
        errors = {"employment": employment[:, columns], "wage": wage[:, columns]}
        base_row = {kind: np.array([kind_error(base[level], kind) for level in self.levels]) for kind in KINDS}
        level_weights = np.array([self.level_weights[level] for level in self.levels], dtype=float)
        level_weights /= level_weights.sum()
        kinds = self.kinds
        largest = max(self.weights[kind] for kind in kinds)  # only the weights' ratio counts: none overflows
        share = {kind: self.weights[kind] / largest for kind in kinds}
        score = sum(share[kind] * (np.log(errors[kind] / base_row[kind]) @ level_weights) for kind in kinds)
        score = score / sum(share[kind] for kind in kinds)
        worst = np.max([np.max(errors[kind] / base_row[kind], axis=1) for kind in kinds], axis=0)
        excess = np.max([np.max(errors[kind] / np.maximum(base_row[kind] * (1 + self.tolerance),
                                                           base_row[kind] + self.absolute), axis=1)
                         for kind in kinds], axis=0)
        behind = np.zeros(len(employment), dtype=bool)
        if self.reference is not None:
            major = [list(levels).index(level) for level in self.major]
            for kind, values in (("employment", employment), ("wage", wage)):
                reference = np.array([kind_error(self.reference[level], kind) for level in self.major])
                behind |= np.any(values[:, major] > reference * (1 + self.lead), axis=1)
        return [Judgement(*row) for row in zip(score.tolist(), worst.tolist(), excess.tolist(), behind.tolist())]

    def behind(self, errors: Errors) -> bool:
        """Whether ``errors`` are worse than the reference's (by more than ``lead``) on a major level."""
        return self.judge(errors, self.reference or errors).behind

    def lenient(self, margin: float) -> Rule:
        """This rule with ``margin`` more tolerance, and ``margin`` of lead on the reference."""
        return replace(self, tolerance=self.tolerance + margin, lead=self.lead + margin)


def as_reference(judgement: Judgement) -> Judgement:
    """The reference's own judgement: never behind itself."""
    return replace(judgement, behind=False)


def preference(judgement: Judgement) -> tuple[bool, bool, float]:
    """The order plans are chosen in (module docstring); lower is better."""
    return judgement.behind, not judgement.acceptable, judgement.score if judgement.acceptable else judgement.excess


def within(candidate: Judgement, best: Judgement, margin: float) -> bool:
    """Whether ``candidate`` (judged leniently) comes within ``margin`` of ``best`` in ``preference``."""
    lenient, bar = preference(candidate), preference(best)
    return lenient[:2] < bar[:2] or (lenient[:2] == bar[:2] and lenient[2] <= bar[2] + margin)


def costs(errors: Errors, reference: Errors, levels: Sequence[int], *, tolerance: float = 0.10,
          absolute: float = ABSOLUTE_TOLERANCE) -> list[tuple[int, str, float, float]]:
    """(level, kind, error, the reference's) where ``errors`` are worse than ``reference``'s by more
    than ``tolerance`` of its error and by more than ``absolute``."""
    out = []
    for level in levels:
        for kind in KINDS:
            error, theirs = kind_error(errors[level], kind), kind_error(reference[level], kind)
            if error > theirs * (1 + tolerance) and error > theirs + absolute:
                out.append((level, kind, error, theirs))
    return out
