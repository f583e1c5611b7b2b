"""Security review of 2026-11-23: what a release folder alone reproduces, and what error messages say."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import gedp
from gedp.errors import InputError
from gedp.evaluation.baselines.erer import job_marginal, worker_codes
from gedp.measure.neighbors import make_psi
from gedp.postprocess.models import PostprocessOptions
from gedp.postprocess.protect import protect_microdata
from gedp.postprocess.wages import fit_wages
from gedp.release.reader import read_answers, read_manifest, read_release, release_answers, release_wage_psi
from gedp.synth.schema import public_columns


@pytest.fixture(scope="module")
def releases(small_state):
    """The same noise (seed 5) released with and without controlled rounding."""
    return (gedp.protect(small_state, seed=5, not_for_publication=True),
            gedp.protect(small_state, gedp.load(integer=True), seed=5, not_for_publication=True))


def test_postprocessing_is_reproduced_bit_for_bit_from_the_release_files(releases):
    """Every protected value (employment with the months smoothed across the quarter, wages informed by
    it) comes back bit for bit from measurements.parquet, the public columns and the manifest: nothing
    else went in. Power: the pooled variance mode gives other employment."""
    folder = releases[0].folder
    manifest = read_manifest(folder)
    assert manifest["variance_mode"] == "smoothed"
    protected, answers = read_release(folder)
    public = protected[public_columns(protected)]
    psi = make_psi(**manifest["psi"])
    again, results = protect_microdata(answers, public, PostprocessOptions(variance_mode="smoothed", psi=psi))
    assert results["wage"].solver == "structured+employment"
    for attribute in ("m1emp", "m2emp", "m3emp", "wage"):
        np.testing.assert_array_equal(again[attribute].to_numpy(), protected[attribute].to_numpy())
    other, _ = protect_microdata(answers, public, PostprocessOptions(variance_mode="pooled", psi=psi))
    assert not np.array_equal(other["m1emp"].to_numpy(), protected["m1emp"].to_numpy())
    # the answers tabulate --moe weighs are those very smoothed months (their sectors' patterns from the
    # release's public columns), and what it refits is that very wage fit
    weighed = release_answers(folder)
    turned, _ = protect_microdata(weighed, public, PostprocessOptions(variance_mode="estimated", psi=psi))
    for attribute in ("m1emp", "m2emp", "m3emp"):
        np.testing.assert_array_equal(turned[attribute].to_numpy(), protected[attribute].to_numpy())
    fit = fit_wages(weighed, protected, release_wage_psi(folder))
    np.testing.assert_array_equal(fit.values, protected["wage"].to_numpy())


def test_integer_release_margins_refit_the_wages_protect_fitted(releases):
    """An integer release publishes rounded employment. The wage fit that `gedp tabulate --moe`
    recomputes from the release's files must be the fit protect rounded: every county x NAICS-5 cell
    of released wages (a QCEW level-77 cell) within 1 of that fit's cell total (README: controlled
    rounding moves no QCEW cell by a whole unit). On main protect fits wages on the unrounded
    employment, so the refit is another fit: cells off by thousands of dollars."""
    folder = releases[1].folder
    protected, _ = read_release(folder)
    assert protected["m1emp"].dtype == np.int64
    fit = fit_wages(release_answers(folder), protected, release_wage_psi(folder))
    released = np.bincount(fit.cell_codes, weights=protected["wage"].to_numpy(dtype=float), minlength=len(fit.totals))
    assert np.max(np.abs(released - fit.totals)) < 1.0


def test_integer_release_rounds_what_it_fitted_and_keeps_the_noise(releases):
    """The two releases share the noise and the employment (rounded), and the rounding report still
    covers every attribute, in the plan's order."""
    plain, whole = (read_release(r.folder)[0] for r in releases)
    for month in ("m1emp", "m2emp", "m3emp"):
        assert np.all(np.abs(plain[month] - whole[month]) < 1)
    answers = [read_answers(r.folder) for r in releases]
    for attribute in answers[0]:
        for a, b in zip(answers[0][attribute], answers[1][attribute]):
            np.testing.assert_array_equal(a.released, b.released)
    report = read_manifest(releases[1].folder)["per_state"]
    for entry in report.values():
        assert list(entry["rounding"]) == ["m1emp", "m2emp", "m3emp", "wage"]


ESTABS = pd.DataFrame({"estab_id": ["A", "B"], "state": ["44", "44"], "county": ["001", "001"],
                       "m1emp": [3.0, 2.0]})


def _jobs(education: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"estab_id": ["A", "A", "A", "B", "B"], "sex": ["1"] * 5, "agegrp": ["A04"] * 5,
                         "education": education, "race": ["A1"] * 5, "ethnicity": ["A1"] * 5})


@pytest.mark.parametrize("bad", [1, 2, 4])
def test_job_errors_do_not_count_jobs(bad):
    """Counts of jobs by worker category are what ER-EE privacy protects: the message names the
    column, the rule and the first row, and is the same whatever the number of offending jobs."""
    education = ["E9"] * bad + ["E2"] * (5 - bad)
    with pytest.raises(InputError) as caught:
        worker_codes(_jobs(education), "education")
    assert str(caught.value) == "column 'education': codes must be one of E1, E2, E3, E4, E5; first at row 1"
    jobs = _jobs(["E2"] * 5)
    jobs.loc[: bad - 1, "estab_id"] = "Z"
    with pytest.raises(InputError) as caught:
        job_marginal(ESTABS, jobs, ["state", "county"])
    assert str(caught.value) == ("column 'estab_id': values must be an estab_id of the establishment table; "
                                 "first at row 1")
