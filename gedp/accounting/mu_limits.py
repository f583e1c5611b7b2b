"""Limits on the mu of a release config, so that a typo cannot release exact values.

The shipped plans spend at most 0.9 per query and attribute and 2.31 in total (configs/). A config
therefore always has a cap: its ``mu_cap``, or ``DEFAULT_MU_CAP`` when it has none; and a query's mu
above ``MAX_QUERY_MU`` is refused unless explicitly allowed (``--allow-large-mu`` on the command
line, ``allow_large_mu=True`` in the API's protect). The refusal says what such a mu would release:
the noise sd, in the attribute's units, of the identity query's answer for a typical establishment
(``TYPICAL_VALUES``: public reference sizes, not read from any data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gedp.errors import ConfigError

if TYPE_CHECKING:  # for annotations only: a release's reader checks MAX_STATED_MU without the workflows
    from gedp.measure.workflows import MeasurementPlan

#: Largest mu of one query on one attribute accepted without ``allow_large_mu``: room for the plans
#: the planner writes (an identity-only plan of total 2.3065 spends up to 1.33 on one month's
#: identity query; the shipped plans 0.7), far below what makes a single query nearly exact (a typo
#: such as 70 for 0.70, or 7 for 0.7). At mu 2 an establishment of 36 employees is released with noise
#: sd 3 employees.
MAX_QUERY_MU = 2.0
#: The cap of a config without ``mu_cap``: the shipped plans' totals (2.28-2.31) with a small margin.
DEFAULT_MU_CAP = 2.5
#: Largest mu a release may state, in total or for one query, even with ``allow_large_mu``: far above
#: any plan (at mu 1e6 every value is released to within a millionth of its noise scale), far below
#: where its epsilon overflows (mu near 1e10). A config above it is refused; so is a release stating more.
MAX_STATED_MU = 1e6
#: A typical establishment's value and unit for each attribute (anything else: jobs of a job family).
TYPICAL_VALUES = {"m1emp": (36.0, "employees"), "m2emp": (36.0, "employees"), "m3emp": (36.0, "employees"),
                  "wage": (500_000.0, "dollars")}
TYPICAL_JOBS = (36.0, "jobs")


def identity_noise_sd(plan: MeasurementPlan, attribute: str, mu: float, value: float) -> float:
    """The noise sd, in the attribute's units, that the identity query at ``mu`` gives a record of
    ``value``: the width psi^-1(psi(x) + gamma / mu) - x of one psi-scale noise sd above x."""
    psi_value = float(plan.psi(np.array([value]))[0])
    return float(plan.psi.inverse(np.array([psi_value + plan.gammas[attribute] / mu]))[0]) - value


def check_query_mus(plan: MeasurementPlan, where: str, allow_large_mu: bool = False) -> None:
    """Refuse a query mu above MAX_QUERY_MU (unless ``allow_large_mu``), naming what it would release.

    Raises:
        ConfigError: the first (query, attribute) whose mu is above the limit.
    """
    if allow_large_mu:
        return
    for query in plan.queries:
        for attribute, mu in query.mu.items():
            if mu <= MAX_QUERY_MU:
                continue
            value, units = TYPICAL_VALUES.get(attribute, TYPICAL_JOBS)
            sd = identity_noise_sd(plan, attribute, mu, value)
            shown_sd = f"{sd:,.0f}" if sd >= 100 else f"{sd:.2g}"
            raise ConfigError(
                f"{where}: mu {mu:g} of query {query.name} on {attribute} is above {MAX_QUERY_MU:g}, the most one "
                f"query may spend; at mu {mu:g} an establishment of {value:,.0f} {units} would be released with "
                f"noise sd {shown_sd} {units} (--allow-large-mu, or allow_large_mu=True, releases it anyway)"
            )
