"""E3, bias ablation (SPEC section 6, appendix setup): estimated versus exact variances in WLS.

Counties x establishments x employees, three queries (identity, county, total) each answered by
the psi-mechanism, for psi = sqrt and psi = log. The answers are combined by weighted least squares
with estimated, exact or hybrid variances. The problem is a tree (establishments in counties in the
total) and unconstrained, so the WLS solution is the exact two-pass tree estimator, vectorized over
trials. Reports the mean squared error and the mean error (bias) per query with standard errors.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from gedp.evaluation.report import Report
from gedp.measure.neighbors import LogPsi, NeighborFunction, SqrtPsi
from gedp.postprocess.months import MONTH_MODES
from gedp.postprocess.wls import VARIANCE_MODES

QUERIES = ("identity", "county", "total")
#: The WLS variance modes of one attribute (the months' modes need three months), the pooled estimator
#: (variances at the neighbouring answers, never at the answer's own) and the answers without postprocessing.
MODES = (*(mode for mode in VARIANCE_MODES if mode not in MONTH_MODES), "pooled", "unprocessed")


@dataclass(frozen=True)
class E3Setup:
    counties: int = 100
    per_county: int = 2
    employees: float = 10.0
    gamma_sqrt: float = 0.5
    gamma_log: float = 0.1
    mu: float = 1.0
    trials: int = 100_000
    batch: int = 5_000

    def __post_init__(self) -> None:
        for name in ("counties", "per_county", "trials", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")
        for name in ("employees", "gamma_sqrt", "gamma_log", "mu"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be > 0")


def tree_wls(a, v, b, w, total, total_variance):
    """Exact WLS of establishments (trials, counties, per) under county and total answers.

    Bottom-up, each county combines its answer with the sum of its establishments' (inverse-variance
    weights); the total likewise. Top-down, each level's discrepancy is spread over its children in
    proportion to their variances. Returns establishment, county and total estimates.
    """
    establishment_variance = v.sum(-1)
    establishment_sum = a.sum(-1)
    county_variance = 1 / (1 / w + 1 / establishment_variance)
    county = county_variance * (b / w + establishment_sum / establishment_variance)
    county_variance_sum = county_variance.sum(-1)
    county_sum = county.sum(-1)
    total_hat = (total / total_variance + county_sum / county_variance_sum) / (
        1 / total_variance + 1 / county_variance_sum
    )
    county_final = county + county_variance / county_variance_sum[..., None] * (total_hat - county_sum)[..., None]
    establishments = a + v / establishment_variance[..., None] * (county_final - establishment_sum)[..., None]
    return establishments, county_final, total_hat


def _answers(psi: NeighborFunction, truth: np.ndarray, sd: float, rng: np.random.Generator):
    """psi-mechanism answers of totals ``truth``: estimates, estimated and exact variances."""
    omega = psi(truth) + rng.normal(0.0, sd, size=truth.shape)
    estimate = psi.unbiased_estimate(omega, sd)
    return estimate, psi.releasable_variance(estimate, sd), psi.estimate_variance(truth, sd)


def pooled_variances(psi: NeighborFunction, a: np.ndarray, b: np.ndarray, sd: float):
    """Variances of the identity, county and total answers evaluated at pooled values: each query's
    variance at the mean of its answers over all its groups (equal sizes here; ``postprocess.wages``
    pools by public counts), the total's at the sum of the county answers. An answer's weight then
    hardly depends on its own noise (1 / groups of it). Released values only: postprocessing."""
    trials = a.shape[0]
    establishment = np.maximum(a.reshape(trials, -1).mean(axis=1), 0.0)[:, None, None]
    county = np.maximum(b.mean(axis=1), 0.0)[:, None]
    return (psi.estimate_variance(np.broadcast_to(establishment, a.shape), sd),
            psi.estimate_variance(np.broadcast_to(county, b.shape), sd),
            psi.estimate_variance(np.maximum(b.sum(-1), 0.0), sd))


def simulate(setup: E3Setup, psi: NeighborFunction, gamma: float, rng: np.random.Generator) -> dict:
    """MSE and mean error per variance mode and query, with standard errors over trials."""
    sd = gamma / setup.mu
    truth = {"identity": setup.employees, "county": setup.employees * setup.per_county,
             "total": setup.employees * setup.per_county * setup.counties}
    squared = {m: {q: [] for q in QUERIES} for m in MODES}
    signed = {m: {q: [] for q in QUERIES} for m in squared}
    done = 0
    while done < setup.trials:
        size = min(setup.batch, setup.trials - done)
        shape = (size, setup.counties)
        a, a_est, a_exact = _answers(psi, np.full((*shape, setup.per_county), truth["identity"]), sd, rng)
        b, b_est, b_exact = _answers(psi, np.full(shape, truth["county"]), sd, rng)
        t, t_est, t_exact = _answers(psi, np.full(size, truth["total"]), sd, rng)
        variances = {
            "estimated": (a_est, b_est, t_est),
            "exact": (a_exact, b_exact, t_exact),
            "hybrid": (a_est, b_exact, t_exact),
            "pooled": pooled_variances(psi, a, b, sd),
        }
        for mode, (va, vb, vt) in variances.items():
            estimates = tree_wls(a, va, b, vb, t, vt)
            for query, estimate in zip(QUERIES, estimates):
                error = estimate - truth[query]
                squared[mode][query].append((error**2).reshape(size, -1).mean(axis=1))
                signed[mode][query].append(error.reshape(size, -1).mean(axis=1))
        for query, estimate in zip(QUERIES, (a, b, t)):
            error = estimate - truth[query]
            squared["unprocessed"][query].append((error**2).reshape(size, -1).mean(axis=1))
            signed["unprocessed"][query].append(error.reshape(size, -1).mean(axis=1))
        done += size
    out = {"mse": {}, "mse_se": {}, "bias": {}, "bias_se": {}}
    for mode in squared:
        for key, store in (("mse", squared), ("bias", signed)):
            values = {q: np.concatenate(store[mode][q]) for q in QUERIES}
            out[key][mode] = {q: float(x.mean()) for q, x in values.items()}
            out[f"{key}_se"][mode] = {q: float(x.std(ddof=1) / np.sqrt(len(x))) for q, x in values.items()}
    return out


@dataclass(frozen=True)
class E3Result:
    """MSE and bias (with standard errors) per psi, variance mode and query."""

    setup: E3Setup
    results: dict[str, dict]
    seed: int
    seconds: float


def compute_e3(setup: E3Setup, *, seed: int) -> E3Result:
    """Simulate E3 for psi = sqrt and psi = log."""
    start = time.perf_counter()
    streams = np.random.SeedSequence(seed).spawn(2)
    results = {
        "sqrt": simulate(setup, SqrtPsi(), setup.gamma_sqrt, np.random.default_rng(streams[0])),
        "log": simulate(setup, LogPsi(), setup.gamma_log, np.random.default_rng(streams[1])),
    }
    return E3Result(setup, results, seed, time.perf_counter() - start)


def run_e3(out: Path, setup: E3Setup, *, seed: int) -> dict:
    """Run E3 for sqrt and log and write report.md, summary.json and the MSE plot into ``out``."""
    return render_e3(compute_e3(setup, seed=seed), out)


def render_e3(computed: E3Result, out: Path) -> dict:
    """report.md, summary.json and the MSE plot; returns the summary."""
    setup, results, seed, seconds = computed.setup, computed.results, computed.seed, computed.seconds
    report = Report(out, "E3: bias of estimated variances in least-squares postprocessing")
    report.section(
        "Setup",
        f"{setup.counties} counties x {setup.per_county} establishments x {setup.employees:g} employees. Queries: "
        f"identity, county and total, each by the psi-mechanism with mu = {setup.mu:g} (total mu = "
        f"{np.sqrt(3) * setup.mu:.3f}); psi = sqrt with gamma = {setup.gamma_sqrt:g} and psi = log with gamma = "
        f"{setup.gamma_log:g}. Answers are made unbiased (SPEC section 4) and combined by weighted least squares "
        "with four variance modes: *estimated* (the releasable variances, computed from the answers; the only "
        "private choice of SPEC section 5), *exact* (the true variances; not private), *hybrid* (estimated for the "
        "identity query, exact for the rest) and *pooled* (private too: each query's variances evaluated at the mean "
        "of its answers over all its groups, the total's at the sum of the county answers, so that an answer's "
        "weight hardly depends on its own noise; the way `gedp` weighs wage answers). "
        "The problem is a tree without bounds, solved exactly for every trial. "
        f"{setup.trials:,} trials per psi (seed {seed}), {seconds:.0f} s.",
    )
    for psi_name, result in results.items():
        report.section(f"Mean squared error and bias, psi = {psi_name}")
        rows = []
        for mode in MODES:
            rows.append([mode, *[f"{result['mse'][mode][q]:.5g} ± {result['mse_se'][mode][q]:.2g}" for q in QUERIES],
                         *[f"{result['bias'][mode][q]:+.4g} ± {result['bias_se'][mode][q]:.2g}" for q in QUERIES]])
        report.table(["mode", *[f"MSE {q}" for q in QUERIES], *[f"bias {q}" for q in QUERIES]], rows)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (psi_name, result) in zip(axes, results.items()):
        positions = np.arange(len(QUERIES))
        for offset, mode in zip(np.linspace(-0.32, 0.32, len(MODES)), MODES):
            relative = [result["mse"][mode][q] / result["mse"]["exact"][q] for q in QUERIES]
            errors = [result["mse_se"][mode][q] / result["mse"]["exact"][q] for q in QUERIES]
            ax.bar(positions + offset, relative, width=0.15, yerr=np.multiply(errors, 2), label=mode)
        ax.set_xticks(positions, QUERIES)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel("MSE relative to exact variances")
        ax.set_title(f"psi = {psi_name}")
    axes[0].legend()
    report.figure(figure, "e3_mse.png", "MSE of each mode relative to exact variances (bars: ±2 SE)")
    report.section("Findings", *_findings(results))
    summary = {
        "experiment": "e3",
        "setup": asdict(setup),
        "seed": seed,
        "seconds": seconds,
        "trials": setup.trials,
        "mse": {p: r["mse"] for p, r in results.items()},
        "mse_se": {p: r["mse_se"] for p, r in results.items()},
        "bias": {p: r["bias"] for p, r in results.items()},
        "bias_se": {p: r["bias_se"] for p, r in results.items()},
    }
    report.write(summary)
    return summary


def _findings(results: dict) -> list[str]:
    """Plain-word comparisons of estimated against exact variances, with their z-scores."""
    lines = []
    for psi_name, result in results.items():
        for query in QUERIES:
            estimated, exact = result["mse"]["estimated"][query], result["mse"]["exact"][query]
            se = np.hypot(result["mse_se"]["estimated"][query], result["mse_se"]["exact"][query])
            z = (estimated - exact) / se
            change = estimated / exact - 1
            verdict = "no resolvable difference" if abs(z) < 3 else ("worse" if z > 0 else "better")
            bias, bias_se = result["bias"]["estimated"][query], result["bias_se"]["estimated"][query]
            pooled, pooled_se = result["bias"]["pooled"][query], result["bias_se"]["pooled"][query]
            lines.append(
                f"- psi = {psi_name}, {query}: estimated variances give an MSE {change:+.1%} relative to exact "
                f"variances ({z:+.1f} SE: {verdict}); the estimated-variance bias is {bias:+.4g} "
                f"({bias / bias_se:+.1f} SE); pooled variances: MSE "
                f"{result['mse']['pooled'][query] / exact - 1:+.1%}, bias {pooled:+.4g} ({pooled / pooled_se:+.1f} SE)."
            )
    verdicts = []
    for psi_name, result in results.items():
        change = result["mse"]["estimated"]["total"] / result["mse"]["exact"]["total"] - 1
        bias = result["bias"]["estimated"]["total"]
        if psi_name == "sqrt":
            agrees = change < 0.10
            verdicts.append(
                "psi = sqrt: the expectation (SPEC section 4) is that estimated variances cost little, because the "
                "releasable variance converges to the true one. "
                + ("The simulation agrees." if agrees else
                   f"**This goes against the expectation** at this size: the estimated variance 2 s^2 (2 x~ + s^2) "
                   f"still grows with the estimate, so low answers get larger weights and the total is biased by "
                   f"{bias:+.3g} with an MSE {change:+.0%} above exact variances. The effect fades as counts grow, "
                   f"since the weights then depend on x~ only relatively (try --employees 1000).")
            )
        else:
            agrees = bias < 0
            verdicts.append(
                "psi = log: the expectation is a downward bias, because the estimated variance is proportional to "
                "the squared estimate and smaller answers get larger weights. "
                + (f"The simulation agrees: total bias {bias:+.3g}, MSE {change:+.0%} above exact variances." if agrees
                   else "**The simulation does not show it**, which goes against the expectation.")
            )
    return ["\n".join(lines), *verdicts]
