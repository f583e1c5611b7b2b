"""Margins of error of tabulations of a release's protected microdata.

Each attribute's margins come from its model (``postprocess.models.attribute_models``, the same
choice its solve made): the weighted least squares' variances (``postprocess.variances``), with the
errors the smoothed months share within cells, or the wage fit's (``postprocess.wages``). The
margin of error of a cell is the half-width of its score interval (``CellVariances.half_width``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.postprocess.cellmargins import indexed_variances
from gedp.postprocess.models import (
    AttributeModel,
    PostprocessOptions,
    VarianceFunction,
    WageModel,
    WageVariances,
    attribute_models,
)
from gedp.postprocess.structured import one_blas_thread
from gedp.postprocess.variances import CellVariances
from gedp.synth.schema import public_columns

#: Suffix of a tabulation column with the slope of each cell's stated variance in its true total.
MOE_SLOPE = "_moe_slope"


@one_blas_thread
def variance_functions(answers: Mapping[str, Sequence[NoisyAnswer]], protected: pd.DataFrame,
                       wage_psi: NeighborFunction | None = None) -> dict[str, VarianceFunction]:
    """(tab_codes, n_tab) -> the variances of tabulation cells of a release's protected microdata, per
    attribute, from its model (``answers``: a release's, as its solve weighed them): from the wage fit
    (made once, here; slope 0) when ``wage_psi`` is given (the release's wages were informed by
    employment), else from the least squares. Each is built once here and applies to any tabulation,
    those by public columns from its per-cell pieces (``cellmargins.indexed_variances``): a function
    of the release's answers and protected microdata only. Built on one BLAS thread: its bits (kept in
    a margin structure) the same on every machine, whatever its BLAS's thread count."""
    models = _models(answers, protected, wage_psi)
    built = {attribute: model.variances(protected) for attribute, model in models.items()}
    return indexed_variances(built, protected)


@one_blas_thread
def variance_function(attribute: str, answers: Mapping[str, Sequence[NoisyAnswer]], protected: pd.DataFrame,
                      wage_psi: NeighborFunction | None = None, kept: Mapping | None = None) -> VarianceFunction:
    """One attribute's variance function (``variance_functions``); ``kept``: what the release's solve
    fitted (``protect_microdata``'s ``kept``), used as it is instead of fitted again."""
    model = _models(answers, protected, wage_psi)[attribute]
    fit = None if kept is None else kept.get(attribute)
    return WageVariances.of(fit) if isinstance(model, WageModel) and fit is not None else model.variances(protected)


def _models(answers: Mapping[str, Sequence[NoisyAnswer]], protected: pd.DataFrame,
            wage_psi: NeighborFunction | None) -> dict[str, AttributeModel]:
    """The release's attribute models, chosen as for its solve, from answers it weighed already."""
    return attribute_models(answers, protected[public_columns(protected)], PostprocessOptions.for_margins(wage_psi))


def margins_of_error(protected: pd.DataFrame, variances: Mapping[str, VarianceFunction], keep: np.ndarray,
                     keys: Sequence[str], n_tab: int) -> dict[str, CellVariances]:
    """The variances and slopes (``CellVariances``: ``half_width`` gives the margins) of every cell
    of a tabulation of a release's protected microdata by ``keys`` (cells in sorted key order) over
    the establishments ``keep``, per attribute of ``variances`` (``variance_functions``)."""
    public = protected[public_columns(protected)]
    unknown = [key for key in keys if key not in public.columns]
    if unknown:
        raise ValueError(f"margins of error by {unknown[0]!r}: margins are given by the release's public columns "
                         f"only ({', '.join(public.columns)}), and {unknown[0]!r} is not one of them (tabulate it "
                         "without --moe, or by public columns)")
    tab_codes = np.full(len(protected), -1, dtype=np.int64)
    # the same groups, in the same order, as the tabulation's sorted group-by
    tab_codes[keep] = public[keep].groupby(list(keys), sort=True, observed=True).ngroup().to_numpy() if keys else 0
    return {attribute: variance(tab_codes, n_tab) for attribute, variance in variances.items()}


def normal_quantile(level: float) -> float:
    """z of a two-sided interval at confidence ``level``."""
    return NormalDist().inv_cdf(0.5 + level / 2)


def half_widths(variances: Mapping[str, VarianceFunction], tab_codes: np.ndarray, n_tab: int,
                level: float) -> dict[str, np.ndarray]:
    """Margins of error (``CellVariances.half_width``) at confidence ``level`` of the ``n_tab`` cells
    of a tabulation whose cell of each establishment is ``tab_codes`` (-1: not tabulated), per attribute."""
    z = normal_quantile(level)
    return {attribute: variance(tab_codes, n_tab).half_width(z) for attribute, variance in variances.items()}
