"""Margins of error from per-cell pieces (postprocess.cellmargins): against dense covariances, against
the per-establishment computation to the last bits, and answered without the numerical stack."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from test_moe import dense_variances
from test_postprocess import nested_instance
from test_wages import _dense_variances as dense_wage_variances

from gedp.measure.queries import group_establishments
from gedp.postprocess import wage_margins
from gedp.postprocess.cellmargins import IndexedVariances, LeastSquaresCells, WageCells, finest_cells, pieces_of
from gedp.postprocess.models import WageVariances
from gedp.postprocess.variances import establishment_variances
from gedp.postprocess.wls import LinearSystem

TABULATIONS = [("county",), ("naics",), ("county", "naics"), ("own",), ("county", "own"), ()]


def instance():
    """A nested instance whose public data has an ownership column: finest cells (county x naics x own)
    finer than the measured cells (county x naics), and tabulations by own that split measured cells."""
    system, cells, public = nested_instance(3, n=120)
    public = public.assign(own=np.random.default_rng(8).choice(["1", "5"], len(public)))
    return system, cells, public


def tab_codes(public, by):
    """Each establishment's cell of a tabulation by ``by``, and the number of cells."""
    grouping = group_establishments(public, by)
    return grouping.codes, grouping.n_groups


def cell_tab(codes, tab):
    """Each finest cell's tabulation cell (the tabulation is a union of finest cells)."""
    out = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    out[codes] = tab
    assert np.array_equal(out[codes], tab)
    return out


def test_least_squares_pieces_give_the_dense_covariance():
    system, cells, public = instance()
    finest = finest_cells(public)
    pieces = pieces_of(establishment_variances(system, np.arange(120), cells), finest.codes, finest.n_groups)
    assert isinstance(pieces, LeastSquaresCells) and finest.n_groups > cells.max() + 1
    for by in TABULATIONS:
        tab, n_tab = tab_codes(public, by)
        variance, slope = pieces.variances(cell_tab(finest.codes, tab), n_tab)
        np.testing.assert_allclose(variance, dense_variances(system, tab, n_tab), rtol=1e-9)
        assert np.all(slope == 0)


def test_shared_errors_and_slopes_from_pieces_are_the_dense_covariances():
    """Identity answers only (rho = 1): Var(T) = 1_T' Sigma 1_T with Sigma = diag(v) + the errors shared
    within pattern cells (a_i a_j), and the slope sum v_j s_j / sum v_j over T's establishments."""
    system, cells, public = instance()
    identity_only = LinearSystem(system.matrix[:120], system.b[:120], system.v[:120])
    rng = np.random.default_rng(6)
    loading, slopes = rng.uniform(0, 3, 120), rng.uniform(0, 2, 120)
    pattern = group_establishments(public, ("county", "naics")).codes
    shared = np.outer(loading, loading) * (pattern[:, None] == pattern[None, :])
    covariance = np.diag(system.v[:120]) + shared - np.diag(np.diag(shared))
    finest = finest_cells(public)
    structure = establishment_variances(identity_only, np.arange(120), cells, variance_slopes=slopes,
                                        pattern_loadings=loading, pattern_cells=pattern)
    pieces = pieces_of(structure, finest.codes, finest.n_groups)
    assert isinstance(pieces, LeastSquaresCells)
    for by in TABULATIONS:
        tab, n_tab = tab_codes(public, by)
        variance, slope = pieces.variances(cell_tab(finest.codes, tab), n_tab)
        dense = np.array([covariance[np.ix_(tab == k, tab == k)].sum() for k in range(n_tab)])
        np.testing.assert_allclose(variance, dense, rtol=1e-12)
        v = system.v[:120]
        np.testing.assert_allclose(slope, np.bincount(tab, v * slopes) / np.bincount(tab, v), rtol=1e-12)


@pytest.fixture(scope="module")
def wage_fit(fitted_state, baseline_wage_fit):
    """A baseline release of the small state (seed 5), its protected microdata and its wage fit
    (conftest: made once for the session)."""
    return fitted_state[1], baseline_wage_fit


def test_wage_pieces_give_the_dense_covariance(wage_fit):
    protected, fit = wage_fit
    finest = finest_cells(protected)
    exact = WageVariances(fit, wage_margins.wage_factorizations(fit))
    pieces = pieces_of(exact, finest.codes, finest.n_groups)
    assert isinstance(pieces, WageCells)
    for by in [("county",), ("county", "naics4"), ("naics3",), ("own", "sector"), ()]:
        tab, n_tab = tab_codes(protected, by)
        variance, _ = pieces.variances(cell_tab(finest.codes, tab), n_tab)
        np.testing.assert_allclose(variance, dense_wage_variances(fit, tab, n_tab), rtol=1e-7)
        # the per-establishment computation, to the last bits
        np.testing.assert_allclose(variance, exact(tab, n_tab).variance, rtol=1e-12)


def test_only_tabulations_of_finest_cells_are_answered_from_pieces():
    """Tabulations that split a finest cell, or entries with coefficients, go to the per-establishment
    computation (bit for bit); the others agree with it to the last bits."""
    system, cells, public = instance()
    exact = establishment_variances(system, np.arange(120), cells)
    finest = finest_cells(public)
    indexed = IndexedVariances(pieces_of(exact, finest.codes, finest.n_groups), finest.codes, exact)
    split = np.random.default_rng(2).integers(-1, 4, 120)
    spread = np.zeros(finest.n_groups, dtype=np.int64)
    spread[finest.codes] = split
    assert not np.array_equal(spread[finest.codes], split)  # it splits a finest cell
    for codes, n_tab in [(split, 4), (np.arange(120), 120)]:
        np.testing.assert_array_equal(indexed(codes, n_tab).variance, exact(codes, n_tab).variance)
    entries = {"establishments": np.arange(120), "coefficients": np.full(120, 0.5)}
    tab, n_tab = tab_codes(public, ("county",))
    np.testing.assert_array_equal(indexed(tab, n_tab, **entries).variance, exact(tab, n_tab, **entries).variance)
    np.testing.assert_allclose(indexed(tab, n_tab).variance, exact(tab, n_tab).variance, rtol=1e-12)


def test_a_further_request_imports_no_solver_plots_or_scheduler(small_release, tmp_path, margins_cache):
    """A further tabulation with margins reads the kept pieces: none of scipy, cvxpy, matplotlib or dask."""
    from gedp.release.margins import kept_tabulation, kept_variances

    kept_variances(small_release[0])
    code = (f"from gedp.release.margins import kept_tabulation\n"
            f"assert kept_tabulation({str(small_release[0])!r}, 'county,naics4', moe=True) is not None\n"
            f"import sys\nprint(' '.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not {m.split(".")[0] for m in out} & {"scipy", "cvxpy", "matplotlib", "dask"}
    assert "gedp.postprocess.cellmargins" in out  # power: the request did run, with pieces
    keys, table = kept_tabulation(small_release[0], "county,naics4", moe=True)
    assert isinstance(table, pd.DataFrame) and np.isfinite(table["wage_moe"]).all()


def test_an_attribute_without_pieces_leaves_the_others_answered_from_theirs(small_release, tmp_path, monkeypatch):
    """Wages without pieces (as for a factor above MAX_FACTOR_ENTRIES): the first request (reading the
    release) and a further one (from the kept index) still give the same bytes, the months' margins
    from their pieces in both."""
    import shutil

    from typer.testing import CliRunner

    from gedp.cli import app
    from gedp.postprocess import cellmargins
    from gedp.release.margins import kept_path, kept_tabulation, read_pieces

    release = tmp_path / "release"
    shutil.copytree(small_release[0], release)
    pieces_of_all = cellmargins.pieces_of
    monkeypatch.setattr(cellmargins, "pieces_of", lambda variance, codes, n: None if isinstance(
        variance, WageVariances) else pieces_of_all(variance, codes, n))
    request = ["tabulate", str(release), "--by", "county,naics3", "--moe"]
    outputs = []
    for name in ("first", "second"):
        result = CliRunner().invoke(app, [*request, "--out", str(tmp_path / f"{name}.csv")])
        assert result.exit_code == 0, result.output
        outputs.append((tmp_path / f"{name}.csv").read_bytes())
    kept = read_pieces(kept_path(release))
    assert kept is not None and kept["wage"] is None and isinstance(kept["m1emp"], LeastSquaresCells)
    assert kept_tabulation(release, "county,naics3", moe=True) is not None  # the second came from the index
    assert outputs[0] == outputs[1]
