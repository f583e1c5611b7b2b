"""Bias of gross job gains and losses from protected microdata, raw and corrected (run on demand).

A state's stand-in (``gedp synth --from-qcew``) is the first quarter; the panel synthesizer
(``gedp.synth.panel``, as ``gedp synth --quarters``) grows the second at its BED rates. Each
replication protects both quarters under the recommended plan at half its mu (an annual budget
of 2.3065 over four quarters) and compares the gains and losses of county x sector cells with the
truth.

    python benchmarks/bench_gains.py STATE.parquet --replications 5 --out results.json
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.config import load_config
from gedp.postprocess.gains import gains_losses
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.tabulation.panel_gains import between_releases

BY = "county,sector"
KEYS = ["state", "county", "sector"]


def quarter_config(quarters: int = 4) -> dict:
    """The recommended plan with every mu divided by sqrt(quarters)."""
    config = copy.deepcopy(load_config("recommended").raw)
    for query in config["queries"]:
        query["mu"] = {attribute: mu / np.sqrt(quarters) for attribute, mu in query["mu"].items()}
    config["mu_cap"] = config["mu_cap"] / np.sqrt(quarters)
    return config


def replication(first: pd.DataFrame, second: pd.DataFrame, config: dict, seed: int, folder: Path) -> pd.DataFrame:
    """One protected pair against the truth, cell by cell."""
    paths = []
    for i, frame in enumerate((first, second)):
        release = gedp.protect(frame, config, seed=seed * 2 + i, not_for_publication=True)
        paths.append(folder / f"q{i + 1}-{seed}")
        release.write(paths[-1])
    truth = gains_losses(first, second, BY)
    estimate = between_releases(paths[0], paths[1], BY)
    return truth.merge(estimate, on=KEYS, suffixes=("", "_hat"))


def summary(cells: pd.DataFrame, employment: float) -> dict:
    """State totals (bias as a share of the true sum) and cell-level relative errors."""
    totals = cells.groupby("rep")[["gains", "gains_hat", "gains_corrected", "losses", "losses_hat",
                                   "losses_corrected", "net", "net_hat"]].sum().mean()
    result: dict = {"employment": employment, "cells": int(cells["rep"].eq(0).sum())}
    for name in ("gains", "losses"):
        true = cells[name].clip(lower=1.0)
        raw, corrected = (cells[f"{name}_hat"] - cells[name]) / true, (cells[f"{name}_corrected"] - cells[name]) / true
        result[name] = {
            "true_share_of_employment": totals[name] / employment,
            "raw_bias_total": totals[f"{name}_hat"] / totals[name] - 1,
            "corrected_bias_total": totals[f"{name}_corrected"] / totals[name] - 1,
            "raw_median_relative_error": float(raw.abs().median()),
            "corrected_median_relative_error": float(corrected.abs().median()),
            "corrected_median_signed_relative_error": float(corrected.median()),
            "corrected_within_raw_moe": float(((cells[f"{name}_corrected"] - cells[name]).abs()
                                               <= cells[f"{name}_moe"]).mean()),
        }
    result["net"] = {"bias_total": (totals["net_hat"] - totals["net"]) / employment,
                     "coverage_95": float(((cells["net_hat"] - cells["net"]).abs() <= cells["net_moe"]).mean())}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state", type=Path)
    parser.add_argument("--replications", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    panel = synthesize_panel(pd.read_parquet(args.state), quarter_range("2016Q1:2016Q2"),
                             rng=np.random.default_rng(11))
    first, second = (panel[panel["qtr"] == qtr].reset_index(drop=True) for qtr in (1, 2))
    config = quarter_config()
    with tempfile.TemporaryDirectory() as folder:
        cells = pd.concat([replication(first, second, config, seed, Path(folder)).assign(rep=seed)
                           for seed in range(args.replications)], ignore_index=True)
    result = summary(cells, float(first["m3emp"].sum()))
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
