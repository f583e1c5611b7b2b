"""Cell suppression run as an agency would: the published table, the audit, shares per level, and
(when the data was fitted to a published QCEW file) the real suppression shares next to ours."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gedp.evaluation.baselines.suppression import SuppressionResult, suppression_shares
from gedp.evaluation.report import Report
from gedp.postprocess.tabulate import qcew_tables
from gedp.release.format import AUDIT_FILE, PUBLISHED_FILE, SHARES_FILE
from gedp.synth.qcew import QCEW_VALUE_COLUMNS


def published_table(microdata: pd.DataFrame, result: SuppressionResult) -> pd.DataFrame:
    """Every QCEW cell in BLS layout as the agency would publish it: suppressed cells get
    disclosure_code "N" and zero employment and wages; establishment counts stay published."""
    table = qcew_tables(microdata)
    cells = result.table.cells
    status = pd.DataFrame({
        "area_fips": cells["state"] + cells["county"], "own_code": cells["own"], "industry_code": cells["industry"],
        "agglvl_code": cells["agglvl"], "suppressed": result.suppressed,
    })
    table = table.merge(status, on=["area_fips", "own_code", "industry_code", "agglvl_code"], how="left",
                        validate="one_to_one")
    hidden = table.pop("suppressed").fillna(False).to_numpy(dtype=bool)
    table.insert(6, "disclosure_code", np.where(hidden, "N", ""))
    for column in QCEW_VALUE_COLUMNS.values():
        if column in table:
            table[column] = table[column].astype(float).where(~hidden, 0.0)
    return table


def write_suppression(out: Path, microdata: pd.DataFrame, result: SuppressionResult, *, data_label: str,
                      published_shares: pd.Series | None = None) -> dict:
    """cells.csv (public), audit_confidential.csv, shares.csv, report.md, summary.json and a plot."""
    shares = _write_tables(out, microdata, result, published_shares)
    report = Report(out, "Cell suppression")
    _setup_section(report, microdata, result, data_label)
    _shares_section(report, result, shares, published=published_shares is not None)
    _plot_shares(report, shares, published=published_shares is not None)
    summary = _summary(microdata, result, shares, data_label, published=published_shares is not None)
    report.write(summary)
    return summary


def _write_tables(out: Path, microdata: pd.DataFrame, result: SuppressionResult,
                  published_shares: pd.Series | None) -> pd.DataFrame:
    """The published cells, the confidential audit intervals and the shares withheld; returns the shares."""
    published_table(microdata, result).to_csv(out / PUBLISHED_FILE, index=False)
    if result.audit is not None:
        audit = result.audit.intervals.merge(result.table.cells[["state", "county", "agglvl", "industry", "estabs"]],
                                             left_on="cell", right_index=True)
        audit.drop(columns="cell").to_csv(out / AUDIT_FILE, index=False)
    shares = suppression_shares(result)
    if published_shares is not None:
        shares["published_share"] = shares["agglvl"].map(published_shares)
    shares.to_csv(out / SHARES_FILE, index=False)
    return shares


def _setup_section(report: Report, microdata: pd.DataFrame, result: SuppressionResult, data_label: str) -> None:
    """The data, the rule, the secondary suppression and the audit's outcome, then the run's log."""
    rule = result.rule
    failures = None if result.audit is None else result.audit.failures
    report.section(
        "Setup",
        f"Data: {data_label}, {len(microdata):,} establishments, {len(result.table.cells):,} cells at QCEW levels "
        f"51-58 and 71-78. Primary suppression: p% rule with p = {rule.p:g} on {', '.join(rule.attributes)} and "
        f"fewer than {rule.min_estabs} establishments. Secondary suppression: until no additive relation (industry "
        "hierarchy in every area, state = sum of counties at every industry level) has exactly one suppressed "
        "cell. " + ("Audit: for every suppressed cell and attribute, the interval of values consistent with the "
                    "published cells and nonnegativity (HiGHS LPs); a primary cell fails when the interval is a "
                    "point or reaches less than (p/100) x1 - (T - x1 - x2) beyond the true value on either side, and "
                    "failures are repaired by suppressing a published cell that pins the interval. "
                    f"{result.repair_rounds} repair round(s); {failures['cell'].nunique()} primary cells still fail. "
                    f"{_skipped_sentence(result.audit.intervals)}"
                    f"{result.audit.determined_secondaries} secondary cells are determined exactly by the published "
                    "ones (harmless: they are not sensitive, and the primaries' intervals account for it)."
                    if result.audit is not None else "No audit was run."),
        "\n".join(f"- {line}" for line in result.log),
    )


def _shares_section(report: Report, result: SuppressionResult, shares: pd.DataFrame, *, published: bool) -> None:
    """The table of shares withheld per aggregation level (and BLS's, when given)."""
    attribute = result.rule.attributes[0]
    columns = ["agglvl", "cells", "withheld cells", f"withheld {attribute}", "withheld before audit repair"]
    if published:
        columns.append("withheld by BLS")
    report.section("Shares withheld per aggregation level",
                   "Before audit repair: primary and secondary suppression only, the pattern a rule-based system "
                   "without an LP audit would publish.")
    report.table(columns, [[int(r.agglvl), f"{int(r.cells):,}", f"{r.suppressed_share:.1%}",
                            f"{getattr(r, f'{attribute}_share'):.1%}", f"{r.before_repair_share:.1%}",
                            *([f"{r.published_share:.1%}"] if published else [])]
                           for r in shares.itertuples()])


def _plot_shares(report: Report, shares: pd.DataFrame, *, published: bool) -> None:
    figure, ax = plt.subplots(figsize=(10, 3.8))
    positions = np.arange(len(shares))
    width = 0.4 if published else 0.8
    ax.bar(positions - (width / 2 if published else 0), shares["suppressed_share"], width,
           label="this suppression (audited)")
    ax.scatter(positions - (width / 2 if published else 0), shares["before_repair_share"],
               marker="_", s=200, color="black", zorder=3, label="before audit repair")
    if published:
        ax.bar(positions + width / 2, shares["published_share"], width, label="withheld by BLS")
    ax.set_xticks(positions, shares["agglvl"].astype(str))
    ax.set_xlabel("aggregation level (51-58 state, 71-78 county; total to NAICS-6)")
    ax.set_ylabel("share of cells withheld")
    ax.legend()
    report.figure(figure, "suppression_shares.png", "Share of cells withheld per aggregation level")


def _summary(microdata: pd.DataFrame, result: SuppressionResult, shares: pd.DataFrame, data_label: str, *,
             published: bool) -> dict:
    """summary.json: the rule, the counts of cells, the audit's outcome and the shares withheld."""
    rule, audit = result.rule, result.audit
    finest = shares.set_index("agglvl")
    summary = {
        "command": "suppress",
        "data": data_label,
        "establishments": len(microdata),
        "rule": {"p": rule.p, "min_estabs": rule.min_estabs, "attributes": list(rule.attributes)},
        "cells": len(result.table.cells),
        "primary": int(result.primary.sum()),
        "suppressed": int(result.suppressed.sum()),
        "repair_rounds": result.repair_rounds,
        "audited_intervals": None if audit is None else len(audit.intervals),
        "failing_cells": None if audit is None else int(audit.failures["cell"].nunique()),
        "determined_secondary_cells": None if audit is None else audit.determined_secondaries,
        "shares": shares.to_dict(orient="records"),
        "county_naics6_share": float(finest.loc[78, "suppressed_share"]) if 78 in finest.index else None,
    }
    if published and 78 in finest.index:
        summary["published_county_naics6_share"] = float(finest.loc[78, "published_share"])
    return summary


def _skipped_sentence(intervals: pd.DataFrame) -> str:
    """What the audit file holds for intervals whose LPs the final audit skipped (none: nothing to say)."""
    skipped = int((~intervals["solved"]).sum())
    if not skipped:
        return ""
    return (f"{skipped:,} of {len(intervals):,} final intervals were not solved to their ends: the solutions of "
            "earlier LPs (feasible tables) already moved those cells by their need both ways, so they pass; "
            f"{AUDIT_FILE} gives them solved = False and the values reached (gedp suppress --every-lp solves them "
            "all, with the same verdicts). ")
