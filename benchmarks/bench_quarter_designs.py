"""Noise designs across quarters at equal annual privacy cost, on panels grown from RI and NJ.

Five quarters (2016Q1 to 2017Q1) at the annual rate 2.3065 per four quarters (mu = 2.3065 sqrt(5/4)
over the panel, mu_q = 1.153 per quarter for independent releases); employment (month 1), psi = sqrt,
gamma = 0.5; county x NAICS-3 cells measured directly and through the identity query. The panels are
those of ``gedp synth --from-qcew FILE --quarters 2016Q1:2017Q1`` (``gedp.synth.panel``).
Also the continuing-series view: the same contrasts over 8 and 12 quarters, where every quarter has
its over-the-year partner. Writes benchmarks/RESULTS-quarter-designs.md.

    python benchmarks/bench_quarter_designs.py [--replications 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

import numpy as np

from gedp.evaluation import quarter_designs as qd
from gedp.measure import over_time as ot
from gedp.synth.establishments import synthesize_state
from gedp.synth.panel import grown_panel
from gedp.synth.qcew import read_qcew

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
STATES = {"RI": "qcew_2016q1_44.csv", "NJ": "qcew_2016q1_34.csv"}
ANNUAL_MU = 2.3065
QUARTERS = 5
GAMMA = 0.5
OUT = Path(__file__).with_name("RESULTS-quarter-designs.md")


def designs(quarters: int) -> list[ot.Design]:
    """Independent, the optimized change-measuring designs, shared components and the binary tree."""
    optimized = [ot.optimal_design(quarters, {"level": 1, "year": weight}) for weight in (0.3, 1, 3, 10)]
    return [ot.independent_design(quarters), *optimized,
            ot.optimal_design(quarters, {"level": 1, "quarter": 1, "year": 1}),
            ot.shared_component_design(quarters, 0.5), ot.shared_component_design(quarters, 0.9),
            ot.binary_tree_design(quarters)]


def state_table(state: str, replications: int) -> list[str]:
    """Measured medians for one state, each as a ratio to independent releases beside its value."""
    microdata = synthesize_state(read_qcew(DATA / STATES[state]), rng=np.random.default_rng(1))
    grown = grown_panel(microdata, "2016Q1:2017Q1", rng=np.random.default_rng(2))
    public, panel = qd.panel_levels(grown)
    mu = ANNUAL_MU * np.sqrt(QUARTERS / 4)
    table = qd.compare_designs(public, panel, designs(QUARTERS), mu=mu, gamma=GAMMA,
                               replications=replications, seed=3)
    lines = [f"### {state}: {len(public):,} establishments, {len(qd.cell_totals(public, panel)):,} cells",
             "", "| design | measured | level | over the quarter | over the year | year, relative |",
             "|---|---|---|---|---|---|"]
    for path, part in table.groupby("path", sort=False):
        base = part.iloc[0]
        for _, row in part.iterrows():
            cells = [f"{row[k]:.2f} ({row[k] / base[k]:.2f})" for k in ("level_abs", "quarter_abs", "year_abs")]
            lines.append(f"| {row.design} | {path} | {' | '.join(cells)} | {row.year_rel:.3f} |")
    lines += ["", "Coverage of 95% margins of the over-the-year change (cells measured directly), by the cell's "
              "employment in the first quarter:", "", "| design | " + " | ".join(
                  f"{low:g}+" for low in qd.SIZE_BANDS[:-1]) + " |", "|---" * len(qd.SIZE_BANDS) + "|"]
    cells = qd.cell_totals(public, panel)
    for design in (designs(QUARTERS)[0], designs(QUARTERS)[3], designs(QUARTERS)[7]):
        coverage = qd.year_change_coverage(design, cells, mu=mu, gamma=GAMMA, replications=replications, seed=4)
        lines.append(f"| {design.name} | " + " | ".join(f"{value:.3f}" for value in coverage.values()) + " |")
    return [*lines, ""]


def horizon_table() -> list[str]:
    """Mean contrast variances on the psi scale relative to independent, by horizon (exact, no data)."""
    lines = ["| quarters | design | level | over the quarter | over the year |", "|---|---|---|---|---|"]
    for quarters in (5, 8, 12):
        base = ot.independent_design(quarters)
        for weight in (1, 3):
            design = ot.optimal_design(quarters, {"level": 1, "year": weight})
            ratios = [ot.contrast_variances(design, ot.design_sd(design, 1, 1), kind).mean()
                      / ot.contrast_variances(base, ot.design_sd(base, 1, 1), kind).mean()
                      for kind in ot.CONTRAST_KINDS]
            lines.append(f"| {quarters} | {design.name} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=20)
    args = parser.parse_args()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {stamp}: designs across quarters, {args.replications} replications "
             f"(load {os.getloadavg()[0]:.2f})", "",
             "Median absolute error (employees) of county x NAICS-3 employment levels and changes, pooled over "
             "cells, quarters and replications; in brackets the ratio to independent releases of the same "
             "measurement. Last column: median of |error| / (|true over-the-year change| + 1).", ""]
    for state in STATES:
        lines += state_table(state, args.replications)
    lines += ["### Variance relative to independent releases by horizon (psi scale, exact)", "",
              *horizon_table()]
    previous = OUT.read_text() if OUT.exists() else "# Designs across quarters\n\nNewest last.\n\n"
    OUT.write_text(previous + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
