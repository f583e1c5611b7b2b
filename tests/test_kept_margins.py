"""The margin structure kept beside a release: bit-identical to recomputing it, rebuilt from the
release alone, and never reused for a release that differs in any byte."""

import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import restate_pnc_noise

from gedp.postprocess.models import WageVariances
from gedp.postprocess.moe import variance_functions
from gedp.postprocess.tabulate import tabulate
from gedp.postprocess.variances import EstablishmentVariances
from gedp.release.format import MEASUREMENTS_FILE, PROTECTED_FILE
from gedp.release.margins import SKELETON_FILE, kept_path, kept_variances, read_structure
from gedp.release.reader import release_answers, release_wage_psi
from gedp.synth.io import read_microdata

TABULATIONS = [("county",), ("county", "naics4"), ("state", "sector"), ()]


def recomputed(folder, protected):
    """The variance functions built from the release's files, as before any structure was kept."""
    return variance_functions(release_answers(folder, protected), protected, release_wage_psi(folder))


def tabulation_codes(protected, by, keep):
    """Each establishment's cell of a tabulation over ``keep`` (-1 outside), and the number of cells."""
    codes = np.full(len(protected), -1, dtype=np.int64)
    if by:
        codes[keep] = protected[keep].groupby(list(by), sort=True, observed=True).ngroup().to_numpy()
    else:
        codes[keep] = 0
    return codes, int(codes.max()) + 1


def assert_same_variances(first, second, protected):
    """Every attribute's variances and slopes equal bit for bit on several tabulations and selections."""
    assert first.keys() == second.keys()
    rng = np.random.default_rng(3)
    for by in TABULATIONS:
        for keep in (np.ones(len(protected), dtype=bool), rng.random(len(protected)) < 0.6):
            codes, n_tab = tabulation_codes(protected, by, keep)
            for attribute in first:
                a, b = first[attribute](codes, n_tab), second[attribute](codes, n_tab)
                assert np.array_equal(a.variance, b.variance, equal_nan=True), (attribute, by)
                assert np.array_equal(a.slope, b.slope, equal_nan=True), (attribute, by)


@pytest.fixture
def release_copy(small_release, tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(small_release[0], folder)
    return folder, read_microdata(folder / PROTECTED_FILE, attributes=None)


def test_kept_structure_is_bit_identical_to_recomputing(release_copy):
    folder, protected = release_copy
    assert not kept_path(folder).exists()
    built = kept_variances(folder)  # the first request builds and keeps it
    kept = read_structure(kept_path(folder))
    assert kept is not None
    # every kind of structure is exercised: months with shared errors, wages from the wage fit
    assert isinstance(kept["m1emp"], EstablishmentVariances) and kept["m1emp"].loading is not None
    assert isinstance(kept["wage"], WageVariances) and kept["wage"].kept is not None  # with its factorizations
    # the kept functions, and the per-cell pieces every request applies them through
    recomputed_functions = recomputed(folder, protected)
    assert_same_variances(kept, {a: getattr(f, "exact", f) for a, f in recomputed_functions.items()}, protected)
    assert_same_variances(kept_variances(folder), recomputed_functions, protected)
    assert_same_variances(kept_variances(folder), built, protected)
    by_kept = tabulate(protected, ["county", "naics3"], moe=True, margins=kept_variances(folder))
    by_answers = tabulate(protected, ["county", "naics3"], moe=True, answers=release_answers(folder, protected),
                          wage_psi=release_wage_psi(folder))
    pd.testing.assert_frame_equal(by_kept, by_answers, check_exact=True)


def test_structure_is_rebuilt_from_a_copy_of_the_release_alone(release_copy, tmp_path, monkeypatch):
    folder, protected = release_copy
    kept_variances(folder)
    first = read_structure(kept_path(folder))
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "another-cache"))
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(folder, copy)  # the release's files only: no kept structure travels with it
    assert not kept_path(copy).exists()
    kept_variances(copy)
    assert kept_path(copy).exists()
    assert_same_variances(first, read_structure(kept_path(copy)), protected)


def test_an_edited_measurement_gets_its_own_structure(release_copy, unresolved):
    folder, protected = release_copy
    original = kept_variances(folder)
    original_path = kept_path(folder)
    part = next((folder / MEASUREMENTS_FILE).glob("*.parquet"))
    measurements = pd.read_parquet(part)
    # one establishment's noisy month-1 employment: the smoothed months' variances follow it
    row = np.flatnonzero((measurements["query"] == "identity").to_numpy() & (measurements["attribute"] == "m1emp"))[0]
    # moved consistently (its estimate and variance those of its released value: a reader checks them)
    from gedp.measure.neighbors import make_psi
    from gedp.release.reader import read_manifest

    psi = make_psi(**read_manifest(folder)["psi"])
    # (by 100 on the sqrt scale: the state's total stays within what the answers' check allows)
    released, sd = measurements.loc[row, "released"] + 100.0, measurements.loc[row, "sd"]
    estimate = float(psi.unbiased_estimate(np.array([released]), sd)[0])
    measurements.loc[row, ["released", "estimate"]] = [released, estimate]
    measurements.loc[row, "variance"] = float(psi.releasable_variance(np.array([estimate]), sd)[0])
    measurements.to_parquet(part, index=False)
    restate_pnc_noise(folder)  # the answers' pnc noise as under the moved answer's bound
    assert kept_path(folder) != original_path
    edited = kept_variances(folder)
    assert_same_variances(edited, recomputed(folder, protected), protected)
    codes, n_tab = tabulation_codes(protected, ("county",), np.ones(len(protected), dtype=bool))
    assert not np.array_equal(edited["m1emp"](codes, n_tab).variance, original["m1emp"](codes, n_tab).variance)


def test_an_unreadable_kept_structure_is_rebuilt(release_copy):
    folder, protected = release_copy
    path = kept_path(folder)
    path.mkdir(parents=True)
    (path / SKELETON_FILE).write_text("not a skeleton")
    assert read_structure(path) is None
    assert_same_variances(kept_variances(folder), recomputed(folder, protected), protected)
    assert read_structure(path) is not None


def test_the_structure_is_the_same_whatever_the_blas_thread_count(small_release, tmp_path):
    """A structure built by a process whose BLAS runs on 2 threads had other last bits than one built on
    1 (main: the wage pieces and, on 3,000 establishments, the margins' CSV differed), so first and
    further requests could differ in bytes across machines. It is built on one BLAS thread: every
    file of the structure, and the request's bytes, are the same under OPENBLAS_NUM_THREADS=1 and 2."""
    import hashlib
    import os
    import subprocess
    import sys

    outputs, files = [], []
    for threads in ("1", "2"):
        cache = tmp_path / f"cache-{threads}"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "GEDP_CACHE_DIR": str(cache), "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        outputs.append(subprocess.run([sys.executable, "-m", "gedp", "tabulate", str(small_release[0]), "--by",
                                       "county,naics4", "--moe"], env=env, capture_output=True, check=True).stdout)
        (structure,) = (cache / "margins").glob("[0-9a-f]*")
        files.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in structure.iterdir()})
    assert files[0] == files[1] and len(files[0]) > 10
    assert outputs[0] == outputs[1]
