"""Noise designs across quarters compared at equal privacy cost on panels of quarters.

Each design of ``gedp.measure.over_time`` is scaled to the same mu over the panel's T quarters and
measures, on the sqrt scale (psi = sqrt, gamma = 0.5 for employment), either the county x NAICS-3
cell totals or every establishment (the identity query, summed to cells afterwards). Least squares
gives each quarter's psi value, the unbiased level yhat^2 - var(yhat), and from the levels the
over-the-quarter and over-the-year changes; their errors against the truth are summarized per design.

The panels are those of ``gedp synth --quarters`` (``gedp.synth.panel``: one synthesized quarter
grown at the Business Employment Dynamics rates and seasonal factors stated there);
``panel_levels`` turns one into the establishments' employment by quarter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gedp.evaluation.replicate import child_streams
from gedp.measure import over_time as ot

#: Employment of the panel: month-1 employment of each quarter.
ATTRIBUTE = "m1emp"
CELL = ("county", "naics3")


def panel_levels(panel: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """A panel (one row per establishment and quarter, ``gedp.synth.panel``) as the public columns
    of every establishment ever present, in order of first appearance, and its employment by
    quarter (n, T), 0 where it is absent."""
    quarter = panel.groupby(["year", "qtr"], sort=True).ngroup().to_numpy()
    ids = panel["estab_id"].astype(str).to_numpy()
    public = panel[["estab_id", *CELL]].assign(estab_id=ids).drop_duplicates("estab_id").reset_index(drop=True)
    row = pd.Index(public["estab_id"]).get_indexer(ids)
    levels = np.zeros((len(public), quarter.max() + 1))
    levels[row, quarter] = panel[ATTRIBUTE].to_numpy(dtype=float)
    return public, levels


def cell_totals(public: pd.DataFrame, panel: np.ndarray) -> np.ndarray:
    """Employment totals of the county x NAICS-3 cells by quarter (cells, T)."""
    codes = public.groupby(list(CELL), observed=True, sort=True).ngroup().to_numpy()
    totals = np.zeros((codes.max() + 1, panel.shape[1]))
    np.add.at(totals, codes, panel)
    return totals


def estimated_levels(design: ot.Design, truth: np.ndarray, sd: float, *, rng: np.random.Generator) -> np.ndarray:
    """Unbiased levels from one release of ``design`` on sqrt(truth): yhat^2 - var(yhat) per quarter."""
    answers = ot.release_answers(design, np.sqrt(truth), sd, rng=rng)
    return ot.sqrt_levels(ot.gls_estimates(design, answers), ot.estimate_covariance(design, sd))


def _summary(estimates: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    out = {}
    for kind in ot.CONTRAST_KINDS:
        rows = ot.contrasts(truth.shape[1], kind)
        error = np.abs((estimates - truth) @ rows.T)
        out[f"{kind}_abs"] = float(np.median(error))
        out[f"{kind}_rel"] = float(np.median(error / (np.abs(truth @ rows.T) + 1)))
    return out


def compare_designs(public: pd.DataFrame, panel: np.ndarray, designs: Sequence[ot.Design], *, mu: float,
                    gamma: float, replications: int, seed: int) -> pd.DataFrame:
    """Median errors of levels and changes of county x NAICS-3 cells for each design at the same mu.

    Two measurements per design: ``cells`` (the cell totals measured directly) and ``identity``
    (the establishments present in every quarter measured, their levels summed to cells; compared
    with those establishments' cell totals). Medians pool cells and replications; every design
    draws from the same ``seed``'s replication streams.
    """
    cells = cell_totals(public, panel)
    continuing = (panel > 0).all(axis=1)
    codes = public[continuing].groupby(list(CELL), observed=True, sort=True).ngroup().to_numpy()
    continuing_cells = cell_totals(public[continuing], panel[continuing])
    rows = []
    for design in designs:
        sd = ot.design_sd(design, gamma, mu)
        for path, truth in (("cells", cells), ("identity", continuing_cells)):
            estimates = []
            for stream in child_streams(seed, replications):
                if path == "cells":
                    estimates.append(estimated_levels(design, cells, sd, rng=stream))
                else:
                    levels = estimated_levels(design, panel[continuing], sd, rng=stream)
                    summed = np.zeros_like(truth)
                    np.add.at(summed, codes, levels)
                    estimates.append(summed)
            rows.append({"design": design.name, "path": path,
                         **_summary(np.vstack(estimates), np.tile(truth, (replications, 1)))})
    return pd.DataFrame(rows)


#: Size bands (employees in the first quarter) for the coverage of change margins.
SIZE_BANDS = (0, 10, 100, 1_000, np.inf)


def year_change_coverage(design: ot.Design, truth: np.ndarray, *, mu: float, gamma: float, replications: int,
                         seed: int) -> dict[str, float]:
    """Share of 95% margins of the first over-the-year change (from ``sqrt_contrast_variances``) that
    cover the true change, by the cell's size band in the first quarter."""
    sd = ot.design_sd(design, gamma, mu)
    covariance = ot.estimate_covariance(design, sd)
    row = ot.contrasts(truth.shape[1], "year")[:1]
    true_change = (truth @ row.T)[:, 0]
    covered = []
    for stream in child_streams(seed, replications):
        estimates = ot.gls_estimates(design, ot.release_answers(design, np.sqrt(truth), sd, rng=stream))
        change = (ot.sqrt_levels(estimates, covariance) @ row.T)[:, 0]
        margin = 1.959964 * np.sqrt(ot.sqrt_contrast_variances(estimates, covariance, row)[:, 0])
        covered.append(np.abs(change - true_change) <= margin)
    hits = np.vstack(covered)
    band = np.digitize(truth[:, 0], SIZE_BANDS[1:-1])
    return {f"{SIZE_BANDS[b]:g}+": float(hits[:, band == b].mean()) for b in range(len(SIZE_BANDS) - 1)
            if (band == b).any()}
