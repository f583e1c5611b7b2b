"""Cell suppression: primary rule, secondary suppression over both hierarchies, and the LP audit.

The audit's intervals are checked against an independent formulation: scipy's linprog over every
cell of the table at once (published cells fixed by their bounds), without the block decomposition,
the warm starts or highspy.
"""

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from gedp.evaluation.baselines.suppression import (
    SuppressionRule,
    audit_suppression,
    build_cells,
    primary_suppression,
    secondary_suppression,
    suppress,
    suppression_shares,
)
from gedp.postprocess.tabulate import qcew_level
from gedp.synth.hierarchy import COUNTY_LEVELS, STATE_LEVELS
from gedp.synth.schema import validate_microdata

RULE = SuppressionRule(p=10, min_estabs=3, attributes=("m1emp", "wage"))


@pytest.fixture(scope="module")
def five():
    """Five establishments; E5 is alone in its county (005) and in its sector (23)."""
    raw = pd.DataFrame({
        "estab_id": ["E1", "E2", "E3", "E4", "E5"],
        "state": "44",
        "county": ["001", "001", "001", "003", "005"],
        "naics": ["541110", "541110", "722511", "722511", "238220"],
        "m1emp": [50.0, 30.0, 40.0, 20.0, 70.0],
        "m2emp": [50.0, 30.0, 40.0, 20.0, 70.0],
        "m3emp": [50.0, 30.0, 40.0, 20.0, 70.0],
        "wage": [5e5, 3e5, 2e5, 1e5, 9e5],
    })
    return validate_microdata(raw)


@pytest.fixture(scope="module")
def tiny_state():
    """300 establishments of the small profile: most cells are sensitive, so the audit has work."""
    from gedp.synth.profiles import generate_profile, load_profile

    return generate_profile(load_profile("small"), n_establishments=300, rng=np.random.default_rng(7))


@pytest.fixture(scope="module")
def tiny_suppressed(tiny_state):
    return suppress(tiny_state, RULE)


def cell_index(table, agglvl, county, industry):
    cells = table.cells
    match = cells[(cells["agglvl"] == agglvl) & (cells["county"] == county) & (cells["industry"] == industry)]
    assert len(match) == 1
    return int(match.index[0])


def brute_force_interval(table, suppressed, attribute, cell):
    """min and max of one cell over all nonnegative tables that satisfy every relation and match the
    published cells, with every cell a variable."""
    values = table.cells[attribute].to_numpy(dtype=float)
    relations = table.relations.toarray()
    bounds = [(0, None) if hidden else (v, v) for hidden, v in zip(suppressed, values)]
    out = []
    for sign in (1, -1):
        cost = np.zeros(len(values))
        cost[cell] = sign
        result = linprog(cost, A_eq=relations, b_eq=np.zeros(len(relations)), bounds=bounds, method="highs")
        out.append(sign * result.fun if result.status == 0 else np.inf)
    return out[0], out[1]


def test_cells_and_relations_match_independent_tabulations(five, small_state):
    for microdata in (five, small_state):
        table = build_cells(microdata, RULE.attributes)
        cells = table.cells
        for level in (*STATE_LEVELS, *COUNTY_LEVELS):
            expected = qcew_level(microdata, level)
            got = cells[cells["agglvl"] == level]
            assert len(got) == len(expected)
            np.testing.assert_allclose(np.sort(got["m1emp"].to_numpy()), np.sort(expected["month1_emplvl"].to_numpy()))
            assert got["estabs"].sum() == len(microdata)
        for attribute in RULE.attributes:  # every relation holds on the true table
            np.testing.assert_allclose(table.relations @ cells[attribute].to_numpy(), 0.0, atol=1e-6)
        # every cell but the state total is a child in exactly one industry relation
        children = (table.relations < 0).sum(axis=0).A1
        assert children[cells["agglvl"].to_numpy() == 51].tolist() == [0] * (cells["agglvl"] == 51).sum()


def test_primary_rule_against_brute_force(small_state):
    table = build_cells(small_state, RULE.attributes)
    sensitive, need = primary_suppression(table, RULE)
    checked = 0
    for level, by in ((75, ["county", "naics3"]), (78, ["county", "naics"]), (54, ["sector"])):
        for key, group in small_state.groupby(by, sort=True):
            county, industry = key if len(by) == 2 else ("000", key[0])
            checked += 1
            i = cell_index(table, level, county, industry)
            expect = len(group) < 3
            needs = []
            for attribute in RULE.attributes:
                top = sorted(group[attribute], reverse=True) + [0.0, 0.0]
                rest = sum(top[2:])
                expect |= rest < 0.1 * top[0]
                needs.append(max(0.1 * top[0] - rest, 0.0))
            assert sensitive[i] == expect
            np.testing.assert_allclose(need[i], needs if expect else [0.0, 0.0], rtol=1e-9, atol=1e-6)
    assert checked > 100 and 0 < sensitive.mean() < 1


def test_five_establishments_secondary_suppression_leaves_no_exact_disclosure(five):
    table = build_cells(five, RULE.attributes)
    primary, need = primary_suppression(table, RULE)
    alone = cell_index(table, 71, "005", "10")
    assert primary[alone] and primary[cell_index(table, 54, "000", "23")]
    suppressed = secondary_suppression(table, primary, need, RULE.attributes)
    counts = abs(table.relations) @ suppressed.astype(float)
    assert not np.any(counts == 1)  # no relation recomputes a suppressed cell
    assert suppressed.sum() > primary.sum()
    audit = audit_suppression(table, suppressed, need, RULE.attributes, cells=np.flatnonzero(primary))
    assert not audit.intervals["exact"].any()
    for row in audit.intervals.itertuples():
        low, high = brute_force_interval(table, suppressed, row.attribute, row.cell)
        assert row.lower == pytest.approx(low, abs=1e-6) and row.upper == pytest.approx(high, abs=1e-6)


def test_audit_flags_an_under_suppressed_table(five):
    table = build_cells(five, RULE.attributes)
    primary, need = primary_suppression(table, RULE)
    audit = audit_suppression(table, primary, need, RULE.attributes)  # primaries only: no complements
    alone = cell_index(table, 71, "005", "10")
    flagged = audit.failures
    assert alone in set(flagged["cell"])
    row = flagged[(flagged["cell"] == alone) & (flagged["attribute"] == "m1emp")].iloc[0]
    assert row["exact"] and row["lower"] == pytest.approx(70) and row["upper"] == pytest.approx(70)
    assert set(audit.binding) >= {alone}  # the published cells that pin it are named for repair
    # the same intervals for cells declared not sensitive: reported as determined, not as failures
    relaxed = audit_suppression(table, primary, need, RULE.attributes, sensitive=np.zeros(len(primary), dtype=bool))
    assert relaxed.failures.empty and relaxed.determined_secondaries == flagged.loc[flagged["exact"], "cell"].nunique()


def test_suppress_repairs_until_the_audit_is_clean(tiny_suppressed):
    result = tiny_suppressed
    assert result.audit is not None and result.audit.failures.empty
    assert result.repair_rounds >= 1 and result.suppressed.sum() > result.before_repair.sum()
    assert not np.any(result.before_repair & ~result.suppressed)  # repairs only add cells
    assert set(result.audit.intervals["cell"]) == set(np.flatnonzero(result.suppressed))
    every = result.audit.intervals
    assert (every["sensitive"] == result.primary[every["cell"]]).all()
    intervals = every[every["sensitive"]]
    assert ((intervals["upper"] - intervals["true"] >= intervals["need"] - 1e-3)
            & (intervals["true"] - intervals["lower"] >= intervals["need"] - 1e-3)).all()
    counts = abs(result.table.relations) @ result.suppressed.astype(float)
    assert not np.any(counts == 1)
    # spot-check the audit against the independent formulation on a few primaries: the ends of solved
    # intervals; for cells whose LPs the final audit skipped, values inside the interval
    solved = intervals[intervals["solved"]]
    skipped = intervals[~intervals["solved"]]
    assert len(solved) >= 5 and len(skipped) >= 5
    for row in solved.sample(5, random_state=0).itertuples():
        low, high = brute_force_interval(result.table, result.suppressed, row.attribute, row.cell)
        assert row.lower == pytest.approx(low, rel=1e-6, abs=1e-3)
        assert row.upper == pytest.approx(high, rel=1e-6, abs=1e-3)
    for row in skipped.sample(5, random_state=0).itertuples():
        low, high = brute_force_interval(result.table, result.suppressed, row.attribute, row.cell)
        assert low - 1e-3 <= row.lower and row.upper <= high + 1e-3


def test_shares_and_status(small_state):
    result = suppress(small_state, RULE, audit=False)
    shares = suppression_shares(result)
    cells = result.table.cells
    for row in shares.itertuples():
        at = (cells["agglvl"] == row.agglvl).to_numpy()
        assert row.cells == at.sum()
        assert row.suppressed_share == pytest.approx(result.suppressed[at].mean())
        assert row.before_repair_share == row.suppressed_share  # no audit, no repair
        total = cells.loc[at, "m1emp"].sum()
        assert row.m1emp_share == pytest.approx(cells.loc[at & result.suppressed, "m1emp"].sum() / total)
    status = result.published_cells()["status"].value_counts()
    assert status["primary"] == result.primary.sum()
    assert status["primary"] + status["secondary"] == result.suppressed.sum()


@pytest.mark.parametrize("kwargs, message", [
    ({"p": 0}, r"p \(0\) must be a percentage in \(0, 100\)"),
    ({"p": 150}, r"p \(150\) must be"),
    ({"min_estabs": 0}, r"min_estabs \(0\) must be a whole number >= 1"),
    ({"attributes": ()}, "one or more distinct names"),
])
def test_rule_refuses_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuppressionRule(**kwargs)


@pytest.mark.shared_data
def test_suppression_realism_on_rhode_island(shared_data, synthesized):
    """Realism check of generator and suppression together: on a state fitted to the published Rhode
    Island file, primary + secondary suppression (p 10%, fewer than 3 establishments) withholds a share
    of county x NAICS-6 cells within 10 percentage points of what BLS withheld (64.4%)."""
    from gedp.synth.qcew import read_qcew

    published = read_qcew(shared_data / "qcew_2016q1_44.csv")
    real = published.aggregates.groupby("agglvl")["suppressed"].mean()
    assert real[78] == pytest.approx(0.644, abs=5e-4)
    state = synthesized("44")
    shares = suppression_shares(suppress(state, RULE, audit=False)).set_index("agglvl")["suppressed_share"]
    assert abs(shares[78] - real[78]) < 0.10


def test_audit_on_worker_processes_equals_the_serial_audit(tiny_suppressed, monkeypatch):
    import gedp.evaluation.baselines.suppression as suppression

    result = tiny_suppressed
    _, need = primary_suppression(result.table, RULE)
    # the pattern before repair has failures, so the repair candidates are compared too
    serial = audit_suppression(result.table, result.before_repair, need, RULE.attributes, sensitive=result.primary,
                               workers=1)
    monkeypatch.setattr(suppression, "PARALLEL_MIN_INTERVALS", 0)
    parallel = audit_suppression(result.table, result.before_repair, need, RULE.attributes,
                                 sensitive=result.primary, workers=2)
    pd.testing.assert_frame_equal(serial.intervals, parallel.intervals)
    assert serial.binding and serial.binding.keys() == parallel.binding.keys()
    assert all(np.array_equal(serial.binding[c], parallel.binding[c]) for c in serial.binding)


@pytest.fixture(scope="module")
def state_3000():
    """3,000 establishments of the small profile: before repair, its pattern has exactly disclosed and
    under-protected primaries, in blocks of up to a few hundred cells."""
    from gedp.synth.profiles import generate_profile, load_profile

    return generate_profile(load_profile("small"), n_establishments=3000, rng=np.random.default_rng(7))


def test_audit_that_skips_lps_gives_the_verdicts_of_every_lp(state_3000):
    """Skipping the LPs of cells that earlier solutions already pass changes no verdict; the skipped
    cells' reported values lie inside the intervals that solving every LP finds."""
    from gedp.evaluation.baselines.suppression import LP_SCALE, PROTECTION_TOLERANCE

    table = build_cells(state_3000, RULE.attributes)
    primary, need = primary_suppression(table, RULE)
    pattern = secondary_suppression(table, primary, need, RULE.attributes)
    every = audit_suppression(table, pattern, need, RULE.attributes, sensitive=primary, workers=1).intervals
    fast = audit_suppression(table, pattern, need, RULE.attributes, sensitive=primary, workers=1,
                             every_lp=False).intervals
    assert every["solved"].all()
    skipped = ~fast["solved"].to_numpy()
    assert skipped.mean() > 0.5 and not skipped.all()  # the shortcut is taken, and not everywhere
    failing = every["sensitive"] & every["under_protected"]
    assert (failing & every["exact"]).any() and (failing & ~every["exact"]).any()  # both kinds of failure occur
    verdicts = ["cell", "attribute", "sensitive", "true", "need", "exact", "under_protected"]
    pd.testing.assert_frame_equal(fast[verdicts], every[verdicts])
    # solver noise allowance: the audit's own tolerance, in each attribute's LP units
    scale = every["attribute"].map({a: max(1.0, table.cells[a].abs().max() / LP_SCALE) for a in RULE.attributes})
    noise = PROTECTION_TOLERANCE * scale
    for end in ("lower", "upper"):
        np.testing.assert_allclose(fast.loc[~skipped, end], every.loc[~skipped, end], rtol=0,
                                   atol=noise[~skipped].min())
    assert (every["lower"] - noise <= fast["lower"])[skipped].all()
    assert (fast["upper"] <= every["upper"] + noise)[skipped].all()
    assert not (fast["exact"] | fast["under_protected"])[skipped].any()


def test_suppress_with_every_lp_in_the_final_audit_gives_the_same_result(tiny_state, tiny_suppressed):
    slow = suppress(tiny_state, RULE, every_lp=True)
    assert np.array_equal(slow.suppressed, tiny_suppressed.suppressed)
    assert slow.audit.intervals["solved"].all() and not tiny_suppressed.audit.intervals["solved"].all()
    verdicts = ["cell", "attribute", "sensitive", "exact", "under_protected"]
    pd.testing.assert_frame_equal(slow.audit.intervals[verdicts], tiny_suppressed.audit.intervals[verdicts])



@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_audits_workers_without_their_tracebacks(tmp_path, ctrl_c_among_workers):
    """Ctrl-C reaches the whole process group: the audit's LP workers ignore it (as protect's state
    workers do) and the main process stops them, so the run ends in one line, exit 130, no worker's
    traceback and no worker left."""
    from gedp.postprocess.cpus import usable_cpus

    if usable_cpus() < 2:
        pytest.skip("the audit runs on worker processes only with 2 or more CPUs")
    ctrl_c_among_workers(["suppress", "--out", str(tmp_path / "out"), "--profile", "small"], workers=1)


# --- tables whose rounds never ended (harden16) -----------------------------------------------------
def _with_lonely_relation(table, cell: int):
    """``table`` with one more relation holding the single cell ``cell`` (no published cell beside it)."""
    import scipy.sparse as sp

    from gedp.evaluation.baselines.suppression import CellTable

    lonely = sp.csr_matrix(([1.0], ([0], [cell])), shape=(1, len(table.cells)))
    return CellTable(table.cells, sp.vstack([table.relations, lonely]).tocsr())


@pytest.mark.timeout(30)
def test_a_relation_with_no_published_cell_beside_its_suppressed_one_is_refused(five):
    """Such a relation has exactly one suppressed cell after every round, and no complement: the code
    before this test repeated the rounds without end. Now an InputError naming the relation's cell."""
    from gedp.errors import InputError

    table = build_cells(five, RULE.attributes)
    primary, need = primary_suppression(table, RULE)
    alone = cell_index(table, 71, "005", "10")
    lonely = _with_lonely_relation(table, alone)
    with pytest.raises(InputError, match=f"relation {table.relations.shape[0]:,} has one suppressed cell "
                                         r"\(level 71, county 005, industry 10\) and no published cell"):
        secondary_suppression(lonely, primary, need, RULE.attributes)


@pytest.mark.timeout(30)
def test_cell_totals_that_are_not_finite_are_refused(five):
    from gedp.errors import InputError

    table = build_cells(five, RULE.attributes)
    primary, need = primary_suppression(table, RULE)
    table.cells.loc[0, "wage"] = np.nan
    with pytest.raises(InputError, match="totals or needs of wage must be finite numbers"):
        secondary_suppression(table, primary, need, RULE.attributes)


@pytest.mark.timeout(30)
def test_secondary_suppression_stops_at_its_round_cap(five, monkeypatch):
    """Every round suppresses one more cell, so the rounds end within one per cell; rounds that would
    suppress nothing new (complements picked among the suppressed cells, here) stop at that cap."""
    from gedp.errors import GedpError
    from gedp.evaluation.baselines import suppression

    table = build_cells(five, RULE.attributes)
    primary, need = primary_suppression(table, RULE)
    monkeypatch.setattr(suppression, "_complements",
                        lambda table, suppressed, need, attributes, relations, protected:
                        (protected, np.arange(len(relations))))
    with pytest.raises(GedpError, match=f"did not end within {len(table.cells) + 1:,} rounds"):
        secondary_suppression(table, primary, need, RULE.attributes)
