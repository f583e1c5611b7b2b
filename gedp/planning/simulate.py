"""Simulated releases of the public stand-in, which calibrate the analytic prediction.

The analytic prediction (``predict``) leaves out the nonnegativity bounds (which shrink small
cells' employment errors) and the wage prior's bias (which grows county wage errors). A release of
the stand-in simulated as ``gedp protect`` makes it (the plan's measurements, then ``protect_microdata`` under the
config's options: months smoothed once) has both; its error on the stand-in is a prediction made from public data
only. A level's median over few cells is noisy, so a simulated median replaces the analytic one
only where the cells with a true value of at least 1, times the releases, number at least
``MIN_CELL_RELEASES`` (the median's sampling error is then under about 10%); the state total and
levels with a handful of cells keep the analytic median.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gedp.config import Config
from gedp.evaluation.replicate import child_streams
from gedp.measure.queries import Groupings
from gedp.measure.workflows import measure
from gedp.planning.predict import TargetCells
from gedp.postprocess.models import PostprocessOptions
from gedp.postprocess.protect import protect_microdata
from gedp.synth.schema import public_columns

#: Cells x releases below which a level's simulated median is too noisy to replace the analytic one.
MIN_CELL_RELEASES = 100

Errors = dict[int, dict[str, float]]
ReleaseErrors = dict[tuple[int, str], np.ndarray]


def simulated_errors(microdata, cells: Sequence[TargetCells], config: Config, attributes: Sequence[str], *,
                     releases: int, seed: int) -> tuple[Errors, dict[int, dict[str, int]]]:
    """Median relative error per level and attribute over ``releases`` simulated releases of the
    stand-in ``microdata`` (pooled over cells with a true value >= 1 and releases, as
    ``evaluation.accuracy`` pools them), and the number of cells x releases behind each."""
    return pooled_medians([release_errors(microdata, cells, config, attributes, rng)
                           for rng in child_streams(seed, releases)])


def release_errors(microdata, cells: Sequence[TargetCells], config: Config, attributes: Sequence[str],
                   rng: np.random.Generator, groupings: Groupings | None = None) -> ReleaseErrors:
    """One simulated release's relative errors per (level, attribute) on the cells with a true value
    >= 1 (``groupings``: of the stand-in's public columns, shared between releases)."""
    public = microdata[public_columns(microdata)]
    plan = config.plan
    measurements = measure(microdata, plan, rng=rng, groupings=groupings)
    release, _ = protect_microdata({a: measurements.for_attribute(a) for a in plan.attributes}, public,
                                   PostprocessOptions.from_config(config), groupings=groupings)
    errors: ReleaseErrors = {}
    for target in cells:
        inside = target.codes >= 0
        for attribute in attributes:
            true = target.true[attribute]
            sums = np.bincount(target.codes[inside], weights=release[attribute].to_numpy()[inside],
                               minlength=target.n_cells)
            keep = true >= 1
            errors[(target.level, attribute)] = np.abs(sums - true)[keep] / true[keep]
    return errors


def pooled_medians(releases: Sequence[ReleaseErrors]) -> tuple[Errors, dict[int, dict[str, int]]]:
    """The median per level and attribute of the releases' errors pooled, and the count behind each."""
    medians: Errors = {}
    counts: dict[int, dict[str, int]] = {}
    for level, attribute in releases[0]:
        pooled = np.concatenate([errors[(level, attribute)] for errors in releases])
        medians.setdefault(level, {})[attribute] = float(np.median(pooled)) if len(pooled) else float("nan")
        counts.setdefault(level, {})[attribute] = len(pooled)
    return medians, counts


def calibrated(analytic: Errors, simulated: Errors, counts: dict[int, dict[str, int]]) -> Errors:
    """The simulated median where at least ``MIN_CELL_RELEASES`` cells x releases stand behind it,
    the analytic one elsewhere."""
    return {level: {attribute: (simulated[level][attribute]
                                if counts.get(level, {}).get(attribute, 0) >= MIN_CELL_RELEASES else value)
                    for attribute, value in by_attribute.items()}
            for level, by_attribute in analytic.items()}
