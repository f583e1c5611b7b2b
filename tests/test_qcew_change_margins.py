"""The QCEW format's over-the-year margins are the change margins of the same cells: one computation
for ``--format qcew --change`` and ``--change --moe``."""

from __future__ import annotations

import numpy as np
import pytest

import gedp
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

CHANGE = "2016Q1:2017Q1"
#: BLS's columns with margins and the attributes they publish.
MARGINED = {"month1_emplvl": "m1emp", "month2_emplvl": "m2emp", "month3_emplvl": "m3emp",
            "total_qtrly_wages": "wage"}


@pytest.fixture(scope="module")
def year_release():
    """A small panel of private establishments (one own code: county x NAICS-3 cells are level 75's)."""
    start = generate_profile(load_profile("small"), n_establishments=700, rng=np.random.default_rng(23))
    panel = synthesize_panel(start, quarter_range(CHANGE), rng=np.random.default_rng(23))
    assert panel["own"].nunique() == 1
    return gedp.protect(panel, seed=7, not_for_publication=True, allow_over_cap=True)


@pytest.fixture(scope="module")
def both(year_release):
    """Level 75's publication with its oty columns beside the change table of the same cells."""
    published = year_release.tabulate(agglvl=75, format="qcew", change=CHANGE, moe=True)
    changes = year_release.tabulate("county,naics3", change=CHANGE, moe=True)
    changes["area_fips"] = changes["state"].astype(str) + changes["county"].astype(str)
    changes["industry_code"] = changes["naics3"].astype(str)
    joined = published.merge(changes, on=["area_fips", "industry_code"], how="left", validate="one_to_one")
    assert len(joined) == len(published) and joined["m3emp_chg"].notna().all()
    return joined


@pytest.mark.parametrize("column", MARGINED)
def test_oty_margins_are_the_change_margins_rounded_up(both, column):
    """Every published cell's oty margin is its change margin rounded up to a whole number, as the
    levels' margins are (none of the change margins sits within 1e-9 of a whole number here)."""
    margin = both[f"{MARGINED[column]}_chg_moe"].to_numpy()
    assert np.abs(margin - np.round(margin)).min() > 1e-9
    np.testing.assert_array_equal(both[f"oty_{column}_chg_moe"].to_numpy(dtype=float), np.ceil(margin))


def test_oty_changes_are_the_changes_of_the_published_levels(both):
    """The oty changes stay the differences of the whole published levels, within rounding of the
    change table's unrounded ones."""
    for column, attribute in MARGINED.items():
        assert (np.abs(both[f"oty_{column}_chg"].astype(float) - both[f"{attribute}_chg"]) <= 1.0).all()


def test_most_small_cells_have_oty_margins_below_their_levels_in_quadrature(year_release, both):
    """Cells under 10 employees in both quarters: the two levels' published margins combined in
    quadrature count each level's score widening in full, the change's margin counts it once
    (module ``postprocess.changes``), so most small cells' oty margins are narrower."""
    before = year_release.tabulate(agglvl=75, format="qcew", quarter=CHANGE.split(":")[0], moe=True)
    joined = both.merge(before, on=["area_fips", "industry_code"], how="left", suffixes=("", "@1"))
    column = "month3_emplvl"
    level_before = joined[f"{column}@1"].astype(float).fillna(0.0)
    small = (joined[column].astype(float) < 10) & (level_before < 10)
    assert small.sum() >= 20
    quadrature = np.hypot(joined[f"{column}_moe"].astype(float), joined[f"{column}_moe@1"].astype(float).fillna(0.0))
    ratio = joined[f"oty_{column}_chg_moe"].astype(float)[small] / quadrature[small]
    assert ratio.median() < 0.97
