"""The budget planner: predicted errors against independent computations and simulated releases,
the search against brute force, and the plan it writes."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.config import load_config, parse_config
from gedp.measure.workflows import measure
from gedp.planning import search, shapes
from gedp.planning.candidates import Candidate, combinations
from gedp.planning.finalists import calibrated_errors
from gedp.planning.predict import median_relative_error, target_cells
from gedp.planning.predictor import StandIn, employment_errors, predict_config, wage_errors
from gedp.planning.rule import Rule, kind_error
from gedp.planning.shapes import Allocation, Shape
from gedp.planning.simulate import MIN_CELL_RELEASES, calibrated
from gedp.postprocess.models import PostprocessOptions
from gedp.postprocess.protect import protect_microdata
from gedp.synth.schema import public_columns

LEVELS = (75, 74, 54)


@pytest.fixture(scope="module")
def standin(small_state):
    return StandIn(small_state, target_cells(small_state, None, LEVELS, ["m1emp", "m2emp", "wage"]), "small")


def test_median_of_one_cell_is_the_half_normal_median():
    # |Z| has median Phi^-1(0.75) = 0.6745
    assert median_relative_error(np.array([100.0]), np.array([4.0])) == pytest.approx(0.6745 * 2 / 100, rel=1e-4)


def test_median_of_a_mixture_matches_sampling():
    rng = np.random.default_rng(3)
    true, variance = np.array([10.0, 50.0, 400.0, 0.5]), np.array([4.0, 1.0, 900.0, 1.0])
    draws = np.abs(rng.normal(size=(400_000, 3)) * np.sqrt(variance[:3])) / true[:3]
    # the cell below 1 is left out, as evaluation.accuracy leaves it out
    assert median_relative_error(true, variance) == pytest.approx(np.median(draws), rel=0.01)


def test_shares_add_up_and_plan_spends_the_total():
    shape = Shape(Allocation((shapes.STATE, shapes.CELL), 0.6, 0.12), Allocation((shapes.NAICS5,), 0.35))
    for allocation in (shape.employment, shape.wage):
        assert sum(allocation.shares().values()) == pytest.approx(1.0)
    config = parse_config(shapes.config_mapping(shape, 2.3065, 0.2, load_config("baseline").raw), "<t>")
    total = config.plan.budget().total
    assert 2.3065 - 1e-3 < total <= 2.3065
    mus = {q.by: q.mu for q in config.plan.queries}
    assert sum(mu**2 for mu in mus[("state", "naics5")].values()) == pytest.approx(
        2.3065**2 * 0.2 * 0.65, rel=1e-3)  # wage mu^2 share x NAICS-5's share of it
    assert mus[("state",)]["m1emp"] ** 2 == pytest.approx(2.3065**2 * 0.8 / 3 * 0.12, rel=1e-3)


def test_written_plan_loads_and_protects(small_state, tmp_path):
    shape = Shape(Allocation((shapes.CELL,), 0.8), Allocation((shapes.NAICS5, shapes.CELL), 0.65))
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(shapes.config_mapping(shape, 2.3065, 0.25, load_config("baseline").raw)))
    release = gedp.protect(small_state, str(path), seed=1, not_for_publication=True)
    assert release.manifest["mu_total"] <= 2.3065
    assert np.isfinite(release.microdata["wage"]).all() and (release.microdata["m1emp"] >= 0).all()


def test_plan_reads_only_the_published_file():
    parameters = inspect.signature(search.make_plan).parameters
    assert list(parameters)[0] == "published_qcew"
    assert not any("micro" in name or "truth" in name for name in parameters)


def _direct(standin, shape, share):
    config = parse_config(shapes.config_mapping(shape, 2.3065, share, load_config("baseline").raw), "<t>")
    return predict_config(standin, config, ["m1emp", "wage"])


def test_search_picks_what_brute_force_picks(standin):
    """The 1 / mu scaling of the search against every pair and share predicted at its own budget."""
    base = load_config("baseline")
    employment_allocations = [Allocation(shapes.query_sets()[0], 0.6), Allocation((shapes.CELL,), 0.8),
                              Allocation(())]
    wage_allocations = [Allocation((shapes.NAICS5,), 0.65), Allocation(())]
    base_errors = predict_config(standin, base, ["m1emp", "wage"])
    rule = Rule(dict.fromkeys(LEVELS, 1.0), tolerance=np.inf)
    employment = employment_errors(standin, base, 2.3065, employment_allocations, lambda d: None)
    wages = wage_errors(standin, base, 2.3065, wage_allocations, lambda d: None)
    ranked = [c for c in combinations(employment, wages, base_errors, rule) if c.wage_share in (0.1, 0.2, 0.3)]
    brute = []
    for candidate in ranked:
        errors = _direct(standin, candidate.shape, candidate.wage_share)
        brute.append(Candidate(candidate.shape, candidate.wage_share, rule.judge(errors, base_errors), errors))
    best = min(brute, key=lambda c: c.score)
    assert (ranked[0].shape, ranked[0].wage_share) == (best.shape, best.wage_share) or (
        next(c.score for c in brute if (c.shape, c.wage_share) == (ranked[0].shape, ranked[0].wage_share))
        <= best.score + 0.02)  # a tie within 2% of error: the scaling's approximation


def test_calibration_keeps_analytic_medians_where_cells_are_few():
    analytic = {78: {"m1emp": 0.05, "wage": 0.08}, 51: {"m1emp": 0.001, "wage": 0.002}}
    simulated = {78: {"m1emp": 0.04, "wage": 0.10}, 51: {"m1emp": 0.003, "wage": 0.0001}}
    counts = {78: {"m1emp": MIN_CELL_RELEASES, "wage": MIN_CELL_RELEASES - 1}, 51: {"m1emp": 2, "wage": 2}}
    assert calibrated(analytic, simulated, counts) == {78: {"m1emp": 0.04, "wage": 0.08},
                                                       51: {"m1emp": 0.001, "wage": 0.002}}


def _simulated_medians(small_state, standin, config, seeds):
    """Per (level, attribute): each release's relative errors on the target cells (true >= 1)."""
    public = small_state[public_columns(small_state)]
    errors: dict = {}
    for seed in seeds:
        answers = measure(small_state, config.plan, rng=np.random.default_rng(seed))
        release, _ = protect_microdata({a: answers.for_attribute(a) for a in config.plan.attributes}, public,
                                       PostprocessOptions.from_config(config))
        for target in standin.cells:
            inside = target.codes >= 0
            for attribute in ("m1emp", "wage"):
                sums = np.bincount(target.codes[inside], weights=release[attribute].to_numpy()[inside],
                                   minlength=target.n_cells)
                true = target.true[attribute]
                keep = true >= 1
                errors.setdefault((target.level, attribute), []).append(np.abs(sums - true)[keep] / true[keep])
    return errors


@pytest.mark.slow
def test_prediction_matches_simulated_releases(standin, small_state):
    """The calibrated prediction against 30 independent simulated releases, within 15%.

    False failures: the bootstrap sd of the simulated median over releases is asserted below 6% of
    it (1.4-5.8% measured); the prediction's own sampling error (three releases where simulated, none
    where analytic) is larger at these cell counts (misses of 0-11% measured with two releases), so a miss
    beyond 15% is about a 2-sd event for the simulated levels: up to a few percent per comparison
    over seeds; the seeds are fixed, so the test is deterministic. Power: a prediction 30% too high
    (the size of the analytic wage error's bias on Rhode Island's county cells) fails at every level.
    """
    shape = Shape(Allocation((shapes.STATE, shapes.NAICS5, shapes.CELL), 0.6, 0.12), Allocation((shapes.NAICS5,), 0.65))
    config = parse_config(shapes.config_mapping(shape, 2.3065, 0.2, load_config("baseline").raw), "<t>")
    analytic = predict_config(standin, config, ["m1emp", "wage"])
    predicted = calibrated_errors(standin, config, analytic)
    errors = _simulated_medians(small_state, standin, config, range(100, 130))
    rng = np.random.default_rng(0)
    for (level, attribute), values in errors.items():
        simulated = np.median(np.concatenate(values))
        boot = [np.median(np.concatenate([values[i] for i in rng.integers(0, len(values), len(values))]))
                for _ in range(200)]
        assert 2.5 * np.std(boot) < 0.15 * simulated, (level, attribute)
        assert predicted[level][attribute] == pytest.approx(simulated, rel=0.15), (level, attribute)
        assert abs(1.3 * predicted[level][attribute] / simulated - 1) > 0.15, (level, attribute)


@pytest.fixture(scope="module")
def planned_by_command(shared_data, tmp_path_factory):
    """``gedp plan`` on Rhode Island's published file, run once for the module (a plan of a state costs
    about 30 s of processor time): what it printed and the plan it wrote."""
    out = tmp_path_factory.mktemp("plan") / "plan.yaml"
    run = CliRunner().invoke(app, ["plan", "--from-qcew", str(shared_data / "qcew_2016q1_44.csv"), "--out", str(out)])
    return run, out


@pytest.mark.slow
def test_plan_command_end_to_end(planned_by_command):
    run, out = planned_by_command
    assert run.exit_code == 0, run.output
    assert "Predicted median relative error" in run.output
    config = load_config(out)
    assert config.plan.budget().total <= 2.3065
    assert (out.parent / "plan.summary.json").is_file() and (out.parent / "plan.frontier.png").is_file()


def test_plan_command_refuses_bad_weights(shared_data, tmp_path):
    run = CliRunner().invoke(app, ["plan", "--from-qcew", str(shared_data / "qcew_2016q1_44.csv"), "--out",
                                   str(tmp_path / "p.yaml"), "--weights", "jobs=1"])
    assert run.exit_code == 2
    assert "weights" in run.output


@pytest.mark.parametrize("weights, message", [
    ("employment=inf,wage=1", "must be a finite number"),
    ("employment=nan,wage=1", "must be a finite number"),
    ("employment=,wage=1", "must be a finite number"),
    ("employment=1,employment=2", "names 'employment' twice"),
])
def test_plan_command_refuses_weights_that_are_not_one_finite_number_each(shared_data, tmp_path, weights, message):
    """Red team rt23 F3: inf was taken (every score NaN, the plan chosen by NaN comparisons, its summary holding
    NaN and Infinity), an empty value ended in an IndexError traceback, and a weight named twice kept the last."""
    run = CliRunner().invoke(app, ["plan", "--from-qcew", str(shared_data / "qcew_2016q1_44.csv"), "--out",
                                   str(tmp_path / "p.yaml"), "--weights", weights])
    assert run.exit_code == 2 and message in run.output, run.output
    assert not (tmp_path / "p.yaml").exists()


def test_plan_beside_baseline_report(small_state, tmp_path):
    from gedp.evaluation.accuracy import compute_accuracy
    from gedp.evaluation.plan_comparison import Comparison, render_comparison

    shape = Shape(Allocation((shapes.STATE, shapes.CELL), 0.8, 0.12), Allocation((shapes.NAICS5,), 0.65))
    plan = parse_config(shapes.config_mapping(shape, 2.3065, 0.2, load_config("baseline").raw), "<t>")
    runs = [compute_accuracy(small_state, config, published=None, replications=1, seed=4, data_label="small")
            for config in (plan, load_config("baseline"))]
    summary = render_comparison(Comparison(*runs, "p"), tmp_path)
    cells = runs[0].levels[78]
    keep = cells.true["wage"] >= 1
    error = np.abs(cells.protected["wage"][0, keep] - cells.true["wage"][keep]) / cells.true["wage"][keep]
    assert summary["within_level_78"]["plan"]["wage"]["25%"] == pytest.approx(np.mean(error <= 0.25))
    assert (tmp_path / "report.md").is_file() and (tmp_path / "plan" / "summary.json").is_file()
    assert summary["baseline"]["levels"]["78"]["m1emp"]["all"]["cells"] == cells.true["m1emp"].size


def test_coarse_to_fine_refines_the_best_sets_only():
    """Sets scored by a known error (set index + 1, times the identity share), so the best sets are the
    first ones; only they are predicted at the second share."""
    sets = shapes.query_sets()[:5]
    base = {78: {"m1emp": 1.0}, 75: {"m1emp": 1.0}}
    asked: list[Allocation] = []

    def predict(chosen):
        asked.extend(chosen)
        return {a: {level: {"m1emp": (sets.index(a.groups) + 1) * a.identity_share} for level in base}
                for a in chosen}

    errors = search.coarse_to_fine(predict, sets, (0.6, 0.8), (0.03,), base, "m1emp")
    assert {a.groups for a in asked if a.identity_share == 0.6} == set(sets)
    assert {a.groups for a in asked if a.identity_share == 0.8} == set(sets[:search.REFINED_SETS])
    assert len(asked) == len(set(asked)) == len(errors) == len(sets) + search.REFINED_SETS


def test_simulated_release_is_what_gedp_protect_releases(small_state, monkeypatch):
    """A simulated release of the stand-in is the release `gedp protect` makes from the same
    measurements (months smoothed once, as the config says): its median errors per level are those
    of the release's protected microdata, recomputed with pandas group-bys."""
    from gedp.evaluation.accuracy import qcew_keys
    from gedp.planning import simulate
    from gedp.release.format import release_order
    from gedp.release.reader import read_answers

    config = load_config("recommended")
    truth = release_order(small_state)
    release = gedp.protect(truth, config, seed=3, not_for_publication=True)
    answers = read_answers(release.folder)

    class Replayed:
        def for_attribute(self, attribute):
            return answers[attribute]

    monkeypatch.setattr(simulate, "measure", lambda *args, **kwargs: Replayed())
    cells = target_cells(truth, None, (75, 78), ["m1emp", "m2emp", "wage"], max_cells=None)
    medians, _ = simulate.simulated_errors(truth, cells, config, ["m1emp", "m2emp", "wage"], releases=1, seed=1)
    for level in (75, 78):
        by = qcew_keys(truth, level)
        true = truth.groupby(by, observed=True)[["m1emp", "m2emp", "wage"]].sum()
        got = release.microdata.groupby(by, observed=True)[["m1emp", "m2emp", "wage"]].sum().loc[true.index]
        for attribute in ("m1emp", "m2emp", "wage"):
            keep = true[attribute] >= 1
            error = (got[attribute] - true[attribute]).abs()[keep] / true[attribute][keep]
            assert medians[level][attribute] == pytest.approx(np.median(error), rel=1e-6), (level, attribute)


def test_plan_command_passes_the_agency_choices_only_when_set(shared_data, tmp_path, monkeypatch):
    """Without --weights and --targets the planner gets None (its default rule, guarded by
    recommended); with them, what the agency set."""
    seen = []

    def stop(*args, **kwargs):
        seen.append((kwargs["weights"], kwargs["targets"]))
        raise gedp.errors.InputError("stopped")

    from gedp.planning import plan_request

    monkeypatch.setattr(plan_request, "make_plan", stop)  # the planner that gedp plan calls
    source = str(shared_data / "qcew_2016q1_44.csv")
    for extra in ([], ["--weights", "employment=1,wage=3", "--targets", "78,75"]):
        CliRunner().invoke(app, ["plan", "--from-qcew", source, "--out", str(tmp_path / "p.yaml"), *extra])
    assert seen == [(None, None), ({"employment": 1.0, "wage": 3.0}, [78, 75])]


@pytest.mark.slow
def test_the_same_file_gives_the_same_plan(shared_data, planned_by_command):
    """Twice from Rhode Island's published file, by the API and by ``gedp plan`` (the module's run, which
    the command's test reads too: one plan of a state fewer): the same plan, choice and predictions. The
    command's side is read back from what it wrote: the plan's YAML (the config, and the header's
    predictions to 2 decimals) whole, and the summary's predicted errors of the plan and the base plan
    (JSON keeps every bit of a float)."""
    from gedp.planning.output import plan_yaml

    run, out = planned_by_command
    assert run.exit_code == 0, run.output
    result = gedp.plan(str(shared_data / "qcew_2016q1_44.csv"))
    written = out.read_text()
    assert yaml.safe_load(written) == result.config
    assert plan_yaml(result) == written
    predicted = json.loads((out.parent / "plan.summary.json").read_text())["predicted"]
    assert predicted["plan"] == {str(level): dict(errors) for level, errors in result.chosen.errors.items()}
    assert predicted["base"] == {str(level): dict(errors) for level, errors in result.base.items()}
    # never behind recommended on the levels that carry most cells (the rule's guard, on its own predictions)
    chosen, reference = result.chosen.errors, result.recommended.errors
    assert all(kind_error(chosen[level], kind) <= kind_error(reference[level], kind)
               for level in result.rule.major for kind in ("employment", "wage"))
