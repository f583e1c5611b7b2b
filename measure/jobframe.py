"""gedp on a job frame (SPEC section 9): each establishment's jobs by worker category become
confidential attributes, measured like employment.

A job plan names *families* of categories: ``worker: [sex, education]`` makes one attribute per
code combination (10 here: "worker[1,E1]", ..., "worker[2,E5]"), each an establishment's number of
jobs of that category; ``home: [home_county]`` one per county of residence. A family's budget is
given per query as a total, like an attribute's: each of its K categories is measured with
mu / sqrt(K), so the family composes to exactly that mu whatever K is (K of ``home_county`` is the
number of the state's counties, a public attribute). The categories' domains are public: the QWI
code lists, and for home counties the state's workplace counties (plus "other" for residents of
anywhere else), never the codes that happen to occur in the job table.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from gedp.measure.workflows import MeasurementPlan, QueryPlan
from gedp.synth.jobs import FAMILY_COLUMNS, UNKNOWN_COUNTY, WORKER_DOMAINS, validate_jobs

#: The home-county category of workers living outside the state's workplace counties.
OTHER_HOME = "other"
#: The employment a family's categories add up to: one job per month-1 employee.
EMPLOYMENT = "m1emp"


@dataclass(frozen=True)
class JobPlan:
    """The job families of a plan: name -> worker columns whose code combinations are its categories."""

    families: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        for name, columns in self.families.items():
            if not columns:
                raise ValueError(f"job family {name} has no worker columns")
            unknown = [c for c in columns if c not in FAMILY_COLUMNS]
            if unknown:
                raise ValueError(f"job family {name}: '{unknown[0]}' is not a worker column "
                                 f"({', '.join(FAMILY_COLUMNS)})")
            if len(set(columns)) < len(columns):
                raise ValueError(f"job family {name} repeats a worker column")

    @property
    def columns(self) -> tuple[str, ...]:
        """Every worker column of the plan's families."""
        return tuple(dict.fromkeys(c for columns in self.families.values() for c in columns))


def home_domain(public: pd.DataFrame) -> tuple[str, ...]:
    """Home-county codes of a state's job frame: its workplace counties (5-digit FIPS, public; not the
    unknown county 999) and OTHER_HOME."""
    place = (public["state"].astype(str) + public["county"].astype(str)).unique()
    return (*sorted(p for p in place if not p.endswith(UNKNOWN_COUNTY)), OTHER_HOME)


def family_categories(columns: Sequence[str], public: pd.DataFrame) -> list[tuple[str, ...]]:
    """A family's categories: every combination of its columns' public codes, in code order."""
    domains = [home_domain(public) if c == "home_county" else WORKER_DOMAINS[c] for c in columns]
    return list(itertools.product(*domains))


def category_attribute(family: str, category: Sequence[str]) -> str:
    """The attribute name of one category, e.g. "worker[2,E4]"."""
    return f"{family}[{','.join(category)}]"


def category_counts(jobs: pd.DataFrame, n_establishments: int, columns: Sequence[str],
                    categories: Sequence[tuple[str, ...]]) -> np.ndarray:
    """Jobs per establishment (rows: positions of ``jobs.estab_id``'s categories) and category
    (columns, in ``categories`` order), from a validated job table (``synth.jobs.validate_jobs``).
    Home counties outside the domain count as OTHER_HOME."""
    code = np.zeros(len(jobs), dtype=np.int64)
    radix = 1
    for position, column in reversed(list(enumerate(columns))):
        domain = pd.Index(list(dict.fromkeys(c[position] for c in categories)))
        values = jobs[column]
        index = domain.get_indexer(values.cat.categories.astype(str))
        if column == "home_county":
            index = np.where(index < 0, domain.get_loc(OTHER_HOME), index)
        code += radix * index[values.cat.codes.to_numpy()]
        radix *= len(domain)
    establishment = jobs["estab_id"].cat.codes.to_numpy().astype(np.int64)
    k = len(categories)
    return np.bincount(establishment * k + code, minlength=n_establishments * k).reshape(n_establishments, k)


def expand_plan(plan: MeasurementPlan, families: Mapping[str, Sequence[str]]) -> MeasurementPlan:
    """The plan with each family's budget spread over its category attributes: ``families`` maps a
    family (an attribute of ``plan`` standing for the family) to its categories' attribute names;
    each gets the family's gamma and mu / sqrt(K) in every query that measures the family."""
    gammas = {a: g for a, g in plan.gammas.items() if a not in families}
    for family, attributes in families.items():
        gammas.update({a: plan.gammas[family] for a in attributes})
    queries = []
    for query in plan.queries:
        mu = {a: m for a, m in query.mu.items() if a not in families}
        for family, attributes in families.items():
            if family in query.mu:
                mu.update({a: query.mu[family] / math.sqrt(len(attributes)) for a in attributes})
        queries.append(QueryPlan(query.by, mu))
    return replace(plan, gammas=gammas, queries=tuple(queries))


@dataclass(frozen=True)
class FamilySpec:
    """One family of a state's job frame: its worker columns, categories and their attributes."""

    family: str
    columns: tuple[str, ...]
    categories: list[tuple[str, ...]]
    attributes: list[str]


def add_job_counts(microdata: pd.DataFrame, jobs: pd.DataFrame, job_plan: JobPlan,
                   plan: MeasurementPlan) -> tuple[pd.DataFrame, MeasurementPlan, list[FamilySpec]]:
    """Validated microdata with one column per category of every family (its jobs of that
    category), the plan measuring them (``expand_plan``), and the families' specs. ``jobs`` is
    checked against ``microdata`` (``synth.jobs.validate_jobs``); a family's worker columns must be
    in it."""
    from gedp.synth.schema import InputError

    jobs = validate_jobs(jobs, microdata)
    missing = [c for c in job_plan.columns if c not in jobs.columns]
    if missing:
        raise InputError(f"job table: the plan's job families need column '{missing[0]}'")
    specs, columns = [], {}
    for family, family_columns in job_plan.families.items():
        categories = family_categories(family_columns, microdata)
        attributes = [category_attribute(family, c) for c in categories]
        counts = category_counts(jobs, len(microdata), family_columns, categories)
        columns.update({a: counts[:, k].astype(float) for k, a in enumerate(attributes)})
        specs.append(FamilySpec(family, tuple(family_columns), categories, attributes))
    counted = pd.concat([microdata.reset_index(drop=True), pd.DataFrame(columns)], axis=1)
    return counted, expand_plan(plan, {s.family: s.attributes for s in specs}), specs
