"""Built-in state profiles: compact parameters from which whole synthetic states are generated.

A profile holds the published establishment count of every county x sector cell (public even where
values are suppressed) and, per sector, its most common six-digit industries with their weights and
fitted parameters of establishment size (log-normal employment with a share of zeros), of the change
from month 1 to month 3, and of wages per employee. The parameters are fitted to a synthetic state
built from the public QCEW aggregates (``gedp synth --from-qcew FILE --fit-profile OUT.json``); no
data file is copied. Shipped: ``small`` (fitted to Rhode Island, 2016 Q1) and ``large`` (New Jersey).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.synth.qcew import PublishedState
from gedp.synth.rules import month2_employment, proportional_shares, split_integer
from gedp.synth.schema import InputError, validate_microdata

PROFILE_DIRECTORY = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "small"
#: Most establishments a profile is rescaled to: twice the US private sector (about 11 million).
MAX_ESTABLISHMENTS = 20_000_000
#: Industries kept per sector in a profile (the rest of the sector is spread over them).
TOP_INDUSTRIES = 25


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIRECTORY.glob("*.json"))


def load_profile(name_or_path: str | Path) -> dict:
    """A shipped profile by name, or a profile JSON file."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIRECTORY / f"{name_or_path}.json"
    if not path.is_file():
        raise InputError(f"profile '{name_or_path}' is neither a file nor shipped ({', '.join(available_profiles())})")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"profile {path} is not valid JSON: {err}") from None


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def fit_profile(published: PublishedState, microdata: pd.DataFrame, *, name: str, description: str) -> dict:
    """Compact profile parameters from published counts and synthetic microdata fitted to them."""
    sector_counts = (
        published.aggregates.query("agglvl == 74 and estabs > 0")
        .pivot_table(index="county", columns="industry", values="estabs", aggfunc="sum", fill_value=0)
    )
    sectors = {}
    for sector, group in microdata.groupby("sector", observed=True):
        industries = group["naics"].value_counts().head(TOP_INDUSTRIES)
        employed = group[group["m1emp"] > 0]
        average = employed[["m1emp", "m2emp", "m3emp"]].mean(axis=1)
        log_sd = float(np.log(employed["m1emp"]).std(ddof=0)) if len(employed) > 1 else 0.0
        growth = np.log((employed["m3emp"] + 0.5) / (employed["m1emp"] + 0.5))
        paid = average > 0
        wage_sd = (
            float(
                np.log(employed["wage"][paid & (employed["wage"] > 0)] / average[paid & (employed["wage"] > 0)]).std(
                    ddof=0
                )
            )
            if (paid & (employed["wage"] > 0)).sum() > 1
            else 0.0
        )
        # Log-normal locations chosen so the means are kept: E[exp(m + s Z)] = exp(m + s^2 / 2).
        mean_employment = float(employed["m1emp"].mean()) if len(employed) else 1.0
        wage_per_employee = float(employed["wage"].sum() / average.sum()) if average.sum() > 0 else 1.0
        sectors[str(sector)] = {
            "industries": {str(code): int(count) for code, count in industries.items()},
            "zero_share": _round((group["m1emp"] == 0).mean()),
            "mean_employment": _round(mean_employment),
            "log_employment_mean": _round(np.log(mean_employment) - log_sd**2 / 2),
            "log_employment_sd": _round(log_sd),
            "log_growth_mean": _round(growth.mean()) if len(employed) else 0.0,
            "log_growth_sd": _round(growth.std(ddof=0)) if len(employed) > 1 else 0.0,
            "log_wage_per_employee_mean": _round(np.log(max(wage_per_employee, 1.0)) - wage_sd**2 / 2),
            "log_wage_per_employee_sd": _round(wage_sd),
        }
    return {
        "name": name,
        "description": description,
        "state": published.state,
        "year": published.year,
        "qtr": published.qtr,
        "establishments": int(published.cells["estabs"].sum()),
        "county_sector_establishments": {
            str(county): {str(s): int(c) for s, c in row.items() if c > 0} for county, row in sector_counts.iterrows()
        },
        "sectors": sectors,
    }


def generate_profile(
    profile: dict, *, rng: np.random.Generator, n_establishments: int | None = None
) -> pd.DataFrame:
    """A synthetic state from a profile; ``n_establishments`` rescales every county x sector count.

    Each establishment gets an industry drawn from its sector's weights, month-1 employment that is
    0 with the sector's zero share and otherwise log-normal (at least 1), month 3 from the log growth
    distribution, month 2 from the month-2 rule, and wages from log-normal wages per employee.
    """
    cells = [(county, sector, count)
             for county, sectors in profile["county_sector_establishments"].items()
             for sector, count in sectors.items()]
    counts = np.array([c for _, _, c in cells], dtype=float)
    if n_establishments is not None:
        if not 1 <= n_establishments <= MAX_ESTABLISHMENTS:
            raise InputError(f"number of establishments ({n_establishments}) must be >= 1 and "
                             f"<= {MAX_ESTABLISHMENTS:,}")
        counts = split_integer(np.zeros(len(counts), dtype=np.int64), np.array([n_establishments]),
                               proportional_shares(np.zeros(len(counts), dtype=np.int64), counts))
    counts = counts.astype(np.int64)
    county = np.repeat([c for c, _, _ in cells], counts)
    sector = np.repeat([s for _, s, _ in cells], counts)
    n = len(county)

    naics = np.empty(n, dtype=object)
    parameters = {name: np.zeros(n) for name in (
        "zero_share", "log_employment_mean", "log_employment_sd", "log_growth_mean", "log_growth_sd",
        "log_wage_per_employee_mean", "log_wage_per_employee_sd")}
    for name, spec in profile["sectors"].items():
        members = np.flatnonzero(sector == name)
        if len(members) == 0:
            continue
        codes = list(spec["industries"])
        weights = np.array(list(spec["industries"].values()), dtype=float)
        naics[members] = np.array(codes)[rng.choice(len(codes), size=len(members), p=weights / weights.sum())]
        for key in parameters:
            parameters[key][members] = spec[key]
    missing = sorted(set(sector) - set(profile["sectors"]))
    if missing:
        raise InputError(f"profile {profile.get('name')}: sector {missing[0]} has establishments but no parameters")

    def lognormal(mean_key: str, sd_key: str) -> np.ndarray:
        return np.exp(parameters[mean_key] + parameters[sd_key] * rng.standard_normal(n))

    m1 = np.maximum(np.rint(lognormal("log_employment_mean", "log_employment_sd")), 1.0)
    m1[rng.random(n) < parameters["zero_share"]] = 0.0
    m3 = np.maximum(np.rint((m1 + 0.5) * lognormal("log_growth_mean", "log_growth_sd") - 0.5), 0.0)
    m2 = month2_employment(m1, m3, rng=rng)
    wage = np.rint((m1 + m2 + m3) / 3 * lognormal("log_wage_per_employee_mean", "log_wage_per_employee_sd"))
    frame = pd.DataFrame({
        "estab_id": np.char.add(f"{profile['state']}-", np.char.zfill(np.arange(n).astype(str), 7)),
        "state": profile["state"],
        "county": county,
        "naics": naics.astype(str),
        "own": "5",
        "year": profile["year"],
        "qtr": profile["qtr"],
        "m1emp": m1, "m2emp": m2, "m3emp": m3, "wage": wage,
    })
    return validate_microdata(frame)
