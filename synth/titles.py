"""Area and industry titles of QCEW cells, as BLS writes them in its open-data files.

Titles come from a published QCEW file when one is given (its own ``area_title`` and
``industry_title`` columns), else from the lists shipped with gedp in ``synth/reference/``:

* ``states.csv`` and ``counties.csv``: U.S. Census Bureau FIPS codes and names of states and
  counties (public domain; county vintages 2015 and 2020, the 2020 name where both have the code),
  as collected in the ``addfips`` package, version 0.4.2.
* ``naics.csv``: titles of the 2022 North American Industry Classification System (U.S. Census
  Bureau), as collected in the ``naics`` package, version 1.0.1 (MIT licence). BLS shortens some
  titles and writes them in sentence case; codes of earlier NAICS vintages absent from 2022 have no
  shipped title.

Totals, domains and supersectors carry BLS's own titles (below). A code without a title is
written as its code alone ("NAICS 238111"), and the count of such codes is reported.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gedp.errors import InputError
from gedp.synth.hierarchy import ALL_INDUSTRIES

REFERENCE = Path(__file__).parent / "reference"
#: Where each shipped list comes from, with its vintage (stated in outputs and the docs).
SHIPPED_SOURCES = {
    "areas": "U.S. Census Bureau state and county FIPS names (county vintages 2015 and 2020), via addfips 0.4.2",
    "industries": "NAICS 2022 titles (U.S. Census Bureau), via naics 1.0.1; BLS titles of totals, domains and "
                  "supersectors",
}
#: BLS's titles of the industry codes above NAICS sectors.
AGGREGATE_INDUSTRY_TITLES = {
    ALL_INDUSTRIES: "Total, all industries",
    "101": "Goods-producing",
    "102": "Service-providing",
    "1011": "Natural resources and mining",
    "1012": "Construction",
    "1013": "Manufacturing",
    "1021": "Trade, transportation, and utilities",
    "1022": "Information",
    "1023": "Financial activities",
    "1024": "Professional and business services",
    "1025": "Education and health services",
    "1026": "Leisure and hospitality",
    "1027": "Other services",
    "1028": "Public administration",
    "1029": "Unclassified",
}
#: BLS's titles of ownership codes.
OWN_TITLES = {"0": "Total Covered", "1": "Federal Government", "2": "State Government", "3": "Local Government",
              "5": "Private", "8": "Total Government", "9": "Total U.I. Covered (Excludes Federal Government)"}
#: The longest title read from a published file: BLS's are at most 84 characters (RI and NJ 2016 Q1),
#: NAICS 2022's at most 118; a spreadsheet cell holds 32,767 (a workbook cut a longer one).
MAX_TITLE_CHARACTERS = 1000
#: BLS's county code of establishments whose county is unknown, and its title.
UNKNOWN_COUNTY = ("999", "Unknown Or Undefined")


@dataclass(frozen=True)
class Titles:
    """Titles by ``area_fips`` and by ``industry_code``, and where they come from."""

    areas: Mapping[str, str]
    industries: Mapping[str, str]
    sources: dict[str, str] = field(default_factory=dict)

    def area_titles(self, area_fips: pd.Series) -> pd.Series:
        """The title of each area code; the code itself when there is none."""
        return area_fips.map(self.areas).fillna(area_fips).astype(str)

    def industry_titles(self, industry_code: pd.Series) -> pd.Series:
        """The title of each industry code; "NAICS <code>" when there is none."""
        return industry_code.map(self.industries).fillna("NAICS " + industry_code).astype(str)

    def untitled(self, area_fips: pd.Series, industry_code: pd.Series) -> dict[str, int]:
        """How many distinct area and industry codes have no title."""
        return {"areas": int((~area_fips.drop_duplicates().isin(list(self.areas))).sum()),
                "industries": int((~industry_code.drop_duplicates().isin(list(self.industries))).sum())}


def _industry_title(code: str, title: str) -> str:
    """BLS's form: "10 Total, all industries", "1011 Natural resources..." and "NAICS 111150 Corn farming"."""
    return f"{code} {title}" if code in AGGREGATE_INDUSTRY_TITLES else f"NAICS {code} {title}"


@functools.cache
def state_names() -> dict[str, str]:
    """Each state's name by its 2-digit FIPS code ("44" -> "Rhode Island"), from the shipped list."""
    states = pd.read_csv(REFERENCE / "states.csv", dtype=str)
    return dict(zip(states["state"], states["name"]))


@functools.cache
def shipped_titles() -> Titles:
    """Titles from the lists shipped with gedp, in BLS's forms ("Rhode Island -- Statewide",
    "Bristol County, Rhode Island", "NAICS 111150 Corn Farming")."""
    counties = pd.read_csv(REFERENCE / "counties.csv", dtype=str)
    naics = pd.read_csv(REFERENCE / "naics.csv", dtype=str)
    names = state_names()
    areas = {f"{state}000": f"{name} -- Statewide" for state, name in names.items()}
    areas |= {f"{state}{UNKNOWN_COUNTY[0]}": f"{UNKNOWN_COUNTY[1]}, {name}" for state, name in names.items()}
    areas |= {f"{s}{c}": f"{name}, {names[s]}" for s, c, name in counties[["state", "county", "name"]].itertuples(
        index=False) if s in names}
    industries = {code: _industry_title(code, title)
                  for code, title in (*zip(naics["code"], naics["title"]), *AGGREGATE_INDUSTRY_TITLES.items())}
    return Titles(areas, industries, dict(SHIPPED_SOURCES))


def published_titles(path: str | Path) -> Titles:
    """Titles carried from a published QCEW CSV (its ``area_title`` and ``industry_title``), with the
    shipped titles for codes the file does not have.

    Raises:
        InputError: the file cannot be read, lacks a title column, or holds a title no table takes
        (``check_titles``).
    """
    path = Path(path)
    columns = ["area_fips", "area_title", "industry_code", "industry_title"]
    try:
        published = pd.read_csv(path, dtype=str, usecols=columns, keep_default_na=False)
    except FileNotFoundError:
        raise InputError(f"titles file '{path}' does not exist") from None
    except ValueError as err:
        raise InputError(f"titles file '{path}': needs columns {', '.join(columns)} ({err})") from None
    except (OSError, pd.errors.ParserError) as err:
        raise InputError(f"titles file '{path}' cannot be read: {err}") from None
    check_titles(published, path)
    shipped = shipped_titles()
    named = f"published file {path.name}"
    return Titles({**shipped.areas, **_first_titles(published, "area_fips", "area_title")},
                  {**shipped.industries, **_first_titles(published, "industry_code", "industry_title")},
                  {kind: f"{named}; for codes it lacks: {source}" for kind, source in shipped.sources.items()})


def check_titles(published: pd.DataFrame, path: Path) -> None:
    """Refuse a titles file holding a title with a character that is not printable (a control
    character such as ESC or NUL, a line or paragraph separator, a format character such as a
    right-to-left override) or longer than MAX_TITLE_CHARACTERS, in one line naming its column and
    line, never the title: titles go into tables printed on a terminal and written as CSV and xlsx
    (whose writer refuses control characters with a traceback)."""
    for column in ("area_title", "industry_title"):
        titles = published[column]
        bad = ~titles.map(lambda title: title.isprintable() and len(title) <= MAX_TITLE_CHARACTERS).to_numpy(bool)
        if bad.any():
            raise InputError(f"titles file '{path}': column '{column}' holds a title with a character that is not "
                             f"printable or longer than {MAX_TITLE_CHARACTERS:,} characters (first at line "
                             f"{int(bad.argmax()) + 2}); BLS's titles are plain text")


def _first_titles(published: pd.DataFrame, code: str, title: str) -> dict[str, str]:
    """The first non-empty title of each code of a published file."""
    rows = published[published[title].str.strip() != ""].drop_duplicates(code)
    return dict(zip(rows[code].str.strip(), rows[title].str.strip()))
