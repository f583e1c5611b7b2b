"""gedp implicates end to end: a release's files only, no budget, its bytes unchanged, reproducible
when seeded; size-class tabulations combined over implicates."""

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.postprocess.derived import tabulate_implicates
from gedp.postprocess.sizeclass import size_class
from gedp.release.implicates import write_implicates

runner = CliRunner()


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_implicates_read_the_release_only_and_change_none_of_its_bytes(lone_release, tmp_path, monkeypatch):
    before = digests(lone_release)
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEDP_CACHE_DIR", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "draws"
    result = runner.invoke(app, ["implicates", str(lone_release), "--n", "3", "--out", str(out), "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert digests(lone_release) == before
    assert not (tmp_path / "home").exists()
    # the cache holds the re-solve's verdict and the release's remembered digest only (gedp.release.resolved)
    kept = sorted(path.relative_to(cache / "margins").parts[0] for path in cache.rglob("*") if path.is_file())
    assert kept == [".digests", ".verdicts"], kept
    frame = pd.read_parquet(out)
    release = pd.read_parquet(lone_release / "protected.parquet")
    assert sorted(frame["implicate"].unique()) == [1, 2, 3]
    assert list(frame.columns) == ["implicate", *release.columns]
    for _, one in frame.groupby("implicate"):
        one = one.drop(columns="implicate").reset_index(drop=True)
        public = [c for c in release.columns if c not in ("m1emp", "m2emp", "m3emp", "wage")]
        pd.testing.assert_frame_equal(one[public], release[public])
        months = one[["m1emp", "m2emp", "m3emp"]].to_numpy()
        assert (months >= 0).all() and (months == np.rint(months)).all() and (one["wage"] >= 0).all()
    # Seeded: the same draws again; another seed: others.
    again = tmp_path / "again"
    write_implicates(lone_release, 3, again, seed=4)
    pd.testing.assert_frame_equal(pd.read_parquet(again), frame)
    other = gedp.read_release(lone_release).implicates(2, seed=5)
    assert not np.array_equal(other.loc[other.implicate == 1, "wage"].to_numpy(),
                              frame.loc[frame.implicate == 1, "wage"].to_numpy())
    # An earlier folder of implicates is replaced; a release folder never is (neither the one read nor another).
    write_implicates(lone_release, 2, out, seed=1)
    assert sorted(pd.read_parquet(out)["implicate"].unique()) == [1, 2]
    with pytest.raises(InputError, match="is inside the release"):
        write_implicates(lone_release, 2, lone_release, seed=1)
    other = tmp_path / "other"
    shutil.copytree(lone_release, other)
    with pytest.raises(InputError, match="is inside the release"):  # another release (rt23 F2: refused first)
        write_implicates(lone_release, 2, other, seed=1)
    assert digests(other) == before
    assert digests(lone_release) == before


def test_secure_draws_without_a_seed(lone_release, tmp_path):
    import json

    out = write_implicates(lone_release, 2, tmp_path / "secure")
    summary = json.loads((out / "_implicates.json").read_text())
    assert summary["rng"]["kind"] == "secure" and "seed" not in summary["rng"]


def test_refusals(lone_release, tmp_path):
    result = runner.invoke(app, ["implicates", str(lone_release), "--n", "0", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "from 1 to 1000" in result.output
    broken = tmp_path / "broken"
    shutil.copytree(lone_release, broken)
    for part in sorted((broken / "measurements.parquet").glob("part-*.parquet")):  # each part rewritten in place
        measurements = pd.read_parquet(part)
        kept = measurements[~((measurements["query"] == "identity") & (measurements["attribute"] == "wage"))]
        kept.to_parquet(part, index=False)
    manifest = json.loads((broken / "manifest.json").read_text())  # as a plan without the identity wage states it
    del manifest["mu"]["identity"]["wage"]
    for section in manifest["per_state"].values():
        section["ledger"] = [e for e in section["ledger"] if (e["query"], e["attribute"]) != ("identity", "wage")]
        section["mu_total"] = math.sqrt(sum(e["mu"] ** 2 for e in section["ledger"]))  # its totals as composed
    total = manifest["mu_total"] = max(section["mu_total"] for section in manifest["per_state"].values())
    wage = math.sqrt(sum(by["wage"] ** 2 for by in manifest["mu"].values() if "wage" in by))
    manifest["privacy"].update(mu=total, rho=total**2 / 2)
    manifest["privacy"]["attributes"]["wage"].update(mu=wage, rho=wage**2 / 2)
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="no identity answer of"):  # the answers' reader (pnc) or implicates (psi)
        write_implicates(broken, 2, tmp_path / "y", seed=1)
    assert not (tmp_path / "y").exists()


def test_size_class_table_is_the_mean_over_implicates_with_rubins_margin(lone_release):
    release = gedp.read_release(lone_release)
    draws = release.implicates(4, seed=2)
    table = tabulate_implicates(draws, "sector,size_class", moe=True)
    # Independently: counts per implicate with numpy, then mean and t_3 sqrt((1 + 1/4) B).
    from scipy import stats

    counts = []
    for k in range(1, 5):
        one = draws[draws.implicate == k]
        keys = list(zip(one["sector"], size_class(one["m3emp"])))
        counts.append(pd.Series(1, index=pd.MultiIndex.from_tuples(keys)).groupby(level=[0, 1]).sum())
    matrix = pd.concat(counts, axis=1).fillna(0.0)
    expected = matrix.mean(axis=1)
    margin = stats.t.ppf(0.975, 3) * np.sqrt(1.25 * matrix.var(axis=1, ddof=1))
    got = table.set_index(["sector", "size_class"])
    np.testing.assert_allclose(got["estabs"].to_numpy(), expected.reindex(got.index).to_numpy())
    np.testing.assert_allclose(got["estabs_moe"].to_numpy(), margin.reindex(got.index).to_numpy())
    # Every establishment is in one class of every implicate: the classes add up to the release exactly.
    assert table["estabs"].sum() == pytest.approx(len(release.microdata))


def test_tabulate_by_size_class_from_the_release_and_the_cli(lone_release, tmp_path, drawn_once):
    """The implicates drawn again for the same request (the same table), then held (conftest.DrawnOnce)
    for the layouts and the command line, which tabulate them."""
    release = gedp.read_release(lone_release)
    table = release.tabulate("size_class", moe=True)
    assert set(table["size_class"]) <= set(range(1, 10))
    assert {"estabs", "estabs_moe", "m3emp_moe", "wage_moe"} <= set(table.columns)
    with drawn_once.again():
        assert table.equals(release.tabulate("size_class", moe=True))  # the same request, the same table
    published = release.tabulate("sector,size_class", format="qcew", moe=True)
    assert {"size_code", "size_title", "qtrly_estabs", "avg_wkly_wage", "qtrly_estabs_moe"} <= set(published.columns)
    assert published["size_title"].notna().all()
    out = tmp_path / "sizes.csv"
    result = runner.invoke(app, ["tabulate", str(lone_release), "--by", "sector,size_class", "--moe",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {"sector", "size_class", "estabs_moe"} <= set(pd.read_csv(out).columns)
    result = runner.invoke(app, ["tabulate", str(lone_release), "--by", "county,size_class", "--format", "qcew"])
    assert result.exit_code == 2 and "size-class layout" in result.output
    with pytest.raises(InputError, match="no such column"):
        release.tabulate("size_class,nonsense", moe=True)
    with pytest.raises(InputError, match="no such column"):
        release.tabulate("nonsense", moe=True)


def test_the_tests_held_draws_are_drawn_anew_under_another_switch(lone_release, drawn_once, monkeypatch):
    """conftest.DrawnOnce's key: the same release under the same settings is drawn once; a measurement
    switch of postprocess (which changes the draws, not the release's bytes) draws anew, and set back
    finds the first draw (a stand-in for the draw: the key is what is tested)."""
    from gedp.postprocess import implicates, whole_changes

    drawn = []

    def stand_in(release, quarter):
        drawn.append(quarter)
        return pd.DataFrame({"draw": [len(drawn)]})

    monkeypatch.setattr(drawn_once, "draw", stand_in)
    monkeypatch.setattr(drawn_once, "held", {})
    first = drawn_once(lone_release)
    assert drawn_once(lone_release).equals(first) and len(drawn) == 1
    for module, switch, value in ((implicates, "LEVEL_BY_SECTOR", True), (implicates, "CELL_CHANGES", "all"),
                                  (implicates, "WAGE_Z", implicates.WAGE_Z + 0.01),
                                  (whole_changes, "LEVEL_DIRECTION", True)):
        with monkeypatch.context() as switched:
            switched.setattr(module, switch, value)
            assert not drawn_once(lone_release).equals(first), switch
    assert len(drawn) == 5 and drawn_once(lone_release).equals(first) and len(drawn) == 5


def test_margins_by_a_column_the_user_added_are_refused_in_words(lone_release):
    release = gedp.read_release(lone_release)
    release.microdata["big"] = release.microdata["m3emp"] > 10
    with pytest.raises(InputError, match="cannot give margins of error by .big."):
        release.tabulate("big", moe=True)
    assert len(release.tabulate("big")) == 2  # without margins, any column of the microdata


def test_a_panel_release_is_drawn_one_quarter_at_a_time(tmp_path, small_panel_release):
    release = small_panel_release
    result = runner.invoke(app, ["implicates", str(release), "--n", "2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "give a quarter" in result.output
    write_implicates(release, 2, tmp_path / "q2", seed=1, quarter="2016Q2")
    drawn = pd.read_parquet(tmp_path / "q2")
    assert len(drawn) == 2 * len(pd.read_parquet(release / "protected.parquet", filters=[("quarter", "==", "2016Q2")]))


def test_wage_model_groups_are_the_sectors_of_the_release(lone_release):
    """The wage priors' groups (``StateAnswers.industry``) are the release's 2-digit NAICS sectors (the
    groups of a regression with sector effects), not its supersectors: two establishments share a
    group exactly when they share a sector."""
    from gedp.release.implicates import prepare

    draws = prepare(lone_release, np.random.default_rng(0))
    for rows, model in draws.models:
        sector = draws.public["sector"].to_numpy()[rows]
        pairs = pd.DataFrame({"sector": sector, "group": model.answers.industry}).drop_duplicates()
        assert pairs["sector"].is_unique and pairs["group"].is_unique
        # power: a supersector of this release holds two sectors, so the former groups would fail above
        supersector = pd.Series(draws.public["supersector"].to_numpy()[rows])
        assert supersector.groupby(sector).first().value_counts().max() >= 2


def test_the_quarters_level_prior_is_an_option_recorded_and_checked(lone_release, tmp_path):
    """``--level-prior quarter`` draws other implicates than the default (the same seed), says so in
    ``_implicates.json``, and every month is still a whole number >= 0; ``Release.implicates`` takes it
    too; an unknown name is refused in one line (exit 2), before anything is written."""
    result = runner.invoke(app, ["implicates", str(lone_release), "--n", "2", "--seed", "5", "--level-prior",
                                 "quarter", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "q" / "_implicates.json").read_text())
    assert summary["level_prior"] == "quarter"
    default = write_implicates(lone_release, 2, tmp_path / "d", seed=5)
    assert json.loads((default / "_implicates.json").read_text())["level_prior"] == "month1"
    quarter, month1 = pd.read_parquet(tmp_path / "q"), pd.read_parquet(default)
    months = ["m1emp", "m2emp", "m3emp"]
    assert not quarter[months].equals(month1[months])
    assert (quarter[months] >= 0).all().all() and (quarter[months] == np.round(quarter[months])).all().all()
    frame = gedp.read_release(lone_release).implicates(1, seed=5, level_prior="quarter")
    assert frame[months].to_numpy().min() >= 0
    _refused_before_writing(lone_release, tmp_path, "--level-prior", "month2",
                            "level prior 'month2' is not one of month1, quarter")


def _refused_before_writing(release, tmp_path, option: str, value: str, message: str) -> None:
    """``gedp implicates`` with ``option value`` exits 2 saying ``message``, its output folder not made."""
    refused = runner.invoke(app, ["implicates", str(release), option, value, "--out", str(tmp_path / "x")])
    assert refused.exit_code == 2 and message in refused.output, refused.output
    assert not (tmp_path / "x").exists()


def test_the_cells_wage_prior_is_an_option_recorded_and_checked(lone_release, tmp_path):
    """``--wage-prior cells`` draws other wages than the default (the same seed) and says so in
    ``_implicates.json``; its fitted priors have a level per county x NAICS-6 cell of the release's public
    columns (the default none); ``Release.implicates`` takes it too; an unknown name is refused in one
    line (exit 2), before anything is written."""
    from gedp.release.implicates import prepare

    result = runner.invoke(app, ["implicates", str(lone_release), "--n", "2", "--seed", "5", "--wage-prior", "cells",
                                 "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "c" / "_implicates.json").read_text())
    assert written["wage_prior"] == "cells"
    default = write_implicates(lone_release, 2, tmp_path / "d", seed=5)
    assert "wage_prior" not in json.loads((default / "_implicates.json").read_text())
    assert all("cell_offsets" not in p for p in json.loads((default / "_implicates.json").read_text())["priors"])
    assert not pd.read_parquet(tmp_path / "c")["wage"].equals(pd.read_parquet(default)["wage"])
    draws = prepare(lone_release, np.random.default_rng(1), wage_prior="cells")
    public = draws.public
    for rows, model in draws.models:
        cells = public.iloc[rows].groupby(["county", "naics"], dropna=False).ngroups
        assert model.priors.cell_offset is not None and len(model.priors.cell_offset) == cells
        assert np.isfinite(model.priors.cell_offset).all()
        summary = model.summary()["cell_offsets"]  # the offsets in public numbers, as written
        assert summary["cells"] == cells
        assert summary["sd"] == pytest.approx(np.std(model.priors.cell_offset), rel=1e-2)
        assert summary["range"] == pytest.approx([model.priors.cell_offset.min(), model.priors.cell_offset.max()],
                                                 rel=1e-2, abs=1e-3)
    assert [p["cell_offsets"]["cells"] for p in written["priors"]] == [
        public.iloc[rows].groupby(["county", "naics"], dropna=False).ngroups for rows, _ in draws.models]
    assert prepare(lone_release, np.random.default_rng(1)).models[0][1].priors.cell_offset is None
    frame = gedp.read_release(lone_release).implicates(1, seed=5, wage_prior="cells")
    assert (frame["wage"] >= 0).all()
    _refused_before_writing(lone_release, tmp_path, "--wage-prior", "county",
                            "wage prior 'county' is not one of sector, cells")


def test_the_joint_change_prior_is_an_option_recorded_and_checked(lone_release, tmp_path):
    """``--change-prior joint`` (with the quarter's level) draws other implicates than the default (the same
    seed), says so in ``_implicates.json``, every month is a whole number >= 0, and its fitted priors
    are joint priors of the two changes per change band; ``Release.implicates`` takes it too; an
    unknown name is refused in one line (exit 2), before anything is written."""
    from gedp.postprocess.implicates import PosteriorModel
    from gedp.release.implicates import prepare

    result = runner.invoke(app, ["implicates", str(lone_release), "--n", "2", "--seed", "5", "--level-prior",
                                 "quarter", "--change-prior", "joint", "--out", str(tmp_path / "j")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "j" / "_implicates.json").read_text())
    assert summary["change_prior"] == "joint" and summary["level_prior"] == "quarter"
    default = write_implicates(lone_release, 2, tmp_path / "d", seed=5, level_prior="quarter")
    assert "change_prior" not in json.loads((default / "_implicates.json").read_text())
    joint, independent = pd.read_parquet(tmp_path / "j"), pd.read_parquet(default)
    months = ["m1emp", "m2emp", "m3emp"]
    assert not joint[months].equals(independent[months])
    assert (joint[months] >= 0).all().all() and (joint[months] == np.round(joint[months])).all().all()
    model: PosteriorModel = prepare(lone_release, np.random.default_rng(1), change_prior="joint").models[0][1]
    assert model.priors.joint is not None and len(model.priors.joint) == len(model.priors.changes)
    assert all(abs(prior.weights.sum() - 1) < 1e-9 for prior in model.priors.joint)
    frame = gedp.read_release(lone_release).implicates(1, seed=5, change_prior="joint")
    assert frame[months].to_numpy().min() >= 0
    _refused_before_writing(lone_release, tmp_path, "--change-prior", "pairs",
                            "change prior 'pairs' is not one of independent, joint")


@pytest.mark.parametrize("option", ["level_prior", "change_prior", "wage_prior"])
def test_a_prior_named_by_anything_but_a_string_is_refused(lone_release, tmp_path, option):
    """A numpy array holding a valid name compares equal to it element by element: it passed the names'
    check, then drew the default's implicates without a word (or failed writing the summary with a
    traceback). Every prior's name must be a string among its names, and is refused before anything is
    written."""
    valid = {"level_prior": "quarter", "change_prior": "joint", "wage_prior": "cells"}[option]
    with pytest.raises(InputError, match="is not one of"):
        write_implicates(lone_release, 1, tmp_path / "x", seed=1, **{option: np.array([valid])})
    assert not (tmp_path / "x").exists()
    with pytest.raises(InputError, match="is not one of"):
        gedp.read_release(lone_release).implicates(1, seed=1, **{option: np.array([valid])})
