"""One HTML page a manager reads about a release: what is protected and at what budget, how many
cells are published (against what cell suppression withholds), the margins of error, and, given the
agency's published file, the release beside the published numbers.

Reads only the release (its manifest, QCEW tables, protected microdata and noisy answers) and the
public published file: nothing confidential. The page is one self-contained file: plots are
embedded as base64 PNG, the style is inline, and nothing is fetched from anywhere.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from string import Template
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # drawn without pyplot: no backend, no display

from gedp.errors import InputError
from gedp.measure.budget import compose
from gedp.measure.conversions import STATED_DELTA, delta_text, gdp_epsilon
from gedp.measure.neighbors import make_psi
from gedp.postprocess.tabulate import qcew_level
from gedp.release.reader import (
    check_one_quarter,
    read_manifest,
    read_tables,
    read_validated,
    release_answers,
    release_wage_psi,
)
from gedp.synth.hierarchy import COUNTY_LEVELS, INDUSTRY_OF_STATE_LEVEL
from gedp.synth.qcew import QCEW_VALUE_COLUMNS, PublishedState
from gedp.synth.titles import state_names

if TYPE_CHECKING:  # the manifest's type: its builder (gedp.config and the mechanisms) is not loaded to read one
    from gedp.release.manifest import Manifest

#: Names a reader understands, for the release's attributes.
ATTRIBUTE_NAMES = {"m1emp": "Employment, month 1", "m2emp": "Employment, month 2",
                   "m3emp": "Employment, month 3", "wage": "Total quarterly wages"}
#: The industry detail of each QCEW level, in words.
INDUSTRY_WORDS = {None: "all industries", "domain": "domain (goods / services)", "supersector": "supersector",
                  "sector": "sector (2-digit industry)", "naics3": "3-digit industry", "naics4": "4-digit industry",
                  "naics5": "5-digit industry", "naics": "6-digit industry"}
#: The attributes the page shows: employment of the first month and the quarter's wages.
SHOWN = ("m1emp", "wage")
#: QCEW levels whose margins of error the page shows (state and county, coarse to fine).
MARGIN_LEVELS = (51, 54, 58, 71, 74, 78)
#: Example values of the privacy statement: employees, and dollars of quarterly wages.
EXAMPLES = {"employment": (3.0, 36.0, 360.0, 3_600.0), "wage": (10_000.0, 100_000.0, 1_000_000.0)}
#: Tolerances of the comparison with published numbers.
WITHIN = (0.05, 0.10)
#: Share of county x 6-digit industry cells BLS withheld in 2016 Q1, from its public files of
#: Rhode Island and New Jersey (disclosure_code "N" at level 78; docs/evaluation/against-suppression.md).
TYPICAL_WITHHELD = {"Rhode Island": 0.644, "New Jersey": 0.521}
#: A table cell that holds a number (aligned right).
NUMBER = re.compile(r"[-+$0-9.,%]+")
#: Cell sizes (employees) of the margins-by-size plot.
SIZE_EDGES = (0, 10, 100, 1_000, 10_000, np.inf)


@dataclass(frozen=True)
class ManagerReport:
    """The page (``html``, one self-contained file) and its machine-readable ``summary``."""

    html: str
    summary: dict

    def write(self, out: str | Path) -> Path:
        """Write the page to ``out`` and the summary beside it (``out``.json), each complete or not at all."""
        import json

        from gedp.tabulation.output_files import summary_path, write_atomically

        out = Path(out)
        write_atomically(out, lambda path: path.write_text(self.html, encoding="utf-8"))
        write_atomically(summary_path(out),
                         lambda path: path.write_text(json.dumps(self.summary, indent=2) + "\n", encoding="utf-8"))
        return out


def level_name(agglvl: int) -> str:
    """A QCEW aggregation level in words: 78 -> "County x 6-digit industry"."""
    county = agglvl in COUNTY_LEVELS
    industry = INDUSTRY_OF_STATE_LEVEL[agglvl - 20 if county else agglvl]
    area = "County" if county else "State"
    return f"{area}, all industries" if industry is None else f"{area} x {INDUSTRY_WORDS[industry]}"


def attribute_mu(manifest: Manifest) -> dict[str, float]:
    """Each attribute's mu: its queries' mu composed (sqrt of the sum of squares)."""
    charged: dict[str, list[float]] = {}
    for by_attribute in manifest["mu"].values():
        for attribute, mu in by_attribute.items():
            charged.setdefault(attribute, []).append(mu)
    return {attribute: compose(mus) for attribute, mus in charged.items()}


def privacy_facts(manifest: Manifest) -> dict:
    """The guarantee in numbers: mu and epsilon (at the delta gedp states, STATED_DELTA) in total and per attribute,
    and the uncertainty interval of example values of each attribute under the release's psi."""
    psi = make_psi(**manifest["psi"])
    attributes = {}
    for attribute, mu in attribute_mu(manifest).items():
        examples = EXAMPLES["wage" if attribute == "wage" else "employment"]
        lower, upper = psi.interval(np.asarray(examples), manifest["gammas"][attribute])
        attributes[attribute] = {
            "mu": mu, "epsilon": gdp_epsilon(mu, STATED_DELTA), "gamma": manifest["gammas"][attribute],
            "intervals": [[x, float(low), float(high)] for x, low, high in zip(examples, lower, upper)],
        }
    return {"mu": manifest["mu_total"], "epsilon": gdp_epsilon(manifest["mu_total"], STATED_DELTA),
            "delta": STATED_DELTA, "psi": manifest["psi"], "zeta": manifest.get("zeta"),
            "attributes": attributes}


def release_quarter(tables: pd.DataFrame) -> tuple[int, int] | None:
    """The quarter (year, qtr) of a release's QCEW tables: their one ``year`` and ``qtr`` (read from
    the release, so checked: a year of 4 digits, a quarter 1-4); None without one."""
    if not {"year", "qtr"} <= set(tables.columns):
        return None
    pairs = tables[["year", "qtr"]].apply(pd.to_numeric, errors="coerce").drop_duplicates()
    if len(pairs) != 1:
        return None
    year, qtr = pairs.iloc[0]
    if not (1000 <= year <= 9999 and qtr in (1, 2, 3, 4) and year == int(year)):
        return None
    return int(year), int(qtr)


def check_same_quarter(tables: pd.DataFrame, published: PublishedState, name: str | None) -> None:
    """Refuse a published file of another quarter than the release's (one without a quarter is taken)."""
    quarter = release_quarter(tables)
    if quarter is not None and quarter != (published.year, published.qtr):
        raise InputError(f"published file {name or ''} is of {published.year} Q{published.qtr}, the release of "
                         f"{quarter[0]} Q{quarter[1]}: give the same quarter's file")


def report_title(manifest: Manifest, quarter: tuple[int, int] | None) -> str:
    """The page's title: the states by name (their FIPS code where the shipped list has none) and the quarter."""
    names = state_names()
    states = ", ".join(names.get(code, f"state {code}") for code in manifest["states"])
    return f"Protected QCEW release: {states}" + ("" if quarter is None else f", {quarter[0]} Q{quarter[1]}")


def cell_counts(tables: pd.DataFrame, published: PublishedState | None) -> pd.DataFrame:
    """Per level: the cells this release publishes and, with ``published``, the agency's private
    cells, how many of them have no establishment (listed with zeros, they have no row in a
    release: no establishment is in them) and the share it withheld (disclosure_code "N")."""
    counts = tables.groupby("agglvl_code").size().rename("released").to_frame()
    if published is not None:
        rows = published.aggregates.assign(empty=published.aggregates["estabs"] == 0)
        agency = rows.groupby("agglvl").agg(size=("suppressed", "size"), mean=("suppressed", "mean"),
                                            empty=("empty", "sum"))
        counts["agency_cells"] = agency["size"]
        counts["agency_empty"] = agency["empty"]
        counts["agency_withheld"] = agency["mean"]
    counts.index.name = "agglvl"
    return counts.reset_index()


def margin_cells(folder: Path, levels: tuple[int, ...] = MARGIN_LEVELS) -> pd.DataFrame:
    """The release's cells at ``levels`` with their 95% margins of error, long: agglvl, attribute,
    value, margin (computed from the release's answers; no budget spent, nothing confidential read)."""
    protected = read_validated(folder)  # exactly the parts its manifest lists
    options = {"moe": True, "answers": release_answers(folder, protected), "wage_psi": release_wage_psi(folder)}
    pieces = []
    for agglvl in levels:
        table = qcew_level(protected, agglvl, **options)
        for attribute in SHOWN:
            column = QCEW_VALUE_COLUMNS[attribute]
            if f"{column}_moe" in table:
                pieces.append(pd.DataFrame({"agglvl": agglvl, "attribute": attribute,
                                            "value": table[column].astype(float),
                                            "margin": table[f"{column}_moe"].astype(float)}))
    return pd.concat(pieces, ignore_index=True)


def within(tolerance: float) -> str:
    """The column of the share of cells within ``tolerance``: within_5 for 5%."""
    return f"within_{round(100 * tolerance)}"


def margin_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """Per level and attribute: cells, the median margin relative to the value, and the share of
    cells whose margin is within 5% and 10% of the value (cells of value 0 have no relative margin
    and are left out of the shares)."""
    positive = cells[cells["value"] > 0]
    relative = positive["margin"] / positive["value"]
    flags = positive[["agglvl", "attribute"]].assign(relative=relative, **{within(t): relative <= t for t in WITHIN})
    grouped = flags.groupby(["agglvl", "attribute"], sort=False)
    summary = grouped["relative"].agg(cells="size", median="median")
    summary[[within(t) for t in WITHIN]] = grouped[[within(t) for t in WITHIN]].mean()
    summary = summary.reset_index()
    return summary


def published_comparison(tables: pd.DataFrame, published: PublishedState) -> pd.DataFrame:
    """The cells both have, the agency's withheld cells left out: agglvl, attribute, release and
    published values (the release's own cells of the published file's state only)."""
    release = tables[tables["area_fips"].str[:2] == published.state]
    county = release["agglvl_code"].isin(COUNTY_LEVELS)
    keys = pd.DataFrame({"agglvl": release["agglvl_code"].astype(int).to_numpy(),
                         "county": np.where(county, release["area_fips"].str[2:], ""),
                         "industry": release["industry_code"].to_numpy()})
    shown = published.aggregates.loc[~published.aggregates["suppressed"], ["agglvl", "county", "industry", *SHOWN]]
    values = keys.assign(**{a: release[QCEW_VALUE_COLUMNS[a]].to_numpy(dtype=float) for a in SHOWN})
    both = values.merge(shown, on=["agglvl", "county", "industry"], suffixes=("_release", "_published"))
    return pd.concat([pd.DataFrame({"agglvl": both["agglvl"], "attribute": a, "release": both[f"{a}_release"],
                                    "published": both[f"{a}_published"]}) for a in SHOWN], ignore_index=True)


def within_shares(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per attribute (and over all levels, agglvl 0) and per level: cells compared and the share
    whose release value is within 5% and 10% of the published one (|release - published| <= t x published)."""
    gap = (comparison["release"] - comparison["published"]).abs()
    flags = comparison[["agglvl", "attribute"]].assign(
        **{within(t): gap <= t * comparison["published"] for t in WITHIN})
    columns = [within(t) for t in WITHIN]
    per_level = flags.groupby(["attribute", "agglvl"])[columns].agg("mean")
    per_level["cells"] = flags.groupby(["attribute", "agglvl"]).size()
    overall = flags.groupby("attribute")[columns].agg("mean").assign(cells=flags.groupby("attribute").size(), agglvl=0)
    return pd.concat([overall.reset_index(), per_level.reset_index()], ignore_index=True)


def png(figure: Figure) -> str:
    """A figure as a base64 PNG data URI (embedded in the page)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def cells_figure(counts: pd.DataFrame) -> Figure:
    """Share of each level's cells published: this release (all) against the agency's cell suppression."""
    counts = counts.dropna(subset=["agency_withheld"]).iloc[::-1]
    figure = Figure(figsize=(9, 0.38 * len(counts) + 1.4))
    ax = figure.subplots()
    rows = np.arange(len(counts))
    ax.barh(rows + 0.2, np.ones(len(counts)), 0.4, color="#1f6fb4", label="This release")
    ax.barh(rows - 0.2, 1 - counts["agency_withheld"], 0.4, color="#c8872a",
            label="Agency's published file (after cell suppression)")
    ax.set_yticks(rows, [level_name(int(level)) for level in counts["agglvl"]])
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:.0%}")
    ax.set_xlabel("Share of cells published with employment and wages")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    return figure


def margins_figure(summary: pd.DataFrame) -> Figure:
    """Median 95% margin of error relative to the value, per level, employment and wages side by side."""
    figure = Figure(figsize=(10, 0.45 * len(MARGIN_LEVELS) + 1.6))
    axes = figure.subplots(1, len(SHOWN), sharey=True)
    for ax, attribute in zip(axes, SHOWN):
        rows = summary[summary["attribute"] == attribute].iloc[::-1]
        positions = np.arange(len(rows))
        ax.barh(positions, 100 * rows["median"], color="#1f6fb4")
        for position, value in zip(positions, rows["median"]):
            ax.annotate(f" {100 * value:.1f}%", (100 * value, position), va="center", fontsize=9)
        ax.set_yticks(positions, [level_name(int(level)) for level in rows["agglvl"]])
        ax.set_xlim(0, 100 * rows["median"].max() * 1.3)
        ax.set_title(ATTRIBUTE_NAMES[attribute])
        ax.set_xlabel("Median margin of error (95%), % of the value")
    figure.tight_layout()
    return figure


def size_figure(cells: pd.DataFrame) -> Figure:
    """Median 95% margin of error of employment (month 1) by the cell's employment, all levels shown."""
    employment = cells[(cells["attribute"] == "m1emp") & (cells["value"] > 0)]
    classes = pd.cut(employment["value"], SIZE_EDGES, right=False)
    medians = (employment["margin"] / employment["value"]).groupby(classes, observed=False).median()
    labels = [_size_label(interval.left, interval.right) for interval in medians.index]
    figure = Figure(figsize=(9, 3.4))
    ax = figure.subplots()
    ax.bar(labels, 100 * medians.fillna(0).to_numpy(), color="#1f6fb4")
    for position, value in enumerate(medians):
        if value == value:  # a class with cells
            ax.annotate(f"{100 * value:.1f}%", (position, 100 * value), ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, 100 * medians.max() * 1.15)
    ax.set_xlabel("Cell's employment (employees)")
    ax.set_ylabel("Median margin of error\n(95%), % of the value")
    return figure


def _size_label(low: float, high: float) -> str:
    return f"{low:,.0f} or more" if high == np.inf else f"{low:,.0f} to {high - 1:,.0f}"


def comparison_figure(comparison: pd.DataFrame, shares: pd.DataFrame) -> Figure:
    """The release against the agency's published numbers, cell by cell, with the 1:1 line."""
    figure = Figure(figsize=(10, 4.6))
    axes = figure.subplots(1, len(SHOWN))
    units = {"m1emp": "employees", "wage": "dollars"}
    for ax, attribute in zip(axes, SHOWN):
        cells = comparison[comparison["attribute"] == attribute]
        overall = shares[(shares["attribute"] == attribute) & (shares["agglvl"] == 0)].iloc[0]
        county = cells["agglvl"].isin(COUNTY_LEVELS)
        for mask, color, label in ((~county, "#c8872a", "statewide cells"), (county, "#1f6fb4", "county cells")):
            ax.scatter(np.maximum(cells.loc[mask, "published"], 1), np.maximum(cells.loc[mask, "release"], 1),
                       s=5, alpha=0.5, color=color, label=label, linewidths=0)
        ends = [1, max(cells["published"].max(), cells["release"].max(), 10)]
        ax.plot(ends, ends, color="black", lw=0.8, label="equal (1:1 line)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"Published by the agency ({units[attribute]}, log scale)")
        ax.set_ylabel(f"This release ({units[attribute]}, log scale)")
        ax.set_title(f"{ATTRIBUTE_NAMES[attribute]}: {overall[within(0.05)]:.0%} of cells within 5%, "
                     f"{overall[within(0.10)]:.0%} within 10%", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    return figure


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td{' class=num' if NUMBER.fullmatch(cell) else ''}>{html.escape(cell)}</td>"
                                    for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(figure: Figure, caption: str) -> str:
    return (f'<figure><img src="{png(figure)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _amount(value: float, attribute: str) -> str:
    return f"${value:,.0f}" if attribute == "wage" else f"{value:,.0f} employees"


def privacy_section(facts: dict) -> str:
    """The guarantee in plain words: what is protected, how strongly, among which neighbours, and
    what is not hidden."""
    employment = next(a for a in facts["attributes"] if a != "wage")
    examples = [f"{_amount(x, employment)} cannot be told from any number between {low:,.0f} and {high:,.0f}"
                for x, low, high in facts["attributes"][employment]["intervals"]]
    wage = facts["attributes"].get("wage")
    wages = ("" if wage is None else " Quarterly wages are hidden the same way: " + "; ".join(
        f"{_amount(x, 'wage')} cannot be told from any amount between ${low:,.0f} and ${high:,.0f}"
        for x, low, high in wage["intervals"]) + ".")
    power = NormalDist().cdf(NormalDist().inv_cdf(0.05) + facts["mu"])
    delta = delta_text(facts["delta"])
    rows = [[ATTRIBUTE_NAMES.get(a, a), f"{g['mu']:.4f}", f"{g['epsilon']:.2f}"]
            for a, g in facts["attributes"].items()]
    rows.append(["Whole release", f"{facts['mu']:.4f}", f"{facts['epsilon']:.2f}"])
    return (
        "<h2>What is protected</h2>"
        "<p>Each establishment's employment and wages are hidden among nearby values, its <em>neighbours</em>: "
        "whatever else a reader knows, this release does not let them tell an establishment's true value from any "
        f"other value close to it. An establishment of {'; one of '.join(examples)}.{html.escape(wages)}</p>"
        "<h2>How strongly</h2>"
        f"<p>The release spends a privacy budget of <strong>mu = {facts['mu']:.4f}</strong> (Gaussian differential "
        f"privacy), which is <strong>epsilon = {facts['epsilon']:.2f} at delta = {delta}</strong> in the more "
        "common terms. In plain words: a reader trying to tell an establishment's value from a neighbouring value, "
        f"who may mistake the neighbour for it at most 5% of the time, recognizes the true value at most {power:.0%} "
        "of the time.</p>"
        + _table(["Attribute", "mu", f"epsilon at delta {delta}"], rows) +
        "<h2>What it does not hide</h2>"
        "<p>Neighbours here are values within the ranges above (psi-neighbours), not the add-or-remove-one "
        "neighbours of textbook differential privacy. The release still tells a small establishment from a large "
        "one (its size class), and which establishments exist, their county and industry, and the number of "
        "establishments in each cell are public and published exactly.</p>"
    )


def cells_section(counts: pd.DataFrame, agency: str | None) -> str:
    """How many cells are published, against what cell suppression withholds."""
    released = int(counts["released"].sum())
    text = (f"<h2>Cells published</h2><p>This release publishes <strong>every cell: {released:,} cells</strong> at "
            f"{len(counts)} levels of detail, from the state total to county x 6-digit industry, each with its "
            "employment and wages. <strong>No cell is withheld.</strong> ")
    if agency is None:
        typical = " and ".join(f"{share:.0%} in {state}" for state, share in TYPICAL_WITHHELD.items())
        return text + ("Cell suppression, as the QCEW publishes today, withholds about half to two thirds of the "
                       f"county x 6-digit industry cells (BLS withheld {typical} in the first quarter of 2016).</p>")
    finest = counts.set_index("agglvl")["agency_withheld"].get(78)
    rows = [[level_name(int(r.agglvl)), f"{int(r.released):,}",
             "-" if r.agency_cells != r.agency_cells else f"{int(r.agency_cells):,}",
             "-" if r.agency_empty != r.agency_empty else f"{int(r.agency_empty):,}",
             "-" if r.agency_withheld != r.agency_withheld else f"{r.agency_withheld:.1%}"]
            for r in counts.itertuples()]
    empty = int(counts["agency_empty"].sum())
    return (text + (f"The agency's published file ({html.escape(agency)}) withholds {finest:.0%} of its county x "
                    "6-digit industry cells by cell suppression. " if finest == finest and finest is not None else "")
            + (f"It also lists {empty:,} cells without any establishment this quarter (published as zeros); no "
               "establishment of the release is in them, so the release has no row for them and withholds nothing "
               "there either: that is why it counts fewer cells than the agency's file." if empty else "")
            + "</p>" + _figure(cells_figure(counts), "Share of cells published, per level of detail")
            + _table(["Level of detail", "Cells in this release", "Cells in the agency's file",
                      "of which without establishments", "Withheld by cell suppression"], rows))


def _by_level(summary: pd.DataFrame, columns) -> list[list[str]]:
    """Table rows, one per level (0: all levels), from a summary of one row per level and attribute:
    the level, its cell count (of the first attribute) and ``columns(row)`` of each attribute."""
    rows = []
    for agglvl, group in summary.groupby("agglvl", sort=False):
        by_attribute = {r.attribute: r for r in group.itertuples()}
        rows.append(["All levels" if agglvl == 0 else level_name(int(agglvl)),
                     f"{int(by_attribute[SHOWN[0]].cells):,}",
                     *(cell for a in SHOWN for cell in (columns(by_attribute[a]) if a in by_attribute else ["-"] * 2))])
    return rows


def margins_section(cells: pd.DataFrame, summary: pd.DataFrame) -> str:
    """Accuracy as the release states it: margins of error per level and by cell size."""
    rows = _by_level(summary, lambda r: [f"{r.median:.1%}", f"{getattr(r, within(0.10)):.0%}"])
    return (
        "<h2>Accuracy: margins of error</h2><p>Every published number comes with a margin of error, computed from "
        "the release itself (no further privacy budget is spent): in 95 of 100 cells the value that would have been "
        "published without protection lies within the margin. Small cells carry the largest margins, in relative "
        "terms; large cells are precise.</p>"
        + _figure(margins_figure(summary), "Typical margin of error per level of detail (half of the cells have a "
                  "smaller one)")
        + _figure(size_figure(cells), "Margin of error of employment (month 1) by the size of the cell, over the "
                  "levels shown")
        + _table(["Level of detail", "Cells above 0", *(f"{ATTRIBUTE_NAMES[a]}: {what}" for a in SHOWN
                                                 for what in ("median margin", "cells with a margin within 10%"))],
                 rows)
    )


def comparison_section(comparison: pd.DataFrame, shares: pd.DataFrame, agency: str) -> str:
    """The release beside the agency's published numbers, on the cells both publish."""
    rows = _by_level(shares, lambda r: [f"{getattr(r, within(t)):.0%}" for t in WITHIN])
    return (
        f"<h2>Beside the agency's published numbers</h2><p>The release against the agency's published file "
        f"({html.escape(agency)}), on the cells both publish: the cells the agency withheld are left out (their "
        "published values are not known). A cell is within 5% when the release differs from the published "
        "number by at most 5% of it.</p>"
        + _figure(comparison_figure(comparison, shares), "This release against the published numbers, one point per "
                  "cell (cells of 0 drawn at 1)")
        + _table(["Level of detail", "Cells compared", *(f"{ATTRIBUTE_NAMES[a]}: within {t:.0%}" for a in SHOWN
                                                         for t in WITHIN)], rows)
    )


#: The page: inline style only, no script, no external reference.
PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d2733;
       max-width: 1040px; margin: 0 auto; padding: 24px 32px 48px; line-height: 1.5; font-size: 16px; }
h1 { font-size: 28px; margin-bottom: 4px; }
h2 { font-size: 21px; margin-top: 34px; border-bottom: 1px solid #d5dbe3; padding-bottom: 4px; }
.subtitle { color: #566273; margin-top: 0; }
.banner { background: #fdecea; border-left: 5px solid #c0392b; padding: 10px 14px; margin: 16px 0; }
.key { display: flex; gap: 14px; flex-wrap: wrap; margin: 20px 0; }
.key div { flex: 1 1 200px; background: #eef4fa; border-radius: 6px; padding: 12px 14px; }
.key strong { display: block; font-size: 24px; color: #1f6fb4; }
table { border-collapse: collapse; margin: 14px 0; font-size: 14px; }
th, td { border-bottom: 1px solid #e1e6ec; padding: 5px 12px; text-align: left; }
td.num { text-align: right; }
th { background: #f3f6f9; }
figure { margin: 18px 0; }
figure img { max-width: 100%; }
figcaption { color: #566273; font-size: 14px; }
footer { margin-top: 40px; color: #566273; font-size: 13px; }
</style>
</head>
<body>
<h1>$title</h1>
<p class="subtitle">$subtitle</p>
$banner
<div class="key">$key</div>
$sections
<footer>$footer</footer>
</body>
</html>
""")


def _key_figures(facts: dict, counts: pd.DataFrame, summary: pd.DataFrame, shares: pd.DataFrame | None) -> str:
    """The figures a reader sees first."""
    finest = summary[(summary["agglvl"] == summary["agglvl"].max()) & (summary["attribute"] == "m1emp")]
    boxes = [(f"{int(counts['released'].sum()):,}", "cells published, none withheld"),
             (f"mu {facts['mu']:.4f}",
              f"privacy budget (epsilon {facts['epsilon']:.2f} at delta {delta_text(facts['delta'])})")]
    if len(finest):
        level = level_name(int(finest["agglvl"].iloc[0])).lower()
        boxes.append((f"{finest['median'].iloc[0]:.1%}", f"typical employment margin of error, {level}"))
    if shares is not None:
        overall = shares[(shares["attribute"] == "m1emp") & (shares["agglvl"] == 0)].iloc[0]
        boxes.append((f"{overall[within(0.10)]:.0%}", "of published employment cells within 10%"))
    return "".join(f"<div><strong>{html.escape(value)}</strong>{html.escape(label)}</div>" for value, label in boxes)


def build_report(release: str | Path, published: PublishedState | None = None, published_name: str | None = None,
                 levels: tuple[int, ...] = MARGIN_LEVELS) -> ManagerReport:
    """The manager's page of a release folder, with the agency's ``published`` file (its name
    ``published_name`` shown on the page) when given."""
    folder = Path(release)
    check_one_quarter(folder, "gedp report")
    manifest = read_manifest(folder)
    if published is not None and published.state not in manifest["states"]:
        raise InputError(f"published file {published_name or ''} is of state {published.state}, which the release "
                         f"(states {', '.join(manifest['states'])}) does not hold: give the same state's file")
    tables = read_tables(folder)
    if published is not None:
        check_same_quarter(tables, published, published_name)
    quarter = release_quarter(tables)
    cells = margin_cells(folder, levels)  # its answers checked against its manifest's mu and gammas: first
    facts = privacy_facts(manifest)
    counts = cell_counts(tables, published)
    summary = margin_summary(cells)
    agency = None if published is None else f"{published_name or 'published file'}, {published.year} Q{published.qtr}"
    sections = [privacy_section(facts), cells_section(counts, agency), margins_section(cells, summary)]
    comparison = shares = None
    if published is not None:
        comparison = published_comparison(tables, published)
        shares = within_shares(comparison)
        sections.append(comparison_section(comparison, shares, agency or ""))
    page = PAGE.substitute(
        title=html.escape(report_title(manifest, quarter)),
        subtitle=html.escape(f"{manifest['establishments']:,} establishments; release of {manifest['created_date']}"),
        banner="" if manifest.get("publishable", False) else (
            '<p class="banner"><strong>Not for publication.</strong> This release was made with a replayable '
            "noise seed.</p>"),
        key=_key_figures(facts, counts, summary, shares), sections="".join(sections),
        footer=html.escape(f"Made by gedp {manifest['gedp_version']} from the release alone"
                           + (f" and the agency's public file {agency}" if agency else "")
                           + "; no confidential data was read."),
    )
    return ManagerReport(page, {
        "command": "report", "states": manifest["states"],
        "quarter": None if quarter is None else f"{quarter[0]}Q{quarter[1]}", "privacy": facts,
        "cells": counts.to_dict(orient="records"), "margins": summary.to_dict(orient="records"),
        "published": None if shares is None else {"file": agency, "shares": shares.to_dict(orient="records")},
    })
