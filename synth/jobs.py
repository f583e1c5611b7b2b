"""Job-frame data: the job table, its validation, and synthetic jobs (``gedp.synth.io.read_jobs`` reads one).

The job table has one row per job: ``estab_id`` (an establishment of the establishment table), the
worker's QWI codes ``sex``, ``agegrp``, ``education``, ``race``, ``ethnicity``, and optionally
``home_county`` (5-digit FIPS of the worker's residence). Every establishment has exactly as many
jobs as its month-1 employment ``m1emp``.

Synthetic jobs draw each establishment's worker mix from a Dirichlet around its sector's shares (so
establishments differ in their mix, the "shape" ER-EE privacy protects) and each job's attributes
from that mix; home counties follow a commuting rule. The share tables are ILLUSTRATIVE: they
follow the national pattern of published QWI and CPS tables by NAICS sector (e.g. women are most of
health care and few in construction, young workers concentrate in food services and retail,
bachelor's degrees in professional services) but were not copied from a published table, so they
are not statistics of any real population.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gedp.synth.schema import InputError, _refuse, canonical_ids, check_columns, code_text

#: QWI worker codes (LEHD QWI schema): sex 1 male, 2 female; agegrp A01 14-18, A02 19-21, A03 22-24,
#: A04 25-34, A05 35-44, A06 45-54, A07 55-64, A08 65-99; education E1 below high school, E2 high
#: school, E3 some college, E4 bachelor's or above, E5 not available (QWI: every worker under 25);
#: race A1 White, A2 Black, A3 American Indian or Alaska Native, A4 Asian, A5 Native Hawaiian or
#: Pacific Islander, A6 some other race (not used by QWI), A7 two or more; ethnicity A1 not
#: Hispanic, A2 Hispanic.
WORKER_DOMAINS: dict[str, tuple[str, ...]] = {
    "sex": ("1", "2"),
    "agegrp": tuple(f"A0{i}" for i in range(1, 9)),
    "education": tuple(f"E{i}" for i in range(1, 6)),
    "race": tuple(f"A{i}" for i in range(1, 8)),
    "ethnicity": ("A1", "A2"),
}
#: Worker columns a family may use: the QWI codes and the home county.
FAMILY_COLUMNS = (*WORKER_DOMAINS, "home_county")
#: Columns of a job table, in output order (``home_county`` optional).
JOB_COLUMNS = ("estab_id", *FAMILY_COLUMNS)
HOME_COUNTY_WIDTH = 5
#: Age groups under 25, whose education QWI reports as E5.
YOUNG = ("A01", "A02", "A03")
#: QCEW's county code for establishments without a known county; nobody lives there.
UNKNOWN_COUNTY = "999"

# --- share tables (ILLUSTRATIVE, see the module docstring) -------------------------------------------
#: Per NAICS sector: share of women, share of workers under 25, share with a bachelor's degree among
#: workers 25 and older, share Hispanic.
SECTOR_PROFILE = pd.DataFrame.from_dict({
    "11": (0.27, 0.17, 0.15, 0.35), "21": (0.14, 0.08, 0.22, 0.17), "22": (0.24, 0.05, 0.33, 0.12),
    "23": (0.11, 0.10, 0.13, 0.28), "31-33": (0.29, 0.08, 0.25, 0.17), "42": (0.30, 0.09, 0.30, 0.15),
    "44-45": (0.49, 0.28, 0.20, 0.17), "48-49": (0.24, 0.08, 0.18, 0.19), "51": (0.40, 0.11, 0.48, 0.11),
    "52": (0.57, 0.08, 0.48, 0.11), "53": (0.48, 0.10, 0.38, 0.15), "54": (0.44, 0.08, 0.62, 0.08),
    "55": (0.52, 0.06, 0.50, 0.09), "56": (0.41, 0.15, 0.17, 0.26), "61": (0.68, 0.16, 0.58, 0.10),
    "62": (0.78, 0.11, 0.38, 0.12), "71": (0.47, 0.30, 0.30, 0.13), "72": (0.52, 0.40, 0.13, 0.25),
    "81": (0.52, 0.12, 0.22, 0.18), "99": (0.45, 0.15, 0.30, 0.15),
}, orient="index", columns=["female", "under25", "bachelor", "hispanic"])
#: How workers under 25 split over A01-A03 and workers 25 and older over A04-A08 (every sector).
AGE_WITHIN = {"under25": (0.15, 0.40, 0.45), "over25": (0.27, 0.25, 0.25, 0.18, 0.05)}
#: How workers 25 and older without a bachelor's degree split over E1-E3 (every sector).
BELOW_BACHELOR = (0.15, 0.45, 0.40)
#: Race A1-A7, the same in every sector.
RACE = (0.78, 0.12, 0.01, 0.06, 0.002, 0.0, 0.028)
#: Dirichlet concentration of an establishment's mix around its sector's shares: smaller, more varied.
MIX_CONCENTRATION = 8.0
#: Share of jobs held by residents of the workplace county (the rest live elsewhere in the state).
SAME_COUNTY_SHARE = 0.75


def share_tables() -> dict[str, pd.DataFrame]:
    """Per worker attribute, shares by sector (rows) and code (columns), each row summing to 1.

    ``education`` covers E1-E4 among workers 25 and older; E5 is exactly the workers under 25.
    """
    p = SECTOR_PROFILE
    young, old = np.asarray(AGE_WITHIN["under25"]), np.asarray(AGE_WITHIN["over25"])
    below = np.asarray(BELOW_BACHELOR)
    columns = {
        "sex": np.column_stack([1 - p["female"], p["female"]]),
        "agegrp": np.column_stack([np.outer(p["under25"], young), np.outer(1 - p["under25"], old)]),
        "education": np.column_stack([np.outer(1 - p["bachelor"], below), p["bachelor"]]),
        "race": np.tile(RACE, (len(p), 1)),
        "ethnicity": np.column_stack([1 - p["hispanic"], p["hispanic"]]),
    }
    return {a: pd.DataFrame(v, index=p.index, columns=list(WORKER_DOMAINS[a][: v.shape[1]]))
            for a, v in columns.items()}


# --- validation -------------------------------------------------------------------------------------
def _codes(jobs: pd.DataFrame, column: str, valid: Sequence[str] | None, rule: str) -> pd.Categorical:
    """A code column as a Categorical, its distinct values checked (not its rows: millions of jobs
    share a few codes). ``valid`` lists the codes; None takes any 5-digit FIPS (integers zero-padded)."""
    positions, uniques = pd.factorize(jobs[column])
    distinct = pd.Series(uniques)
    if valid is None:
        text, malformed = code_text(distinct, HOME_COUNTY_WIDTH)
        categories = pd.Index(text[~malformed].astype(str).unique())
    else:
        text, categories = distinct.astype(str).str.strip(), pd.Index(valid)
    index = categories.get_indexer(text.astype(str))
    codes = np.where(positions >= 0, index[positions] if len(index) else -1, -1)
    _refuse(column, codes < 0, jobs, rule)
    return pd.Categorical.from_codes(codes, categories=categories)


def validate_jobs(jobs: pd.DataFrame, establishments: pd.DataFrame) -> pd.DataFrame:
    """Check a job table against validated establishment microdata and return it in canonical form:
    the columns of ``JOB_COLUMNS`` present, as Categoricals (``estab_id`` over the establishment
    table's ids, worker codes over ``WORKER_DOMAINS``), rows in input order; other columns are dropped.
    ``establishments`` is validated microdata with ``m1emp``.

    Messages name the column, the rule and the first offending row with its estab_id, as the
    microdata validation does (never a count or a value: counts of jobs are what is protected).

    Raises:
        InputError: a missing or repeated column, a job without an establishment of the establishment
            table, a code outside its domain, a home county that is not 5 digits, or an establishment
            whose number of jobs differs from its m1emp.
    """
    try:
        check_columns(jobs.columns, (), required=JOB_COLUMNS[:-1])
    except InputError as err:
        raise InputError(f"job table: {err}") from None
    jobs = jobs.reset_index(drop=True)
    _refuse("estab_id", jobs["estab_id"].isna().to_numpy(), jobs.drop(columns="estab_id"), "values must not be missing")
    ids = pd.Index(establishments["estab_id"].astype(str))
    positions, uniques = pd.factorize(canonical_ids(jobs["estab_id"]))
    index = ids.get_indexer(pd.Index(uniques))
    position = np.where(positions >= 0, index[positions] if len(index) else -1, -1)
    _refuse("estab_id", position < 0, jobs, "values must be an estab_id of the establishment table")
    out = pd.DataFrame({"estab_id": pd.Categorical.from_codes(position, categories=ids)})
    for attribute, domain in WORKER_DOMAINS.items():
        out[attribute] = _codes(jobs, attribute, domain, f"codes must be one of {', '.join(domain)}")
    if "home_county" in jobs.columns:
        out["home_county"] = _codes(jobs, "home_county", None, "codes must be 5-digit FIPS")
    jobs_per_establishment = np.bincount(position, minlength=len(ids))
    _refuse("m1emp", jobs_per_establishment != establishments["m1emp"].to_numpy(), establishments,
            "every establishment needs as many jobs in the job table as its m1emp")
    return out


# --- synthetic jobs ---------------------------------------------------------------------------------
def _mixes(shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each establishment's mix ~ Dirichlet(MIX_CONCENTRATION x its row of ``shares``), as cumulative
    shares (one row per establishment)."""
    draws = rng.gamma(MIX_CONCENTRATION * shares)
    totals = draws.sum(axis=1, keepdims=True)
    mix = np.divide(draws, totals, out=shares.copy(), where=totals > 0)  # all draws underflowed: the mean
    return np.cumsum(mix, axis=1)


def _categories(cumulative: np.ndarray, establishment: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each job's category, drawn from its establishment's mix by inverse CDF (a loop over the few
    categories, not over jobs)."""
    u = rng.random(len(establishment))
    codes = np.zeros(len(establishment), dtype=np.int8)
    for k in range(cumulative.shape[1] - 1):
        codes += u >= cumulative[establishment, k]
    return codes


def home_counties(workplace: np.ndarray, employment: pd.Series, rng: np.random.Generator) -> np.ndarray:
    """Each job's home county, as positions in ``employment.index`` (the state's counties, 5-digit FIPS,
    with their employment): the workplace county with probability SAME_COUNTY_SHARE, otherwise another
    county with probability proportional to its employment. Jobs in the unknown county (999) and
    jobs of a state with one populated county are all placed by employment / at the workplace."""
    counties = employment.index.to_numpy(dtype=str)
    weight = np.where(np.char.endswith(counties, UNKNOWN_COUNTY), 0.0, employment.to_numpy(dtype=float))
    ends = np.cumsum(weight)
    starts = ends - weight
    elsewhere = ends[-1] - weight[workplace]  # employment of the other counties
    moves = (rng.random(len(workplace)) >= SAME_COUNTY_SHARE) | (weight[workplace] == 0)
    moves &= elsewhere > 0
    # A uniform point on the other counties' employment, mapped past the workplace's own stretch.
    point = rng.random(len(workplace)) * elsewhere
    point += np.where(point >= starts[workplace], weight[workplace], 0.0)
    last = int(np.flatnonzero(weight)[-1]) if weight.any() else 0  # rounding never passes the last populated
    home = np.minimum(np.searchsorted(ends, point, side="right"), last)
    return np.where(moves, home, workplace)


def synthesize_jobs(microdata: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """One job per month-1 employee of validated microdata, in establishment order, with worker codes
    drawn from each establishment's mix around its sector's shares (``share_tables``; education E5
    exactly for workers under 25, as in QWI) and a home county (``home_counties``).

    Raises:
        InputError: an m1emp that is not a whole number, or a sector without a share table.
    """
    m1emp = microdata["m1emp"].to_numpy(dtype=float)
    _refuse("m1emp", m1emp != np.floor(m1emp), microdata, "values must be whole numbers to build jobs")
    tables = share_tables()
    sector = pd.Index(tables["sex"].index).get_indexer(microdata["sector"].astype(str))
    _refuse("sector", sector < 0, microdata, "has no worker share table")
    establishment = np.repeat(np.arange(len(microdata)), m1emp.astype(np.int64))
    out = {"estab_id": pd.Categorical.from_codes(establishment, categories=pd.Index(microdata["estab_id"]))}
    for attribute, table in tables.items():
        codes = _categories(_mixes(table.to_numpy()[sector], rng), establishment, rng)
        if attribute == "education":  # QWI: no education for workers under 25, E5 for all of them
            young = np.isin(out["agegrp"].codes, [WORKER_DOMAINS["agegrp"].index(a) for a in YOUNG])
            codes = np.where(young, WORKER_DOMAINS["education"].index("E5"), codes).astype(np.int8)
        out[attribute] = pd.Categorical.from_codes(codes, categories=WORKER_DOMAINS[attribute])
    place = (microdata["state"].astype(str) + microdata["county"].astype(str)).to_numpy()
    employment = pd.Series(m1emp).groupby(place).sum()
    workplace = employment.index.get_indexer(place)
    home = home_counties(workplace[establishment], employment, rng)
    out["home_county"] = pd.Categorical.from_codes(home, categories=employment.index).remove_unused_categories()
    return pd.DataFrame(out)
