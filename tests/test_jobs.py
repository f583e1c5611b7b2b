"""Job-frame data (synth/jobs.py): synthetic jobs against independent computations, and the job
table's validation rule by rule.

Share checks compare each sector's job share with its table value in units of the exact standard
error of a Dirichlet-multinomial sum (|z| <= 5: false-failure rate 5.7e-7 per comparison, below 3e-4
over the few hundred comparisons); power checks show the same statistic rejects a wrong table.
Dispersion and goodness-of-fit checks reject at p < 1e-6 / accept at p >= 1e-4 (false-failure rate
1e-4 per check), each with its power check.
"""

import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from gedp.errors import InputError
from gedp.synth import jobs as jobs_module
from gedp.synth.io import read_jobs, write_microdata
from gedp.synth.jobs import (
    MIX_CONCENTRATION,
    SAME_COUNTY_SHARE,
    share_tables,
    synthesize_jobs,
    validate_jobs,
)
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.schema import validate_microdata

Z = 5.0
#: The QWI codes, written out from the QWI schema (not taken from the module).
QWI = {
    "sex": {"1", "2"},
    "agegrp": {"A01", "A02", "A03", "A04", "A05", "A06", "A07", "A08"},
    "education": {"E1", "E2", "E3", "E4", "E5"},
    "race": {"A1", "A2", "A3", "A4", "A5", "A6", "A7"},
    "ethnicity": {"A1", "A2"},
}


@pytest.fixture(scope="module")
def state():
    return generate_profile(load_profile("small"), rng=np.random.default_rng(3))


@pytest.fixture(scope="module")
def jobs(state):
    return synthesize_jobs(state, rng=np.random.default_rng(4))


def establishment_counts(state, jobs, attribute, codes):
    """Per establishment: its jobs, and its jobs whose ``attribute`` is in ``codes``."""
    ids = jobs["estab_id"]
    position = pd.Index(state["estab_id"]).get_indexer(ids.cat.categories)[ids.cat.codes]
    column = jobs[attribute]
    hits = column.cat.categories.isin(codes)[column.cat.codes]
    return (np.bincount(position, minlength=len(state)).astype(float),
            np.bincount(position, weights=hits, minlength=len(state)))


def share_z(n, x, share):
    """z of sum(x) / sum(n) against ``share`` when x_e ~ DirichletMultinomial(n_e, c * shares):
    Var(x_e) = n_e s (1 - s) (1 + (n_e - 1) / (c + 1))."""
    variance = np.sum(n * share * (1 - share) * (1 + (n - 1) / (MIX_CONCENTRATION + 1)))
    return (x.sum() - share * n.sum()) / np.sqrt(variance)


def sector_z_scores(state, jobs, tables):
    """z of every (attribute, code) in every sector with 200 establishments or more; education among
    workers 25 and older, against the E1-E4 table."""
    older = jobs["education"].astype(str) != "E5"
    sectors = state["sector"].value_counts()
    scores = []
    for attribute, table in tables.items():
        frame = jobs[older] if attribute == "education" else jobs
        for code in table.columns:
            n, x = establishment_counts(state, frame, attribute, {code})
            for sector in sectors.index[sectors >= 200]:
                mine, share = (state["sector"] == sector).to_numpy(), table.loc[sector, code]
                if share == 0:  # a code the table never gives (race A6, unused by QWI) never occurs
                    assert x[mine].sum() == 0
                else:
                    scores.append(share_z(n[mine], x[mine], share))
    return np.array(scores)


# --- synthetic jobs ---------------------------------------------------------------------------------
def test_every_establishment_gets_one_job_per_month1_employee_in_establishment_order(state, jobs):
    per_establishment = jobs.groupby(jobs["estab_id"].astype(str), sort=False).size()
    employed = state[state["m1emp"] > 0]
    assert list(per_establishment.index) == list(employed["estab_id"])  # establishment order, contiguous
    assert np.array_equal(per_establishment.to_numpy(), employed["m1emp"].to_numpy())
    assert len(jobs) == state["m1emp"].sum() and state["m1emp"].eq(0).any()


def test_codes_are_qwi_codes_and_education_e5_is_exactly_the_workers_under_25(state, jobs):
    for attribute, codes in QWI.items():
        assert set(jobs[attribute].astype(str)) <= codes
    young = jobs["agegrp"].astype(str).isin(["A01", "A02", "A03"])
    assert ((jobs["education"].astype(str) == "E5") == young).all()
    assert young.any() and not young.all()
    assert jobs["home_county"].astype(str).str.fullmatch("44[0-9]{3}").all()
    validate_jobs(jobs, validate_microdata(state))


def test_share_tables_are_distributions_over_the_qwi_codes():
    for attribute, table in share_tables().items():
        assert set(table.columns) <= QWI[attribute]
        assert (table.to_numpy() >= 0).all()
        assert np.allclose(table.sum(axis=1), 1.0, atol=1e-12)


def test_job_shares_by_sector_converge_to_the_share_tables(state, jobs):
    tables = share_tables()
    scores = sector_z_scores(state, jobs, tables)
    assert len(scores) > 100 and np.abs(scores).max() <= Z
    # power: the same statistic against the tables of the next sector in the list rejects
    shifted = {a: pd.DataFrame(np.roll(t.to_numpy(), 1, axis=0), index=t.index, columns=t.columns)
               for a, t in tables.items() if a != "race"}  # race has one table for every sector
    assert np.abs(sector_z_scores(state, jobs, shifted)).max() > Z


def dispersion_p(state, jobs, sector):
    """P-value of Pearson's statistic for women per establishment (10+ jobs) of ``sector`` when every
    establishment had the sector's share (binomial counts, no establishment-level variation)."""
    n, x = establishment_counts(state, jobs, "sex", {"2"})
    share = share_tables()["sex"].loc[sector, "2"]
    mine = (state["sector"] == sector).to_numpy() & (n >= 10)
    statistic = np.sum((x[mine] - n[mine] * share) ** 2 / (n[mine] * share * (1 - share)))
    return stats.chi2.sf(statistic, df=int(mine.sum())), int(mine.sum())


def test_establishments_differ_in_their_mix(state, jobs, monkeypatch):
    p, establishments = dispersion_p(state, jobs, "44-45")
    assert establishments > 300 and p < 1e-6
    # power of the counterfactual: without establishment-level variation the same check accepts
    monkeypatch.setattr(jobs_module, "MIX_CONCENTRATION", 1e12)
    same_mix = synthesize_jobs(state, rng=np.random.default_rng(4))
    assert dispersion_p(state, same_mix, "44-45")[0] >= 1e-4


def test_home_counties_follow_the_commuting_rule(state, jobs):
    workplace = pd.Series(("44" + state["county"]).to_numpy(), index=state["estab_id"])
    job_workplace = workplace.reindex(jobs["estab_id"].astype(str)).to_numpy()
    home = jobs["home_county"].astype(str).to_numpy()
    employment = state.groupby("44" + state["county"])["m1emp"].sum()
    real = employment.drop("44999")
    assert "44999" not in set(home)
    for county in real.index:
        mine = job_workplace == county
        stayed = (home[mine] == county).mean()
        assert abs(stayed - SAME_COUNTY_SHARE) <= Z * np.sqrt(SAME_COUNTY_SHARE * (1 - SAME_COUNTY_SHARE) / mine.sum())
        others = real.drop(county)
        observed = pd.Series(home[mine & (home != county)]).value_counts().reindex(others.index, fill_value=0)
        assert stats.chisquare(observed, others / others.sum() * observed.sum()).pvalue >= 1e-4
        uniform = np.full(len(others), observed.sum() / len(others))  # power: a rule ignoring employment
        assert stats.chisquare(observed, uniform).pvalue < 1e-6
    unknown = pd.Series(home[job_workplace == "44999"]).value_counts().reindex(real.index, fill_value=0)
    assert stats.chisquare(unknown, real / real.sum() * unknown.sum()).pvalue >= 1e-4


def test_jobs_are_deterministic_given_the_seed(state, jobs):
    again, other = (synthesize_jobs(state, rng=np.random.default_rng(seed)) for seed in (4, 5))
    assert list(again.columns) == list(jobs.columns)
    for column in jobs.columns:
        assert again[column].cat.categories.equals(jobs[column].cat.categories)
        assert np.array_equal(again[column].cat.codes, jobs[column].cat.codes)
    assert not np.array_equal(other["sex"].cat.codes, jobs["sex"].cat.codes)


def test_fractional_employment_is_refused():
    state = generate_profile(load_profile("small"), n_establishments=50, rng=np.random.default_rng(1))
    state.loc[3, "m1emp"] = 2.5
    with pytest.raises(InputError, match=r"^column 'm1emp': values must be whole numbers to build jobs; first at "
                                         r"row 4 \(estab_id [^)]+\)$"):
        synthesize_jobs(state, rng=np.random.default_rng(1))


def test_synth_jobs_writes_the_job_table_and_leaves_the_microdata_unchanged(tmp_path):
    from gedp.cli import app

    runner = CliRunner()
    for name, extra in (("plain", []), ("with", ["--jobs"]), ("again", ["--jobs"])):
        result = runner.invoke(app, ["synth", "--profile", "small", "--establishments", "400", "--seed", "2",
                                     "--out", str(tmp_path / f"{name}.parquet"), *extra])
        assert result.exit_code == 0, result.output
    assert not (tmp_path / "plain.jobs.parquet").exists()
    assert (tmp_path / "plain.parquet").read_bytes() == (tmp_path / "with.parquet").read_bytes()
    assert (tmp_path / "with.jobs.parquet").read_bytes() == (tmp_path / "again.jobs.parquet").read_bytes()
    establishments = pd.read_parquet(tmp_path / "with.parquet")
    table = read_jobs(tmp_path / "with.jobs.parquet", validate_microdata(establishments))
    assert len(table) == establishments["m1emp"].sum()


def test_synth_jobs_from_qcew_file(tmp_path, shared_data):
    from gedp.cli import app

    out = tmp_path / "ri.parquet"
    result = CliRunner().invoke(app, ["synth", "--from-qcew", str(shared_data / "qcew_2016q1_44.csv"), "--jobs",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    establishments = validate_microdata(pd.read_parquet(out))
    assert len(read_jobs(tmp_path / "ri.jobs.parquet", establishments)) == establishments["m1emp"].sum()


# --- validation -------------------------------------------------------------------------------------
ESTABLISHMENTS = validate_microdata(pd.DataFrame({
    "estab_id": ["A", "B", "C"], "state": "44", "county": ["001", "007", "007"],
    "naics": ["311811", "445110", "722511"], "m1emp": [2.0, 1.0, 0.0], "m2emp": 1.0, "m3emp": 1.0, "wage": 9.0,
}))


def job_rows(**overrides) -> pd.DataFrame:
    frame = pd.DataFrame({"estab_id": ["A", "B", "A"], "sex": ["1", "2", "2"], "agegrp": ["A04", "A02", "A08"],
                          "education": ["E4", "E5", "E1"], "race": ["A1", "A2", "A7"], "ethnicity": ["A1", "A2", "A1"],
                          "home_county": ["44001", "44007", "25005"]})
    for column, values in overrides.items():
        frame[column] = values
    return frame


def test_a_valid_job_table_gets_canonical_columns():
    out = validate_jobs(job_rows(sex=[1, 2, 2], home_county=[44001, 44007, 1001]), ESTABLISHMENTS)
    assert list(out.columns) == ["estab_id", "sex", "agegrp", "education", "race", "ethnicity", "home_county"]
    assert list(out["sex"].astype(str)) == ["1", "2", "2"]
    assert list(out["home_county"].astype(str)) == ["44001", "44007", "01001"]  # whole numbers zero-padded
    assert list(out["estab_id"].astype(str)) == ["A", "B", "A"]
    assert "home_county" not in validate_jobs(job_rows().drop(columns="home_county"), ESTABLISHMENTS)


@pytest.mark.parametrize("frame, message", [
    (job_rows().drop(columns="race"), "job table: missing column 'race'; required: estab_id, sex, agegrp, "
                                      "education, race, ethnicity"),
    (pd.concat([job_rows(), job_rows()[["sex"]]], axis=1), "job table: column 'sex' appears more than once"),
    (job_rows(estab_id=["A", "Z", "A"]), "column 'estab_id': values must be an estab_id of the establishment table; "
                                         "first at row 2 (estab_id Z)"),
    (job_rows(estab_id=["A", None, "A"]), "column 'estab_id': values must not be missing; first at row 2"),
    (job_rows(sex=["1", "F", "2"]), "column 'sex': codes must be one of 1, 2; first at row 2 (estab_id B)"),
    (job_rows(agegrp=["A04", "A2", "A08"]), "column 'agegrp': codes must be one of A01, A02, A03, A04, A05, A06, "
                                            "A07, A08; first at row 2 (estab_id B)"),
    (job_rows(education=["E4", "E5", "E0"]), "column 'education': codes must be one of E1, E2, E3, E4, E5; first "
                                             "at row 3 (estab_id A)"),
    (job_rows(race=[None, "A2", "A7"]), "column 'race': codes must be one of A1, A2, A3, A4, A5, A6, A7; first at "
                                        "row 1 (estab_id A)"),
    (job_rows(ethnicity=["A1", "A2", "A3"]), "column 'ethnicity': codes must be one of A1, A2; first at row 3 "
                                             "(estab_id A)"),
    (job_rows(home_county=["44001", "4407", "25005"]), "column 'home_county': codes must be 5-digit FIPS; first at "
                                                       "row 2 (estab_id B)"),
    (job_rows().iloc[:2], "column 'm1emp': every establishment needs as many jobs in the job table as its m1emp; "
                          "first at row 1 (estab_id A)"),
    (job_rows(estab_id=["A", "B", "C"]), "column 'm1emp': every establishment needs as many jobs in the job table "
                                         "as its m1emp; first at row 1 (estab_id A)"),
])
def test_each_rule_is_refused_in_one_line_without_counts_or_values(frame, message):
    with pytest.raises(InputError) as raised:
        validate_jobs(frame, ESTABLISHMENTS)
    assert str(raised.value) == message and "\n" not in message


def test_job_tables_are_read_from_csv_with_codes_kept_as_text(tmp_path):
    path = tmp_path / "jobs.csv"
    job_rows(home_county=["01001", "44007", "25005"]).to_csv(path, index=False)
    assert list(read_jobs(path, ESTABLISHMENTS)["home_county"].astype(str)) == ["01001", "44007", "25005"]
    write_microdata(job_rows().drop(columns="ethnicity"), tmp_path / "short.parquet")
    with pytest.raises(InputError, match=re.escape("missing column 'ethnicity'")):
        read_jobs(tmp_path / "short.parquet", ESTABLISHMENTS)
