"""benchmarks/wage_noise_sandwich.py: the exact sandwich's term against a dense inverse."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp


@pytest.fixture(scope="module")
def sandwich(benchmark_script):
    return benchmark_script("wage_noise_sandwich")


def test_sandwich_term_is_the_dense_forms(sandwich, monkeypatch):
    """12 cells in 5 plan cells, 7 groups of plan cells (3 of one plan cell), one cell fixed: per free
    cell c, sum_j eps_j (K^-1)_jc^2 with K = diag(1 / v) + A' C' diag(1 / w) C A over the free cells,
    inverted densely; 0 for the fixed cell. Chunks of 5 columns, so that chunking is exercised."""
    rng = np.random.default_rng(3)
    n_cells, n_plan = 12, 5
    coarse = np.r_[np.arange(n_plan), rng.integers(0, n_plan, n_cells - n_plan)]
    groups = np.zeros((7, n_plan))
    groups[np.arange(3), [0, 2, 4]] = 1  # single plan cells
    groups[3:] = rng.random((4, n_plan)) < 0.5
    groups[3:, 1] = 1  # every multi-cell group holds plan cell 1: one connected block
    w = rng.uniform(0.5, 3.0, 7)
    v = rng.uniform(0.2, 2.0, n_cells)
    fixed = np.zeros(n_cells, bool)
    fixed[7] = True
    eps = rng.normal(0, 0.3, n_cells)
    fit = SimpleNamespace(fixed_cells=fixed, cell_variance=v, coarse_groups=sp.csr_matrix(groups),
                          group_variance=w, coarse_cells=coarse)
    monkeypatch.setattr(sandwich, "CHUNK", 5)
    got = sandwich.sandwich_terms(fit, eps)

    a = np.zeros((n_plan, n_cells))
    a[coarse, np.arange(n_cells)] = 1
    free = ~fixed
    cells_groups = groups @ a[:, free]
    k = np.diag(1 / v[free]) + cells_groups.T @ np.diag(1 / w) @ cells_groups
    k_inv = np.linalg.inv(k)
    expected = np.zeros(n_cells)
    expected[free] = eps[free] @ k_inv**2
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
    assert got[7] == 0.0
