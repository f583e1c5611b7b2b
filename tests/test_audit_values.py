"""gedp audit --release reads values (issue 46, red team item 4): it passes genuine releases (one
quarter over several seeds, a panel, --integer, a job frame) and fails on copies broken in nine
ways, the red team's two among them; the fit statistic behind the values check is the chi-square
it is stated to be when the protected values are the true ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import gedp
from gedp.audit.release import audit_release
from gedp.cli import app
from gedp.synth.jobs import synthesize_jobs
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

ATTRIBUTES = ["m1emp", "m2emp", "m3emp", "wage"]


def failed(folder: Path) -> set[str]:
    return {check.name for check in audit_release(folder) if not check.passed}


@pytest.fixture(scope="module")
def truth() -> pd.DataFrame:
    """The confidential input: the small profile at 1,500 establishments."""
    return generate_profile(load_profile("small"), n_establishments=1_500, rng=np.random.default_rng(21))


@pytest.fixture(scope="module")
def releases(truth, tmp_path_factory) -> dict[str, Path]:
    """Genuine releases of ``truth``: three seeds, --integer, the baseline config."""
    root = tmp_path_factory.mktemp("genuine")
    made = {}
    for name, options in {"seed 1": dict(seed=1), "seed 2": dict(seed=2), "seed 3": dict(seed=3),
                          "integer": dict(seed=4, config=gedp.load(integer=True)),
                          "baseline": dict(config="baseline", seed=5)}.items():
        made[name] = gedp.protect(truth, not_for_publication=True, **options).write(root / name.replace(" ", ""))
    return made


@pytest.fixture(scope="module")
def panel(tmp_path_factory) -> Path:
    first = generate_profile(load_profile("small"), n_establishments=1_500, rng=np.random.default_rng(22))
    quarters = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(22))
    release = gedp.protect(quarters, seed=5, not_for_publication=True, allow_over_cap=True)
    return release.write(tmp_path_factory.mktemp("panel") / "r")


@pytest.fixture(scope="module")
def job_frame(tmp_path_factory) -> Path:
    state = generate_profile(load_profile("small"), n_establishments=600, rng=np.random.default_rng(11))
    jobs = synthesize_jobs(state, rng=np.random.default_rng(12))
    release = gedp.protect(state.drop(columns=["m2emp", "m3emp", "wage"]), "jobs", input=gedp.Input(jobs=jobs), seed=3,
                           not_for_publication=True)
    return release.write(tmp_path_factory.mktemp("jobs") / "r")


@pytest.mark.parametrize("name", ["seed 1", "seed 2", "seed 3", "integer", "baseline"])
def test_genuine_releases_pass(releases, name):
    assert failed(releases[name]) == set()


def test_a_genuine_panel_and_job_frame_pass(panel, job_frame):
    assert failed(panel) == set()
    assert failed(job_frame) == set()


# --- broken copies ----------------------------------------------------------------------------
def copy_of(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    return copy


def rewrite(part: Path, edit) -> None:
    frame = pd.read_parquet(part)
    edit(frame).to_parquet(part, index=False)


def true_values(copy, truth, releases):
    """Red team: the true confidential values written over protected.parquet/part-<state>.parquet."""
    def truthful(frame):
        known = truth.set_index("estab_id").loc[frame["estab_id"]]
        return frame.assign(**{a: known[a].to_numpy() for a in ATTRIBUTES})

    rewrite(copy / "protected.parquet" / "part-44.parquet", truthful)


def raw_records(copy, truth, releases):
    """Red team: an extra protected.parquet/extra.parquet of 50 raw records."""
    truth.head(50).to_parquet(copy / "protected.parquet" / "extra.parquet", index=False)


def count_edited(copy, truth, releases):
    """The manifest's count edited, consistently with its state's (so it still reads)."""
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["establishments"] -= 100
    manifest["per_state"]["44"]["establishments"] -= 100
    (copy / "manifest.json").write_text(json.dumps(manifest))


def measurements_of_another_release(copy, truth, releases):
    """The measurements replaced by those of another release of the same data (another noise draw)."""
    shutil.copy(releases["seed 2"] / "measurements.parquet" / "part-44.parquet",
                copy / "measurements.parquet" / "part-44.parquet")


def protected_of_another_release(copy, truth, releases):
    shutil.copy(releases["seed 2"] / "protected.parquet" / "part-44.parquet",
                copy / "protected.parquet" / "part-44.parquet")


def part_dropped(copy, truth, releases):
    (copy / "measurements.parquet" / "part-44.parquet").unlink()


def rows_duplicated(copy, truth, releases):
    rewrite(copy / "protected.parquet" / "part-44.parquet", lambda f: pd.concat([f, f.tail(5)], ignore_index=True))


def ids_altered(copy, truth, releases):
    """Each protected row's estab_id replaced by another establishment's (rows kept in place)."""
    rewrite(copy / "protected.parquet" / "part-44.parquet",
            lambda f: f.assign(estab_id=np.roll(f["estab_id"].to_numpy(), 1)))


def a_value_shifted(copy, truth, releases):
    """One establishment's employment made 10 times its protected value in a few rows."""
    rewrite(copy / "protected.parquet" / "part-44.parquet",
            lambda f: f.assign(m1emp=np.where(np.arange(len(f)) < 300, f["m1emp"] * 10 + 50, f["m1emp"])))


def sector_scaled(copy, truth, releases):
    """Red team: the months of sector 62 (health care) multiplied by 1.25 and their wages by 1.4."""
    def scaled(frame):
        health = (frame["sector"].astype(str) == "62").to_numpy()
        assert 0 < health.sum() < len(frame)
        factors = {a: np.where(health, 1.4 if a == "wage" else 1.25, 1.0) for a in ATTRIBUTES}
        return frame.assign(**{a: frame[a] * factors[a] for a in ATTRIBUTES})

    rewrite(copy / "protected.parquet" / "part-44.parquet", scaled)


def true_values_in_some_rows(rows: int):
    """Red team: the true confidential values written over ``rows`` protected rows (random ones; one row:
    the largest establishment's)."""
    def edit(copy, truth, releases):
        def partly_true(frame):
            order = (np.random.default_rng(8).permutation(len(frame)) if rows > 1
                     else np.argsort(-frame["m1emp"].to_numpy()))
            chosen = np.isin(np.arange(len(frame)), order[:rows])
            known = truth.set_index("estab_id").loc[frame["estab_id"]]
            return frame.assign(**{a: np.where(chosen, known[a].to_numpy(), frame[a]) for a in ATTRIBUTES})

        rewrite(copy / "protected.parquet" / "part-44.parquet", partly_true)
    return edit


def a_table_cell_rewritten(copy, truth, releases):
    """Red team: the last figure of qcew_tables.csv's first row rewritten (sed '2s/,[0-9.]*$/,999999999/')."""
    lines = (copy / "qcew_tables.csv").read_text().splitlines(keepends=True)
    lines[1] = lines[1].rstrip("\n").rsplit(",", 1)[0] + ",999999999\n"
    (copy / "qcew_tables.csv").write_text("".join(lines))


BROKEN = {
    "true values over the part": (true_values, {"re-solved values", "tables"}),
    "sector 62 scaled": (sector_scaled, {"re-solved values", "tables"}),
    "true values in 30% of rows": (true_values_in_some_rows(450), {"re-solved values", "tables"}),
    "true values in 60% of rows": (true_values_in_some_rows(900), {"re-solved values", "tables"}),
    "true values in 1 row of 1,500": (true_values_in_some_rows(1), {"re-solved values"}),
    "a table cell rewritten": (a_table_cell_rewritten, {"tables"}),
    "an extra part of raw records": (raw_records, {"files"}),
    "the manifest's count edited": (count_edited, {"counts"}),
    "another release's measurements": (measurements_of_another_release, {"re-solved values"}),
    "another release's protected values": (protected_of_another_release,
                                           {"re-solved values", "tables"}),
    "a part dropped": (part_dropped, {"files"}),
    "rows duplicated": (rows_duplicated, {"counts"}),
    "ids altered": (ids_altered, {"counts"}),
    "values shifted in 300 rows": (a_value_shifted, {"re-solved values", "tables"}),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_the_audit_fails_every_broken_copy(truth, releases, tmp_path, case):
    """Each broken copy fails the check that reads what was broken (others may fail with it)."""
    break_it, expected = BROKEN[case]
    copy = copy_of(releases["seed 1"], tmp_path)
    break_it(copy, truth, releases)
    found = failed(copy)
    assert expected <= found, found
    result = CliRunner().invoke(app, ["audit", "--release", str(copy)])
    assert result.exit_code == 2 and "release audit failed" in result.output, result.output


def test_a_hostile_manifest_is_the_failed_check(releases, tmp_path):
    copy = copy_of(releases["seed 1"], tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps(manifest | {"states": ["../44"]}))
    [check] = audit_release(copy)
    assert check.name == "manifest" and not check.passed and "'states' holds" in check.detail


def test_a_panel_with_its_quarters_swapped_fails(panel, tmp_path):
    """The protected rows of 2016Q1 and 2016Q2 exchanged (each relabelled as the other quarter)."""
    copy = copy_of(panel, tmp_path)
    parts = [copy / "protected.parquet" / f"part-2016Q{q}-44.parquet" for q in (1, 2)]
    frames = [pd.read_parquet(part) for part in parts]
    for part, frame, label in zip(parts, reversed(frames), ("2016Q1", "2016Q2")):
        frame.assign(quarter=label).to_parquet(part, index=False)
    assert {"counts", "re-solved values"} & failed(copy)


def test_a_panel_quarter_with_true_values_fails(tmp_path):
    first = generate_profile(load_profile("small"), n_establishments=1_500, rng=np.random.default_rng(23))
    quarters = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(23))
    folder = gedp.protect(quarters, seed=6, not_for_publication=True, allow_over_cap=True).write(tmp_path / "panel")
    part = folder / "protected.parquet" / "part-2016Q2-44.parquet"
    known = quarters[quarters["qtr"] == 2].set_index("estab_id")
    rewrite(part, lambda f: f.assign(**{a: known.loc[f["estab_id"], a].to_numpy() for a in ATTRIBUTES}))
    assert failed(folder) == {"re-solved values", "tables"}
    assert "2016Q2" in next(c.detail for c in audit_release(folder) if not c.passed)
