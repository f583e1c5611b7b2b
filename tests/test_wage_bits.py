"""The wage fit's grouped computations give the bits of their plain forms (bincounts, texts)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from gedp.measure.queries import Groupings
from gedp.postprocess import structured, wage_layout, wage_rates, wage_shares, wages


def _unsorted_cells(rng, n_cells=40, n=3000):
    """Cell codes in random order (some cells empty, a few large), values of very different sizes."""
    sizes = rng.choice([0, 1, 2, 7, 30, 200], size=n_cells, p=[0.1, 0.2, 0.2, 0.2, 0.2, 0.1])
    codes = rng.permutation(np.repeat(np.arange(n_cells), sizes))[:n]
    values = rng.lognormal(0.0, 4.0, len(codes)) * rng.choice([-1.0, 1.0, 0.0], size=len(codes), p=[0.3, 0.6, 0.1])
    return codes, values


def test_run_sums_have_the_bits_of_bincount():
    rng = np.random.default_rng(11)
    codes, values = _unsorted_cells(rng)
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=40)
    sums = wage_shares._run_sums(counts) @ values[order]
    assert sums.tobytes() == np.bincount(codes, weights=values, minlength=40).tobytes()
    # power: the order within a cell matters for these values, so equal bits are not a coincidence
    reversed_order = np.argsort(codes[::-1], kind="stable")
    other = wage_shares._run_sums(counts) @ values[::-1][reversed_order]
    assert other.tobytes() != sums.tobytes()


def test_run_extremes_match_ufunc_at():
    rng = np.random.default_rng(12)
    codes, values = _unsorted_cells(rng)
    values[5] = np.nan
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=40)
    low, high = np.full(40, np.inf), np.full(40, -np.inf)
    with np.errstate(invalid="ignore"):  # the NaN
        np.minimum.at(low, codes, values)
        np.maximum.at(high, codes, values)
        run_low, run_high = wage_shares._run_extremes(values[order], counts)
    np.testing.assert_array_equal(run_low, low)  # NaN where the cell holds one, inf / -inf where empty
    np.testing.assert_array_equal(run_high, high)
    assert np.isinf(run_low[counts == 0]).all() and np.isnan(run_low[codes[5]])


def _bincount_shares(totals, cell_codes, target, variance):
    """The bisection summed by np.bincount over every establishment at every step (no grouping)."""
    n_cells = len(totals)
    ratio = -target / variance
    low, high = np.full(n_cells, np.inf), np.full(n_cells, -np.inf)
    np.minimum.at(low, cell_codes, ratio)
    np.maximum.at(high, cell_codes, ratio)
    spare = totals - np.bincount(cell_codes, weights=target, minlength=n_cells)
    summed = np.bincount(cell_codes, weights=variance, minlength=n_cells)
    high = np.maximum(high, np.divide(spare, summed, out=np.zeros(n_cells), where=summed > 0))
    low = np.minimum(low, high)
    for _ in range(wage_shares.SHARE_STEPS):
        middle = (low + high) / 2
        shared = np.bincount(cell_codes, weights=np.maximum(target + variance * middle[cell_codes], 0.0),
                             minlength=n_cells)
        high, low = np.where(shared > totals, middle, high), np.where(shared > totals, low, middle)
    free = (target + variance * high[cell_codes] > 0) & (totals[cell_codes] > 0)
    free_variance = np.bincount(cell_codes, weights=np.where(free, variance, 0.0), minlength=n_cells)
    free_target = np.bincount(cell_codes, weights=np.where(free, target, 0.0), minlength=n_cells)
    lam = np.divide(totals - free_target, free_variance, out=np.zeros(n_cells), where=free_variance > 0)
    return np.where(free, np.maximum(target + variance * lam[cell_codes], 0.0), 0.0), free


@pytest.mark.parametrize("settle_every", [1, wage_shares.SETTLE_EVERY, 1000])  # check every step, as shipped, never
@pytest.mark.parametrize("compact_share", [0.0, wage_shares.COMPACT_SHARE, 2.0])  # drop at once, as shipped, never
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_shares_have_the_bits_of_the_plain_bisection(seed, compact_share, settle_every, monkeypatch):
    monkeypatch.setattr(wage_shares, "COMPACT_SHARE", compact_share)
    monkeypatch.setattr(wage_shares, "SETTLE_EVERY", settle_every)
    rng = np.random.default_rng(seed)
    codes, target = _unsorted_cells(rng)
    variance = rng.lognormal(0.0, 3.0, len(codes))
    if seed == 4:  # ties: many establishments share a breakpoint -target / variance, at 0 and elsewhere
        target = np.where(rng.random(len(codes)) < 0.5, 0.0, np.round(target, 0))
        variance = np.where(rng.random(len(codes)) < 0.5, 1.0, np.round(variance, 0) + 1.0)
    totals = np.bincount(codes, weights=np.abs(target), minlength=40) * rng.uniform(0.0, 2.0, 40)
    totals[rng.choice(40, 4, replace=False)] = 0.0
    values, free = wage_shares.share_cells(totals, codes, target, variance)
    expected, expected_free = _bincount_shares(totals, codes, target, variance)
    assert values.tobytes() == expected.tobytes()
    np.testing.assert_array_equal(free, expected_free)
    # power: the cells' sums are at their totals, so a wrong free set would show
    np.testing.assert_allclose(np.bincount(codes, weights=values, minlength=40)[totals > 0],
                               totals[totals > 0], rtol=1e-9)


def test_county_codes_number_the_state_county_texts(small_state):
    """Numbered as the texts "state/county" are by first appearance, across states and in any row order."""
    other = small_state.assign(state="09")
    both = pd.concat([small_state, other], ignore_index=True).sample(frac=1.0, random_state=4)
    for frame in (small_state, both):
        texts = pd.factorize(frame["state"].astype(str) + "/" + frame["county"].astype(str))[0]
        codes = wage_layout.establishment_counties(Groupings(frame))
        assert codes.dtype == texts.dtype and np.array_equal(codes, texts)
    assert wage_layout.establishment_counties(Groupings(both)).max() + 1 == 2 * small_state["county"].nunique()


def test_shared_codes_number_as_pandas_factorize(small_state):
    """The state numbering (first appearance) and the industries' (sorted) from the shared groupings."""
    frame = small_state.sample(frac=1.0, random_state=5).reset_index(drop=True)
    groupings = Groupings(frame)
    assert np.array_equal(wage_layout.first_appearance(groupings, ("state",)), pd.factorize(frame["state"])[0])
    assert np.array_equal(groupings((wage_layout.DETAIL,)).codes, pd.factorize(frame[wage_layout.DETAIL], sort=True)[0])


def test_left_solve_keeps_one_left_per_operator():
    """Several right sides with one left give the bits of fresh operators; a new left is not answered
    from the kept one (against the dense left' (I + S A' M A)^-1 p)."""
    rng = np.random.default_rng(13)
    n_coarse, n_cells = 12, 30
    coarse_cells = np.sort(rng.integers(0, n_coarse, n_cells))
    coarse_cells[:n_coarse] = np.arange(n_coarse)  # every plan cell holds a cell
    groups = sp.vstack([sp.identity(n_coarse, format="csr"),
                        sp.csr_matrix((rng.random((4, n_coarse)) < 0.4).astype(float))], format="csr")
    groups = groups[np.diff(groups.indptr) > 0]
    w, s = rng.uniform(0.5, 2.0, groups.shape[0]), rng.uniform(0.1, 3.0, n_cells)
    lefts = [sp.csr_matrix(rng.random((n_cells, 3)) * (rng.random((n_cells, 3)) < 0.5)) for _ in range(2)]
    rights = [sp.csc_matrix(rng.random((n_cells, 2))) for _ in range(2)]
    kept = wage_rates.CellsInPlanCells(groups, w, s, coarse_cells)
    inside = wage_rates.cells_inside(coarse_cells, n_coarse).toarray()
    m = inside.T @ (groups.T.toarray() @ np.diag(1.0 / w) @ groups.toarray()) @ inside
    for left in lefts:
        for right in rights:
            fresh = wage_rates.CellsInPlanCells(groups, w, s, coarse_cells).left_solve(left, right)
            solved = kept.left_solve(left, right)
            assert solved.tobytes() == fresh.tobytes()
            dense = left.toarray().T @ np.linalg.solve(np.eye(n_cells) + np.diag(s) @ m, right.toarray())
            np.testing.assert_allclose(solved, dense, rtol=1e-9, atol=1e-12)


def test_detail_rates_number_as_sorted_unique(small_state):
    """Each establishment's detail rate and the detail rates' NAICS-5 groups, against np.unique of the
    (rate group, industry) pairs: sorted pairs, the group of each pair's first establishment."""
    frame = small_state.sample(frac=1.0, random_state=6).reset_index(drop=True)
    groupings = Groupings(frame)
    rate_codes = groupings(wages.RATE_QUERY).codes
    detail = groupings((wage_layout.DETAIL,)).codes
    n_rates = int(rate_codes.max()) + 1
    _, group, node = wage_layout.detail_cells(groupings, rate_codes, rate_codes, n_rates)
    pairs, first, inverse = np.unique(np.stack([rate_codes, detail], axis=1), axis=0, return_index=True,
                                      return_inverse=True)
    pair_group = rate_codes[first]
    several = np.bincount(pair_group, minlength=n_rates)[pair_group] > 1
    assert several.any() and not several.all()  # both kinds of NAICS-5 group are in the state
    assert np.array_equal(group, pair_group[several])
    expected = np.where(several, np.cumsum(several) - 1, -1)[inverse.ravel()]
    assert np.array_equal(node, expected)


def _nested_groups(rng, n_cells):
    """0/1 groups x cells: every cell alone, and a few random unions of cells."""
    unions = sp.csr_matrix((rng.random((5, n_cells)) < 0.4).astype(float))
    groups = sp.vstack([sp.identity(n_cells, format="csr"), unions], format="csr")
    return groups[np.diff(groups.indptr) > 0]


def test_operators_of_split_groups_have_the_bits_of_fresh_ones():
    """One split of C used at several S (the pivots, the rates' passes) gives the bits of operators built
    from C at each S, and solves the dense system (I + S C' W C) t = p."""
    rng = np.random.default_rng(17)
    n_coarse, n_cells = 10, 25
    coarse_cells = np.sort(np.concatenate([np.arange(n_coarse), rng.integers(0, n_coarse, n_cells - n_coarse)]))
    groups = _nested_groups(rng, n_coarse)
    w = rng.uniform(0.5, 2.0, groups.shape[0])
    split = structured.CellGroups.split(groups, w)
    inside = wage_rates.cells_inside(coarse_cells, n_coarse)
    m = groups.T.toarray() @ np.diag(1.0 / w) @ groups.toarray()
    left, right = sp.csc_matrix(rng.random((n_cells, 3))), sp.csc_matrix(rng.random((n_cells, 2)))
    for _ in range(3):
        s, p = rng.uniform(0.1, 3.0, n_coarse), rng.normal(size=n_coarse)
        solved = structured.CellOperator.at(split, s).solve(p)
        assert solved.tobytes() == structured.CellOperator(groups, w, s).solve(p).tobytes()
        np.testing.assert_allclose(solved, np.linalg.solve(np.eye(n_coarse) + np.diag(s) @ m, p), rtol=1e-10)
        fine_s = rng.uniform(0.1, 3.0, n_cells)
        fine = wage_rates.CellsInPlanCells.at(split, inside, fine_s).left_solve(left, right)
        fresh = wage_rates.CellsInPlanCells(groups, w, fine_s, coarse_cells)
        assert fine.tobytes() == fresh.left_solve(left, right).tobytes()
        fine_m = inside.T.toarray() @ m @ inside.toarray()
        dense = left.toarray().T @ np.linalg.solve(np.eye(n_cells) + np.diag(fine_s) @ fine_m, right.toarray())
        np.testing.assert_allclose(fine, dense, rtol=1e-9, atol=1e-12)


def test_in_place_steps_of_the_structured_solver_have_the_plain_bits():
    """The structured solver's in-place steps against their plain numpy forms, with free and fixed values."""
    from gedp.postprocess import structured

    rng = np.random.default_rng(19)
    a, v, lam = rng.normal(0, 1e3, 500), rng.lognormal(0, 3, 500), rng.normal(0, 1e-2, 40)
    codes = rng.integers(0, 40, 500)
    assert structured._plus_scaled(a, v, lam[codes]).tobytes() == (a + v * lam[codes]).tobytes()
    for free in (rng.random(500) < 0.7, np.ones(500, dtype=bool)):
        values = -rng.normal(size=500)
        expected = np.where(free, values, 0.0)
        assert structured._zero_where_fixed(values.copy(), free).tobytes() == expected.tobytes()


def test_settled_cells_stop_the_bisection_early(monkeypatch):
    """Power of the settled-cell check: with it the bisection evaluates the cells' shares fewer times."""
    rng = np.random.default_rng(5)
    codes, target = _unsorted_cells(rng)
    variance = rng.lognormal(0.0, 3.0, len(codes))
    totals = np.bincount(codes, weights=np.abs(target), minlength=40)
    evaluations = {}
    never = wage_shares.SHARE_STEPS + 1
    for settle_every in (wage_shares.SETTLE_EVERY, never):
        monkeypatch.setattr(wage_shares, "SETTLE_EVERY", settle_every)
        calls = []
        monkeypatch.setattr(wage_shares, "_shifted",
                            lambda *a, shifted=wage_shares._shifted: calls.append(1) or shifted(*a))
        wage_shares.share_cells(totals, codes, target, variance)
        monkeypatch.undo()
        evaluations[settle_every] = len(calls)
    assert evaluations[wage_shares.SETTLE_EVERY] < 0.6 * evaluations[never], evaluations  # 48 against 100


@pytest.mark.parametrize("settle_every", [1, wage_shares.SETTLE_EVERY])
def test_shares_near_the_largest_floats_have_the_bits_of_the_plain_bisection(settle_every, monkeypatch):
    """Brackets near 1e308, where the bisection's middle overflows: such a cell is never taken as
    settled, so it ends as the plain bisection ends (the case a review found)."""
    monkeypatch.setattr(wage_shares, "SETTLE_EVERY", settle_every)
    codes = np.array([2, 1, 1, 3])
    target = np.array([-6.947089732868628e307, -1.0430136638219817e308, -3.100575703030018e307,
                       -1.3306947352681913e308])
    variance = np.array([0.6631566609383533, 0.8753128749480874, 0.8319210047814558, 0.544837391222531])
    totals = np.array([3.587097636934566e306, 3.584900099249124e307, 5.851400405651813e307, 5.408733174396423e307])
    with np.errstate(over="ignore", invalid="ignore"):
        values, free = wage_shares.share_cells(totals, codes, target, variance)
        expected, expected_free = _bincount_shares(totals, codes, target, variance)
    assert values.tobytes() == expected.tobytes()
    np.testing.assert_array_equal(free, expected_free)
