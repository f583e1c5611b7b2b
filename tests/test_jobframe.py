"""gedp on a job frame: category attributes, the plan's families, consistent protected job counts,
job tabulations and their margins of error (measure.jobframe, postprocess.jobframe)."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.config import load_config, parse_config
from gedp.errors import ConfigError, GedpError
from gedp.measure.jobframe import category_attribute, category_counts, expand_plan, family_categories, home_domain
from gedp.postprocess.jobframe import cell_sums, margin_targets, rake_counts, raking_seed, round_counts
from gedp.postprocess.wls import build_system, system_structure
from gedp.release.reader import release_answers
from gedp.synth.jobs import synthesize_jobs, validate_jobs
from gedp.synth.profiles import generate_profile, load_profile

runner = CliRunner()


@pytest.fixture(scope="module")
def state():
    return generate_profile(load_profile("small"), n_establishments=600, rng=np.random.default_rng(11))


@pytest.fixture(scope="module")
def jobs(state):
    return synthesize_jobs(state, rng=np.random.default_rng(12))


@pytest.fixture(scope="module")
def release(state, jobs):
    return gedp.protect(state.drop(columns=["m2emp", "m3emp", "wage"]), "jobs", input=gedp.Input(jobs=jobs), seed=3,
                        not_for_publication=True)


@pytest.fixture(scope="module")
def integer_release(state, jobs):
    """The same state and noise seed released with whole numbers (three tests read it or write copies of it)."""
    return gedp.protect(state.drop(columns=["m2emp", "m3emp", "wage"]), gedp.load("jobs", integer=True),
                        input=gedp.Input(jobs=jobs), seed=3, not_for_publication=True)


# --- the projection onto protected employment ------------------------------------------------------
def test_raking_meets_every_margin_and_is_the_kl_projection_of_its_seed():
    """Against cvxpy's exponential-cone solve of min KL(y || seed) subject to the row totals and two
    crossed margins (county-like and sector-like groups, neither nested in the other)."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(0)
    county = np.array([0, 0, 0, 1, 1, 1, 1])
    sector = np.array([0, 1, 1, 0, 1, 0, 1])
    seed = rng.random((7, 3)) + 0.05
    truth = rng.random((7, 3)) * 4  # margins of one table, so a solution exists
    totals = truth.sum(axis=1)
    margins = [(county, cell_sums(truth, county)), (sector, cell_sums(truth, sector))]
    y = rake_counts(seed, totals, margins)
    np.testing.assert_allclose(y.sum(axis=1), totals, rtol=1e-12)
    for codes, targets in margins:
        np.testing.assert_allclose(cell_sums(y, codes), targets, atol=1e-8)
    z = cp.Variable((7, 3), nonneg=True)
    constraints = [cp.sum(z, axis=1) == totals]
    constraints += [np.eye(2)[codes].T @ z == targets for codes, targets in margins]
    problem = cp.Problem(cp.Minimize(cp.sum(cp.kl_div(z, seed))), constraints)
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, max_iter=500)
    np.testing.assert_allclose(y, z.value, atol=1e-6)
    assert not np.allclose(y, seed * (totals / seed.sum(axis=1))[:, None], atol=1e-3)  # power: the margins move it


def test_a_row_the_margins_empty_keeps_its_total_in_its_seeds_mix():
    """A row whose seed lies only in a category its group's target gives 0 (a genuine release met it: the
    unknown county's establishments with home counties, about 1 release in 10 of a small job state, whose
    frame then failed the readers' adds-up check) keeps its total, split as its seed; the other rows are
    raked as before (the same as without the emptied row's group mate)."""
    seed = np.array([[2.0, 0.0], [1.0, 1.0], [1.0, 3.0]])
    totals = np.array([3.0, 2.0, 4.0])
    margins = [(np.array([0, 0, 1]), np.array([[0.0, 5.0], [1.0, 3.0]]))]
    y = rake_counts(seed, totals, margins)
    np.testing.assert_allclose(y.sum(axis=1), totals, rtol=1e-12)
    np.testing.assert_allclose(y[0], [3.0, 0.0], rtol=1e-12)  # the seed's mix at its total
    np.testing.assert_allclose(y[1:], rake_counts(seed[1:], totals[1:], [(np.array([0, 1]), np.array([[0.0, 2.0],
                                                                                                     [1.0, 3.0]]))]))


def test_margin_targets_are_the_clipped_group_totals_raked_to_employment_and_the_state_mix():
    """Cells 0-1 in group 0, 2 in group 1, 3 in group 2; group 2's totals are all negative, so it
    takes the state mix. Checked against the 2-way fit it must be: rows = employment, columns =
    state mix x employment, and the clipped table's cross-ratios kept (the KL projection's form)."""
    cell_totals = np.array([[4.0, -1.0, 2.0], [2.0, 3.0, 0.0], [1.0, 1.0, 6.0], [-2.0, -1.0, -3.0]])
    cell_groups = np.array([0, 0, 1, 2])
    employment = np.array([9.0, 7.0, 4.0])
    state_mix = np.array([0.5, 0.2, 0.3])
    targets = margin_targets(cell_totals, cell_groups, employment, state_mix)
    np.testing.assert_allclose(targets.sum(axis=1), employment, rtol=1e-12)
    np.testing.assert_allclose(targets.sum(axis=0), state_mix * employment.sum(), rtol=1e-9)
    clipped = np.array([[6.0, 2.0, 2.0], [1.0, 1.0, 6.0], [0.5, 0.2, 0.3]])
    ratio = np.log(targets) - np.log(clipped)  # = row effect + column effect for a raked table
    interaction = ratio - ratio.mean(axis=1, keepdims=True) - ratio.mean(axis=0) + ratio.mean()
    np.testing.assert_allclose(interaction, 0.0, atol=1e-8)
    w = raking_seed(np.array([[2.0, 0.0, 6.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), np.array([0, 0, 1]))
    np.testing.assert_allclose(w[1], [1.0, 0.0, 3.0])  # an all-zero row starts from its cell's mix
    np.testing.assert_allclose(w[2], [1.0, 1.0, 1.0])  # a cell with no estimated jobs: even


def test_rounding_keeps_each_rows_whole_total_with_the_largest_fractions_up():
    rng = np.random.default_rng(1)
    totals = rng.integers(0, 30, 400).astype(float)
    counts = rng.dirichlet(np.ones(5), 400) * totals[:, None]
    rounded = round_counts(counts, totals)
    np.testing.assert_array_equal(rounded.sum(axis=1), totals)
    assert np.all((rounded == np.floor(counts)) | (rounded == np.ceil(counts)))
    for row, whole in zip(counts, rounded):  # independent: a loop over each row's fractions
        up = int(round(row.sum() - np.floor(row).sum()))
        chosen = sorted(range(len(row)), key=lambda c: (-(row[c] - math.floor(row[c])), c))[:up]
        expected = np.floor(row)
        expected[chosen] += 1
        np.testing.assert_array_equal(whole, expected)


# --- categories and the plan -------------------------------------------------------------------------
def test_category_counts_are_the_crosstab_of_the_job_table(state, jobs):
    valid = validate_jobs(jobs, state)
    for columns in (("sex", "education"), ("home_county",), ("agegrp",)):
        categories = family_categories(columns, state)
        counts = category_counts(valid, len(state), columns, categories)
        frame = valid.astype({c: str for c in columns})
        crosstab = frame.groupby(["estab_id", *columns], observed=True).size()
        for (estab, *codes), n in crosstab.sample(200, random_state=0, replace=True).items():
            row = state.index[state["estab_id"] == estab][0]
            assert counts[row, categories.index(tuple(codes))] == n
        np.testing.assert_array_equal(counts.sum(axis=1), state["m1emp"].to_numpy())


def test_home_counties_outside_the_state_count_as_other(state, jobs):
    valid = validate_jobs(jobs.assign(home_county=jobs["home_county"].astype(str).where(
        np.arange(len(jobs)) % 7 > 0, "36061")), state)
    categories = family_categories(("home_county",), state)
    assert categories[-1] == ("other",) and set(home_domain(state)) == {c[0] for c in categories}
    counts = category_counts(valid, len(state), ("home_county",), categories)
    assert counts[:, -1].sum() == (np.arange(len(jobs)) % 7 == 0).sum()


def test_a_family_spends_its_mu_whatever_its_number_of_categories():
    config = load_config("jobs")
    for k in (1, 10, 23):
        attributes = [category_attribute("home", (f"{i:05d}",)) for i in range(k)]
        worker = [category_attribute("worker", c) for c in [("1", "E1"), ("2", "E1")]]
        plan = expand_plan(config.plan, {"home": attributes, "worker": worker})
        assert math.isclose(plan.budget().total, config.plan.budget().total, rel_tol=1e-12)
        identity = plan.identity_plan.mu
        assert math.isclose(identity[attributes[0]], 0.7 / math.sqrt(k), rel_tol=1e-15)
        assert plan.gammas[attributes[-1]] == 1.0 and "home" not in plan.gammas


@pytest.mark.parametrize("change, message", [
    (lambda raw: raw["jobs"]["families"].update(worker=["sex", "colour"]), "'colour' is not a worker column"),
    (lambda raw: raw["jobs"]["families"].update(m1emp=["sex"]), "must be a plain name"),
    (lambda raw: raw["attributes"].update(m1emp=None) or raw["attributes"].pop("m1emp")
     or raw["attributes"].update(wage={"gamma": 50}), "add up to m1emp"),
    (lambda raw: raw["queries"][0]["mu"].pop("home"), "needs the identity query"),
    (lambda raw: raw["jobs"].pop("gamma"), "missing key 'gamma'"),
])
def test_bad_job_sections_are_refused(change, message):
    import yaml

    from gedp import configs

    raw = yaml.safe_load(configs.path("jobs").read_text())
    raw["queries"] = [q | {"mu": {a: m for a, m in q["mu"].items() if a in ("m1emp", "worker", "home", "wage")}}
                      for q in raw["queries"]]
    change(raw)
    if "wage" in raw["attributes"]:
        for q in raw["queries"]:
            q["mu"] = {("wage" if a == "m1emp" else a): m for a, m in q["mu"].items()}
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


# --- the release -------------------------------------------------------------------------------------
def test_every_family_adds_up_to_the_protected_employment(release):
    protected, jobs = release.microdata, release.jobs
    assert jobs["jobs"].min() > 0  # only positive counts are listed
    for family in ("worker", "home"):
        sums = jobs[jobs["family"] == family].groupby("estab_id")["jobs"].sum()
        employment = protected.set_index(protected["estab_id"].astype(str))["m1emp"]
        np.testing.assert_allclose(sums.reindex(employment.index, fill_value=0.0), employment, rtol=1e-9, atol=1e-9)
    manifest = release.manifest
    assert manifest["jobs"]["families"]["worker"] == {"columns": ["sex", "education"], "categories": {"44": 10}}
    assert math.isclose(manifest["mu_total"], load_config("jobs").plan.budget().total, rel_tol=1e-12)


def test_job_and_establishment_tabulations_of_one_release_agree(release):
    by_county = release.tabulate("county")
    for by in ("county,sex,education", "home_county,county"):
        jobs = release.tabulate(by)
        summed = jobs.groupby(["state", "county"])["jobs"].sum().to_numpy()
        np.testing.assert_allclose(summed, by_county["m1emp"].to_numpy(), rtol=1e-9)


def test_integer_job_frames_are_whole_and_add_up(integer_release):
    whole = integer_release
    frame = whole.jobs
    assert np.all(frame["jobs"] == np.round(frame["jobs"]))
    sums = frame[frame["family"] == "worker"].groupby("estab_id")["jobs"].sum()
    employment = whole.microdata.set_index(whole.microdata["estab_id"].astype(str))["m1emp"]
    np.testing.assert_array_equal(sums.reindex(employment.index, fill_value=0), employment)


# --- a plan whose cells no raking margin holds: the cells' own totals ----------------------------------
@pytest.fixture(scope="module")
def supersector_plan():
    """The jobs plan measuring only the worker family by identity, state and state x supersector: its
    cells (state x supersector) lie in no county and (supersector 1021: sectors 22, 42, 44-45, 48-49)
    in no sector, so protect_family rakes to the cells' own totals."""
    raw = json.loads(json.dumps(load_config("jobs").raw))
    raw["jobs"]["families"] = {"worker": ["sex", "education"]}
    raw["queries"] = [{"by": by, "mu": {"m1emp": mu, "worker": mu}}
                      for by, mu in (("identity", 0.7), (["state"], 0.4), (["state", "supersector"], 0.9))]
    return raw


def dense_unbounded_cell_totals(answers, public, cells):
    """Per cell (rows) and category (columns): the cells' sums of each category's weighted least
    squares solution without bounds, from a dense n x n solve of the normal equations (numpy)."""
    ids = pd.Index(public["estab_id"].astype(str))
    totals = []
    for attribute in answers:
        rows, b, v = [], [], []
        for answer in answers[attribute]:
            if answer.query.is_identity:
                position = ids.get_indexer(answer.keys["estab_id"].astype(str))
                assert (position >= 0).all() and len(np.unique(position)) == len(public)  # every establishment
                rows.append(np.eye(len(public))[position])
            else:
                keys = answer.keys.astype(str).assign(row=np.arange(len(answer.keys)))
                member = public[list(answer.query.by)].astype(str).merge(keys, how="left")["row"].to_numpy()
                rows.append((member[None, :] == np.arange(len(keys))[:, None]).astype(float))
            b.append(answer.estimate)
            v.append(answer.variance)
        a, b, w = np.vstack(rows), np.concatenate(b), 1.0 / np.concatenate(v)
        x = np.linalg.solve(a.T @ (w[:, None] * a), a.T @ (w * b))
        totals.append(np.bincount(cells, weights=x))
    return np.column_stack(totals)


def two_way_fit(table, row_totals, column_totals, sweeps=20_000):
    """The table with these row and column totals nearest to ``table`` in KL divergence: rows and
    columns scaled in turn until both hold to 1e-13 (relative to the grand total)."""
    fit = table.copy()
    for _ in range(sweeps):
        fit *= (row_totals / fit.sum(axis=1))[:, None]
        fit *= np.divide(column_totals, fit.sum(axis=0), out=np.zeros_like(column_totals),
                         where=fit.sum(axis=0) > 0)
        if np.abs(fit.sum(axis=1) - row_totals).max() <= 1e-13 * row_totals.sum():
            return fit
    raise AssertionError("the two-way fit did not converge")


def fallback_targets(cell_totals, cell_employment):
    """SPEC's raking targets for cells that no margin holds, recomputed: each cell's unbounded totals,
    clipped at 0 (a cell with none positive takes the state's mix, the clipped state totals'
    shares), fitted to the cells' protected employment and the state's mix of it."""
    state_mix = np.maximum(cell_totals.sum(axis=0), 0.0)
    state_mix /= state_mix.sum()
    table = np.maximum(cell_totals, 0.0)
    table[table.sum(axis=1) <= 0] = state_mix
    return two_way_fit(table, cell_employment, state_mix * cell_employment.sum())


def released_cell_counts(release, cells):
    """The released job frame's worker counts per establishment (release order) and per cell."""
    from gedp.postprocess.jobframe import family_attributes
    from gedp.release.reader import read_answers

    protected, frame = release.microdata, release.jobs
    categories = list(family_attributes("worker", read_answers(release.folder)).values())
    frame = frame[frame["family"] == "worker"]
    counts = np.zeros((len(protected), len(categories)))
    position = pd.Index(protected["estab_id"].astype(str)).get_indexer(frame["estab_id"].astype(str))
    category = pd.Index(categories).get_indexer(pd.MultiIndex.from_frame(frame[["sex", "education"]].astype(str)))
    np.add.at(counts, (position, category), frame["jobs"].to_numpy(dtype=float))
    return counts, np.column_stack([np.bincount(cells, weights=column) for column in counts.T])


def test_cells_no_margin_holds_are_raked_to_their_own_unbounded_totals(state, jobs, supersector_plan, monkeypatch):
    """The no-margin path of protect_family, against an independent computation: the plan's cells
    (state x supersector, which the test checks are nested in neither county nor sector) each get
    the category totals recomputed here from a dense unbounded least squares of the release's
    answers (``fallback_targets``); every establishment's counts are >= 0 and add up to its
    protected m1emp; job tabulations agree with the establishment tabulation. Power: targets from
    perturbed unbounded totals, and a release raked to county and sector margins as if they held the
    cells, both miss by far more than the tolerance."""
    from gedp.release.reader import read_answers

    micro = state.drop(columns=["m2emp", "m3emp", "wage"])
    release = gedp.protect(micro, supersector_plan, input=gedp.Input(jobs=jobs), seed=5, not_for_publication=True)
    protected = release.microdata
    cells = protected.groupby(["state", "supersector"], sort=True).ngroup().to_numpy()
    spans = protected.groupby(cells)[["county", "sector"]].nunique()
    assert (spans["county"] > 1).any() and (spans["sector"] > 1).any()  # the fallback's case
    employment = protected["m1emp"].to_numpy(dtype=float)
    counts, cell_counts = released_cell_counts(release, cells)
    assert release.jobs["jobs"].min() > 0 and counts.min() >= 0
    np.testing.assert_allclose(counts.sum(axis=1), employment, rtol=1e-9, atol=1e-9)
    answers = read_answers(release.folder)
    worker = {a: answers[a] for a in sorted(answers) if a.startswith("worker[")}
    assert len(worker) == 10
    cell_totals = dense_unbounded_cell_totals(worker, protected, cells)
    cell_employment = np.bincount(cells, weights=employment)
    targets = fallback_targets(cell_totals, cell_employment)
    tolerance = 1e-8 * cell_employment[:, None]
    assert np.all(np.abs(cell_counts - targets) <= tolerance)
    assert (cell_totals < 0).any()  # the clipping is exercised
    # power: perturbed unbounded totals give other targets
    rng = np.random.default_rng(0)
    perturbed = fallback_targets(cell_totals * (1 + 0.05 * rng.standard_normal(cell_totals.shape)), cell_employment)
    assert np.abs(cell_counts - perturbed).max() > 1e3 * tolerance.max()
    # job tabulations and the establishment tabulation of the release agree
    for by in (["supersector"], ["state", "county"]):
        summed = release.tabulate([*by, "sex"]).groupby(by)["jobs"].sum()
        establishments = release.tabulate(by).set_index(by)["m1emp"]
        assert len(summed) == len(establishments) > 1
        np.testing.assert_allclose(summed.to_numpy(), establishments.reindex(summed.index).to_numpy(), rtol=1e-9)
    # power: without the fallback (county and sector taken as if they held the cells) the cells miss
    import gedp.postprocess.jobframe as jobframe

    monkeypatch.setattr(jobframe, "_holds_cells", lambda codes, cell_codes: True)
    other = gedp.protect(micro, supersector_plan, input=gedp.Input(jobs=jobs), seed=5, not_for_publication=True)
    assert np.abs(released_cell_counts(other, cells)[1] - targets).max() > 1e3 * tolerance.max()


def test_job_margins_are_the_dense_covariance_of_the_linearized_projection(release):
    """jobs_moe against a dense computation: each category's (A'WA)^-1 and m1emp's, and the
    projection's linear map at the release built here from the released counts and weights."""
    table = release.tabulate("sector,sex", moe=True)
    answers = release_answers(release.folder)
    protected = release.microdata
    public = protected[[c for c in protected.columns if c != "m1emp"]]
    n = len(protected)
    ids = pd.Index(protected["estab_id"].astype(str))
    names = [category_attribute("worker", c) for c in family_categories(("sex", "education"), protected)]
    frame = release.jobs[release.jobs["family"] == "worker"]
    y = np.zeros((n, len(names)))
    y[ids.get_indexer(frame["estab_id"]), [names.index(f"worker[{s},{e}]") for s, e in
                                          zip(frame["sex"], frame["education"])]] = frame["jobs"]

    @functools.cache  # each attribute's (A'WA)^-1 once, for every cell sampled
    def covariance(attribute):
        system = build_system(answers[attribute], public, [a.variance for a in answers[attribute]])
        a = system.matrix.toarray()
        return np.linalg.inv(a.T @ (a / system.v[:, None]))

    cells = system_structure(answers[names[0]], public)[1]
    share = cell_sums(y, cells)
    share[share.sum(axis=1) == 0] = 1.0  # a cell without jobs: an even split
    rho = (share / share.sum(axis=1, keepdims=True))[cells]
    z = NormalDist().inv_cdf(0.975)
    for cell in table.sample(6, random_state=1).itertuples():
        inside = (protected["sector"].astype(str) == cell.sector).to_numpy()
        in_k = np.array([n.startswith(f"worker[{cell.sex},") for n in names])
        rho_k = rho[:, in_k].sum(axis=1)
        variance = (inside * rho_k) @ covariance("m1emp") @ (inside * rho_k)
        for k, name in enumerate(names):
            a = inside * (in_k[k] - rho_k)
            variance += a @ covariance(name) @ a
        assert math.isclose(cell.jobs_moe, z * math.sqrt(variance), rel_tol=1e-7)
        # power: without the employment's part the margin is smaller
        assert (inside * rho_k) @ covariance("m1emp") @ (inside * rho_k) > 1e-3 * variance


def test_held_job_answers_build_each_structure_once_and_give_the_bits_of_the_answers_alone(release, monkeypatch):
    """Tabulations from one ``JobAnswers`` (their variance structures kept) build each attribute's
    structure once, not once a tabulation, and a tabulation that reuses them equals, bit for bit,
    the same tabulated from the answers alone (which build them again: the count's power); answers
    held over other protected microdata (a copy) are refused."""
    import gedp.postprocess.variances as variances
    from gedp.postprocess.jobframe import JobAnswers, tabulate_jobs
    from gedp.postprocess.keys import by_columns
    from gedp.release.reader import release_families
    from gedp.tabulation.job_frame_tables import read_job_frame

    protected, answers = release.microdata, release_answers(release.folder)
    frame, families = read_job_frame(release.folder), release_families(release.folder)
    built, structure = [], variances.answers_structure
    monkeypatch.setattr(variances, "answers_structure",
                        lambda answers, public, *a, **k: built.append(1) or structure(answers, public, *a, **k))
    held = JobAnswers(protected, answers)
    tabulate_jobs(protected, frame, families, by_columns("sector,sex"), moe=True, answers=held)
    reused = tabulate_jobs(protected, frame, families, by_columns("county,education"), moe=True, answers=held)
    n_attributes = 1 + len([a for a in answers if a.startswith("worker[")])
    assert len(built) == n_attributes  # without the kept structures: one per attribute per tabulation
    alone = tabulate_jobs(protected, frame, families, by_columns("county,education"), moe=True, answers=answers)
    assert len(built) == 2 * n_attributes
    pd.testing.assert_frame_equal(reused, alone, check_exact=True)
    with pytest.raises(ValueError, match="other protected microdata"):
        tabulate_jobs(protected.copy(), frame, families, by_columns("sex"), moe=True, answers=held)


def test_tabulations_by_worker_columns_need_a_family_with_them(release, small_release):
    with pytest.raises(gedp.errors.InputError, match="no job family of this release has agegrp"):
        release.tabulate("county,agegrp")
    with pytest.raises(gedp.errors.InputError, match="has no job frame"):
        gedp.read_release(small_release[0]).tabulate("sex")


# --- command line and trust ----------------------------------------------------------------------------
def test_protect_with_jobs_end_to_end_and_its_errors(tmp_path, state, jobs):
    state.drop(columns=["m2emp", "m3emp", "wage"]).to_parquet(tmp_path / "s.parquet")
    jobs.to_parquet(tmp_path / "s.jobs.parquet")
    common = ["--seed", "1", "--not-for-publication"]
    result = runner.invoke(app, ["protect", str(tmp_path / "s.parquet"), "--jobs", str(tmp_path / "s.jobs.parquet"),
                                 "--config", "jobs", "--out", str(tmp_path / "rel"), *common])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["tabulate", str(tmp_path / "rel"), "--by", "county,sector,sex,education", "--moe"])
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0]
    assert header == "state,county,sector,sex,education,estabs,jobs,jobs_moe"
    # errors: one line, exit 2, nothing written, on either engine (each is refused before a cluster
    # starts); one message, from pipeline.check_job_table, names the mismatch
    bad = jobs.astype({"estab_id": str}).copy()
    bad.loc[5, "estab_id"] = "nope"
    bad.to_parquet(tmp_path / "bad.parquet")
    rule = ("job table was given: a job table (--jobs) goes with a config with job families (e.g. --config jobs), "
            "and such a config needs one")
    state.to_parquet(tmp_path / "full.parquet")  # every attribute baseline measures: only the job table is wrong
    cases = [("full.parquet", ["--jobs", str(tmp_path / "s.jobs.parquet"), "--config", "baseline"],
              f"error: config baseline has no job families and a {rule}"),
             ("s.parquet", ["--config", "jobs"],
              f"error: config jobs measures job families (worker, home) and no {rule}"),
             ("s.parquet", ["--jobs", str(tmp_path / "bad.parquet"), "--config", "jobs"],
              "error: column 'estab_id': values of the job table must be an estab_id of the input; first at row 6 "
              "(estab_id nope)")]
    for engine in ("local", "dask"):
        for data, extra, message in cases:
            out = tmp_path / "never"
            result = runner.invoke(app, ["protect", str(tmp_path / data), *extra, "--out", str(out), *common,
                                         "--engine", engine])
            assert result.exit_code == 2, result.output
            assert result.output.strip().splitlines() == [message], result.output
            assert not out.exists()
    assert str(len(jobs)) not in result.output  # no count of jobs in a message
    # refused before a lifetime ledger reserves anything (it would hold a pending release)
    ledger = tmp_path / "ledger.json"
    result = runner.invoke(app, ["protect", str(tmp_path / "s.parquet"), "--config", "jobs", "--out",
                                 str(tmp_path / "never"), "--ledger", str(ledger), "--lifetime-cap", "5"])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [cases[1][2]], result.output
    assert not ledger.exists() and not (tmp_path / "never").exists()



def test_a_job_release_of_two_states_has_margins_by_establishment_columns(tmp_path, state, jobs, monkeypatch):
    """Red team rt24 F7: the margins by establishment columns were built for every attribute, a family's
    categories too; a home county of one state (home[34001]) has that state's identity answers only, and
    `tabulate --by county --moe` of a two-state job release failed (answers of query identity do not match
    the groups of the public data). Its m1emp margins are now each state's as its own release gives them."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    one = state.drop(columns=["m2emp", "m3emp", "wage"])
    other = one.assign(state="34", estab_id="34" + one["estab_id"].str[2:])
    other_jobs = jobs.assign(estab_id="34" + jobs["estab_id"].str[2:],
                             home_county=jobs["home_county"].str.replace("^44", "34", regex=True))
    pd.concat([one, other]).to_parquet(tmp_path / "two.parquet")
    pd.concat([jobs, other_jobs]).to_parquet(tmp_path / "two.jobs.parquet")
    one.to_parquet(tmp_path / "one.parquet")
    jobs.to_parquet(tmp_path / "one.jobs.parquet")
    for name in ("two", "one"):
        result = runner.invoke(app, ["protect", str(tmp_path / f"{name}.parquet"), "--jobs",
                                     str(tmp_path / f"{name}.jobs.parquet"), "--config", "jobs", "--out",
                                     str(tmp_path / name), "--seed", "1", "--not-for-publication", "--processes", "1"])
        assert result.exit_code == 0, result.output
    two = gedp.read_release(tmp_path / "two").tabulate(by=["county"], moe=True)
    alone = gedp.read_release(tmp_path / "one").tabulate(by=["county"], moe=True)
    assert sorted(two["state"].unique()) == ["34", "44"]
    mine = two[two["state"] == "44"].reset_index(drop=True)
    assert (mine["m1emp_moe"] > 0).all()
    # the same establishments and seed; the two-state release's zeta per state is about half the one-state
    # release's, so its tau, bounds and noise differ a little (measured: margins within 1.1%)
    assert np.allclose(mine["m1emp_moe"], alone["m1emp_moe"], rtol=0.05)


def test_release_bytes_do_not_depend_on_the_order_of_either_input(tmp_path, state, jobs):
    micro = state.drop(columns=["m2emp", "m3emp", "wage"])
    shuffled = micro.sample(frac=1.0, random_state=5)
    shuffled_jobs = jobs.astype({"estab_id": str}).sample(frac=1.0, random_state=6)
    outputs = []
    for name, m, j in (("a", micro, jobs), ("b", shuffled, shuffled_jobs)):
        m.to_parquet(tmp_path / f"{name}.parquet")
        j.to_parquet(tmp_path / f"{name}.jobs.parquet")
        out = tmp_path / f"rel-{name}"
        result = runner.invoke(app, ["protect", str(tmp_path / f"{name}.parquet"), "--jobs",
                                     str(tmp_path / f"{name}.jobs.parquet"), "--config", "jobs", "--out", str(out),
                                     "--seed", "9", "--not-for-publication"])
        assert result.exit_code == 0, result.output
        outputs.append(out)
    for part in ("protected_jobs.parquet/part-44.parquet", "protected.parquet/part-44.parquet",
                 "measurements.parquet/part-44.parquet", "qcew_tables.csv"):
        assert (outputs[0] / part).read_bytes() == (outputs[1] / part).read_bytes(), part
    frame = pd.read_parquet(outputs[0] / "protected_jobs.parquet")
    assert frame["family"].tolist() == sorted(frame["family"].tolist(), key=["worker", "home"].index)
    shutil.rmtree(outputs[1])


@pytest.mark.slow
def test_job_margins_cover_at_least_95_percent_on_worker_mixes_and_commuting_flows():
    """Coverage of 95% margins over 10 releases of the small profile (35,796 establishments, about
    400k jobs): county x sex x education (60 cells a release), sector x sex (about 40) and home
    county x county (33). The margins are conservative (the identity answers' variances are estimated
    at their noisy values): measured per release on the test's seeds (100-109) 100% / 98.5% (sd 2.1%)
    / 98.1% (sd 3.0%), and on 12 others (200-211, benchmarks/RESULTS.md) 100% / 96.5% (sd 3.6%) /
    96.3% (sd 2.7%): from the latter, a mean below 0.93 over 10 releases is 3.0 sds away for sector x
    sex and 3.9 for home x county (a false failure about 1e-3 were the seeds drawn anew; the test's
    seeds are fixed, and its 10 releases pass; a true coverage of exactly 0.95 with these sds would
    fail 1.2-4.8% of runs). Power: margins too wide to say anything cover nearly every cell within
    half their width; at most 96% may be (county x sex x education has 92.0% within half, sd 3.4% a
    release: 3.7 sds over 10, a false failure about 1e-4; 91.4%, sd 3.2%, on the other seeds: 4.6
    sds); margins 0.6x as wide cover 85% / 79% of sector x sex / home x county. Each release
    is tabulated from one reading of its answers and job frame (``tabulate_jobs``, what
    ``Release.tabulate`` runs after reading them, their variance structures kept: ``JobAnswers``),
    the first checked bit for bit against ``Release.tabulate``."""
    from gedp.postprocess.jobframe import JobAnswers, tabulate_jobs
    from gedp.postprocess.keys import by_columns
    from gedp.release.reader import release_families
    from gedp.tabulation.job_frame_tables import read_job_frame

    micro = generate_profile(load_profile("small"), rng=np.random.default_rng(1)).drop(columns=["m2emp", "m3emp",
                                                                                               "wage"])
    jobs = synthesize_jobs(micro, rng=np.random.default_rng(2))
    workers = jobs.merge(micro[["estab_id", "state", "county", "sector"]], on="estab_id").astype(
        {"sex": str, "education": str, "home_county": str})
    tabulations = {"county,sex,education": ["state", "county", "sex", "education"], "sector,sex": ["sector", "sex"],
                   "home_county,county": ["home_county", "state", "county"]}
    covered: dict[str, list] = {by: [] for by in tabulations}
    within_half: dict[str, list] = {by: [] for by in tabulations}
    for seed in range(10):
        release = gedp.protect(micro, "jobs", input=gedp.Input(jobs=jobs), seed=100 + seed, not_for_publication=True)
        protected = release.microdata
        frame, families = read_job_frame(release.folder), release_families(release.folder)
        answers = JobAnswers(protected, release_answers(release.folder, protected))
        for by, keys in tabulations.items():
            table = tabulate_jobs(protected, frame, families, by_columns(by), moe=True, answers=answers)
            if seed == 0 and by == "home_county,county":  # after two tabulations of the same answers
                pd.testing.assert_frame_equal(table, release.tabulate(by, moe=True), check_exact=True)
            table = table.set_index(keys)
            homes = table.index.get_level_values("home_county") if "home_county" in keys else None
            truth = workers.assign(home_county=workers["home_county"].where(workers["home_county"].isin(homes),
                                                                            "other")) if homes is not None else workers
            true = truth.groupby(keys, observed=True).size().reindex(table.index, fill_value=0).to_numpy()
            error = np.abs(table["jobs"].to_numpy() - true)
            covered[by].append(error <= table["jobs_moe"].to_numpy())
            within_half[by].append(error <= table["jobs_moe"].to_numpy() / 2)
    for by in tabulations:
        share, half = np.concatenate(covered[by]).mean(), np.concatenate(within_half[by]).mean()
        assert share >= 0.93 and half <= 0.96, (by, share, half)


# --- what a holder of the release can learn ------------------------------------------------------------
def test_the_job_frame_is_recomputed_bit_for_bit_from_the_release_files_alone(release):
    """Every released job count is a function of released answers, protected m1emp and public
    attributes: re-running the postprocessing on the release's own files gives the same bits (so no
    confidential value, and no low bit of one, reaches the file). Power: the integer release differs."""
    from gedp.measure.jobframe import FamilySpec
    from gedp.postprocess.jobframe import family_attributes, job_table, protect_family
    from gedp.release.reader import read_answers

    answers = read_answers(release.folder)
    protected = release.microdata
    public = protected.drop(columns=["m1emp"])
    specs = [FamilySpec(family, tuple(spec["columns"]), list(codes.values()), list(codes))
             for family, spec in release.manifest["jobs"]["families"].items()
             for codes in [family_attributes(family, answers)]]
    recomputed = [(spec, protect_family(spec, answers, public, protected["m1emp"].to_numpy(dtype=float),
                                        solver="auto", integer=False)[0]) for spec in specs]
    again = job_table(protected["estab_id"], recomputed)
    pd.testing.assert_frame_equal(again, release.jobs, check_exact=True)
    whole = job_table(protected["estab_id"], [(s, round_counts(c, np.round(protected["m1emp"].to_numpy())))
                                              for s, c in recomputed])
    assert not whole["jobs"].equals(release.jobs["jobs"])


def test_home_counties_outside_the_state_leave_no_trace_in_the_release(tmp_path, state, jobs):
    """Moving some workers' homes from one out-of-state county to another (both only in the job table)
    leaves every released byte unchanged, and neither code nor the number of jobs appears anywhere."""
    micro = state.drop(columns=["m2emp", "m3emp", "wage"])
    moved = np.arange(len(jobs)) % 9 == 0
    folders = []
    inside = home_domain(state)[0]  # power: a move to a county of the state does show
    for code in ("36061", "42101", inside):
        table = jobs.assign(home_county=jobs["home_county"].astype(str).where(~moved, code))
        out = tmp_path / code
        gedp.protect(micro, "jobs", input=gedp.Input(jobs=table), seed=21, not_for_publication=True).write(out)
        folders.append(out)
    jobs_part = "protected_jobs.parquet/part-44.parquet"
    assert (folders[0] / jobs_part).read_bytes() != (folders[2] / jobs_part).read_bytes()
    files = sorted(p.relative_to(folders[0]) for p in folders[0].rglob("*") if p.is_file())
    for name in files:  # the manifest too (its creation date is the same day)
        data = (folders[0] / name).read_bytes()
        assert data == (folders[1] / name).read_bytes(), name
        assert b"36061" not in data and b"42101" not in data, name

    def numbers(value):
        if isinstance(value, dict):
            return [n for v in value.values() for n in numbers(v)]
        if isinstance(value, list):
            return [n for v in value for n in numbers(v)]
        return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []

    manifest = json.loads((folders[0] / "manifest.json").read_text())
    assert len(jobs) not in numbers(manifest)  # the number of jobs (= true total m1emp) is not released


# --- the job frame read as untrusted input ------------------------------------------------------------
@pytest.fixture(scope="module")
def written(release, tmp_path_factory):
    folder = tmp_path_factory.mktemp("jobs") / "release"
    release.write(folder)
    return folder


#: Job frames edited as the red team did (their column types were not checked: jobs as text and a worker
#: column as numbers were tabulated, a dropped column raised KeyError), and what the refusal names.
JOB_FRAMES = {
    "jobs as text": (lambda f: f.assign(jobs=f["jobs"].astype(str)), "column 'jobs' as large_string, not as double"),
    "a worker column as numbers": (lambda f: f.assign(sex=f["sex"].isna().astype("int64")),
                                   "column 'sex' as int64, not as text"),
    "estab_id as numbers": (lambda f: f.assign(estab_id=np.arange(len(f))), "column 'estab_id' as int64, not as text"),
    "family as numbers": (lambda f: f.assign(family=(f["family"] == "worker").astype("int64")),
                          "column 'family' as int64, not as text"),
    "jobs dropped": (lambda f: f.drop(columns=["jobs"]), "lack the column 'jobs'"),
    "a worker column dropped": (lambda f: f.drop(columns=["education"]), "lack the column 'education'"),
    "a column gedp does not write": (lambda f: f.assign(note="x"), "hold a column 'note' gedp does not write"),
}


def edited_job_frame(written, tmp_path, monkeypatch, edit):
    """A copy of the release ``written`` whose job frame is ``edit``-ed (its one part rewritten), read with
    a cache folder of the test's own."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "copy"
    shutil.copytree(written, copy)
    part = copy / "protected_jobs.parquet" / "part-44.parquet"
    edit(pd.read_parquet(part)).to_parquet(part, index=False)
    return copy


@pytest.mark.parametrize("case", list(JOB_FRAMES))
def test_a_job_frame_of_other_columns_is_refused_from_its_schema(written, tmp_path, monkeypatch, case):
    from gedp.errors import InputError
    from gedp.tabulation.job_frame_tables import read_job_frame

    edit, message = JOB_FRAMES[case]
    copy = edited_job_frame(written, tmp_path, monkeypatch, edit)
    with pytest.raises(InputError, match=re.escape(message)):
        read_job_frame(copy)
    for moe in ([], ["--moe"]):
        result = runner.invoke(app, ["tabulate", str(copy), "--by", "county,sex", *moe])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_genuine_job_frame_is_read_with_the_columns_gedp_writes(written, release, integer_release, tmp_path):
    """Power of the rule above: the frames gedp writes are read whole, an integer release's too."""
    from gedp.tabulation.job_frame_tables import read_job_frame

    whole = integer_release
    for folder, written_release in ((written, release), (whole.write(tmp_path / "integer"), whole)):
        frame = read_job_frame(folder)
        assert list(frame.columns) == ["estab_id", "family", "sex", "education", "home_county", "jobs"]
        assert frame["jobs"].sum() == pytest.approx(written_release.jobs["jobs"].sum())


def _set(column, value, row=3):
    def edit(frame):
        frame = frame.copy()
        frame[column] = frame[column].astype(object) if column != "jobs" else frame[column]
        frame.loc[row, column] = value
        return frame
    return edit


#: Job frames whose values (not their types) were edited as the round-22 red team did (F2: a formula
#: in education reached the CSV, sex 3 was tabulated, jobs -5 or 1e300 were summed), and the refusal.
JOB_VALUES = {
    "a formula for a worker code": (_set("education", '=HYPERLINK("http://evil")'),
                                    "column 'education' holds a value gedp does not write (first at row 4"),
    "sex 3": (_set("sex", "3"), "column 'sex' holds a value gedp does not write (first at row 4"),
    "a home county of another state": (
        lambda f: _set("home_county", "34001", int(f["home_county"].notna().argmax()))(f),
        "column 'home_county' holds a value gedp does not write"),
    "a county of its state no establishment is in": (  # harden23 item 6: the reader took any county of the
        lambda f: _set("home_county", "44998", int(f["home_county"].notna().argmax()))(f),  # states; protect
        "column 'home_county' holds a value gedp does not write"),  # measures its establishments' counties only
    "the unknown county": (lambda f: _set("home_county", "44999", int(f["home_county"].notna().argmax()))(f),
                           "column 'home_county' holds a value gedp does not write"),
    "a worker code in another family's row": (lambda f: _set("sex", "1", int(f["sex"].isna().argmax()))(f),
                                              "column 'sex' holds a value gedp does not write"),
    "a family the manifest lacks": (_set("family", "other"), "column 'family' holds a value gedp does not write"),
    "negative jobs": (lambda f: f.assign(jobs=-5.0), "column 'jobs' holds a value gedp does not write (first at row 1"),
    "zero jobs": (_set("jobs", 0.0), "column 'jobs' holds a value gedp does not write (first at row 4"),
    "infinite jobs": (_set("jobs", np.inf), "column 'jobs' holds a value gedp does not write (first at row 4"),
    "NaN jobs": (_set("jobs", np.nan), "column 'jobs' holds a value gedp does not write (first at row 4"),
    "huge jobs": (lambda f: f.assign(jobs=1e300), "do not add up to its protected employment"),
    "jobs moved between establishments": (lambda f: f.assign(jobs=f["jobs"].to_numpy()[::-1]),
                                          "do not add up to its protected employment"),
}


@pytest.mark.parametrize("case", list(JOB_VALUES))
def test_a_job_frame_of_values_gedp_does_not_write_is_refused_by_every_reader(written, tmp_path, monkeypatch, case):
    from gedp.audit.release import audit_release

    edit, message = JOB_VALUES[case]
    copy = edited_job_frame(written, tmp_path, monkeypatch, edit)
    for by in ("sex", "education", "county,home_county"):
        for moe in ([], ["--moe"]):
            result = runner.invoke(app, ["tabulate", str(copy), "--by", by, *moe, "--out", str(tmp_path / "t.csv")])
            assert result.exit_code == 2 and message in result.output, (by, moe, result.output)
            assert len(result.output.strip().splitlines()) == 1 and "=" not in result.output, result.output
    assert not (tmp_path / "t.csv").exists()
    with pytest.raises(GedpError, match=re.escape(message)):
        gedp.read_release(copy).tabulate(by="sex")
    with pytest.raises(GedpError, match=re.escape(message)):
        _ = gedp.read_release(copy).jobs
    files = next(check for check in audit_release(copy) if check.name == "files")
    assert not files.passed and message in files.detail


def test_the_reader_reads_every_home_county_protect_measures(written, state):
    """The home counties the reader accepts are the list protect measures (``home_domain``, one function):
    a genuine frame holds only them, and each of them (every county of its establishments, and "other")
    is read when written in a row of the home family."""
    from gedp.release.reader import check_adds_up, read_protected
    from gedp.tabulation.job_frame_tables import read_job_frame

    frame, protected = read_job_frame(written), read_protected(written)
    homes = frame.loc[frame["family"] == "home", "home_county"].astype(str)
    assert set(homes) <= set(home_domain(state)) and len(set(homes)) >= 3
    row = int(frame["home_county"].notna().to_numpy().argmax())
    for code in home_domain(protected):
        frame.loc[row, "home_county"] = code
        check_adds_up(written, frame, protected)


def test_a_genuine_job_frame_passes_the_value_checks(written, integer_release, tmp_path):
    """Power: the frames gedp writes (an integer release's too) are tabulated and pass audit's files check;
    an integer release's fractional jobs are refused."""
    from gedp.audit.release import audit_release

    integer = integer_release.write(tmp_path / "integer")
    for folder in (written, integer):
        table = gedp.read_release(folder).tabulate(by="sex")
        assert table["jobs"].sum() == pytest.approx(gedp.read_release(folder).tabulate()["m1emp"].sum())
        assert next(check for check in audit_release(folder) if check.name == "files").passed
    part = integer / "protected_jobs.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    frame["jobs"] = frame["jobs"].astype(float)
    frame.loc[[0, 1], "jobs"] += [0.5, -0.5]  # still adding up, no longer whole
    frame.to_parquet(part, index=False)
    with pytest.raises(GedpError, match="column 'jobs' holds a value gedp does not write"):
        gedp.read_release(integer).tabulate(by="sex")


def _protected_edit(written, tmp_path, edit):
    """A copy of the release ``written`` whose protected part is ``edit``-ed."""
    copy = tmp_path / "copy"
    shutil.copytree(written, copy)
    part = copy / "protected.parquet" / "part-44.parquet"
    edit(pd.read_parquet(part)).to_parquet(part, index=False)
    return copy


#: Releases with a job frame, genuine and broken, the audit's verdicts of which must not change.
AUDITED = {
    "genuine": lambda written, tmp_path, monkeypatch: written,
    "jobs moved": lambda written, tmp_path, monkeypatch: edited_job_frame(
        written, tmp_path, monkeypatch, lambda f: f.assign(jobs=f["jobs"].to_numpy()[::-1])),
    "a home county of no establishment": lambda written, tmp_path, monkeypatch: edited_job_frame(
        written, tmp_path, monkeypatch, JOB_VALUES["a county of its state no establishment is in"][0]),
    "a protected county edited": lambda written, tmp_path, monkeypatch: _protected_edit(
        written, tmp_path, lambda f: f.assign(county=f["county"].where(f.index != 5, "1"))),
    "protected employment edited": lambda written, tmp_path, monkeypatch: _protected_edit(
        written, tmp_path, lambda f: f.assign(m1emp=f["m1emp"] + (f.index == 7))),
}


@pytest.mark.parametrize("case", list(AUDITED))
def test_the_audit_reads_the_protected_microdata_once_with_the_same_verdicts(written, tmp_path, monkeypatch, case):
    """harden23 item 5: gedp audit --release read a job release's protected microdata twice (its state parts,
    then read_protected for the job frame's check). It reads them once now, before the measurements: its files
    check takes the state parts it read, through the same checks, and gives the verdicts and words the
    readers' read gives (the check run with read_protected, as before), on the genuine release and broken
    copies."""
    from gedp.audit import release as audit
    from gedp.release import part_sizes, reader

    folder = AUDITED[case](written, tmp_path, monkeypatch)
    manifest = dict(reader.read_manifest(folder))
    before = audit.check_files(folder, manifest)  # the job frame checked against read_protected's rows
    reads = []
    read_parts = part_sizes.read_parts

    def counted(paths, *args, **kwargs):
        reads.extend(path for path in paths if "protected.parquet" in str(path))
        return read_parts(paths, *args, **kwargs)

    for module in (audit, reader):
        monkeypatch.setattr(module, "read_parts", counted)
    checks = {check.name: check for check in audit.audit_release(folder)}
    assert len(reads) == 1  # one protected part, read once
    _, protected = audit.protected_parts(folder, manifest)
    assert audit.check_files(folder, manifest, protected) == before
    assert checks["files"].passed == (not before) and all(failure in checks["files"].detail for failure in before)
    assert (case == "genuine") == all(check.passed for check in checks.values())
