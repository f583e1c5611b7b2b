"""`gedp evaluate accuracy`: every figure against a recomputation from the releases it simulated (plain
pandas group-bys, the tabulation margins of `tabulate`), published flags against the raw BLS file."""

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.config import load_config
from gedp.evaluation import accuracy
from gedp.measure.neighbors import SqrtPsi
from gedp.postprocess.months import month_answers
from gedp.postprocess.tabulate import qcew_keys, tabulate
from gedp.synth.hierarchy import COUNTY_LEVELS, STATE_LEVELS


@pytest.fixture(scope="module")
def simulated(small_state):
    """Two releases of the small state under the baseline config, with the microdata and answers each made."""
    made = []
    real = accuracy.protect_microdata

    def recording(answers, public, options, **callbacks):
        protected, report = real(answers, public, options, **callbacks)
        made.append((answers, protected))
        return protected, report

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(accuracy, "protect_microdata", recording)
        result = accuracy.compute_accuracy(small_state, load_config("baseline"), published=None, replications=2,
                                           seed=5, data_label="test")
    return result, made



def test_levels_kept_are_those_of_the_whole_run_bit_for_bit(simulated, small_state):
    """``levels``: the same releases (seed 5), the kept levels' cells and margins and the state z scores
    equal to the whole run's bit for bit, the state's level kept too, no other level; an unknown level
    refused."""
    result, _ = simulated
    kept = accuracy.compute_accuracy(small_state, load_config("baseline"), published=None, replications=2, seed=5,
                                     data_label="test", levels=[78, 53])
    assert list(kept.levels) == [51, 53, 78]
    for level, cells in kept.levels.items():
        whole = result.levels[level]
        for name in ("true", "protected", "margin"):
            mine, theirs = getattr(cells, name), getattr(whole, name)
            assert list(mine) == list(theirs) and all(np.array_equal(mine[a], theirs[a]) for a in mine), (level, name)
    assert all(np.array_equal(kept.state_z[a], result.state_z[a]) for a in result.state_z)
    assert np.array_equal(kept.employer_zero_share, result.employer_zero_share)
    with pytest.raises(ValueError, match=r"levels \[99\] are not QCEW levels"):
        accuracy.compute_accuracy(small_state, load_config("baseline"), published=None, replications=1, seed=5,
                                  data_label="test", levels=[53, 99])

def test_cells_are_the_releases_group_sums_and_margins_are_tabulates(simulated, small_state):
    result, made = simulated
    assert len(made) == 2
    for level in (*STATE_LEVELS, *COUNTY_LEVELS):
        by = qcew_keys(small_state, level)
        true = small_state.groupby(by, observed=True)[["m1emp", "wage"]].sum()
        cells = result.levels[level]
        for r, (answers, protected) in enumerate(made):
            got = protected.groupby(by, observed=True)[["m1emp", "wage"]].sum()
            for attribute in ("m1emp", "wage"):
                np.testing.assert_allclose(cells.true[attribute], true[attribute].to_numpy(), rtol=1e-12)
                np.testing.assert_allclose(cells.protected[attribute][r], got[attribute].to_numpy(), rtol=1e-12)
            if level in (54, 75):  # margins: what `gedp tabulate --moe` states for the same cells
                turned = month_answers(answers, "smoothed", SqrtPsi(), protected)  # as a release's reader turns them
                table = tabulate(protected, by, ["m1emp", "wage"], moe=True, answers=turned, wage_psi=SqrtPsi())
                for attribute in ("m1emp", "wage"):
                    np.testing.assert_allclose(cells.margin[attribute][r], table[f"{attribute}_moe"], rtol=1e-9)


def test_figures_are_recomputed_from_the_cells(simulated, small_state):
    result, made = simulated
    summary = accuracy.summarize(result)
    cells = result.levels[78]
    true, protected, margin = cells.true["wage"], cells.protected["wage"], cells.margin["wage"]
    keep = true >= 1
    errors = (np.abs(protected - true) / np.where(keep, true, 1.0))[:, keep].ravel()
    got = summary["levels"]["78"]["wage"]["all"]
    assert got["cells_positive"] == keep.sum() and got["cells"] == len(true)
    assert got["median_relative_error"] == pytest.approx(np.median(errors))
    assert got["p90_relative_error"] == pytest.approx(np.percentile(errors, 90))
    assert got["within_3pct"] == pytest.approx(np.count_nonzero(errors <= 0.03) / errors.size)
    assert got["artificial_zero_share"] == pytest.approx(np.count_nonzero(protected[:, keep] < 0.5) / errors.size)
    covered = [abs(p - t) <= m for r in range(2) for t, p, m in zip(true, protected[r], margin[r]) if t >= 1]
    assert got["coverage_95"] == pytest.approx(np.mean(covered))
    # pooled size bands: cells of every level with a true wage of $10M or more
    big = [abs(c.protected["wage"][r][k] - c.true["wage"][k]) <= c.margin["wage"][r][k]
           for c in result.levels.values() for r in range(2) for k in np.flatnonzero(c.true["wage"] >= 1e7)]
    assert summary["coverage_95_by_band_all_levels"]["wage"]["[10M, inf)"] == pytest.approx(np.mean(big))
    # state totals in sd units of the state measurement; employers paid $0
    for r, (answers, protected_r) in enumerate(made):
        [state] = [a for a in answers["m1emp"] if a.query.by == ("state",)]
        z = (protected_r["m1emp"].sum() - small_state["m1emp"].sum()) / np.sqrt(state.variance[0])
        assert result.state_z["m1emp"][r] == pytest.approx(z)
        employed = protected_r["m1emp"] >= 1
        assert result.employer_zero_share[r] == pytest.approx((protected_r["wage"][employed] < 0.5).mean())
    assert summary["employers_paid_zero_share"] == pytest.approx(result.employer_zero_share.mean())


def test_report_has_every_level_attribute_and_plot(simulated, tmp_path):
    result, _ = simulated
    summary = accuracy.render_accuracy(result, tmp_path)
    text = (tmp_path / "report.md").read_text()
    for attribute in ("m1emp", "m2emp", "m3emp", "wage"):
        assert f"## {attribute} by QCEW level" in text
    assert set(summary["figures"]) == {"error_by_level.png", "coverage_by_band.png", "state_totals.png"}
    assert all((tmp_path / f).stat().st_size > 1_000 for f in summary["figures"])
    assert json.loads((tmp_path / "summary.json").read_text())["levels"]["71"]["wage"]["all"]["cells"] > 0
    assert "published" not in summary["levels"]["78"]["wage"]  # no QCEW file: no published flags


def published_rows_in_file(path):
    """(agglvl, area_fips, industry_code) of the private rows BLS published with establishments (a row of 0
    establishments is no cell of any release), read with csv alone."""
    with open(path, newline="") as handle:
        return {(int(r["agglvl_code"]), r["area_fips"], r["industry_code"]) for r in csv.DictReader(handle)
                if r["own_code"] == "5" and r["disclosure_code"] != "N" and 51 <= int(r["agglvl_code"]) <= 78
                and int(r["qtrly_estabs_count"]) > 0}


def test_evaluate_accuracy_on_rhode_island_flags_the_published_cells(shared_data, tmp_path):
    path = shared_data / "qcew_2016q1_44.csv"
    out = tmp_path / "accuracy"
    run = CliRunner().invoke(app, ["evaluate", "accuracy", "--from-qcew", str(path), "--replications", "1",
                                   "--out", str(out)])
    assert run.exit_code == 0, run.output
    summary = json.loads((out / "summary.json").read_text())
    in_file = published_rows_in_file(path)
    for level in (*STATE_LEVELS, *COUNTY_LEVELS):
        expected = sum(1 for lvl, _, _ in in_file if lvl == level)
        assert summary["levels"][str(level)]["wage"]["published"]["cells"] == expected, level
    assert "## wage by QCEW level" in (out / "report.md").read_text()


def test_published_flags_follow_the_keys(shared_data, synthesized):
    """Cell by cell at level 78: flagged exactly when the file has the county x NAICS-6 row unsuppressed."""
    from gedp.measure.queries import group_establishments
    from gedp.synth.qcew import read_qcew

    path = shared_data / "qcew_2016q1_44.csv"
    published = read_qcew(path)
    truth = synthesized("44")
    keys = group_establishments(truth, qcew_keys(truth, 78)).keys
    flags = accuracy.published_flags(published, 78, keys)
    in_file = {(a[2:], i) for lvl, a, i in published_rows_in_file(path) if lvl == 78}
    expected = np.array([(c, n) in in_file for c, n in zip(keys["county"], keys["naics"])])
    assert flags.sum() > 0 and np.array_equal(flags, expected)


def test_accuracy_reports_what_gedp_protect_releases(small_state):
    """The evaluation's cells and margins are those of a release `gedp protect` makes from the same
    measurements (the recommended config: smoothed months, the wage prior): its county x NAICS-3 and
    county x NAICS-6 tables and margins as `Release.tabulate(moe=True)` reads them."""
    import gedp
    from gedp.release.format import release_order
    from gedp.release.reader import read_answers

    config = load_config("recommended")
    truth = release_order(small_state)  # the rows as the release holds them
    release = gedp.protect(truth, config, seed=3, not_for_publication=True)
    answers = read_answers(release.folder)

    class Replayed:  # the release's own measurements, in place of a new draw
        def for_attribute(self, attribute):
            return answers[attribute]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(accuracy, "measure", lambda *args, **kwargs: Replayed())
        result = accuracy.compute_accuracy(truth, config, published=None, replications=1, seed=1,
                                           data_label="test")
    for level in (75, 78):
        by = qcew_keys(truth, level)
        keys = truth.groupby(by, observed=True).size().reset_index()[by]
        table = keys.merge(release.tabulate(by, moe=True), on=by, how="left")
        cells = result.levels[level]
        for attribute in ("m1emp", "m3emp", "wage"):
            np.testing.assert_allclose(cells.protected[attribute][0], table[attribute], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(cells.margin[attribute][0], table[f"{attribute}_moe"], rtol=1e-6, atol=1e-6)
