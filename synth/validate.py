"""How synthetic microdata compares with the published QCEW cells it was fitted to."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gedp.synth.establishments import top_share
from gedp.synth.qcew import PublishedState
from gedp.synth.schema import CONFIDENTIAL


def _stats(values: np.ndarray) -> dict[str, float]:
    return {"min": float(values.min()), "median": float(np.median(values)), "max": float(values.max()),
            "mean": float(values.mean()), "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0}


def validation_report(microdata: pd.DataFrame, published: PublishedState) -> dict:
    """Per aggregation level: cells published / suppressed, the largest difference between synthetic
    and published values over published cells (0 when the fit is exact; fractional published values
    are compared as rounded on reading, see ``rounded_to_whole_numbers``), and the distribution of
    establishments, employment (month 1) and wages per cell of the synthetic data."""
    cells = published.cells[["county", "naics"]]
    grouped = microdata.groupby(["county", "naics"], observed=True)
    finest = grouped[list(CONFIDENTIAL)].sum().assign(estabs=grouped.size())
    finest = finest.reindex(pd.MultiIndex.from_frame(cells)).fillna(0.0)
    unexpected = len(grouped) - int((finest["estabs"] > 0).sum())
    synthetic = {c: published.membership @ finest[c].to_numpy() for c in ("estabs", *CONFIDENTIAL)}
    aggregates = published.aggregates
    levels = {}
    for level, rows in aggregates.groupby("agglvl").indices.items():
        shown = ~aggregates["suppressed"].to_numpy()[rows]
        differences = {
            a: float(np.max(np.abs(synthetic[a][rows][shown] - aggregates[a].to_numpy()[rows][shown]), initial=0.0))
            for a in CONFIDENTIAL
        }
        occupied = synthetic["estabs"][rows] > 0
        levels[str(level)] = {
            "cells": int(len(rows)),
            "published": int(shown.sum()),
            "suppressed": int((~shown).sum()),
            "max_abs_difference": differences,
            "max_abs_difference_estabs": float(
                np.max(np.abs(synthetic["estabs"][rows] - aggregates["estabs"].to_numpy()[rows]))
            ),
            "per_cell": {
                name: _stats(synthetic[column][rows][occupied])
                for name, column in (("establishments", "estabs"), ("employment_m1", "m1emp"), ("wages", "wage"))
            },
        }
    exact = all(
        v == 0
        for level in levels.values()
        for v in (*level["max_abs_difference"].values(), level["max_abs_difference_estabs"])
    )
    return {
        "state": published.state,
        "year": published.year,
        "qtr": published.qtr,
        "establishments": int(len(microdata)),
        "exact": bool(exact and unexpected == 0),
        "rounded_to_whole_numbers": list(published.rounded),
        "cells_outside_published": unexpected,
        "negative_values": int((microdata[list(CONFIDENTIAL)] < 0).to_numpy().sum()),
        "top1_share_m1emp_cells_5plus": top_share(microdata),
        "levels": levels,
    }
