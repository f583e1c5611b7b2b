"""The embedded default state: a synthetic state generated from the package's own parameters.

It needs no input file, so ``gedp run`` works on a fresh machine. Parameters are rounded from public
QCEW aggregates of a small state (2016 Q1 statewide private sectors): per sector the share of
establishments, the mean employment per establishment and the average weekly wage, and the most
common six-digit industries with their relative weights. Establishment sizes are log-normal around
the sector mean (heavy-tailed: mean far above median); wages follow employment times the sector's
weekly wage with establishment-level dispersion.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from synth.rules import month2_employment
from synth.schema import validate_microdata

STATE = "99"
STATE_NAME = "Default synthetic state"
N_ESTABLISHMENTS = 25_000
COUNTY_WEIGHTS = {"001": 0.05, "003": 0.16, "005": 0.10, "007": 0.55, "009": 0.14}
#: log-sd of establishment size within a sector (mean / median = exp(sd^2 / 2)).
SIZE_LOG_SD = 1.4
#: log-sd of an establishment's wage per employee around its sector's average.
WAGE_LOG_SD = 0.3
WEEKS_PER_QUARTER = 13
#: Share of establishments with no employment in month 1 (seasonal, newly opened or closing).
ZERO_EMPLOYMENT_SHARE = 0.04

#: sector: (share of establishments, mean employment, average weekly wage, {naics6: weight}).
SECTORS: dict[str, tuple[float, float, float, dict[str, int]]] = {
    "11": (0.0045, 4.0, 850, {"111421": 34, "111219": 21, "115210": 14, "114112": 12, "111331": 8}),
    "21": (0.0005, 10.0, 1200, {"212321": 11, "211111": 2, "212319": 2}),
    "22": (0.0011, 26.8, 1884, {"221122": 9, "221112": 8, "221210": 6, "221310": 5}),
    "23": (0.0991, 4.5, 1045, {"236118": 606, "238221": 335, "236115": 286, "238211": 240, "238321": 170,
                               "236220": 159, "238212": 148, "238351": 133}),
    "31-33": (0.0444, 25.5, 1096, {"339910": 143, "323111": 88, "311811": 62, "332710": 45, "336612": 31,
                                   "332813": 30, "326199": 29, "311812": 27}),
    "42": (0.0824, 5.6, 1362, {"425120": 1622, "423830": 84, "423940": 82, "423450": 74, "424210": 69,
                               "424490": 55}),
    "44-45": (0.1071, 12.4, 561, {"446110": 269, "445310": 234, "447110": 231, "445110": 181, "445120": 157,
                                  "443142": 137, "441120": 134, "452990": 112}),
    "48-49": (0.0208, 13.1, 730, {"484110": 109, "484220": 85, "488510": 50, "487210": 42, "492110": 38}),
    "51": (0.0230, 9.7, 1381, {"518210": 147, "512110": 145, "511210": 143, "519130": 65, "517110": 64}),
    "52": (0.0468, 14.7, 1922, {"524210": 455, "522110": 201, "523930": 128, "523120": 108, "522292": 97}),
    "53": (0.0302, 5.4, 833, {"531210": 277, "531311": 172, "531120": 97, "531110": 93, "532111": 49}),
    "54": (0.1383, 4.9, 1327, {"541512": 876, "541110": 769, "541511": 438, "541611": 358, "541330": 316,
                               "541211": 219}),
    "55": (0.0092, 40.0, 3062, {"551114": 299, "551112": 25}),
    "56": (0.0769, 9.3, 644, {"561730": 673, "561320": 496, "561720": 369, "561110": 131, "561311": 112}),
    "61": (0.0167, 31.7, 965, {"611110": 108, "611620": 80, "611710": 76, "611310": 67}),
    "62": (0.1076, 20.7, 807, {"624120": 928, "621111": 651, "621210": 376, "624410": 274, "623210": 159,
                               "621340": 132}),
    "71": (0.0163, 12.8, 550, {"713940": 150, "713990": 74, "713930": 73, "711510": 53}),
    "72": (0.0833, 14.6, 351, {"722511": 1079, "722513": 843, "722515": 377, "722410": 263, "721110": 123}),
    "81": (0.0908, 5.3, 582, {"814110": 440, "812112": 393, "811111": 338, "813110": 208, "811121": 190}),
    "99": (0.0010, 0.4, 678, {"999999": 36}),
}


def _industry_table() -> pd.DataFrame:
    """One row per six-digit industry: its probability and its sector's size and wage parameters."""
    rows = []
    for share, mean_emp, weekly_wage, industries in SECTORS.values():
        total = sum(industries.values())
        for naics, weight in industries.items():
            rows.append((naics, share * weight / total, mean_emp, weekly_wage))
    table = pd.DataFrame(rows, columns=["naics", "probability", "mean_emp", "weekly_wage"])
    table["probability"] /= table["probability"].sum()
    return table


def generate_default_state(
    n_establishments: int = N_ESTABLISHMENTS, *, rng: np.random.Generator
) -> pd.DataFrame:
    """Synthetic establishment microdata for the default state, validated.

    Args:
        n_establishments: number of establishments (>= 1).
        rng: random generator; the same seed gives the same state.
    """
    if n_establishments < 1:
        raise ValueError(f"n_establishments ({n_establishments}) must be >= 1")
    industries = _industry_table()
    pick = rng.choice(len(industries), size=n_establishments, p=industries["probability"].to_numpy())
    counties = np.array(list(COUNTY_WEIGHTS))
    weights = np.array(list(COUNTY_WEIGHTS.values()))
    county = counties[rng.choice(len(counties), size=n_establishments, p=weights / weights.sum())]

    mean_emp = industries["mean_emp"].to_numpy()[pick]
    log_median = np.log(mean_emp) - SIZE_LOG_SD**2 / 2
    m1 = np.ceil(np.exp(log_median + SIZE_LOG_SD * rng.standard_normal(n_establishments)))
    m1[rng.random(n_establishments) < ZERO_EMPLOYMENT_SHARE] = 0.0
    growth = np.exp(0.005 + 0.08 * rng.standard_normal(n_establishments))
    m3 = np.rint(m1 * growth)
    m2 = month2_employment(m1, m3, rng=rng)

    average_emp = (m1 + m2 + m3) / 3
    wage_per_employee = (
        WEEKS_PER_QUARTER
        * industries["weekly_wage"].to_numpy()[pick]
        * np.exp(WAGE_LOG_SD * rng.standard_normal(n_establishments) - WAGE_LOG_SD**2 / 2)
    )
    wage = np.rint(average_emp * wage_per_employee)

    frame = pd.DataFrame(
        {
            "estab_id": [f"E{i:07d}" for i in range(n_establishments)],
            "state": STATE,
            "county": county,
            "naics": industries["naics"].to_numpy()[pick],
            "own": "5",
            "year": 2016,
            "qtr": 1,
            "m1emp": m1,
            "m2emp": m2,
            "m3emp": m3,
            "wage": wage,
        }
    )
    return validate_microdata(frame)
