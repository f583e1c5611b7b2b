"""The mu-GDP budget plan: per query and attribute, composed as sqrt(sum mu^2), with a ledger."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gedp.errors import BudgetError


def compose(mus: Iterable[float]) -> float:
    """Total mu of fully adaptive composition of mu-GDP mechanisms: sqrt(sum of mu_k^2)."""
    return math.sqrt(math.fsum(mu * mu for mu in mus))


#: Largest mu a plan may give a query or its cap: far beyond any meaningful privacy (mu 100 hides nothing).
MAX_MU = 100.0


def check_mu(mu: float, what: str = "mu", largest: float = math.inf) -> None:
    """Refuse a mu that is not a finite number in (0, largest]."""
    if not (math.isfinite(mu) and 0 < mu <= largest):
        bound = f" and <= {largest:g}" if math.isfinite(largest) else ""
        raise BudgetError(f"{what} ({mu}) must be a finite number > 0{bound}")


@dataclass
class BudgetPlan:
    """Planned mu per (query, attribute); refuses a plan over ``cap`` before any noise is drawn.

    Every mechanism call first reserves the (query, attribute) it answers with :meth:`spend`, which
    returns the planned mu to calibrate its noise to; then :meth:`charge` records the mu its privacy map gives
    for the noise it actually drew. A charge above the plan is refused. The ledger records each
    charge with what has been spent and what remains of the plan (and of the cap); ``spent`` is
    composed from the charges, never from the plan.
    """

    planned: Mapping[tuple[str, str], float]
    cap: float | None = None
    ledger: list[dict] = field(default_factory=list)
    _reserved: set[tuple[str, str]] = field(default_factory=set)
    _charged: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.planned:
            raise BudgetError("the budget plan has no queries")
        for (query, attribute), mu in self.planned.items():
            check_mu(mu, f"mu of query '{query}' on '{attribute}'", MAX_MU)
        if self.cap is not None:
            check_mu(self.cap, "mu cap", MAX_MU)
            if self.total > self.cap * (1 + 1e-12):
                raise BudgetError(
                    f"planned total mu ({self.total:.4f}) exceeds the cap ({self.cap:.4f}); nothing was measured"
                )

    @property
    def total(self) -> float:
        """Total planned mu."""
        return compose(self.planned.values())

    @property
    def spent(self) -> float:
        """Total mu charged so far: the mechanisms' privacy maps applied to the noise they drew."""
        return compose(self._charged.values())

    @property
    def complete(self) -> bool:
        """Whether every planned (query, attribute) has been charged."""
        return set(self._charged) == set(self.planned)

    def spend(self, query: str, attribute: str) -> float:
        """Reserve the planned mu of (query, attribute) once and return it (to calibrate noise to)."""
        key = (query, attribute)
        if key not in self.planned:
            raise BudgetError(f"query '{query}' on '{attribute}' is not in the budget plan")
        if key in self._reserved:
            raise BudgetError(f"query '{query}' on '{attribute}' was already answered; its budget is spent")
        self._reserved.add(key)
        return self.planned[key]

    def charge(self, query: str, attribute: str, mu: float) -> None:
        """Record the mu a reserved (query, attribute) actually cost; refuse more than planned."""
        key = (query, attribute)
        if key not in self._reserved or key in self._charged:
            raise BudgetError(f"query '{query}' on '{attribute}' was not reserved once before its charge")
        planned = self.planned[key]
        if not (math.isfinite(mu) and 0 <= mu <= planned * (1 + 1e-9)):
            raise BudgetError(f"query '{query}' on '{attribute}' charged mu {mu:.6g}, more than its plan "
                              f"{planned:.6g}; nothing is released")
        self._charged[key] = mu
        spent = self.spent
        self.ledger.append(
            {
                "query": query,
                "attribute": attribute,
                "mu": mu,
                "mu_planned": planned,
                "spent_total": spent,
                "remaining_of_plan": math.sqrt(max(self.total**2 - spent**2, 0.0)),
                "remaining_of_cap": None if self.cap is None else math.sqrt(max(self.cap**2 - spent**2, 0.0)),
            }
        )
