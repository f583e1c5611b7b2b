"""mu-GDP in the other units of differential privacy: (epsilon, delta)-DP and rho-zCDP.

A mu-GDP mechanism is (eps, delta(eps))-DP for every eps >= 0 with the exact conversion of Dong,
Roth & Su (JRSS-B 2022, Corollary 2.13)

    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2),

and rho-zCDP with rho = mu^2 / 2 (its Renyi divergences are those of the Gaussian mechanism).
These are guarantees between psi-neighbours (one establishment's value moved within its
uncertainty interval), the neighbouring relation gedp's mu is stated for, not add/remove-one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from scipy import optimize, special

#: The deltas at which a privacy statement gives epsilon.
STATEMENT_DELTAS = (1e-5, 1e-6, 1e-9)
#: The delta of every epsilon gedp states in words (the command line, a publication's notes, the
#: manager's page, the documentation): one of STATEMENT_DELTAS, so the manifest holds the same figure.
STATED_DELTA = 1e-6
#: Smallest delta converted (below it Phi^-1(delta) leaves double precision's normal range).
MIN_DELTA = 1e-300


def _check_mu(mu: float) -> None:
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu > 0):
        raise ValueError(f"mu ({mu}) must be a finite number > 0")


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and MIN_DELTA <= delta < 1):
        raise ValueError(f"delta ({delta}) must be in [{MIN_DELTA:g}, 1)")


def gdp_rho(mu: float) -> float:
    """rho of the rho-zCDP guarantee implied by mu-GDP: mu^2 / 2."""
    _check_mu(mu)
    return mu * mu / 2


def gdp_delta(eps: float, mu: float) -> float:
    """The delta at which a mu-GDP mechanism is (eps, delta)-DP (Dong, Roth & Su 2022, Corollary 2.13):
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    # Phi and log Phi as scipy.stats.norm computes them (ndtr, log_ndtr), without importing scipy.stats
    return float(special.ndtr(-eps / mu + mu / 2) - math.exp(eps + special.log_ndtr(-eps / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float = 1e-6) -> float:
    """The smallest eps >= 0 at which a mu-GDP mechanism is (eps, delta)-DP: ``gdp_delta``, which
    falls with eps, solved for eps by bracketing (0 when delta(0) <= delta already). At the upper
    end of the bracket -eps/mu + mu/2 = -(z + 1), z = Phi^-1(1 - delta), so delta(eps) < delta."""
    _check_mu(mu)
    _check_delta(delta)
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    upper = mu * (mu / 2 - float(special.ndtri(delta)) + 1)  # Phi^-1(1 - delta) = -Phi^-1(delta)
    return float(optimize.brentq(lambda eps: gdp_delta(eps, mu) - delta, 0.0, upper, xtol=1e-14, rtol=1e-14))


def gdp_mu(eps: float, delta: float = 1e-6) -> float:
    """The mu at which mu-GDP is (eps, delta)-DP (``gdp_delta``, which grows with mu, solved for mu)."""
    if not (math.isfinite(eps) and eps > 0 and 0 < delta < 1):
        raise ValueError(f"eps ({eps}) must be finite and > 0 and delta ({delta}) in (0, 1)")
    return float(optimize.brentq(lambda mu: gdp_delta(eps, mu) - delta, 1e-6, 2 * eps + 10, xtol=1e-14))


def delta_text(delta: float = STATED_DELTA) -> str:
    """A delta as people write it: 1e-6, not 1e-06."""
    mantissa, exponent = f"{delta:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def stated_guarantee(mu: float) -> str:
    """A budget in words, the one way gedp states it: "mu 2.3063 (epsilon 13.08 at delta 1e-6)"."""
    return f"mu {mu:.4f} (epsilon {gdp_epsilon(mu, STATED_DELTA):.2f} at delta {delta_text()})"


def _guarantee(mu: float) -> dict:
    return {"mu": mu, "rho": gdp_rho(mu), "epsilon": {f"{delta:g}": gdp_epsilon(mu, delta)
                                                     for delta in STATEMENT_DELTAS}}


def privacy_statement(mu_total: float, mu_by_attribute: Mapping[str, float]) -> dict:
    """A release's guarantee in mu, rho and epsilon at STATEMENT_DELTAS, in total and per attribute:
    {"mu", "rho", "epsilon": {"1e-05": .., "1e-06": .., "1e-09": ..}, "attributes": {name: {same}}}."""
    return {**_guarantee(mu_total), "attributes": {name: _guarantee(mu) for name, mu in mu_by_attribute.items()}}
