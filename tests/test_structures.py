"""Within-establishment structures of synth.structures: what each keeps (cell totals, months,
wages) and the structure it imposes, checked against the stated law."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from gedp.evaluation.microdata_stats import within_slope
from gedp.synth.structures import (
    STRUCTURES,
    HeavyTailedMonths,
    MovingCells,
    WageElasticity,
    apply_structures,
)

CELL = ["county", "naics"]


@pytest.fixture(scope="module")
def state():
    from gedp.synth.profiles import generate_profile, load_profile

    return generate_profile(load_profile("small"), n_establishments=20_000, rng=np.random.default_rng(11))


def _cell_sums(frame, column):
    return frame.groupby(CELL, observed=True)[column].sum()


def test_heavy_tailed_months_keep_cells_and_month_one(state):
    out = HeavyTailedMonths().apply(state, np.random.default_rng(1))
    assert out["estab_id"].equals(state["estab_id"]) and out["m1emp"].equals(state["m1emp"])
    for column in ("m1emp", "m2emp", "m3emp", "wage"):
        assert _cell_sums(out, column).equals(_cell_sums(state, column))
    assert (out[["m2emp", "m3emp"]] == np.round(out[["m2emp", "m3emp"]])).all().all()


def test_heavy_tailed_months_point_mass_and_tail(state):
    """No change month 1 -> 2 for at least the share drawn without one (binomial: 4 sd below 0.6 has
    probability < 1e-4); among establishments of 20+ employees, the share changing by more than half
    is near the Student-t's P(|0.08 t_2| > 0.5) x 0.4 (within a factor 2: a normal change of the
    same sd would give about 1e-9)."""
    structure = HeavyTailedMonths()
    out = structure.apply(state, np.random.default_rng(2))
    m1, m2 = state["m1emp"].to_numpy(), out["m2emp"].to_numpy()
    n = len(m1)
    assert np.mean(m1 == m2) >= structure.no_change - 4 * np.sqrt(0.24 / n)
    large = m1 >= 20
    expected = (1 - structure.no_change) * 2 * stats.t.sf(0.5 / structure.sd, structure.df)
    observed = np.mean(np.abs(m2[large] - m1[large]) > 0.5 * m1[large])
    assert expected / 2 <= observed <= expected * 2


def test_heavy_tailed_months_extremes(state):
    rng = np.random.default_rng(3)
    unchanged = HeavyTailedMonths(no_change=1.0).apply(state, rng)
    # no mover: cells whose month-2 total is their month-1 total keep every establishment's month 1;
    # the others are rescaled as a whole to their month-2 total
    same = (_cell_sums(state, "m1emp") == _cell_sums(state, "m2emp")).rename("same")
    kept = state.join(same, on=CELL)["same"].to_numpy()
    assert (unchanged["m2emp"] == state["m1emp"])[kept].all() and 0 < kept.mean() < 1
    assert _cell_sums(unchanged, "m2emp").equals(_cell_sums(state, "m2emp"))
    everyone = HeavyTailedMonths(no_change=0.0).apply(state, rng)
    assert _cell_sums(everyone, "m3emp").equals(_cell_sums(state, "m3emp"))


@pytest.mark.parametrize("elasticity", [0.1, 0.6])
def test_wage_elasticity_within_cells(state, elasticity):
    out = WageElasticity(elasticity=elasticity).apply(state, np.random.default_rng(4))
    assert _cell_sums(out, "wage").equals(_cell_sums(state, "wage"))
    for column in ("m1emp", "m2emp", "m3emp"):
        assert out[column].equals(state[column])
    employment = state[["m1emp", "m2emp", "m3emp"]].mean(axis=1).to_numpy()
    idle = employment == 0
    assert out["wage"].to_numpy()[idle].tolist() == state["wage"].to_numpy()[idle].tolist()
    keep = (employment >= 1) & (out["wage"].to_numpy() > 0)
    groups = out[keep].groupby(CELL, observed=True).ngroup().to_numpy()
    x = np.log(employment[keep])
    slope, variance = within_slope(x, np.log(out["wage"].to_numpy()[keep]) - x, groups)
    assert abs(slope - elasticity) <= max(4 * np.sqrt(variance), 0.02)


def test_moving_cells_move_by_the_stated_amount(state):
    structure = MovingCells()
    out = structure.apply(state, np.random.default_rng(5))
    for column in ("m1emp", "wage"):
        assert out[column].equals(state[column])
    moved = structure.moving_cells(out, state)
    m1, m3 = _cell_sums(state, "m1emp"), _cell_sums(out, "m3emp")
    changed = _cell_sums(out.assign(moved=moved), "moved") > 0
    ratio = (m3[changed] / m1[changed] - 1).abs()
    slack = 0.5 / m1[changed]  # rounding to whole employees
    assert ((ratio >= structure.low - slack) & (ratio <= structure.high + slack)).all()
    assert (m1[changed] >= structure.min_employment).all()
    eligible = (m1 >= structure.min_employment).sum()
    assert 0.05 <= changed.sum() / eligible <= 0.35  # 1 - 0.9 x 0.95 = 0.145 expected, industries clustered
    for column in ("m2emp", "m3emp"):
        assert _cell_sums(out, column)[~changed].equals(_cell_sums(state, column)[~changed])
    m2 = _cell_sums(out, "m2emp")[changed]
    between = (m2 - m1[changed]) * (m3[changed] - m1[changed]) >= 0
    assert between.all()  # month 2 part of the way, on the same side


def test_structures_refuse_bad_parameters_and_names(state):
    with pytest.raises(ValueError, match=r"no_change \(1.5\) must be in \[0.0, 1.0\]"):
        HeavyTailedMonths(no_change=1.5)
    with pytest.raises(ValueError, match=r"high \(0.2\) must be in \[0.3, 1.0\]"):
        MovingCells(high=0.2)
    with pytest.raises(ValueError, match="structure 'calm' is unknown"):
        apply_structures(state, ["calm"], np.random.default_rng(0))
    both = apply_structures(state, ["moving-cells", "heavy-tailed-months"], np.random.default_rng(0))
    assert len(both) == len(state) and set(STRUCTURES) >= {"moving-cells", "heavy-tailed-months"}
