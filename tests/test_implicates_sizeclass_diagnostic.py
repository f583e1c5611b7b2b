"""benchmarks/implicates_sizeclass_diagnostic.py: the level prior's expected size classes against draws
from the prior, and the class counts against BLS's size codes."""

from types import SimpleNamespace

import numpy as np
import pytest

from gedp.measure.neighbors import make_psi
from gedp.postprocess.deconvolve import Mixture


@pytest.fixture(scope="module")
def diagnostic(benchmark_script):
    return benchmark_script("implicates_sizeclass_diagnostic")


def test_prior_counts_are_the_class_shares_of_draws_from_the_prior(diagnostic):
    """A level prior (atom at 0, Gaussians at sizes about 3, 6 and 12) on 10,000 fitted answers (and 5
    above the fit's top, not counted): its expected classes against the classes of 400,000 draws from
    it (binomial sd at most 0.5 n / sqrt(draws) = 8 establishments; 6 sds: a false failure in fewer
    than 1 run in 10^8), and a prior with its middle component moved from 6 to 12 employees refused
    (power: about 3,000 establishments move from class 2 to class 3)."""
    psi = make_psi("sqrt", a=0.0)
    level = Mixture(np.array([0.0, np.sqrt(3.0), np.sqrt(6.0), np.sqrt(12.0)]), np.array([0.0, 0.3, 0.3, 0.3]),
                    np.array([0.1, 0.4, 0.3, 0.2]))
    sd, n = 0.5, 10_000
    months = np.concatenate([np.full((n, 3), 2.0), np.full((5, 3), 100.0)])
    model = SimpleNamespace(psi=psi, priors=SimpleNamespace(level=level, level_cut=20.0),
                            answers=SimpleNamespace(month_sd=np.full(3, sd), months=months))
    expected = np.array(diagnostic.prior_counts(model)[:3])
    rng = np.random.default_rng(5)
    draws = 400_000
    pick = rng.choice(len(level.weights), size=draws, p=level.weights)
    theta = level.means[pick] + level.sds[pick] * rng.standard_normal(draws)
    size = np.where(theta > 0, theta, 0.0) ** 2  # below psi(0): no employees (class 1)
    drawn = np.array([np.mean(diagnostic.size_class(size) == c) for c in (1, 2, 3)]) * n
    assert np.abs(expected - drawn).max() < 6 * 0.5 * n / np.sqrt(draws)  # 6 binomial sds at most
    moved = Mixture(level.means.copy(), level.sds, level.weights)
    moved.means[2] = np.sqrt(12.0)
    model.priors.level = moved
    assert np.abs(np.array(diagnostic.prior_counts(model)[:3]) - drawn).max() > 1000
