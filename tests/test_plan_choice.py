"""How the planner chooses: the acceptance rule and its fallback on hand-computed cases, the default
targets, the small county queries, which finalists are simulated, and the margin machinery's
gathered blocks against the component-by-component forms."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from gedp.planning import search, shapes
from gedp.planning.output import acceptance_lines, plan_yaml
from gedp.planning.predict import published_levels
from gedp.planning.search import Candidate, PlanResult, close, preference, score
from gedp.planning.shapes import Allocation, Shape
from gedp.postprocess import structured
from gedp.postprocess.structured import CellOperator
from gedp.synth.qcew import read_qcew

WEIGHTS = {"employment": 1.0, "wage": 1.0}
BASE = {78: {"m1emp": 1.0, "wage": 1.0}, 71: {"m1emp": 1.0, "wage": 1.0}}
SHAPE = Shape(Allocation((shapes.CELL,), 0.6), Allocation(()))


def _errors(at_78: tuple[float, float], at_71: tuple[float, float]) -> dict:
    return {78: {"m1emp": at_78[0], "wage": at_78[1]}, 71: {"m1emp": at_71[0], "wage": at_71[1]}}


# Errors against a base plan at 1.0 everywhere. By hand (natural logs), score = the mean over
# employment and wages of the mean over levels of log(ratio):
#   A: employment (log 0.5 + log 1.2) / 2 = -0.25541, wages (log 0.5 + 0) / 2 = -0.34657 -> -0.30099; worst 1.20
#   B: employment (log 0.8 + log 1.08) / 2 = -0.07309, wages log 0.8 / 2 = -0.11157 -> -0.09233; worst 1.08
#   C: employment (log 0.95 + log 1.02) / 2 = -0.01575, wages log 0.95 / 2 = -0.02565 -> -0.02070; worst 1.02
HAND = {"A": (_errors((0.5, 0.5), (1.2, 1.0)), -0.30099, 1.20),
        "B": (_errors((0.8, 0.8), (1.08, 1.0)), -0.09233, 1.08),
        "C": (_errors((0.95, 0.95), (1.02, 1.0)), -0.02070, 1.02)}


def _candidates() -> dict[str, Candidate]:
    out = {}
    for name, (errors, _, _) in HAND.items():
        value, worst = score(errors, BASE, WEIGHTS)
        out[name] = Candidate(SHAPE, 0.1, value, worst, errors)
    return out


def test_scores_and_worst_ratios_are_the_hand_computed_ones():
    for name, candidate in _candidates().items():
        assert candidate.score == pytest.approx(HAND[name][1], abs=1e-5), name
        assert candidate.worst_ratio == pytest.approx(HAND[name][2], rel=1e-12), name


def test_acceptable_shapes_first_best_score_wins():
    """At 10%: B and C are acceptable (A is 20% worse at level 71 despite the best score); B scores better."""
    candidates = _candidates()
    assert min(candidates.values(), key=lambda c: preference(c, 0.10)) is candidates["B"]
    ranked = sorted(candidates.values(), key=lambda c: preference(c, 0.10))
    assert [c.errors for c in ranked] == [HAND[name][0] for name in "BCA"]


def test_without_an_acceptable_shape_the_smallest_worst_ratio_wins():
    """At 1%, none is acceptable: C (worst 1.02) is chosen, not A (best score, worst 1.20)."""
    candidates = _candidates()
    assert min(candidates.values(), key=lambda c: preference(c, 0.01)) is candidates["C"]


def _result(candidate: Candidate, tolerance: float) -> PlanResult:
    return PlanResult({"queries": []}, candidate, BASE, None, {}, [candidate], 2.3065, "test.csv", 1.0,
                      tolerance=tolerance)


def test_the_plan_says_when_it_is_the_least_bad():
    candidates = _candidates()
    fallback = _result(candidates["C"], 0.01)
    assert not fallback.acceptable
    assert fallback.worst() == (71, "employment", pytest.approx(1.02))
    header = plan_yaml(fallback)
    assert "# No shape searched is predicted within 1% of the base plan's error" in header
    assert "x1.02 the base plan's error (employment, level 71)" in header
    accepted = _result(candidates["B"], 0.10)
    assert accepted.acceptable
    assert acceptance_lines(accepted) == ["Every target level is predicted within 10% of the base plan's error or "
                                          "better; the worst: x1.08 the base plan's error (employment, level 71)."]


def test_a_finalist_is_simulated_when_its_proxy_comes_close():
    """close(): within SIMULATION_MARGIN (0.03) in score among acceptable ones, or acceptable at
    10% + 3% against a best that is not."""
    candidates = _candidates()
    best = candidates["B"]  # acceptable, score -0.09233
    near = Candidate(SHAPE, 0.1, best.score + 0.029, 1.05, best.errors)
    far = Candidate(SHAPE, 0.1, best.score + 0.031, 1.05, best.errors)
    assert close(near, best, 0.10) and not close(far, best, 0.10)
    assert not close(candidates["A"], best, 0.10)  # worst 1.20 > 1.13
    least_bad = candidates["C"]  # at 1%: not acceptable, worst 1.02
    assert close(Candidate(SHAPE, 0.1, 0.5, 1.035, best.errors), least_bad, 0.01)  # acceptable at 4%
    assert not close(Candidate(SHAPE, 0.1, -1.0, 1.06, best.errors), least_bad, 0.01)  # 1.06 > 1.02 + 0.03


def test_a_small_county_query_takes_its_share_from_the_other_group_bys():
    allocation = Allocation((shapes.STATE, shapes.NAICS5, shapes.CELL), 0.6, 0.12).with_county(0.05)
    assert allocation.groups == (shapes.STATE, shapes.NAICS5, shapes.COUNTY, shapes.CELL)
    # by hand: state 0.12, identity 0.88 x 0.6 = 0.528, county 0.05, the other two (1 - 0.698) / 2 = 0.151
    assert allocation.shares() == pytest.approx({(): 0.528, shapes.STATE: 0.12, shapes.COUNTY: 0.05,
                                                 shapes.NAICS5: 0.151, shapes.CELL: 0.151})
    assert "5% county" in allocation.label


def test_county_variants_come_from_the_best_sets_without_a_county_query():
    base = {78: {"m1emp": 1.0}}
    errors = {Allocation(shapes.query_sets()[0], 0.6): {78: {"m1emp": 0.5}},  # has a county query
              Allocation((shapes.CELL,), 0.6): {78: {"m1emp": 0.7}},
              Allocation((shapes.NAICS5, shapes.CELL), 0.8): {78: {"m1emp": 0.8}},
              Allocation((shapes.NAICS5, shapes.CELL), 0.6): {78: {"m1emp": 0.9}},
              Allocation(()): {78: {"m1emp": 0.6}}}  # nothing to take a county share from
    variants = search.county_variants(errors, base, "m1emp", (0.02, 0.1, 0.3))
    # the two best sets without a county query, then the best with one; 0.3 only where the group-bys
    # other than the state query have more: 0.4 at 60% identity, 0.2 at 80%, 0.97 x 0.4 for the five
    assert [(v.groups, v.identity_share, v.county_share) for v in variants] == [
        ((shapes.COUNTY, shapes.CELL), 0.6, 0.02), ((shapes.COUNTY, shapes.CELL), 0.6, 0.1),
        ((shapes.COUNTY, shapes.CELL), 0.6, 0.3),
        ((shapes.NAICS5, shapes.COUNTY, shapes.CELL), 0.8, 0.02),
        ((shapes.NAICS5, shapes.COUNTY, shapes.CELL), 0.8, 0.1),
        (shapes.query_sets()[0], 0.6, 0.02), (shapes.query_sets()[0], 0.6, 0.1), (shapes.query_sets()[0], 0.6, 0.3)]


def test_default_targets_are_every_published_level(shared_data):
    """Levels with an unsuppressed private row, read from the CSV with pandas."""
    path = shared_data / "qcew_2016q1_44.csv"
    raw = pd.read_csv(path, dtype=str)
    private = raw[(raw["own_code"] == "5") & (raw["disclosure_code"].fillna("") != "N")]
    expected = sorted(int(level) for level in set(private["agglvl_code"])
                      if 51 <= int(level) <= 58 or 71 <= int(level) <= 78)
    assert list(published_levels(read_qcew(path))) == expected
    assert len(expected) == 16


def test_plan_without_targets_judges_every_published_level(shared_data, monkeypatch):
    seen = []

    def stop(published, source, levels, seed=1):
        seen.append(tuple(levels))
        raise RuntimeError("stand-in reached")

    monkeypatch.setattr(search, "stand_in", stop)
    path = shared_data / "qcew_2016q1_44.csv"
    with pytest.raises(RuntimeError, match="stand-in reached"):
        search.make_plan(path)
    with pytest.raises(RuntimeError, match="stand-in reached"):
        search.make_plan(path, targets=[78, 71])
    assert seen == [published_levels(read_qcew(path)), (78, 71)]


def test_gathered_blocks_give_the_forms_of_one_block_per_component(monkeypatch):
    """G with many small components (disjoint groups of 1-3 cells) and one large one: the forms with
    the small components gathered equal those computed component by component."""
    rng = np.random.default_rng(5)
    n_cells, rows = 900, []
    for start in range(0, 600, 3):  # disjoint 3-cell groups, and pairs inside them: 200 components
        rows += [[start, start + 1, start + 2], [start, start + 1]]
    rows += [list(range(600, 900)), list(range(600, 750))]  # one component of 2 rows over 300 cells
    rows += [[cell] for cell in range(n_cells)]  # single-cell groups (folded in)
    c = sp.csr_matrix((np.ones(sum(map(len, rows))), (np.repeat(np.arange(len(rows)), [len(r) for r in rows]),
                                                       np.concatenate(rows))), shape=(len(rows), n_cells))
    w, s = rng.uniform(0.5, 2.0, len(rows)), rng.uniform(0.1, 3.0, n_cells)
    p = sp.random(n_cells, 40, density=0.05, random_state=6, format="csc")
    gathered = CellOperator(c, w, s)
    forms = gathered.forms_after_solve(p)
    monkeypatch.setattr(structured, "GATHERED_ROWS", 1)
    one_by_one = CellOperator(c, w, s)
    assert forms == pytest.approx(one_by_one.forms_after_solve(p), rel=1e-10)
    assert len(gathered._group_blocks) == 2 and len(one_by_one._group_blocks) == 201  # 402 rows in 256-row blocks
    # and both against the dense formula p' M (I + S M)^-1 p, M = C' W^-1 C
    m = (c.T @ sp.diags(1.0 / w) @ c).toarray()
    dense = np.einsum("ij,ij->j", p.toarray(), m @ np.linalg.solve(np.eye(n_cells) + np.diag(s) @ m, p.toarray()))
    assert forms == pytest.approx(dense, rel=1e-8)
