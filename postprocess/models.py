"""Attribute models: how each confidential attribute's answers become protected values, and what
the margins of error of its tabulations are.

Every model implements one small interface (``AttributeModel``): the answers the least squares
fits, the solve with the model's prior, and the variances of tabulation cells. There are three:

* ``PlainModel``: the attribute's own answers, fitted by the weighted least squares
  (``postprocess.wls``) with no prior.
* ``MonthModel``: a month of employment, whose identity answers are smoothed across the months
  under the ``smoothed`` and ``pooled`` variance modes (``postprocess.months``) before that least
  squares, and whose margins add the errors the months share within cells.
* ``WageModel``: wages, with a prior informed by protected employment (``postprocess.wages``).

``attribute_models`` is the one place a model is chosen for each attribute; a release's solve and
its margins of error both call it, so they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np
import pandas as pd

from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.measure.queries import Groupings
from gedp.postprocess import wage_margins, wages
from gedp.postprocess.attributes import MONTHS, WAGE, WAGE_PRIOR
from gedp.postprocess.months import month_answers, pattern_cells
from gedp.postprocess.structured import GroupFactorizations
from gedp.postprocess.variances import CellVariances, answers_structure
from gedp.postprocess.wls import RELEASE_VARIANCE_MODES, WLSResult, protect_attribute
from gedp.synth.schema import public_columns

if TYPE_CHECKING:
    from gedp.measure.workflows import MeasurementPlan

#: (tab_codes, n_tab) -> the variances of an attribute's tabulation cells.
VarianceFunction = Callable[[np.ndarray, int], CellVariances]
Answers = Mapping[str, Sequence[NoisyAnswer]]


class ReleaseConfig(Protocol):
    """What the options read from a release configuration (the typed config of the front)."""

    @property
    def variance_mode(self) -> str: ...

    @property
    def solver(self) -> str: ...

    @property
    def wages(self) -> str: ...

    @property
    def plan(self) -> MeasurementPlan: ...


@dataclass(frozen=True)
class PostprocessOptions:
    """How noisy answers are postprocessed.

    Attributes:
        variance_mode: what the least squares weighs the answers by (``wls.VARIANCE_MODES``; an
            unknown one is refused by the solve).
        solver: "auto", "structured" or a cvxpy solver (``wls.SOLVERS``; likewise).
        wages: "employment" (informed by protected employment, where it applies) or "wls".
        psi: the plan's neighbor function (needed by the month modes and the wage model).
        exact_variances: true variances per attribute and query name (confidential: ablation
            studies of the ``exact`` and ``hybrid`` modes only).
    """

    variance_mode: str = "estimated"
    solver: str = "auto"
    wages: str = "employment"
    psi: NeighborFunction | None = None
    exact_variances: Mapping[str, Mapping[str, np.ndarray]] | None = None

    def __post_init__(self) -> None:
        if self.wages not in wages.WAGE_METHODS:
            raise ValueError(f"wages '{self.wages}' is unknown; choose one of {', '.join(wages.WAGE_METHODS)}")

    @classmethod
    def from_config(cls, config: ReleaseConfig) -> PostprocessOptions:
        """The options a release configuration asks for."""
        return cls(variance_mode=config.variance_mode, solver=config.solver, wages=config.wages, psi=config.plan.psi)

    @classmethod
    def for_margins(cls, wage_psi: NeighborFunction | None) -> PostprocessOptions:
        """The options that choose a release's models for its margins of error, from answers already
        weighed as its solve weighed them: ``wage_psi`` is the release's psi when its wages were
        informed by employment (as the release manifest records), else None."""
        return cls(wages="wls" if wage_psi is None else "employment", psi=wage_psi)

    @property
    def wage_psi(self) -> NeighborFunction | None:
        """The psi wages are informed by employment with: only with released or pooled variances
        and the structured solver (None otherwise)."""
        if (self.wages == "employment" and self.variance_mode in RELEASE_VARIANCE_MODES
                and self.solver in ("auto", "structured")):
            return self.psi
        return None


class AttributeModel(Protocol):
    """One attribute's model: its answers to fit, its solve (with its prior) and its margins; its
    ``name`` is recorded with the solve (``WLSResult.model``, the manifest's solver section)."""

    attribute: str
    name: ClassVar[str]

    @property
    def answers(self) -> Sequence[NoisyAnswer]:
        """The answers the least squares fits."""
        ...

    def solve(self, protected: pd.DataFrame, groupings: Groupings, kept: dict | None = None) -> WLSResult:
        """The attribute's protected values, from ``protected`` (the public columns and the
        attributes protected before) and ``groupings`` of its public columns; ``kept``, when given,
        receives by attribute what the margins would fit again (``variance_function``'s ``kept``)."""
        ...

    def variances(self, protected: pd.DataFrame) -> VarianceFunction:
        """The variances of tabulation cells of a release's protected microdata."""
        ...


@dataclass(frozen=True, eq=False)
class _ModelOf:
    """A model of ``attribute`` over a release's answers (its own and the other attributes')."""

    attribute: str
    answers_by_attribute: Answers

    @property
    def answers(self) -> Sequence[NoisyAnswer]:
        """The attribute's answers (as the variance mode weighs them)."""
        return self.answers_by_attribute[self.attribute]


@dataclass(frozen=True, eq=False)
class PlainModel(_ModelOf):
    """The attribute's own answers, fitted by the weighted least squares with no prior."""

    options: PostprocessOptions
    name: ClassVar[str] = "plain"

    def solve(self, protected: pd.DataFrame, groupings: Groupings, kept: dict | None = None) -> WLSResult:
        """The weighted least squares of the answers (nothing kept: its margins fit nothing again)."""
        exact = self.options.exact_variances
        return protect_attribute(self.answers, protected, variance_mode=self.options.variance_mode,
                                 solver=self.options.solver,
                                 exact_variances=None if exact is None else exact[self.attribute], groupings=groupings)

    def variances(self, protected: pd.DataFrame) -> VarianceFunction:
        """The least squares' variances of tabulation cells (``variances.answers_structure``), the
        identity variances shrunk where the bound holds the protected values."""
        return answers_structure(self.answers, protected[public_columns(protected)],
                                 values=_protected_values(protected, self.attribute))


@dataclass(frozen=True, eq=False)
class MonthModel(PlainModel):
    """A month of employment: its identity answers smoothed across the months before the least
    squares (``month_answers``, for all months at once), and its margins with the errors the
    smoothed months share within cells (``NoisyAnswer.pattern_loading``)."""

    name: ClassVar[str] = "months"

    def variances(self, protected: pd.DataFrame) -> VarianceFunction:
        """The least squares' variances, plus the errors shared within cells (grouped once here)."""
        public = protected[public_columns(protected)]
        identity = next((a for a in self.answers if a.query.is_identity), None)
        shared = identity is not None and identity.pattern_loading is not None
        return answers_structure(self.answers, public, pattern_cells=pattern_cells(public) if shared else None,
                                 values=_protected_values(protected, self.attribute))


@dataclass(frozen=True, eq=False)
class WageModel(_ModelOf):
    """Wages with a prior informed by protected employment (``postprocess.wages``)."""

    psi: NeighborFunction
    name: ClassVar[str] = WAGE_PRIOR

    def solve(self, protected: pd.DataFrame, groupings: Groupings, kept: dict | None = None) -> WLSResult:
        """The wage fit at the protected employment (``wages.protect_wages``), kept in ``kept``."""
        return wages.protect_wages(self.answers_by_attribute, protected, self.psi, groupings, kept)

    def variances(self, protected: pd.DataFrame) -> VarianceFunction:
        """The wage fit's variances (the fit made once, here; slope 0)."""
        return WageVariances.of(wages.fit_wages(self.answers_by_attribute, protected, self.psi))


@dataclass(frozen=True, eq=False)
class WageVariances:
    """The variances of tabulation cells of wages from the wage fit (slope 0), with the factorizations
    every tabulation's variances use (``wage_margins.wage_factorizations``; None: made for each)."""

    fit: wages.WageFit
    kept: GroupFactorizations | None = None

    @classmethod
    def of(cls, fit: wages.WageFit) -> WageVariances:
        """The variances of a wage fit, its factorizations made once here."""
        return cls(fit, wage_margins.wage_factorizations(fit))

    def __call__(self, tab_codes: np.ndarray, n_tab: int) -> CellVariances:
        """The variances of the cells of one tabulation (``wage_margins.wage_variances``)."""
        return CellVariances(wage_margins.wage_variances(self.fit, tab_codes, n_tab, self.kept), np.zeros(n_tab))


def attribute_models(answers_by_attribute: Answers, public: pd.DataFrame | None,
                     options: PostprocessOptions) -> dict[str, AttributeModel]:
    """Each attribute's model, wages last (their prior reads the protected employment): the one place
    models are chosen. The months' answers are turned by the variance mode first (``month_answers``
    over ``public``, the public microdata, without the loadings only margins need)."""
    turned = month_answers(answers_by_attribute, options.variance_mode, options.psi, public, loadings=False)
    models: dict[str, AttributeModel] = {}
    for attribute in sorted(turned, key=lambda name: name == WAGE):
        wage_psi = options.wage_psi
        if wage_psi is not None and wages.applies(turned[attribute], attribute, list(turned)):
            models[attribute] = WageModel(attribute, turned, wage_psi)
        elif attribute in MONTHS:
            models[attribute] = MonthModel(attribute, turned, options)
        else:
            models[attribute] = PlainModel(attribute, turned, options)
    return models


def _protected_values(protected: pd.DataFrame, attribute: str) -> np.ndarray | None:
    """An attribute's protected values, whose bound shrinks its identity variances; None for an
    attribute that is not a column of the microdata (a job family's worker categories)."""
    return protected[attribute].to_numpy(dtype=float) if attribute in protected.columns else None
