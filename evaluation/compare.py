"""Protected versus true: per-group differences and their summaries (SPEC section 6, metrics)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gedp.postprocess.tabulate import group_keys, tabulate


def compare_tabulations(
    truth: pd.DataFrame, protected: pd.DataFrame, by: Sequence[str], attribute: str
) -> pd.DataFrame:
    """Per group of ``by``: true and protected totals, signed, absolute and relative differences.

    relative = |protected - true| / (true + 1), so empty or tiny cells do not divide by zero.
    """
    true_table = tabulate(truth, by, [attribute]).rename(columns={attribute: "true"})
    protected_table = tabulate(protected, by, [attribute]).rename(columns={attribute: "protected"})
    keys = group_keys(truth, by)
    if keys:
        table = true_table.merge(protected_table[[*keys, "protected"]], on=keys, how="outer", validate="one_to_one")
    else:
        table = true_table.assign(protected=protected_table["protected"].to_numpy())
    table[["true", "protected"]] = table[["true", "protected"]].fillna(0.0)
    table["signed"] = table["protected"] - table["true"]
    table["absolute"] = table["signed"].abs()
    table["relative"] = table["absolute"] / (table["true"] + 1.0)
    return table


def error_summary(comparison: pd.DataFrame) -> dict[str, float]:
    """Quartiles and mean of signed differences, mean absolute and median relative difference."""
    signed = comparison["signed"].to_numpy(dtype=float)
    q1, median, q3 = np.quantile(signed, [0.25, 0.5, 0.75])
    return {
        "groups": int(len(comparison)),
        "signed_q1": float(q1),
        "signed_median": float(median),
        "signed_q3": float(q3),
        "signed_mean": float(signed.mean()),
        "mean_absolute": float(comparison["absolute"].mean()),
        "median_relative": float(comparison["relative"].median()),
    }
