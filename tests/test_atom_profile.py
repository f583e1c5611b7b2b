"""benchmarks/implicates_atom_profile.py: the no-change atom's profile likelihood against a convex solver's
constrained optimum, and its curvature against the atom weight's standard error."""


import numpy as np
import pytest
from scipy import stats

from gedp.postprocess.deconvolve import GAP_NATS, MixtureFit, binned
from gedp.postprocess.prior_components import atom_standard_error, change_components


@pytest.fixture(scope="module")
def profiles(benchmark_script):
    return benchmark_script("implicates_atom_profile")


def constrained_optimum(likelihood: np.ndarray, counts: np.ndarray, atom: int, p: float) -> float:
    """max over w (w_atom = p, sum w = 1, w >= 0) of counts . log(L w), by a convex solver (CLARABEL)."""
    cvxpy = pytest.importorskip("cvxpy")
    w = cvxpy.Variable(likelihood.shape[1], nonneg=True)
    problem = cvxpy.Problem(cvxpy.Maximize(counts @ cvxpy.log(likelihood @ w)), [cvxpy.sum(w) == 1, w[atom] == p])
    problem.solve(solver="CLARABEL")
    return float(problem.value)


def test_atom_profile_is_the_convex_solvers_constrained_optimum(profiles):
    """Differences of the profile log-likelihood between atom weights against CLARABEL's optimum with the
    atom's weight constrained, on the change prior's components and the binned answers (within twice the
    certified gap plus the solver's tolerance); power: the profile is not flat here (p = 0.9 is more than
    0.1 nat below the best p), so a profile that ignored p would fail."""
    rng = np.random.default_rng(21)
    n, sd = 8000, 0.8
    truth = np.where(rng.random(n) < 0.5, 0.0, rng.standard_t(3, n) * 0.6)
    observed = truth + rng.normal(0, sd, n)
    means, sds = change_components(0.15, 8.0, sd)
    fit = MixtureFit.of(observed, sd, means, sds, basis=True)
    grid = np.array([0.0, 0.3, 0.6, 0.9])
    profile = profiles.atom_profile(fit, grid)
    centers, counts = binned(observed, sd / 10)
    likelihood = stats.norm.pdf(centers[:, None], means, np.sqrt(sds**2 + sd**2))
    atom = int(np.flatnonzero((sds == 0) & (means == 0))[0])
    solver = np.array([constrained_optimum(likelihood, counts, atom, p) for p in grid])
    assert np.abs((profile - profile[0]) - (solver - solver[0])).max() < 2 * GAP_NATS + 0.02
    assert solver[-1] < solver.max() - 0.1
    assert profiles.likelihood_interval(np.array([-5.0, -1.0, 0.0, -2.5]), grid) == (0.3, 0.6)


def test_the_profiles_curvature_is_the_atom_weights_standard_error(profiles):
    """Where the formula holds (atoms at 0 and +-a, a = 0.2, noise sd 1, 400,000 answers, p = 0.5: first
    order in a^2, the real sd 2.0% above it, ``test_deconvolve``), the sd of the normalized likelihood
    exp(profile) (its log interpolated linearly between 101 points, integrated on 100,001) is the standard
    error within 10% in each of 4 samples (it was within 0.6%), and its mean is within 4 of its sds of the
    truth (a false failure in 1 run in 10,000 per sample for a calibrated profile). Power: the profile of
    half the answers (an sd 41% wider) fails."""
    rng = np.random.default_rng(8)
    n, a, p = 400_000, 0.2, 0.5
    expected = atom_standard_error(n, a, 1.0) * 1.02
    grid = np.linspace(0.0, 1.0, 101)
    fine = np.linspace(0.0, 1.0, 100_001)
    for _ in range(4):
        observed = rng.choice([0.0, a, -a], p=[p, (1 - p) / 2, (1 - p) / 2], size=n) + rng.normal(size=n)
        for half in (False, True):
            fit = MixtureFit.of(observed[: n // 2] if half else observed, 1.0, np.array([0.0, a, -a]), np.zeros(3))
            profile = profiles.atom_profile(fit, grid)
            density = np.exp(np.interp(fine, grid, profile - profile.max()))
            density /= density.sum()
            mean = float(fine @ density)
            sd = float(np.sqrt(((fine - mean) ** 2) @ density))
            assert (abs(sd / expected - 1) > 0.1) if half else (abs(sd / expected - 1) < 0.1)
            if not half:
                assert abs(mean - p) < 4 * sd
