"""A heavier-tailed prior for the sibling rates (``postprocess.wages``, option RATE_TAILS): each
rate's deviation u_i from its parent's is normal with variance s^2 c_i / lambda_i, lambda_i ~
Gamma(nu / 2, rate nu / 2) (a Student-t of nu degrees of freedom and scale s^2 c_i; nu = inf is the
normal prior). The cells' wages use the same machinery (``cell_tails``, option CELL_TAILS).

The deviations are observed with noise: d_i = u_i + e_i, e_i ~ N(0, n_i), independent of the prior.
Per state, s^2 and nu are those of the largest marginal likelihood of the d_i,
prod_i E_lambda[N(d_i; 0, n_i + s^2 c_i / lambda)] (the expectation over lambda by a trapezoid rule
in log lambda; nu on the grid NU_GRID, above 2 so that the prior has a variance; s^2 by a bounded
scalar search per nu). Each rate then gets the prior variance s^2 c_i E[1 / lambda_i | d_i], the
mixture's variance given its data: a rate far from its parent relative to s^2 c_i + n_i gets a wide
prior (it is shrunk less), one near its parent a narrower one, and a rate its data say nothing of
the t's variance s^2 c_i nu / (nu - 2).

Where the d_i come from (``effective_deviations``): a fit of the joint least squares at normal priors
of variance tau_i^2 gives each deviation a posterior mean u_i and variance v_i; the data's Gaussian
likelihood of u_i is what is left after dividing the prior out: noise n_i = 1 / (1 / v_i - 1 / tau_i^2)
around d_i = u_i / (1 - v_i / tau_i^2) (no information where v_i >= tau_i^2). Exact for one rate
measured alone; with the rates coupled through their parents and cells, the marginal information of
each. The weighted least squares keeps its form: only its priors' variances change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import scipy.optimize

#: Degrees of freedom tried (inf: the normal prior; all above 2, a prior with a variance); the grid is
#: coarse, the likelihood flat in nu.
NU_GRID = (2.5, 3.0, 4.0, 6.0, 10.0, 20.0, np.inf)
#: The expectation over lambda: a trapezoid rule in log lambda over LOG_RANGE with NODES nodes (the
#: integrands are smooth there; Gauss-Laguerre's few nodes near 0 missed far outliers' posteriors).
NODES = 800
LOG_RANGE = (-30.0, 7.0)
#: Terms per block of the expectation (its arrays are terms x NODES: blocks bound the memory).
BLOCK = 128


#: Nodes above the Gamma density's largest node are dropped where their log weight plus half their log
#: lambda lies more than CUT below the largest node's: there the normal factor is at most sqrt(lambda /
#: lambda_max) times its value at the largest node (its variance is smaller, its exponent no larger), so
#: each dropped node adds less than exp(-CUT) of one kept node, all of them less than NODES exp(-CUT)
#: (3e-15 at CUT = 40) relative to the expectation. Nodes below it are all kept (a far outlier's
#: expectation lies there).
CUT = 40.0


@functools.lru_cache(maxsize=64)
def _mixture(nu: float, shape: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes 1 / lambda_k and log weights of E over lambda ~ Gamma(shape, rate nu / 2): the density
    times lambda times the step in log lambda (not renormalized: the mass outside LOG_RANGE, where the
    likelihoods vanish or are flat, counts as lost, not spread over the nodes), less the nodes CUT drops.
    Cached per (nu, shape): read-only."""
    import scipy.stats  # here: protect starts without scipy.stats (test_light_imports)

    if np.isinf(nu):
        inverse, log_weight = np.ones(1), np.zeros(1)
    else:
        log_lam = np.linspace(*LOG_RANGE, NODES)
        step = log_lam[1] - log_lam[0]
        log_weight = scipy.stats.gamma.logpdf(np.exp(log_lam), shape, scale=2.0 / nu) + log_lam + np.log(step)
        top = int(np.argmax(log_weight))
        bound = log_weight + 0.5 * (log_lam - log_lam[top])
        keep = np.ones(NODES, dtype=bool)
        keep[top + 1:] = bound[top + 1:] >= log_weight[top] - CUT
        inverse, log_weight = np.exp(-log_lam[keep]), log_weight[keep]
    inverse.flags.writeable = log_weight.flags.writeable = False
    return inverse, log_weight


def _log_likelihoods(d2: np.ndarray, noise: np.ndarray, scale: np.ndarray, spread2: float, nu: float,
                     shape: float | None = None) -> np.ndarray:
    """Per term: log E_lambda N(d; 0, n + s^2 c / lambda), lambda ~ Gamma(``shape`` (nu / 2 unless
    given), rate nu / 2). Blocks of BLOCK terms in buffers made once (no page faults per block)."""
    inverse, log_weight = _mixture(nu, nu / 2.0 if shape is None else shape)
    out = np.empty(len(d2))
    rows = min(BLOCK, len(d2))
    precision, terms = np.empty((rows, len(inverse))), np.empty((rows, len(inverse)))
    peak, total = np.empty(rows), np.empty(rows)
    for start in range(0, len(d2), BLOCK):
        block = slice(start, start + BLOCK)
        size = len(d2[block])
        p, t, m, s = precision[:size], terms[:size], peak[:size], total[:size]
        np.multiply((spread2 * scale[block])[:, None], inverse[None, :], out=p)
        p += noise[block, None]
        np.reciprocal(p, out=p)  # 1 / variance
        np.log(p, out=t)
        p *= d2[block, None]
        t -= p
        t *= 0.5
        t += log_weight[None, :]  # log weight - (log variance + d^2 / variance) / 2
        np.max(t, axis=1, out=m)
        m[~np.isfinite(m)] = 0.0  # a term every node gives 0 (infinite noise): log 0, as logsumexp
        t -= m[:, None]
        np.exp(t, out=t)
        np.sum(t, axis=1, out=s)
        out[block] = np.log(s) + m - 0.5 * np.log(2 * np.pi)
    return out


def variance_multiplier(d2: np.ndarray, noise: np.ndarray, scale: np.ndarray, spread2: float, nu: float
                        ) -> np.ndarray:
    """E[1 / lambda | d] per term (nu > 2): a Gamma(a, b) density times 1 / lambda is b / (a - 1) times
    the Gamma(a - 1, b) density, so the numerator is the same expectation at shape nu / 2 - 1."""
    if np.isinf(nu):
        return np.ones(len(d2))
    shifted = _log_likelihoods(d2, noise, scale, spread2, nu, nu / 2.0 - 1.0)
    return nu / (nu - 2.0) * np.exp(shifted - _log_likelihoods(d2, noise, scale, spread2, nu))


def fit_tails(deviation: np.ndarray, noise: np.ndarray, scale: np.ndarray, bounds: tuple[float, float],
              nus: Sequence[float] = NU_GRID, most: int | None = None) -> tuple[float, float, np.ndarray]:
    """One state's terms: the marginal-likelihood s^2 (within ``bounds``) and nu, and each term's
    variance multiplier E[1 / lambda | d] (the prior variance is s^2 c times it; 1 for every term
    at nu = inf). Terms of ``scale`` 0 take no part and get multiplier 1. ``most``: s^2 and nu from
    at most this many terms (every k-th in their order, k the least that keeps within it; the
    multipliers are every term's)."""
    used = scale > 0
    d2, n, c = deviation[used] ** 2, np.maximum(noise[used], 0.0), scale[used]
    multiplier = np.ones(len(deviation))
    if not used.any():
        return bounds[0], np.inf, multiplier
    every = 1 if most is None else -(-len(d2) // most)
    best = (-np.inf, bounds[0], np.inf)
    low, high = np.log(bounds[0]), np.log(bounds[1])
    for nu in nus:
        search = scipy.optimize.minimize_scalar(lambda x: -_log_likelihoods(d2[::every], n[::every], c[::every],
                                                                            np.exp(x), nu).sum(),
                                                bounds=(low, high), method="bounded", options={"xatol": 1e-4})
        if -search.fun > best[0]:
            best = (-search.fun, float(np.exp(search.x)), nu)
    _, spread2, nu = best
    multiplier[used] = variance_multiplier(d2, n, c, spread2, nu)
    return spread2, nu, multiplier


def effective_deviations(mean: np.ndarray, variance: np.ndarray, prior_variance: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The measurements (d, n) a normal posterior (``mean``, ``variance``) at a normal prior of mean 0
    and ``prior_variance`` was made from (module docstring); d = 0, n = inf without information."""
    information = np.divide(1.0, variance, out=np.zeros(len(variance)), where=variance > 0) - 1.0 / prior_variance
    informed = information > 1e-12 / prior_variance
    noise = np.divide(1.0, information, out=np.full(len(information), np.inf), where=informed)
    deviation = np.divide(mean * prior_variance, prior_variance - variance, out=np.zeros(len(mean)), where=informed)
    return deviation, noise


def tail_variances(codes: np.ndarray, deviation: np.ndarray, noise: np.ndarray, scale: np.ndarray, n_states: int,
                   bounds: tuple[float, float], most: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per term, its prior variance s^2 c E[1 / lambda | d] (``fit_tails`` per state of ``codes``, each
    state's s^2 and nu from at most ``most`` terms); per state, s^2 and nu."""
    variance = np.zeros(len(deviation))
    spreads, nus = np.full(n_states, bounds[0]), np.full(n_states, np.inf)
    for state in range(n_states):
        terms = codes == state
        spreads[state], nus[state], multiplier = fit_tails(deviation[terms], noise[terms], scale[terms], bounds,
                                                                           most=most)
        variance[terms] = spreads[state] * scale[terms] * multiplier
    return variance, spreads, nus
