"""Protected microdata from noisy answers: each attribute solved by its model (``postprocess.models``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from gedp.measure.answers import NoisyAnswer
from gedp.measure.queries import Groupings
from gedp.postprocess.models import PostprocessOptions, attribute_models
from gedp.postprocess.wls import WLSResult


def protect_microdata(
    measurements_by_attribute: Mapping[str, Sequence[NoisyAnswer]],
    public: pd.DataFrame,
    options: PostprocessOptions | None = None,
    *,
    on_step: Callable[[str], None] | None = None,
    finish: Callable[[str, np.ndarray], np.ndarray] | None = None,
    groupings: Groupings | None = None,
    kept: dict | None = None,
) -> tuple[pd.DataFrame, dict[str, WLSResult]]:
    """Protected microdata: the public columns plus every attribute's postprocessed values.

    Each attribute is solved by its model (``models.attribute_models``: plain, months, or wages
    informed by the protected employment, solved last) under ``options`` (default: estimated
    variances, the auto solver). ``finish(attribute, values)``, when given, turns each attribute's
    values into the released ones (an integer release's controlled rounding) before a later
    attribute is solved: the wage fit then takes the employment the release holds, so its margins of
    error can recompute it from the release's files. ``groupings``: of ``public`` (shared with
    measurement). ``on_step`` is told of each attribute solved. ``kept``, when given, receives by
    attribute what the margins of error would fit again from the release (the wage fit), for margins
    made next in this process (``moe.variance_function``'s ``kept``).
    """
    models = attribute_models(measurements_by_attribute, public, options or PostprocessOptions())
    protected = public.copy()
    groupings = groupings or Groupings(public)  # the public columns never change: one per query for all attributes
    results = {}
    for attribute, model in models.items():
        results[attribute] = dataclasses.replace(model.solve(protected, groupings, kept), model=model.name)
        protected[attribute] = (results[attribute].values if finish is None
                                else finish(attribute, results[attribute].values))
        if on_step is not None:
            on_step(f"postprocess {attribute}")
    return protected, results
