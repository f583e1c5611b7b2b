"""Releases with extreme answers (red team of rt8): an answer far from all others must neither make a
prior's grid, and so its fit's time and memory, grow with its distance, nor be pulled to the bulk."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import restate_pnc_noise

import gedp
from gedp.measure.neighbors import make_psi
from gedp.postprocess.deconvolve import MixtureFit
from gedp.release.implicates import write_implicates

#: The copies here hold answers edited on purpose, to see what the fits and draws make of them; they are not
#: the fit of their answers, which every reader's re-solve (``gedp.release.resolved``) refuses first.
pytestmark = pytest.mark.usefixtures("unresolved")

#: The most components a fit may get in these tests: any fixed bound (the grid's size may not depend on
#: how far the answers reach); a fit of that many is seconds and megabytes.
FIXED_BOUND = 1000


@pytest.fixture(scope="module")
def release(seeded_small_release) -> Path:
    return seeded_small_release("extreme", 1500)


def with_wage_answer(release: Path, folder: Path, value: float, psi: dict | None = None,
                     restate: bool = True) -> tuple[str, float]:
    """A copy of ``release`` whose first idle establishment's identity wage answer is ``value`` (on the
    scale of ``psi``, sqrt by default), its estimate and variance the mechanism's from it; that
    establishment and the answer's sd. ``restate``: the pnc answers' noise restated as the mechanism would
    have drawn it under the edited bound (``restate_pnc_noise``); without, see ``answers_alone``."""
    shutil.copytree(release, folder)
    part = folder / "measurements.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    protected = pd.read_parquet(release / "protected.parquet")
    idle = protected.loc[protected[["m1emp", "m2emp", "m3emp"]].sum(axis=1) == 0, "estab_id"].iloc[0]
    rows = (frame["query"] == "identity") & (frame["attribute"] == "wage") & (frame["estab_id"] == idle)
    assert rows.sum() == 1
    psi = make_psi(**(psi or {"name": "sqrt", "a": 0}))
    grid, sd = frame.loc[rows, "grid"].to_numpy(), frame.loc[rows, "sd"].to_numpy()
    frame.loc[rows, "released"] = np.round(value / grid) * grid
    frame.loc[rows, "estimate"] = psi.unbiased_estimate(frame.loc[rows, "released"].to_numpy(), sd)
    frame.loc[rows, "variance"] = psi.releasable_variance(frame.loc[rows, "estimate"].to_numpy(), sd)
    frame.to_parquet(part, index=False)
    if restate:
        restate_pnc_noise(folder)
    return idle, float(sd[0])


def answers_alone(monkeypatch) -> None:
    """Readers' check of the pnc noise against the identity answers' bounds, and of the answers' totals
    against the protected microdata's (``answer_checks``), off: an answer so extreme that the mechanism's
    pnc noise under its bound would exceed what a release holds, or thousands of noise sds above its
    state's total (so a reader refuses any such copy), still may not break the postprocessing, which
    these tests check on their own."""
    from gedp.release import answer_checks, pnc_checks

    monkeypatch.setattr(pnc_checks, "check_pnc_sd", lambda *args, **kwargs: None)
    monkeypatch.setattr(answer_checks, "check_answer_totals", lambda *args, **kwargs: None)


def test_an_extreme_wage_answer_gets_a_bounded_grid_and_a_draw_near_it(release, tmp_path, monkeypatch):
    """One wage answer 1e6 on the sqrt scale (a wage of 1e12, sd about 70): main built a grid of
    every sd / 3 from 0 to it (44,000 points, a 14 GiB Hessian). Every fit stays under a fixed bound,
    and the establishment's draws sit within 6 answer sds of its answer (its likelihood alone is that
    narrow; a grid not reaching it would have pulled it to the bulk, 1e6 / 70 sds away)."""
    largest = []
    made = MixtureFit.of.__func__

    def bounded(cls, observed, sd, means, sds, basis=False):
        largest.append(len(means))
        assert len(means) <= FIXED_BOUND, f"a prior of {len(means)} components"
        return made(cls, observed, sd, means, sds, basis)

    monkeypatch.setattr(MixtureFit, "of", classmethod(bounded))
    answers_alone(monkeypatch)
    value = 1e6
    idle, sd = with_wage_answer(release, tmp_path / "extreme", value)
    out = write_implicates(tmp_path / "extreme", 2, tmp_path / "draws", seed=3)
    assert largest and max(largest) <= FIXED_BOUND
    draws = pd.read_parquet(out)
    wage = draws.loc[draws["estab_id"] == idle, "wage"].to_numpy()
    assert len(wage) == 2 and (np.abs(np.sqrt(wage) - value) < 6 * sd).all(), (np.sqrt(wage), sd)
    # The other establishments' wages stay those of the bulk.
    others = draws.loc[draws["estab_id"] != idle, "wage"]
    assert np.sqrt(others.max()) < value / 100


def brute_force_near(answers: np.ndarray, start: float, top: float, step: float, reach: float) -> np.ndarray:
    """Every point start + k step (k >= 1, up to top) within ceil(reach / step) steps of an answer's
    nearest point, from the whole lattice."""
    lattice = start + step * np.arange(1, np.ceil((top - start) / step) + 1)
    nearest = np.clip(np.rint((answers - start) / step), 1, len(lattice))
    near = (np.abs(np.arange(1, len(lattice) + 1)[:, None] - nearest[None, :]) <= np.ceil(reach / step)).any(axis=1)
    return lattice[near]


def test_a_bounded_grid_holds_every_lattice_point_near_an_answer():
    """``lattice_near`` against brute force on the whole lattice: the points within reach of an answer,
    on the finest step (``step`` doubled) that leaves at most ``most`` of them; every answer within one
    step of a point."""
    from gedp.postprocess.deconvolve import lattice_near

    rng = np.random.default_rng(8)
    answers = np.concatenate([rng.normal(5.0, 1.0, 500), [300.0, 301.5, 2000.0]])
    start, top, reach = 0.0, 2010.0, 2.0
    for most in (10_000, 60, 12):
        steps = 0.25 * 2.0 ** np.arange(20)
        finest = next(s for s in steps if len(brute_force_near(answers, start, top, s, reach)) <= most)
        points, step = lattice_near(answers, start, top, 0.25, reach, most)
        assert step == finest and len(points) <= most
        np.testing.assert_allclose(points, brute_force_near(answers, start, top, step, reach))
        assert (np.abs(answers[:, None] - points[None, :]).min(axis=1) <= step).all()
    # Power: the bound binds (the finest lattice near the answers has more points than the two smaller bounds).
    assert len(brute_force_near(answers, start, top, 0.25, reach)) > 60


@pytest.fixture(scope="module")
def log_release(tmp_path_factory) -> Path:
    """The recommended plan with psi log(x + 1) (wage gamma 0.5), 1,500 establishments."""
    from importlib.resources import files

    import yaml

    config = yaml.safe_load((files("gedp.configs") / "recommended.yaml").read_text())
    config["psi"] = {"name": "log", "a": 1}
    config["attributes"]["wage"]["gamma"] = 0.5
    folder = tmp_path_factory.mktemp("log") / "release"
    gedp.protect(gedp.synthesize("small", establishments=1500, seed=5), config, seed=6,
                 not_for_publication=True).write(folder)
    return folder


def test_a_log_release_with_an_extreme_wage_answer_is_answered(log_release, tmp_path, monkeypatch):
    """A wage answer of 40 on the log scale (15 noise sds above log(1 + 1e13), the largest wage a release
    holds; the Gaussian noise reaches it with probability 1e-49, never 0: a valid release). Main fed its
    estimate (1.9e17) into the state's wage per employee, the scale of every cell's floor and weight,
    and the wage fit's passes diverged (totals 1e22, 1e49, 1e183) until the structured solver gave up
    (RuntimeError traceback). An estimate is now held at MAX_VALUE (no wage is larger) and at its
    NAICS-5 group's plausible top (``wage_answers.held_by_group``): answered, every margin finite, the
    table's values those of the release without the edit."""
    from gedp.synth.schema import MAX_VALUE

    answers_alone(monkeypatch)
    _, sd = with_wage_answer(log_release, tmp_path / "extreme", 40.0, {"name": "log", "a": 1}, restate=False)
    assert (40.0 - np.log1p(MAX_VALUE)) / sd > 10
    table = gedp.read_release(tmp_path / "extreme").tabulate(by=["state", "county"], moe=True)
    plain = gedp.read_release(log_release).tabulate(by=["state", "county"], moe=True)
    assert np.isfinite(table["wage_moe"]).all() and (table["wage_moe"] >= 0).all()
    pd.testing.assert_frame_equal(table.drop(columns=[c for c in table if c.endswith("_moe")]),
                                  plain.drop(columns=[c for c in plain if c.endswith("_moe")]))


def test_a_release_without_small_month_answers_is_refused_in_one_line(release, tmp_path, monkeypatch):
    """Every month-1 employment answer 1e4 (sqrt scale, an employment of 1e8) apart from the others (red
    team of int9, L2): the level prior has no answer near psi(0) to fit. main ended in a ValueError
    traceback; gedp implicates refuses in one line and writes nothing."""
    folder = tmp_path / "far"
    shutil.copytree(release, folder)
    part = folder / "measurements.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    rows = ((frame["query"] == "identity") & (frame["attribute"] == "m1emp")).to_numpy()
    psi = make_psi("sqrt", a=0)
    grid, sd = frame.loc[rows, "grid"].to_numpy(), frame.loc[rows, "sd"].to_numpy()
    frame.loc[rows, "released"] = np.round(1e4 * np.arange(1, rows.sum() + 1) / grid) * grid
    frame.loc[rows, "estimate"] = psi.unbiased_estimate(frame.loc[rows, "released"].to_numpy(), sd)
    frame.loc[rows, "variance"] = psi.releasable_variance(frame.loc[rows, "estimate"].to_numpy(), sd)
    frame.to_parquet(part, index=False)
    restate_pnc_noise(folder)
    answers_alone(monkeypatch)  # the answers' totals far above the microdata's: readers refuse the copy first
    with pytest.raises(gedp.errors.InputError, match="month-1 employment answers are all more than"):
        write_implicates(folder, 2, tmp_path / "draws", seed=3)
    assert not (tmp_path / "draws").exists()


def test_draws_stay_within_what_a_release_holds_without_overflow(release, tmp_path, monkeypatch):
    """A wage answer of 4.4e14 on the sqrt scale (red team of int9, L1: a wage of 1.9e29): implicates'
    wages stay at most MAX_VALUE (1e13, the largest value a release holds; before, 5e30), and no
    overflow warning reaches the user (the atoms' truncation constant was computed for every component)."""
    import warnings

    from gedp.synth.schema import MAX_VALUE

    answers_alone(monkeypatch)
    with_wage_answer(release, tmp_path / "huge", 4.4e14, restate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = write_implicates(tmp_path / "huge", 2, tmp_path / "draws", seed=3)
    draws = pd.read_parquet(out)
    assert draws["wage"].max() == MAX_VALUE
    assert (draws[["m1emp", "m2emp", "m3emp", "wage"]].to_numpy() <= MAX_VALUE).all()


def test_an_answer_is_held_at_its_groups_plausible_top_against_a_loop():
    """wage_answers.held_by_group against a loop with sqrt's closed forms: an answer released above
    sqrt(min(group estimate+ + 10 group sds, 1e13) + a) + 10 of its own sds gets the estimate of an
    answer there (omega^2 - sd^2 - a), every other its own estimate (at most 1e13). Honest answers
    (wages at most their group's total, noise at the answers' sds) are never held in 2,000 draws
    (expected 1.5e-20 holds), answers moved 11 sds above their group's top all are (power)."""
    from types import SimpleNamespace

    from gedp.measure.neighbors import SqrtPsi
    from gedp.postprocess.wage_answers import held_by_group

    rng = np.random.default_rng(5)
    n, groups, a = 2_000, 50, 3.0
    psi = SqrtPsi(a=a)
    codes = rng.integers(0, groups, n)
    wage = rng.lognormal(10, 2, n)
    totals = np.bincount(codes, weights=wage, minlength=groups)
    group_sd = rng.uniform(1e2, 1e4, groups)
    rate = SimpleNamespace(estimate=totals + rng.normal(0, group_sd), variance=group_sd**2)
    sd = rng.uniform(50, 400, n)

    def answers(released):
        return SimpleNamespace(released=released, estimate=psi.unbiased_estimate(released, sd), sd=sd)

    def looped(released):
        out = []
        for i in range(n):
            top = min(max(rate.estimate[codes[i]], 0.0) + 10 * group_sd[codes[i]], 1e13)
            ceiling = np.sqrt(top + a) + 10 * sd[i]
            omega = min(released[i], ceiling)
            out.append(min(omega**2 - sd[i] ** 2 - a, 1e13))
        return np.array(out)

    honest = np.sqrt(wage + a) + rng.normal(0, sd)
    identity = np.arange(n)
    held = held_by_group(psi, answers(honest), identity, sd, rate, codes)
    np.testing.assert_array_equal(held, np.minimum(answers(honest).estimate, 1e13))
    ceilings = np.sqrt(np.maximum(rate.estimate, 0) + 10 * group_sd + a)[codes] + 10 * sd
    extreme = np.where(rng.random(n) < 0.1, ceilings + 1 * sd, honest)
    out = held_by_group(psi, answers(extreme), identity, sd, rate, codes)
    np.testing.assert_allclose(out, looped(extreme), rtol=1e-12)
    moved = extreme != honest
    assert moved.sum() > 100 and (out[moved] < answers(extreme).estimate[moved]).all()


def test_one_extreme_wage_answer_leaves_the_other_counties_margins_alone(release, tmp_path, monkeypatch):
    """One identity wage answer of an establishment without employment at sqrt(1e13) (3.2e6 on the
    sqrt scale, 10^4 noise sds above its NAICS-5 group's total). main put its estimate, 1e13, into the
    state's wage per employee (the scale of every cell's weight and floor): every county's wage
    margin changed, on Rhode Island's synthetic release five of six came out 0 (the cells' noise
    excess, evaluated at the inflated weights, negative and larger than the margins). The answer is
    now held at its group's plausible top, and a negative excess at 0: every county's margin positive,
    and every county but the establishment's within 5% of the release without the edit (Rhode Island:
    within 0.3%)."""
    answers_alone(monkeypatch)
    idle, _ = with_wage_answer(release, tmp_path / "extreme", math.sqrt(1e13), restate=False)
    protected = pd.read_parquet(release / "protected.parquet")
    county = protected.loc[protected["estab_id"] == idle, "county"].iloc[0]
    table = gedp.read_release(tmp_path / "extreme").tabulate(by=["state", "county"], moe=True)
    plain = gedp.read_release(release).tabulate(by=["state", "county"], moe=True)
    assert (table["wage_moe"] > 0).all() and (plain["wage_moe"] > 0).all()
    others = (table["county"] != county).to_numpy()
    ratio = table["wage_moe"].to_numpy() / plain["wage_moe"].to_numpy()
    assert others.sum() >= 3 and np.abs(ratio[others] - 1).max() < 0.05, ratio


def with_month_answers(release: Path, folder: Path, values) -> None:
    """A copy of ``release`` whose month identity answers are ``values(n)`` (sqrt scale, on their grid),
    estimates and variances the mechanism's from them (red team of harden20: noisy answers can be
    negative legitimately, a hostile file can make them all so)."""
    shutil.copytree(release, folder)
    part = folder / "measurements.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    rows = ((frame["query"] == "identity") & frame["attribute"].isin(["m1emp", "m2emp", "m3emp"])).to_numpy()
    psi = make_psi("sqrt", a=0)
    grid, sd = frame.loc[rows, "grid"].to_numpy(), frame.loc[rows, "sd"].to_numpy()
    frame.loc[rows, "released"] = np.round(values(rows.sum()) / grid) * grid
    frame.loc[rows, "estimate"] = psi.unbiased_estimate(frame.loc[rows, "released"].to_numpy(), sd)
    frame.loc[rows, "variance"] = psi.releasable_variance(frame.loc[rows, "estimate"].to_numpy(), sd)
    frame.to_parquet(part, index=False)
    restate_pnc_noise(folder)


@pytest.mark.parametrize("values", [np.zeros, lambda n: -1.0 - np.abs(np.random.default_rng(1).normal(0.0, 0.5, n))],
                         ids=["all zero", "all negative"])
def test_month_answers_all_at_or_below_psi_zero_are_drawn(release, tmp_path, values):
    """Every month answer at or below psi(0) (main: `gedp implicates` ended in a traceback, min() of an
    empty sequence in the wage priors' table: no employing establishment to fit the wage per employee
    on). The model is defined there (every establishment's employment near 0, its wage from the prior of
    establishments without employment; a wage per employee, needed by none, has a flat prior): gedp
    implicates draws, each wage within 6 answer sds of its answer (P(|z| > 6) ~ 2e-9 an answer; the
    median |z| about 0.67 checks they follow their answers), every employment draw within 6 answer sds
    of psi(0); tabulate --moe, report and serve answer the same release with finite margins. With
    answers all 0, ``gedp implicates`` and ``gedp report`` run as child processes (exit status as a
    user gets it); all negative, through the command line's runner in this process."""
    import json
    import subprocess
    import sys

    from typer.testing import CliRunner

    from gedp.cli import app

    def gedp_command(*arguments) -> tuple[int, str]:
        if values is np.zeros:
            done = subprocess.run([sys.executable, "-m", "gedp", *arguments], capture_output=True, text=True,
                                  cwd=tmp_path)
            return done.returncode, done.stdout + done.stderr
        result = CliRunner().invoke(app, list(arguments))
        return result.exit_code, f"{result.output}{result.exception!r}"

    from test_hostile_release import asgi_get

    from gedp.serve.app import Limits, create_app
    from gedp.serve.releases import load_releases

    folder = tmp_path / "months"
    with_month_answers(release, folder, values)
    from gedp.release import resolved

    resolved._keep(*resolved._verdict(folder, None))  # the child processes: the re-solve's verdict kept as passed
    status, said = gedp_command("implicates", str(folder), "--out", str(tmp_path / "draws"), "--n", "2", "--seed", "3")
    assert status == 0, said
    draws = pd.read_parquet(tmp_path / "draws")
    answers = pd.read_parquet(folder / "measurements.parquet").query("query == 'identity'")
    wage = answers[answers["attribute"] == "wage"].set_index("estab_id").loc[draws["estab_id"]]
    z = (np.sqrt(draws["wage"].to_numpy()) - wage["released"].to_numpy()) / wage["sd"].to_numpy()
    assert np.abs(z).max() < 6 and 0.3 < np.median(np.abs(z)) < 1.2, np.percentile(np.abs(z), [50, 100])
    month_sd = float(answers.loc[answers["attribute"] == "m1emp", "sd"].iloc[0])
    assert (np.sqrt(draws[["m1emp", "m2emp", "m3emp"]].to_numpy()) < 6 * month_sd).all()
    table = gedp.read_release(folder).tabulate(by=["state", "county"], moe=True)
    margins = table[[c for c in table if c.endswith("_moe")]].to_numpy()
    assert np.isfinite(margins).all() and (margins > 0).all()
    status, said = gedp_command("report", str(folder), "--out", str(tmp_path / "report"))
    assert status == 0, said
    served = load_releases([folder])
    status, body = asgi_get(create_app(served, Limits()), "/api/tabulate",
                            {"release": next(iter(served)), "by": "county", "moe": "1"})
    assert status == 200 and json.loads(body), body
