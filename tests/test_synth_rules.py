"""Building blocks of the generator: Dirichlet divider, Gamma concentrations, controlled rounding."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gedp.synth.rules import dirichlet_shares, gamma_concentrations, proportional_shares, skewed_weights, split_integer


def test_gamma_concentrations_have_shape_10_scale_200():
    draws = gamma_concentrations(200_000, rng=np.random.default_rng(0))
    n = len(draws)
    assert abs(draws.mean() - 2_000) < 4 * np.sqrt(10 * 200**2 / n)
    # variance shape * scale^2 = 400,000; its standard error from the sample's fourth moment
    centered = draws - draws.mean()
    assert abs(centered.var() - 400_000) < 4 * np.sqrt((np.mean(centered**4) - centered.var() ** 2) / n)


def test_dirichlet_shares_have_the_dirichlet_mean_and_sum_to_one():
    rng = np.random.default_rng(1)
    b = np.array([1.0, 2.0, 7.0])
    runs = 50_000
    codes = np.repeat(np.arange(runs), 3)
    shares = dirichlet_shares(codes, np.tile(b, runs), rng=rng).reshape(runs, 3)
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)
    expected = b / b.sum()
    # Var of a Dirichlet component: m (1 - m) / (sum b + 1)
    se = np.sqrt(expected * (1 - expected) / (b.sum() + 1) / runs)
    assert np.all(np.abs(shares.mean(axis=0) - expected) < 4 * se)


def test_dirichlet_with_all_zero_concentrations_is_uniform():
    runs = 40_000
    codes = np.repeat(np.arange(runs), 4)
    shares = dirichlet_shares(codes, np.zeros(4 * runs), rng=np.random.default_rng(2)).reshape(runs, 4)
    se = np.sqrt(0.25 * 0.75 / 5 / runs)
    assert np.all(np.abs(shares.mean(axis=0) - 0.25) < 4 * se)


def test_proportional_shares_fall_back_to_equal_shares():
    codes = np.array([0, 0, 1, 1, 1])
    np.testing.assert_allclose(
        proportional_shares(codes, np.array([1.0, 3.0, 0.0, 0.0, 0.0])), [0.25, 0.75, 1 / 3, 1 / 3, 1 / 3]
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.lists(st.floats(0.0, 1e6), min_size=1, max_size=12)),
                min_size=1, max_size=20))
def test_controlled_rounding_keeps_totals_and_rounds_each_part_down_or_up(cells):
    totals = np.array([t for t, _ in cells])
    codes = np.concatenate([np.full(len(w), i) for i, (_, w) in enumerate(cells)])
    shares = proportional_shares(codes, np.concatenate([w for _, w in cells]))
    parts = split_integer(codes, totals, shares)
    np.testing.assert_array_equal(np.bincount(codes, weights=parts, minlength=len(totals)), totals)
    raw = totals[codes] * shares
    assert np.all(parts >= np.floor(raw + 1e-9) - 1e-9) and np.all(parts <= np.ceil(raw - 1e-9) + 1e-9)
    assert np.all(parts == np.round(parts)) and np.all(parts >= 0)


def test_controlled_rounding_refuses_fractional_totals():
    with pytest.raises(ValueError, match="whole numbers >= 0"):
        split_integer(np.array([0, 0]), np.array([2.5]), np.array([0.5, 0.5]))


def test_skewed_weights_are_heavy_tailed():
    w = skewed_weights(100_000, rng=np.random.default_rng(3))
    assert w.mean() > 2 * np.median(w)
