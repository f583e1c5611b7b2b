"""QCEW tables ready to publish: BLS's open-data layout with titles, whole numbers, average weekly
wages and margins of error, as CSV or as an Excel workbook with a notes sheet.

Quality flags: with margins of error, each value's flag ``<column>_flag`` follows its margins
(``postprocess.quality``: the band of its coefficient of variation, A to D, and X for a value as
noisy as itself).

Rounding: employment, wages and establishment counts to whole numbers, half up (BLS publishes
whole employees and dollars); margins of error up to the next whole number, so that a published
margin is never smaller than the computed one. ``avg_wkly_wage`` is BLS's average weekly wage,
total_qtrly_wages / (mean of the three months' employment) / 13, from the published (rounded)
values and rounded to whole dollars, half up; it is empty where the mean employment is 0 (no
employees to average over). ``disclosure_code`` is empty: nothing is suppressed; in a table of
confidential microdata (not a release, written only on request) it is ``UNPROTECTED`` in every row,
so that the mark travels with any row copied out of it.

Text that a spreadsheet would run as a formula (a title from a ``--titles`` file beginning with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return, OWASP's CSV-injection list, or their
full-width forms) is never written as one: a table in the qcew format, written as CSV, carries such
text behind a single quote (``'=HYPERLINK(...)``), which spreadsheets show and never evaluate; a
workbook writes every text cell as a string, never as a formula.
"""

from __future__ import annotations

import math
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.postprocess.combine import level_percent
from gedp.postprocess.quality import FLAG_MEANINGS, quality_flags
from gedp.postprocess.tabulate import OWNERSHIP_TOTAL_LEVELS, qcew_level
from gedp.synth.hierarchy import COUNTY_LEVELS, STATE_LEVELS
from gedp.synth.qcew import QCEW_VALUE_COLUMNS
from gedp.synth.titles import OWN_TITLES, Titles

#: Weeks in a quarter, BLS's divisor of the average weekly wage.
WEEKS_PER_QUARTER = 13
#: BLS's size code of tables over every establishment size.
ALL_SIZES = 0
EMPLOYMENT_COLUMNS = tuple(QCEW_VALUE_COLUMNS[m] for m in ("m1emp", "m2emp", "m3emp"))
WAGES_COLUMN = QCEW_VALUE_COLUMNS["wage"]
#: Columns of a published table, in order (margins ``<column>_moe`` follow when requested).
PUBLICATION_COLUMNS = (
    "area_fips", "own_code", "industry_code", "agglvl_code", "size_code", "year", "qtr", "disclosure_code",
    "area_title", "own_title", "industry_title", "qtrly_estabs", *QCEW_VALUE_COLUMNS.values(), "avg_wkly_wage",
)
#: Example employment and quarterly wages whose uncertainty intervals the notes show.
EXAMPLE_EMPLOYMENT = (10, 100, 1000)
EXAMPLE_WAGES = (100_000, 1_000_000)
#: A workbook's document properties, and the time its members carry (the earliest a zip file holds).
CORE_PROPERTIES = "docProps/core.xml"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
#: ``disclosure_code`` of every row of a table of confidential microdata, not of a release.
UNPROTECTED = "NOT PROTECTED"
#: First characters that make a spreadsheet read a cell as a formula (OWASP CSV injection), with
#: their full-width forms, which some spreadsheets read alike.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def whole(values: pd.Series) -> pd.Series:
    """Values >= 0 rounded to whole numbers, half up (as integers; missing stays missing)."""
    return np.floor(values.astype(float) + 0.5).astype("Int64")


def rounded_up(margins: pd.Series) -> pd.Series:
    """Margins of error rounded up to whole numbers, so that none is understated."""
    return np.ceil(margins.astype(float)).astype("Int64")


def average_weekly_wage(wages: pd.Series, employment: Sequence[pd.Series]) -> pd.Series:
    """BLS's average weekly wage: wages / mean monthly employment / 13, in whole dollars (half up);
    missing where the mean employment is 0."""
    mean_employment = sum(e.astype(float) for e in employment) / len(employment)
    weekly = wages.astype(float) / mean_employment.where(mean_employment > 0) / WEEKS_PER_QUARTER
    return whole(weekly)


def publication_levels(microdata: pd.DataFrame) -> tuple[int, ...]:
    """The QCEW levels a publication of the microdata has: 51-58 and 71-78, and the totals over
    ownerships 50 and 70 when the microdata have several own codes."""
    totals = microdata["own"].nunique() > 1
    return (*((50,) if totals else ()), *STATE_LEVELS, *((70,) if totals else ()), *COUNTY_LEVELS)


def qcew_publication(microdata: pd.DataFrame, agglvl: int, titles: Titles, **options: Any) -> pd.DataFrame:
    """One QCEW aggregation level ready to publish (``PUBLICATION_COLUMNS`` and margins), rounded as
    the module says; ``options`` (where, moe, level, answers, wage_psi) as for ``tabulate``.

    Raises:
        ValueError: a bad level or option, or a total over ownerships (50, 70) of microdata with one
            own code (the private level 51 or 71 has the same cells).
    """
    return published_table(tabulated_level(microdata, agglvl, **options), titles,
                           options.get("level", 0.95) if options.get("moe") else None)


def tabulated_level(microdata: pd.DataFrame, agglvl: int, **options: Any) -> pd.DataFrame:
    """``qcew_level`` of a level a publication of the microdata can have (``qcew_publication``)."""
    owns = sorted(microdata["own"].unique())
    if agglvl in OWNERSHIP_TOTAL_LEVELS and len(owns) < 2:
        raise ValueError(f"aggregation level {agglvl} totals over ownerships, but the microdata have one own code "
                         f"({owns[0]}); level {OWNERSHIP_TOTAL_LEVELS[agglvl]} has the same cells")
    return qcew_level(microdata, agglvl, **options)


def published_table(table: pd.DataFrame, titles: Titles, level: float | None = None) -> pd.DataFrame:
    """A ``qcew_level`` table ready to publish, row for row: titles, whole numbers, average weekly
    wages and margins rounded up (module docstring), and with margins at confidence ``level`` each
    value's quality flag ``<column>_flag`` (``postprocess.quality``: its CV's band, from the value
    and margin before rounding), after the margins."""
    out = table[["area_fips", "own_code", "industry_code", "agglvl_code"]].copy()
    out["size_code"] = ALL_SIZES
    out["year"], out["qtr"] = table["year"], table["qtr"]
    out["disclosure_code"] = ""
    out["area_title"] = titles.area_titles(table["area_fips"])
    out["own_title"] = table["own_code"].map(OWN_TITLES).fillna("")
    out["industry_title"] = titles.industry_titles(table["industry_code"])
    out["qtrly_estabs"] = table["qtrly_estabs"].astype("int64")
    for column in QCEW_VALUE_COLUMNS.values():
        out[column] = whole(table[column])
    out["avg_wkly_wage"] = average_weekly_wage(out[WAGES_COLUMN], [out[c] for c in EMPLOYMENT_COLUMNS])
    for column in QCEW_VALUE_COLUMNS.values():
        if f"{column}_moe" in table:
            out[f"{column}_moe"] = rounded_up(table[f"{column}_moe"])
    if level is not None:
        for column in QCEW_VALUE_COLUMNS.values():
            if f"{column}_moe" in table:
                out[f"{column}_flag"] = quality_flags(table[column].to_numpy(), table[f"{column}_moe"].to_numpy(),
                                                      level)
    return out


def formula_safe(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every text value that begins with one of ``FORMULA_STARTS`` behind a single
    quote, so that a spreadsheet opening the table as CSV shows it and never runs it (other values,
    and tables without such text, unchanged)."""
    out = table
    for column in table.columns:
        values = table[column]
        if not (pd.api.types.is_string_dtype(values) or values.dtype == object):
            continue
        risky = values.map(lambda v: isinstance(v, str) and v.startswith(FORMULA_STARTS)).to_numpy(dtype=bool)
        if risky.any():
            out = out.copy() if out is table else out
            out[column] = values.where(~risky, "'" + values.astype(str))
    return out


def _composed_mu(mu_by_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each attribute's mu over every query that measured it: sqrt(sum of mu^2)."""
    squares: dict[str, float] = {}
    for by_attribute in mu_by_query.values():
        for attribute, mu in by_attribute.items():
            squares[attribute] = squares.get(attribute, 0.0) + mu * mu
    return {attribute: math.sqrt(total) for attribute, total in squares.items()}


def _hidden(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Notes on what the release's psi and gammas hide, with example uncertainty intervals."""
    from gedp.measure.neighbors import make_psi

    psi = make_psi(**manifest["psi"])
    gammas = manifest["gammas"]
    notes = [("What is protected", f"Each establishment's monthly employment and quarterly wages are hidden within "
                                   f"an uncertainty interval around the true value (psi {manifest['psi']['name']}, "
                                   f"gamma {', '.join(f'{a} {g:g}' for a, g in gammas.items())}): a reader of the "
                                   f"release tells which value in that interval the establishment has no better "
                                   f"than the privacy guarantee's mu allows.")]
    examples = [("employment", "m1emp", EXAMPLE_EMPLOYMENT, "{:,.0f} employees"),
                ("quarterly wages", "wage", EXAMPLE_WAGES, "${:,.0f}")]
    for what, attribute, values, form in examples:
        if attribute in gammas:
            lower, upper = psi.interval(np.asarray(values, dtype=float), gammas[attribute])
            shown = "; ".join(f"{form.format(x)}: between {form.format(lo)} and {form.format(hi)}"
                              for x, lo, hi in zip(values, lower, upper))
            notes.append((f"Intervals of {what}", f"An establishment with {shown}."))
    return notes


def _privacy_notes(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The privacy statement of a release: mu and epsilon as gedp states them
    (``conversions.stated_guarantee``), and what psi and gamma hide."""
    from gedp.measure.conversions import stated_guarantee

    mu_total = manifest["mu_total"]
    per_attribute = ", ".join(f"{a} {mu:.4f}" for a, mu in _composed_mu(manifest["mu"]).items())
    notes = [
        ("Release", f"Protected by gedp {manifest['gedp_version']} on {manifest['created_date']}: "
                    f"{manifest['establishments']:,} establishments, states {', '.join(manifest['states'])}."
                    + ("" if manifest["publishable"] else " NOT FOR PUBLICATION: its noise came from a seed.")),
        ("Privacy guarantee", f"Gaussian differential privacy: total {stated_guarantee(mu_total)}, the "
                              f"(epsilon, delta)-differential privacy it is equivalent to; per attribute mu "
                              f"{per_attribute}."),
    ]
    return notes + _hidden(manifest)


def publication_notes(manifest: Mapping[str, Any] | None, titles: Titles, source: str,
                      level: float | None) -> pd.DataFrame:
    """The notes sheet: privacy statement (a release's ``manifest``; None: not a release), titles'
    sources, rounding, and the meaning of margins of error (``level``; None: none)."""
    notes = _privacy_notes(manifest) if manifest is not None else [
        ("Release", f"NOT PROTECTED: tabulated from the microdata file {source}, not from a gedp release.")]
    notes += [
        ("Area titles", titles.sources.get("areas", "")),
        ("Industry titles", titles.sources.get("industries", "")),
        ("Values", "Establishments, employment and wages in whole numbers (rounded half up). avg_wkly_wage = "
                   "total_qtrly_wages / mean monthly employment / 13 in whole dollars, empty where the mean "
                   "employment is 0. disclosure_code is empty: no cell is suppressed."),
        ("Margins of error", "None requested." if level is None else
         f"Columns ending in _moe: half-width of the {level_percent(level)} confidence interval of the value, from the "
         f"release's least squares covariance (no further privacy cost), rounded up to whole numbers so that "
         f"none is understated. avg_wkly_wage has no margin."),
    ]
    if level is not None:
        notes.append(("Quality flags", "Columns ending in _flag: the band of the value's coefficient of variation "
                                       "(CV: the error's standard deviation over the value): " + "; ".join(
                                           f"{flag} {meaning}" for flag, meaning in FLAG_MEANINGS.items()) + "."))
    return pd.DataFrame(notes, columns=["topic", "note"])


def write_workbook(tables: Mapping[int, pd.DataFrame], notes: pd.DataFrame, path: str | Path) -> None:
    """An Excel workbook: one sheet per QCEW level ("agglvl 78"), then the notes sheet ("notes");
    every text cell a string, never a formula (openpyxl takes text beginning with "=" for one); the
    same tables and notes give the same bytes (no time stamped on it)."""
    with pd.ExcelWriter(path, engine="openpyxl") as writer:
        for agglvl, table in tables.items():
            table.to_excel(writer, sheet_name=f"agglvl {agglvl}", index=False, freeze_panes=(1, 0))
        notes.to_excel(writer, sheet_name="notes", index=False)
        sheet = writer.sheets["notes"]
        sheet.column_dimensions["A"].width = 22
        sheet.column_dimensions["B"].width = 140
        for sheet in writer.sheets.values():
            _no_formulas(sheet)
    _without_timestamps(path)


def _no_formulas(sheet: Any) -> None:
    """Every cell of an openpyxl sheet that would be written as a formula written as the string it is."""
    for row in sheet.iter_rows():
        for cell in row:
            if cell.data_type == "f":
                cell.data_type = "s"


def _without_timestamps(path: str | Path) -> None:
    """Rewrite a workbook without the times openpyxl stamps on it (the members' times and the
    document's created and modified dates), so that the same tables always give the same bytes."""
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            if info.filename == CORE_PROPERTIES:
                data = re.sub(rb"<dcterms:(created|modified)\b[^>]*>[^<]*</dcterms:\1>", b"", data)
            member = zipfile.ZipInfo(info.filename, date_time=ZIP_EPOCH)
            member.compress_type, member.external_attr = zipfile.ZIP_DEFLATED, info.external_attr
            archive.writestr(member, data)


@dataclass(frozen=True)
class PublishedLevels:
    """QCEW levels in BLS layout by level, and the titles they were given (None: raw layout), with
    the levels as tabulated (``qcew_level``: unrounded, with their margins' pieces) row for row."""

    levels: dict[int, pd.DataFrame]
    titles: Titles | None
    tabulated: dict[int, pd.DataFrame]


def publish_levels(microdata: pd.DataFrame, agglvl: int | None, format: str, titles: str | Path | None,
                   protected: bool = True, **options: Any) -> PublishedLevels:
    """The QCEW level ``agglvl`` (every level present when None) of microdata: ready to publish
    (``qcew_publication``) for formats qcew and xlsx, else in the raw BLS layout of
    ``qcew_level``; ``options`` as for ``tabulate``. InputError for a bad level or option.
    ``protected=False``: the microdata are confidential (not a release's), and every row of a table
    ready to publish says so in its ``disclosure_code`` (``UNPROTECTED``)."""
    from gedp.synth.titles import published_titles, shipped_titles

    if agglvl is None and format != "xlsx":
        raise InputError(f"format {format} needs an aggregation level (agglvl)")
    levels = publication_levels(microdata) if agglvl is None else (agglvl,)
    named = None if format not in ("qcew", "xlsx") else shipped_titles() if titles is None else published_titles(
        titles)
    try:
        tabulated = {level: tabulated_level(microdata, level, **options) if named is not None else
                     qcew_level(microdata, level, **options) for level in levels}
    except ValueError as err:
        raise InputError(str(err)) from None
    confidence = options.get("level", 0.95) if options.get("moe") else None
    published = tabulated if named is None else {level: published_table(table, named, confidence)
                                                 for level, table in tabulated.items()}
    if named is not None and not protected:
        published = {level: table.assign(disclosure_code=UNPROTECTED) for level, table in published.items()}
    if format == "qcew":  # a table ready to publish as CSV: no cell a spreadsheet would run
        published = {level: formula_safe(table) for level, table in published.items()}
    return PublishedLevels(published, named, tabulated)
