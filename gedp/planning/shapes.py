"""Plan shapes: which group-by queries measure employment and wages, how a month's and the wage's
mu are shared between them, and the config a shape makes at a total mu and wage share.

A shape's employment queries measure every month alike (or, ``months_apart``, month 1 by every query
and months 2 and 3 by the identity query alone); its wage queries are chosen separately, because
wages are postprocessed by the employment-informed wage model only when the state x NAICS-5 query
measures them (``postprocess.wages``) and by the plain least squares otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gedp.postprocess.attributes import MONTHS, WAGE

STATE = ("state",)
NAICS5 = ("state", "naics5")
COUNTY = ("state", "county")
CELL = ("state", "county", "naics5")
#: Short names of the group-by queries in printed shapes.
QUERY_LABELS = {STATE: "state", NAICS5: "NAICS-5", COUNTY: "county", CELL: "county x NAICS-5"}
_QUERY_ORDER = list(QUERY_LABELS)
#: Shares of an attribute's mu^2 the state query may get when a shape has it (the shipped baseline
#: gives it 0.04 of a month's 1.74; the state total needs more where no other query sums to it).
STATE_SHARES = (0.03, 0.12)
#: Shares of an attribute's mu^2 (after the state query's) the identity query may get; the first is
#: searched for every query set, the others for the best sets (``search.coarse_to_fine``).
IDENTITY_SHARES = (0.6, 0.8)
WAGE_IDENTITY_SHARES = (0.65, 0.35)
#: Shares of employment's mu^2 a county query may get, in the best sets without one and the best with
#: one: the path between no county query (county totals from the finer cells) and the shipped five
#: queries (about 21%).
COUNTY_SHARES = (0.02, 0.05, 0.10, 0.15, 0.20, 0.25)


@dataclass(frozen=True)
class Allocation:
    """Group-by queries of one attribute, the state query's share of its mu^2 (when measured) and
    the identity query's share of the rest; the county query's share when ``county_share`` is set
    (taken from the other group-by queries', the identity's left as it is); the other group-by
    queries share what is left equally."""

    groups: tuple[tuple[str, ...], ...]
    identity_share: float = 1.0
    state_share: float = STATE_SHARES[0]
    county_share: float | None = None

    def shares(self) -> dict[tuple[str, ...], float]:
        """Each query's share of the attribute's mu^2 (the identity query under key ())."""
        state = self.state_share if STATE in self.groups else 0.0
        others = [g for g in self.groups if g != STATE]
        identity = 1.0 - state if not others else (1.0 - state) * self.identity_share
        out = {(): identity, **({STATE: state} if state else {})}
        rest = 1.0 - state - identity
        if self.county_share is not None and COUNTY in others:
            others.remove(COUNTY)
            out[COUNTY] = self.county_share if others else rest
            rest -= out[COUNTY]
        out.update({g: rest / len(others) for g in others})
        return out

    def group_share(self) -> float:
        """The share of the attribute's mu^2 that the group-by queries other than the state query have."""
        return sum(share for query, share in self.shares().items() if query not in ((), STATE))

    def with_county(self, share: float) -> Allocation:
        """This allocation with a county query getting ``share`` of the attribute's mu^2."""
        groups = self.groups if COUNTY in self.groups else tuple(sorted((*self.groups, COUNTY), key=_QUERY_ORDER.index))
        return Allocation(groups, self.identity_share, self.state_share, share)

    @property
    def label(self) -> str:
        names = ["identity", *(QUERY_LABELS[g] for g in self.groups)]
        parts = [f"{self.identity_share:.0%} identity"] if any(g != STATE for g in self.groups) else []
        parts += [f"{self.state_share:.0%} state"] if STATE in self.groups else []
        parts += [f"{self.county_share:.0%} county"] if self.county_share is not None else []
        return " + ".join(names) + (f" ({', '.join(parts)})" if parts else "")


@dataclass(frozen=True)
class Shape:
    """An employment allocation, a wage allocation and whether months 2-3 are measured apart."""

    employment: Allocation
    wage: Allocation
    months_apart: bool = False
    label: str = field(default="", compare=False)

    def describe(self) -> str:
        apart = "; months 2-3 by the identity query only" if self.months_apart else ""
        return f"employment: {self.employment.label}; wages: {self.wage.label}{apart}"


def query_sets() -> list[tuple[tuple[str, ...], ...]]:
    """The group-by sets searched: the shipped five queries' four, county x NAICS-5 alone, none;
    the first without, the other two with, each of the state, NAICS-5 and county queries."""
    five = (STATE, NAICS5, COUNTY, CELL)
    sets = [five, *(tuple(g for g in five if g != drop) for drop in (STATE, NAICS5, COUNTY)), (CELL,), ()]
    sets += [(extra, CELL) for extra in (STATE, NAICS5, COUNTY)]
    sets += [(extra,) for extra in (STATE, NAICS5, COUNTY)]
    return sets


def allocations(sets: Sequence[tuple[tuple[str, ...], ...]], shares: Sequence[float],
                state_shares: Sequence[float] = STATE_SHARES) -> list[Allocation]:
    """Every set with every identity share and state share (one allocation where a share does not
    matter)."""
    out = []
    for groups in sets:
        free = any(g != STATE for g in groups)
        out += [Allocation(groups, share, state) for share in (shares if free else (1.0,))
                for state in (state_shares if STATE in groups else state_shares[:1])]
    return out


def wage_sets() -> list[tuple[tuple[str, ...], ...]]:
    """Wage group-by sets: the wage model's (NAICS-5 measured) and the plain least squares' best."""
    return [(STATE, NAICS5, COUNTY, CELL), (NAICS5, CELL), (NAICS5,), (CELL,), ()]


def plan_mus(shape: Shape, mu_total: float, wage_share: float) -> dict[tuple[str, ...], dict[str, float]]:
    """mu per query (identity under ()) and attribute: wages get ``wage_share`` of mu_total^2, each
    month a third of the rest (months 2-3 of a ``months_apart`` shape all of theirs on the identity)."""
    month = mu_total**2 * (1.0 - wage_share) / len(MONTHS)
    out: dict[tuple[str, ...], dict[str, float]] = {}
    for query, share in shape.employment.shares().items():
        for index, attribute in enumerate(MONTHS):
            if shape.months_apart and index > 0:
                share = 1.0 if query == () else 0.0
            if share > 0:
                out.setdefault(query, {})[attribute] = math.sqrt(month * share)
    if wage_share > 0:
        for query, share in shape.wage.shares().items():
            if share > 0:
                out.setdefault(query, {})[WAGE] = math.sqrt(mu_total**2 * wage_share * share)
    return out


def config_mapping(shape: Shape, mu_total: float, wage_share: float, base: Mapping[str, Any],
                   quarters: int = 1) -> dict[str, Any]:
    """The YAML mapping of a shape's plan under ``base``'s psi, gammas, zeta and options: mus
    rounded down to 4 decimals (the total stays within mu_total) and a cap at sqrt(quarters) x
    mu_total rounded up, the budget of ``quarters`` quarters of this plan (a panel of them fits it)."""
    cap = math.ceil(math.sqrt(quarters) * mu_total * 1e3) / 1e3
    return mapping_of(plan_mus(shape, mu_total, wage_share), base, cap)


def mapping_of(mus: Mapping[tuple[str, ...], Mapping[str, float]], base: Mapping[str, Any],
               cap: float | None) -> dict[str, Any]:
    """A config mapping measuring ``mus`` (query -> attribute -> mu; the identity under ()), rounded
    down to 4 decimals, with ``base``'s other keys and the cap ``cap`` (None: no cap)."""
    queries = []
    for query, by_attribute in mus.items():
        rounded = {a: math.floor(mu * 1e4) / 1e4 for a, mu in by_attribute.items()}
        queries.append({"by": "identity" if query == () else list(query), "mu": rounded})
    attributes = sorted({a for q in queries for a in q["mu"]}, key=[*MONTHS, WAGE].index)
    out = {key: value for key, value in base.items() if key not in ("attributes", "queries", "mu_cap")}
    if cap is not None:
        out["mu_cap"] = cap
    out["attributes"] = {a: dict(base["attributes"][a]) for a in attributes}
    out["queries"] = queries
    return out
