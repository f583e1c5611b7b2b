"""Composition arithmetic, the shipped plans' totals, the ledger, and refusal before any noise."""

import math

import numpy as np
import pytest

from gedp.config import load_config
from gedp.measure.budget import BudgetError, BudgetPlan, compose
from gedp.measure.workflows import measure


def test_compose_is_root_sum_of_squares():
    assert compose([0.3, 0.4]) == pytest.approx(0.5)
    assert compose([1.0] * 9) == pytest.approx(3.0)
    assert compose([]) == 0.0


#: SPEC section 6, per query (identity, state total, NAICS-5, county, county x NAICS-5) and attribute.
SPEC_QUERIES = (("estab_id",), ("state",), ("state", "naics5"), ("state", "county"), ("state", "county", "naics5"))
MONTHS = ("m1emp", "m2emp", "m3emp")
SPEC_PLANS = {
    "baseline": {**{m: (0.70, 0.20, 0.60, 0.60, 0.70) for m in MONTHS}, "wage": (0.15, 0.10, 0.15, 0.15, 0.15)},
    "uniform": {a: (0.611, 0.179, 0.525, 0.525, 0.611) for a in (*MONTHS, "wage")},
    "employment": {m: (0.7, 0.2, 0.6, 0.6, 0.7) for m in MONTHS},
}
#: The totals SPEC section 6 states ("both total ~ 2.31", "total mu ~ 2.28"), to its two decimals.
SPEC_TOTALS = {"baseline": 2.31, "uniform": 2.31, "employment": 2.28}


@pytest.mark.parametrize("name", sorted(SPEC_PLANS))
def test_shipped_plans_total_what_the_spec_says(name):
    """Each shipped plan holds SPEC's budget table, and its total is the total SPEC states (both
    numbers come from SPEC, not from compose, so a wrong composition rule or a mistyped YAML entry fails)."""
    plan = load_config(name).plan
    shipped = {q.by: q.mu for q in plan.queries}
    assert set(shipped) == set(SPEC_QUERIES)
    for attribute, mus in SPEC_PLANS[name].items():
        for by, mu in zip(SPEC_QUERIES, mus):
            assert shipped[by][attribute] == mu, (by, attribute)
    assert all(set(mu) == set(SPEC_PLANS[name]) for mu in shipped.values())
    assert abs(plan.budget().total - SPEC_TOTALS[name]) <= 0.005  # SPEC's rounding to two decimals


def test_ledger_records_every_charge_and_refuses_double_spending():
    plan = BudgetPlan({("identity", "m1emp"): 0.6, ("total", "m1emp"): 0.8}, cap=1.5)
    assert plan.spend("identity", "m1emp") == 0.6
    plan.charge("identity", "m1emp", 0.6)
    plan.charge("total", "m1emp", plan.spend("total", "m1emp"))
    assert [e["query"] for e in plan.ledger] == ["identity", "total"]
    assert plan.ledger[-1]["spent_total"] == pytest.approx(1.0)
    assert plan.ledger[0]["remaining_of_plan"] == pytest.approx(0.8)
    assert plan.ledger[-1]["remaining_of_cap"] == pytest.approx(math.sqrt(1.5**2 - 1.0))
    with pytest.raises(BudgetError, match="already answered"):
        plan.spend("total", "m1emp")
    with pytest.raises(BudgetError, match="not in the budget plan"):
        plan.spend("county", "m1emp")


def test_over_cap_plan_is_refused_before_any_noise_is_drawn(small_state):
    plan = load_config("baseline").plan
    import dataclasses

    over = dataclasses.replace(plan, cap=2.0)
    rng = np.random.default_rng(3)
    state_before = rng.bit_generator.state
    message = r"planned total mu \(2.3065\) exceeds the cap \(2.0000\); nothing was measured"
    with pytest.raises(BudgetError, match=message):
        measure(small_state, over, rng=rng)
    assert rng.bit_generator.state == state_before


@pytest.mark.parametrize("planned, message", [
    ({}, "has no queries"),
    ({("total", "wage"): -0.1}, r"mu of query 'total' on 'wage' \(-0.1\) must be a finite number > 0"),
    ({("total", "wage"): float("nan")}, "must be a finite number > 0"),
])
def test_invalid_plans_are_refused(planned, message):
    with pytest.raises(BudgetError, match=message):
        BudgetPlan(planned)


def test_spent_is_composed_from_charges_not_from_the_plan():
    plan = BudgetPlan({("identity", "m1emp"): 0.6, ("total", "m1emp"): 0.8})
    plan.charge("identity", "m1emp", plan.spend("identity", "m1emp") / 2)  # a mechanism that drew more noise
    plan.spend("total", "m1emp")
    assert plan.spent == pytest.approx(0.3) and not plan.complete
    plan.charge("total", "m1emp", 0.8)
    assert plan.spent == pytest.approx(math.hypot(0.3, 0.8)) and plan.complete


def test_a_charge_above_its_plan_is_refused():
    plan = BudgetPlan({("total", "m1emp"): 0.8})
    with pytest.raises(BudgetError, match="was not reserved"):
        plan.charge("total", "m1emp", 0.8)
    plan.spend("total", "m1emp")
    with pytest.raises(BudgetError, match=r"charged mu 0.81, more than its plan 0.8; nothing is released"):
        plan.charge("total", "m1emp", 0.81)


def test_measure_refuses_a_mechanism_that_draws_less_noise_than_it_charges_for(small_state, monkeypatch):
    """A mechanism whose privacy map gives more than the plan (e.g. its noise sd halved) stops the run."""
    import dataclasses

    import gedp.measure.mechanisms as mechanisms
    import gedp.measure.workflows as workflows

    def half_noise(values, grouping, *, mu, **kwargs):
        return mechanisms.psi_mechanism(values, grouping, mu=2 * mu, **kwargs)

    monkeypatch.setattr(workflows, "psi_mechanism", half_noise)
    plan = load_config("employment").plan
    with pytest.raises(BudgetError, match="more than its plan"):
        measure(small_state, dataclasses.replace(plan), rng=np.random.default_rng(0))
