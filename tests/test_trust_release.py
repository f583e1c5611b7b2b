"""What someone holding a release could learn from its bytes: one regression test per finding of the
trust review (issue 12) on the release itself: float bits, row order, seeds, key, manifest fields,
mechanism accounting and solver status."""

import json
import math
import os
import secrets
import subprocess
import sys

import mpmath
import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from gedp import configs
from gedp.cli import app
from gedp.config import load_config
from gedp.measure.grid import low_bits_flag, psi_grid
from gedp.measure.mechanisms import pnc_sensitivity
from gedp.measure.neighbors import LinearPsi, LogPsi, SqrtPsi
from gedp.measure.rng import make_rng
from gedp.measure.workflows import measure
from gedp.postprocess import structured, wages, wls
from gedp.postprocess.wls import SolverError, protect_attribute
from gedp.release.reader import read_release

runner = CliRunner()
CONFIDENTIAL = ["m1emp", "m2emp", "m3emp", "wage"]


def protect(source, out, *extra):
    result = runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out), *map(str, extra)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def sorted_by_size(tmp_path, small_state):
    """The small state ordered by its confidential m1emp, as an agency's extract might be."""
    path = tmp_path / "sorted.parquet"
    small_state.sort_values("m1emp", kind="stable").to_parquet(path, index=False)
    return path


def test_released_rows_do_not_follow_the_input_order(tmp_path, small_state, sorted_by_size):
    """Finding 3: output position was correlated -0.996 with true m1emp when the input was sorted by it."""
    out = protect(sorted_by_size, tmp_path / "r")
    protected = pd.read_parquet(out / "protected.parquet")
    truth = small_state.set_index("estab_id").loc[protected["estab_id"], "m1emp"].to_numpy()
    rho = stats.spearmanr(np.arange(len(truth)), truth).statistic
    # the order is the public keys' order: whatever it correlates with, the public columns show it too
    by_keys = small_state.sort_values(["state", "county", "naics", "estab_id"])
    assert protected["estab_id"].tolist() == by_keys["estab_id"].tolist()
    assert rho == pytest.approx(stats.spearmanr(np.arange(len(truth)), by_keys["m1emp"]).statistic) and rho < 0.5
    measurements = pd.read_parquet(out / "measurements.parquet").query("query == 'identity' and attribute == 'm1emp'")
    assert measurements["estab_id"].tolist() == protected["estab_id"].tolist()
    keys = list(zip(protected["state"], protected["county"], protected["naics"], protected["estab_id"]))
    assert keys == sorted(keys)


def test_release_is_the_same_whatever_the_input_row_order(tmp_path, small_state, sorted_by_size):
    shuffled = tmp_path / "shuffled.parquet"
    small_state.sample(frac=1, random_state=3).to_parquet(shuffled, index=False)
    seeded = ("--seed", 5, "--not-for-publication")
    first = pd.read_parquet(protect(sorted_by_size, tmp_path / "a", *seeded) / "protected.parquet")
    second = pd.read_parquet(protect(shuffled, tmp_path / "b", *seeded) / "protected.parquet")
    pd.testing.assert_frame_equal(first, second)


@pytest.mark.parametrize("flags", [("--seed", 3), ("--rng", "pcg64")])
def test_replayable_noise_is_refused_for_publication(tmp_path, sorted_by_size, flags):
    """Finding 1: a seeded release is replayed and subtracted; it needs --not-for-publication."""
    result = runner.invoke(app, ["protect", str(sorted_by_size), "--out", str(tmp_path / "r"), *map(str, flags)])
    assert result.exit_code == 2 and result.output.startswith("error: ") and len(result.output.splitlines()) == 1
    assert "--not-for-publication" in result.output and not (tmp_path / "r").exists()
    manifest = json.loads((protect(sorted_by_size, tmp_path / "t", *flags, "--not-for-publication")
                           / "manifest.json").read_text())
    assert manifest["publishable"] is False and manifest["rng"]["kind"] in ("seed", "os-entropy")


def test_secure_key_has_256_bits_of_entropy(monkeypatch):
    """Finding 7: the key went through a SeedSequence (a 128-bit pool); it is now the ChaCha key itself."""
    keys = []

    def randbits(k):
        keys.append((k, (1 << 255) | 0xABCDEF))
        return keys[-1][1]

    monkeypatch.setattr(secrets, "randbits", randbits)
    rng, description = make_rng(None)
    assert description["kind"] == "secure" and keys[0][0] == 256
    key_words = rng.bit_generator.state["state"]["keysetup"]
    assert int(sum(int(w) << (32 * i) for i, w in enumerate(key_words))) == keys[0][1]


def test_released_manifest_has_no_paths_no_timings_and_the_charged_mu(tmp_path, sorted_by_size):
    """Finding 8 and 11: no absolute path, no timing; mu_total is composed from what was charged."""
    config = tmp_path / "private-dir" / "agency.yaml"
    config.parent.mkdir()
    config.write_text(configs.path("employment").read_text())
    out = tmp_path / "r"
    result = runner.invoke(app, ["protect", str(sorted_by_size), "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    text = json.dumps(manifest)
    assert str(tmp_path) not in text and "private-dir" not in text and "agency" not in text
    assert "seconds" not in text and "timings" not in manifest and manifest["config_name"] == "custom"
    assert manifest["publishable"] is True
    assert manifest["mu_total"] <= manifest["mu_planned_total"] * (1 + 1e-9)
    assert manifest["mu_total"] == pytest.approx(manifest["mu_planned_total"], rel=1e-9)


def test_release_files_carry_no_write_times(tmp_path, small_state):
    """The times at which a two-state release's parts were written would tell how long each state
    took: every file and folder is dated the manifest's created_date at midnight UTC instead (access
times too, until a reader opens them). Power:
    a file written now is not dated so (its time has a fraction of a day)."""
    two = pd.concat([small_state, small_state.iloc[:2000].assign(
        state="45", estab_id=lambda d: "45-" + d["estab_id"].astype(str))])
    source = tmp_path / "two.parquet"
    two.to_parquet(source, index=False)
    out = protect(source, tmp_path / "r", "--seed", 1, "--not-for-publication")
    created = json.loads((out / "manifest.json").read_text())["created_date"]
    midnight = pd.Timestamp(created, tz="UTC").timestamp()
    paths = [out, *out.rglob("*")]
    assert len([p for p in paths if p.name.startswith("part-")]) >= 4
    assert {os.stat(p).st_mtime for p in paths} == {midnight}
    probe = tmp_path / "probe"
    probe.write_text("x")
    assert os.stat(probe).st_mtime != midnight


def test_every_released_value_is_a_whole_multiple_of_the_published_grid(tmp_path, sorted_by_size):
    """Finding 2: no released float carries low bits beyond its grid."""
    out = protect(sorted_by_size, tmp_path / "r")
    measurements = pd.read_parquet(out / "measurements.parquet")
    manifest = json.loads((out / "manifest.json").read_text())
    units = measurements["released"] / measurements["grid"]
    assert (units == np.rint(units)).all() and (measurements["grid"] > 0).all()
    for (query, attribute), grid in measurements.groupby(["query", "attribute"])["grid"].first().items():
        assert manifest["grid"][query][attribute] == grid
    identity = measurements.query("query == 'identity'")
    assert identity["grid"].eq(psi_grid(0.5)).all()
    assert not low_bits_flag(identity["released"].to_numpy()).any()


def test_sqrt_clip_sensitivity_does_not_cancel_at_tiny_gamma():
    """Finding 10: u - (sqrt(u) - gamma)^2 lost 5 digits at gamma 1e-9; checked against 50-digit arithmetic."""
    mpmath.mp.dps = 50
    clips = np.array([1.0, 1e3, 1e6, 1e9])
    for psi in (SqrtPsi(a=0.0), SqrtPsi(a=2.5)):
        for gamma in (1e-9, 1e-3, 0.5):
            lower = [max(mpmath.mpf(0), (mpmath.sqrt(mpmath.mpf(u) + psi.a) - gamma) ** 2 - psi.a) for u in clips]
            exact = [float(mpmath.mpf(u) - x) for u, x in zip(clips, lower)]
            np.testing.assert_allclose(pnc_sensitivity(clips, psi, gamma), exact, rtol=1e-13)


def test_log_and_linear_clip_sensitivities_match_high_precision():
    mpmath.mp.dps = 50
    clips = np.array([5.0, 1e4, 1e8])
    for gamma in (1e-9, 0.1, 2.0):
        log = LogPsi(a=1.0)
        exact = [float(mpmath.mpf(u) - ((u + 1) * mpmath.exp(-gamma) - 1)) if (u + 1) * math.exp(-gamma) >= 1 else u
                 for u in clips]
        np.testing.assert_allclose(pnc_sensitivity(clips, log, gamma), exact, rtol=1e-13)
        np.testing.assert_allclose(pnc_sensitivity(clips, LinearPsi(d=3.0), gamma), np.minimum(3 * gamma, clips))


def test_log_psi_variance_estimates_take_arrays():
    """Finding 10: math.expm1 on an array crashed exact and hybrid variances under log psi."""
    x, sd = np.array([0.0, 10.0, 1e4]), np.array([0.1, 0.2, 0.3])
    np.testing.assert_allclose(LogPsi(a=1.0).estimate_variance(x, sd), (x + 1) ** 2 * np.expm1(sd**2), rtol=1e-15)


@pytest.fixture
def log_wage_answers(tmp_path, small_state):
    config = yaml.safe_load(configs.path("baseline").read_text())
    config.update(psi={"name": "log", "a": 1.0}, attributes={"wage": {"gamma": 0.5}})
    config["queries"] = [{"by": q["by"], "mu": {"wage": 1.0}} for q in config["queries"]]
    config.pop("mu_cap", None)
    path = tmp_path / "log.yaml"
    path.write_text(yaml.safe_dump(config))
    measurements = measure(small_state, load_config(str(path)).plan, rng=np.random.default_rng(0))
    return measurements.for_attribute("wage"), small_state.drop(columns=CONFIDENTIAL)


def test_plans_without_identity_fall_back_to_clarabel(log_wage_answers):
    """Finding 10: OSQP reported these log-wage problems 'infeasible'; Clarabel solves them."""
    answers, public = log_wage_answers
    with pytest.raises(SolverError, match="infeasible"):
        protect_attribute(answers[1:], public, solver="osqp")
    result = protect_attribute(answers[1:], public)
    assert result.solver == "clarabel" and result.status == "optimal" and (result.values >= 0).all()


def test_a_solution_that_is_not_optimal_is_refused(monkeypatch, small_state):
    """Finding 10: the structured solver's status was 'optimal' whatever its KKT residual."""
    plan = load_config("employment").plan
    answers = measure(small_state, plan, rng=np.random.default_rng(1)).for_attribute("m1emp")
    public = small_state.drop(columns=CONFIDENTIAL)
    solve = structured.solve_structured_wls

    def perturbed(*args, **kwargs):
        values, iterations, info = solve(*args, **kwargs)
        return values * 1.5 + 1.0, iterations, info

    monkeypatch.setattr(wls, "solve_structured_wls", perturbed)
    with pytest.raises(SolverError, match="KKT residual"):
        protect_attribute(answers, public, solver="structured")

    def overflowing(*args, **kwargs):  # psi sqrt a = 1e300 gave objective inf, reported 'optimal'
        values, iterations, info = solve(*args, **kwargs)
        return np.full_like(values, np.inf), iterations, info

    monkeypatch.setattr(wls, "solve_structured_wls", overflowing)
    with pytest.raises(SolverError, match="non-finite"):
        protect_attribute(answers, public, solver="structured")

    def diverging(*args, **kwargs):
        raise RuntimeError("pivoting did not converge in 100 rounds")

    monkeypatch.setattr(wls, "solve_structured_wls", diverging)
    with pytest.raises(SolverError, match="structured solver: pivoting"):
        protect_attribute(answers, public, solver="structured")


def test_values_beyond_the_grid_range_are_refused_from_public_bounds_only(tmp_path):
    """Attacker review F3/F4: int64 group sums wrapped (1,000 wages of 1e13 released -8e15), and a
    total too large for the psi grid ended in a traceback that depended on the data. Group sums are
    now exact at any size (``test_grid_range``); what is refused, on public bounds (clip levels,
    MAX_VALUE, the noise sd) before any value is gridded, is noise beyond the grid's range."""
    from gedp.measure.grid import VALUE_GRID
    from gedp.measure.mechanisms import pnc_mechanism
    from gedp.measure.queries import Grouping
    from gedp.synth.schema import InputError

    rng = np.random.default_rng(0)
    grouping = Grouping(("state",), np.zeros(1_000, dtype=np.int64), pd.DataFrame(index=range(1)))
    clip = np.full(1_000, 1e13)
    for values in (np.full(1_000, 1e13), np.zeros(1_000)):  # the refusal does not depend on the values
        with pytest.raises(InputError, match="noise sd up to .* is beyond the release grid's range"):
            pnc_mechanism(values, grouping, clip, attribute="wage", psi=SqrtPsi(), gamma=50, mu=1e-6, rng=rng)
    answer = pnc_mechanism(np.full(1_000, 1e13), grouping, clip, attribute="wage", psi=SqrtPsi(), gamma=50, mu=0.15,
                           rng=rng)
    assert answer.released[0] == pytest.approx(1e16, rel=1e-6) and answer.released[0] % VALUE_GRID == 0


@pytest.fixture
def sorted_by_wage(tmp_path, small_state):
    path = tmp_path / "by-wage.parquet"
    small_state.sort_values("wage", kind="stable").to_parquet(path, index=False)
    return path


def test_released_wages_and_their_solver_report_follow_from_the_other_released_files(tmp_path, sorted_by_wage):
    """Wages informed by employment (issue 13) are postprocessing: recomputed from the release's
    measurements, public columns and protected employment alone, they come back bit for bit, and
    so does the manifest's solver entry for wages (no timing, nothing else). Any confidential input
    to the fit, even in the lowest bit, would break the equality."""
    out = tmp_path / "r"
    result = runner.invoke(app, ["protect", str(sorted_by_wage), "--out", str(out)])  # the default config, secure
    assert result.exit_code == 0, result.output
    protected, answers = read_release(out)
    manifest = json.loads((out / "manifest.json").read_text())
    psi = load_config("baseline").plan.psi
    recomputed = wages.protect_wages(answers, protected.drop(columns="wage"), psi)
    assert np.array_equal(recomputed.values, protected["wage"].to_numpy())
    [state] = manifest["states"]
    assert manifest["per_state"][state]["solver"]["wage"] == {**recomputed.report(), "model": "wage prior"}
    assert manifest["solver"]["wage"]["kkt_residual"] == recomputed.kkt_residual


@pytest.mark.parametrize("rounding", ["--no-integer", "--integer"])
def test_wage_release_is_the_same_whatever_the_input_row_order(tmp_path, small_state, sorted_by_wage, rounding):
    """Under the baseline plan (wages informed by employment), an input sorted by its confidential
    wages and a shuffled one give the same files: neither order nor float bits depend on the input's;
    nor do the ties of controlled rounding (broken in release order) with --integer."""
    shuffled = tmp_path / "shuffled.parquet"
    small_state.sample(frac=1, random_state=4).to_parquet(shuffled, index=False)
    files = []
    for source, name in ((sorted_by_wage, "a"), (shuffled, "b")):
        out = tmp_path / name
        result = runner.invoke(app, ["protect", str(source), "--seed", "5", "--not-for-publication", "--out", str(out),
                                     rounding])
        assert result.exit_code == 0, result.output
        parts = [*sorted((out / "protected.parquet").rglob("*")), out / "qcew_tables.csv"]
        files.append([(part.relative_to(out).as_posix(), part.read_bytes()) for part in parts if part.is_file()])
    assert len(files[0]) > 1 and files[0] == files[1]


def test_release_bytes_do_not_depend_on_the_number_of_blas_threads(tmp_path):
    """Postprocessing runs its linear algebra on one BLAS thread: the same seed gives the same bytes
    whether the process may use 1 or 2 BLAS threads (before, wage low bits moved with the thread
    count: a release then told something about the machine, and reruns were not reproducible)."""
    from gedp.synth.profiles import generate_profile, load_profile

    source = tmp_path / "state.parquet"
    generate_profile(load_profile("small"), rng=np.random.default_rng(11)).to_parquet(source, index=False)
    files = []
    for threads in ("1", "2"):
        out = tmp_path / f"t{threads}"
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        subprocess.run([sys.executable, "-m", "gedp", "protect", str(source), "--seed", "5", "--not-for-publication",
                        "--out", str(out)], env=env, check=True, capture_output=True)
        files.append({part.relative_to(out).as_posix(): part.read_bytes()
                      for part in sorted(out.rglob("*")) if part.is_file()})
    assert len(files[0]) > 3 and files[0] == files[1]
