"""Cell suppression as the QCEW runs it today, with an audit of what the published cells still reveal.

The cells are the QCEW aggregation levels 51-58 (state) and 71-78
(county) of every ownership in the microdata. Additive relations link them in two hierarchies:

* industry: in every area, a cell equals the sum of its children one industry level down
  (total -> domain -> supersector -> sector -> NAICS-3 -> ... -> NAICS-6);
* geography: at every industry level, a state cell equals the sum of its county cells.

Steps: primary suppression (p% rule and a minimum establishment count), secondary suppression (no
relation may have exactly one suppressed cell, complements chosen to cover the protection the rule
asks for), and an audit by linear programming: for every primary cell, the interval of values
consistent with the published cells and nonnegativity. A cell whose interval is narrower than its
required protection is reported and, in ``suppress``, repaired by suppressing more cells.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import highspy
import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from gedp.errors import AuditError, GedpError, InputError, held_stops
from gedp.measure.queries import group_establishments
from gedp.postprocess.cpus import usable_cpus
from gedp.running.process import worker_signals
from gedp.running.state_pool import stop_workers
from gedp.synth.hierarchy import (
    ALL_INDUSTRIES,
    COUNTY_LEVELS,
    INDUSTRY_OF_STATE_LEVEL,
    STATE_LEVELS,
)
from gedp.waits import awaited

#: Values are rescaled so that the largest cell is at most this before the LPs (HiGHS tolerances are absolute).
LP_SCALE = 1e6
#: An interval narrower than this (in rescaled units) is an exact disclosure.
EXACT_WIDTH = 1e-6
#: Shortfalls of protection below this (rescaled units) are solver noise, not findings.
PROTECTION_TOLERANCE = 1e-6
#: Audits with fewer intervals run in this process (starting worker processes costs about a second).
PARALLEL_MIN_INTERVALS = 5_000




@dataclass(frozen=True)
class SuppressionRule:
    """Primary suppression: the p% rule on each attribute and a minimum establishment count.

    A cell is sensitive when, for some attribute, (T - x1 - x2) < (p / 100) x1 (x1 >= x2 the two
    largest contributions, T the total), or when it has fewer than ``min_estabs`` establishments.
    """

    p: float = 10.0
    min_estabs: int = 3
    attributes: tuple[str, ...] = ("m1emp", "wage")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p) and 0 < self.p < 100):
            raise ValueError(f"p ({self.p}) must be a percentage in (0, 100)")
        if isinstance(self.min_estabs, bool) or not isinstance(self.min_estabs, int) or self.min_estabs < 1:
            raise ValueError(f"min_estabs ({self.min_estabs}) must be a whole number >= 1")
        if not self.attributes or len(set(self.attributes)) != len(self.attributes):
            raise ValueError(f"attributes ({', '.join(self.attributes) or 'none'}) must be one or more distinct names")


@dataclass(frozen=True, eq=False)
class CellTable:
    """Every QCEW cell of the microdata, the additive relations between them, and the rule's inputs.

    Attributes:
        cells: one row per cell: ``state``, ``own``, ``county`` ("000" at state levels), ``agglvl``,
            ``industry`` ("10" for all industries), ``estabs``, each attribute's total, and its two
            largest contributions ``x1_<attribute>`` and ``x2_<attribute>``.
        relations: sparse (relations x cells), +1 for the parent cell and -1 for each child, so every
            row times the cell totals is 0.
    """

    cells: pd.DataFrame
    relations: sp.csr_matrix


def _level_keys(level: int) -> list[str]:
    county = level in COUNTY_LEVELS
    industry = INDUSTRY_OF_STATE_LEVEL[level - 20 if county else level]
    return ["state", "own", *(["county"] if county else []), *([industry] if industry else [])]


def _top_two(values: np.ndarray, codes: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The largest and second-largest value of every group (0 when a group has one member)."""
    order = np.lexsort((-values, codes))
    sorted_codes, sorted_values = codes[order], values[order]
    first = np.searchsorted(sorted_codes, np.arange(n_groups))
    size = np.bincount(codes, minlength=n_groups)
    second = np.minimum(first + 1, len(values) - 1)
    return sorted_values[first], np.where(size >= 2, sorted_values[second], 0.0)


def check_microdata(microdata: pd.DataFrame, attributes: Sequence[str]) -> None:
    """Cell suppression needs the attributes it covers and one quarter (cells do not key on the quarter)."""
    missing = [a for a in attributes if a not in microdata.columns]
    if missing:
        raise ValueError(f"cell suppression: the microdata has no column {', '.join(missing)}")
    carried = [c for c in ("year", "qtr") if c in microdata.columns]
    quarters = len(microdata[carried].drop_duplicates()) if carried else 1
    if quarters > 1:
        raise ValueError(f"cell suppression: the microdata holds {quarters} quarters; suppress one quarter at a time")


def build_cells(microdata: pd.DataFrame, attributes: Sequence[str]) -> CellTable:
    """The cells of QCEW levels 51-58 and 71-78 with totals, top-two contributions and relations."""
    check_microdata(microdata, attributes)
    frames, codes, offset = [], {}, 0
    for level in (*STATE_LEVELS, *COUNTY_LEVELS):
        keys = _level_keys(level)
        grouping = group_establishments(microdata, keys)
        county = level in COUNTY_LEVELS
        industry = keys[-1] if len(keys) > 2 + county else None
        frame = pd.DataFrame({
            "state": grouping.keys["state"].to_numpy(),
            "own": grouping.keys["own"].to_numpy(),
            "county": grouping.keys["county"].to_numpy() if county else "000",
            "agglvl": level,
            "industry": grouping.keys[industry].to_numpy() if industry else ALL_INDUSTRIES,
            "estabs": np.bincount(grouping.codes, minlength=grouping.n_groups),
        })
        for attribute in attributes:
            values = microdata[attribute].to_numpy(dtype=float)
            frame[attribute] = grouping.sum(values)
            frame[f"x1_{attribute}"], frame[f"x2_{attribute}"] = _top_two(values, grouping.codes, grouping.n_groups)
        frames.append(frame)
        codes[level] = offset + grouping.codes
        offset += grouping.n_groups
    cells = pd.concat(frames, ignore_index=True)

    parents, children = [], []
    for level in STATE_LEVELS:
        parents.append(codes[level])  # geography: state cell = sum of its county cells
        children.append(codes[level + 20])
    for level in (*STATE_LEVELS[1:], *COUNTY_LEVELS[1:]):
        parents.append(codes[level - 1])  # industry: cell = sum of its children one level down
        children.append(codes[level])
    kinds = np.repeat([0, 1], [len(STATE_LEVELS), len(STATE_LEVELS[1:]) + len(COUNTY_LEVELS[1:])])
    n = np.int64(offset)
    # (kind, parent, child) as one integer, sorted like the triples: one 1-D sort instead of a row-wise unique.
    pairs = np.unique(np.concatenate([(k * n + p) * n + c for p, c, k in zip(parents, children, kinds)]))
    relation_keys, relation = np.unique(pairs // n, return_inverse=True)  # (kind, parent)
    n_relations = len(relation_keys)
    rows = np.concatenate([np.arange(n_relations), relation])
    columns = np.concatenate([relation_keys % n, pairs % n])
    signs = np.concatenate([np.ones(n_relations), -np.ones(len(pairs))])
    relations = sp.csr_matrix((signs, (rows, columns)), shape=(n_relations, len(cells)))
    return CellTable(cells, relations)


def primary_suppression(table: CellTable, rule: SuppressionRule) -> tuple[np.ndarray, np.ndarray]:
    """Sensitive cells, and the protection each needs per attribute (cells x attributes).

    The protection a p%-rule cell needs on each side is (p / 100) x1 - (T - x1 - x2): the interval an
    outsider can derive must reach that far beyond the true total, or the second-largest contributor
    could estimate the largest within p%. Count-rule cells need the same amount (0 if all values are 0).
    """
    cells = table.cells
    sensitive = cells["estabs"].to_numpy() < rule.min_estabs
    need = np.zeros((len(cells), len(rule.attributes)))
    for i, attribute in enumerate(rule.attributes):
        x1 = cells[f"x1_{attribute}"].to_numpy()
        rest = np.maximum(cells[attribute].to_numpy() - x1 - cells[f"x2_{attribute}"].to_numpy(), 0.0)
        sensitive |= rest < rule.p / 100 * x1
        need[:, i] = np.maximum(rule.p / 100 * x1 - rest, 0.0)
    need[~sensitive] = 0.0
    return sensitive, need


def _complements(table: CellTable, suppressed: np.ndarray, need: np.ndarray, attributes: Sequence[str],
                 relations: np.ndarray, protected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One published cell per relation in ``relations``, to be suppressed alongside ``protected``, and
    the positions in ``relations`` of the relations that have one (those with a published cell).

    Among the relation's published cells, the one with the smallest first-attribute value that is
    positive and at least the protected cell's need in every attribute; if there is none, the largest.
    """
    block = table.relations[relations].tocoo()
    keep = ~suppressed[block.col]
    row, candidate = block.row[keep], block.col[keep]
    values = table.cells[list(attributes)].to_numpy()
    cost = values[candidate, 0]
    adequate = (values[candidate] >= need[protected[row]]).all(axis=1) & (cost > 0)
    # Adequate cells first, by increasing cost; otherwise the largest cell.
    order = np.lexsort((np.where(adequate, cost, -cost), ~adequate, row))
    rows, first = np.unique(row[order], return_index=True)
    return candidate[order][first], rows


def secondary_suppression(table: CellTable, suppressed: np.ndarray, need: np.ndarray,
                          attributes: Sequence[str]) -> np.ndarray:
    """Suppress complements until no relation has exactly one suppressed cell (so none is recomputable
    from one relation of published cells).

    Each round gives every such relation a complement from its published cells, so it suppresses at
    least one more cell: the rounds end within as many as there are cells. A relation whose one
    suppressed cell has no published cell beside it (no complement to pick: the rounds would repeat
    without end) and cell totals or needs that are not finite numbers are refused (InputError)."""
    _check_finite(table, need, attributes)
    suppressed = suppressed.copy()
    membership = abs(table.relations)
    for _ in range(len(suppressed) + 1):
        counts = membership @ suppressed.astype(float)
        singles = np.flatnonzero(counts == 1)
        if singles.size == 0:
            return suppressed
        block = membership[singles].tocoo()
        alone = block.col[suppressed[block.col]]
        protected = np.empty(singles.size, dtype=np.int64)
        protected[block.row[suppressed[block.col]]] = alone
        picks, rows = _complements(table, suppressed, need, attributes, singles, protected)
        if rows.size < singles.size:
            _refuse_lonely(table, singles, protected, rows)
        suppressed[picks] = True
    raise GedpError(f"secondary suppression did not end within {len(suppressed) + 1:,} rounds (one per cell)")


def _check_finite(table: CellTable, need: np.ndarray, attributes: Sequence[str]) -> None:
    """Every cell's totals and needs finite numbers (a NaN total is no cost to compare)."""
    for k, attribute in enumerate(attributes):
        values = table.cells[attribute].to_numpy(dtype=np.float64)
        if not (np.isfinite(values).all() and np.isfinite(need[:, k]).all()):
            raise InputError(f"secondary suppression: the cells' totals or needs of {attribute} must be finite numbers")


def _refuse_lonely(table: CellTable, singles: np.ndarray, protected: np.ndarray, rows: np.ndarray) -> None:
    """Refuse the first relation of ``singles`` (its suppressed cell ``protected``) that got no
    complement (not in ``rows``), naming its suppressed cell by its public keys."""
    lonely = int(np.setdiff1d(np.arange(singles.size), rows)[0])
    cell = table.cells.iloc[int(protected[lonely])]
    raise InputError(f"secondary suppression: relation {int(singles[lonely]):,} has one suppressed cell (level "
                     f"{cell['agglvl']}, county {cell['county']}, industry {cell['industry']}) and no published "
                     "cell beside it to suppress (a relation of one cell: no table build_cells makes)")


@dataclass(frozen=True, eq=False)
class AuditResult:
    """Intervals of the audited cells: one row per (cell, attribute) with ``cell``, ``attribute``,
    ``sensitive`` (a primary cell, whose disclosure is a failure), ``true``, ``lower``, ``upper``,
    ``solved``, ``need``, ``exact`` (width ~ 0) and ``under_protected``. ``solved`` is False where the
    audit skipped the cell's LPs because earlier LP solutions (feasible tables) already showed it
    passes: ``lower`` and ``upper`` are then values its interval reaches at least, not its ends.

    ``binding`` maps each failing cell to the published cells whose publication pins its interval
    (suppressing any of them widens it): the candidates for repair.
    """

    intervals: pd.DataFrame
    binding: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def failures(self) -> pd.DataFrame:
        """Sensitive cells that are exactly disclosed or under-protected."""
        iv = self.intervals
        return iv[iv["sensitive"] & (iv["exact"] | iv["under_protected"])]

    @property
    def determined_secondaries(self) -> int:
        """Secondary cells whose value the published cells determine exactly (no harm to a sensitive
        cell, since the audit of the sensitive cells already accounts for it; reported for information)."""
        iv = self.intervals
        return int(iv.loc[~iv["sensitive"] & iv["exact"], "cell"].nunique())


def audit_suppression(table: CellTable, suppressed: np.ndarray, need: np.ndarray, attributes: Sequence[str],
                      cells: np.ndarray | None = None, sensitive: np.ndarray | None = None,
                      progress: Callable[[int, int], None] | None = None, workers: int | None = None,
                      every_lp: bool = True) -> AuditResult:
    """For each audited cell (default: every suppressed cell), the interval [lower, upper] of its value
    over all nonnegative tables that agree with the published cells: two HiGHS LPs per cell and
    attribute, one model per connected block of suppressed cells.

    Without ``every_lp``, the LPs of a cell are skipped when the solutions of earlier LPs already show
    that it passes; its ``lower`` and ``upper`` are then values the interval reaches at least
    (``solved`` False). The verdicts are the same either way.

    A cell is an exact disclosure when the interval has (almost) no width, and under-protected when it
    reaches less than the cell's need above or below the true value; only ``sensitive`` cells (a mask
    over the table; default: every audited cell) count as failures. ``progress(done, total)`` is
    called after each block with the number of intervals computed. Large audits run on ``workers``
    processes (default: one per core).
    """
    suppressed = np.asarray(suppressed, dtype=bool)
    cells = np.flatnonzero(suppressed) if cells is None else np.asarray(cells, dtype=np.int64)
    if not suppressed[cells].all():
        raise ValueError("only suppressed cells can be audited")
    hidden, shown = np.flatnonzero(suppressed), np.flatnonzero(~suppressed)
    position = np.full(len(suppressed), -1)
    position[hidden] = np.arange(hidden.size)
    relations = table.relations.tocsc()
    on_hidden = relations[:, hidden].tocsr()
    active = np.flatnonzero(np.diff(on_hidden.indptr) > 0)
    system = on_hidden[active]  # relations that involve a suppressed cell, over suppressed cells
    on_shown = relations[:, shown].tocsr()[active]
    _, block = connected_components(system.T @ system, directed=False)
    targets_all = position[cells]
    flagged = np.ones(len(suppressed), dtype=bool) if sensitive is None else np.asarray(sensitive, dtype=bool)
    contexts, jobs = [], []
    for a, attribute in enumerate(attributes):
        values = table.cells[attribute].to_numpy(dtype=float)
        scale = max(1.0, float(np.abs(values).max()) / LP_SCALE)
        rhs = -(on_shown @ values[shown]) / scale
        for b in np.unique(block[targets_all]):
            columns = np.flatnonzero(block == b)
            targets = targets_all[block[targets_all] == b]
            sub_rows = np.flatnonzero(np.diff(system[:, columns].tocsr().indptr) > 0)
            contexts.append((a, attribute, values, scale, sub_rows, targets))
            jobs.append((system[sub_rows][:, columns].tocsc(), rhs[sub_rows], np.searchsorted(columns, targets),
                         values[hidden[targets]] / scale, need[hidden[targets], a] / scale, flagged[hidden[targets]],
                         every_lp))
    rows, binding = [], {}
    total = cells.size * len(attributes)
    for (a, attribute, values, scale, sub_rows, targets), (lower, upper, solved, duals) in zip(contexts,
                                                                                              _solve(jobs, workers)):
        for i, y in duals:
            # A published cell p made free moves by x_p - v_p >= -v_p: it helps when a_p^T y > 0
            # (p grows), or when a_p^T y < 0 and v_p > 0 (p shrinks).
            pull = on_shown[sub_rows].T @ y
            pinned = shown[(pull > PROTECTION_TOLERANCE) | ((pull < -PROTECTION_TOLERANCE) & (values[shown] > 0))]
            cell = int(hidden[targets[i]])
            binding[cell] = np.union1d(binding.get(cell, np.empty(0, dtype=np.int64)), pinned)
        for target, low, high, both in zip(targets, lower, upper, solved):
            cell = hidden[target]
            rows.append((cell, attribute, values[cell], low * scale, high * scale, bool(both), need[cell, a], scale))
        if progress:
            progress(len(rows), total)
    frame = pd.DataFrame(rows, columns=["cell", "attribute", "true", "lower", "upper", "solved", "need", "scale"])
    frame["exact"], frame["under_protected"] = _verdicts(frame["true"], frame["lower"], frame["upper"],
                                                         frame["need"], frame["scale"])
    frame.insert(2, "sensitive", True if sensitive is None else np.asarray(sensitive, dtype=bool)[frame["cell"]])
    return AuditResult(frame.drop(columns="scale").sort_values(["cell", "attribute"], ignore_index=True), binding)


def _solve(jobs: list[tuple], workers: int | None):
    """``_interval_lps`` of every job, yielded in order. With more than one worker and enough intervals,
    the jobs run in worker processes, largest first. Each job is solved the same way wherever it runs,
    so the results do not depend on the number of workers."""
    workers = min(workers or usable_cpus(), len(jobs))
    # fork: the workers inherit the loaded modules and never re-run the caller's script (spawn and
    # forkserver would, in a script without a __main__ guard). Where there is no fork, run here.
    can_fork = "fork" in multiprocessing.get_all_start_methods()
    if workers <= 1 or not can_fork or sum(len(job[2]) for job in jobs) < PARALLEL_MIN_INTERVALS:
        for job in jobs:
            yield _interval_lps(*job)
        return
    work = [len(job[2]) * job[0].shape[1] for job in jobs]
    # The workers are stopped however the iteration ends (an error, Ctrl-C, the caller leaving it): none
    # is waited for once the results are no longer wanted, not even one stuck (a forked child can start
    # with a lock another thread of this process held).
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=worker_signals)
    try:
        with held_stops():
            futures = {i: pool.submit(_interval_lps, *jobs[i]) for i in np.argsort(work, kind="stable")[::-1]}
        for i in range(len(jobs)):
            yield awaited(futures[i])
    finally:
        stop_workers(pool)


def _verdicts(true, lower, upper, need, scale):
    """(exact disclosure, under-protected) for intervals in units where ``scale`` is one LP unit."""
    exact = (upper - lower) <= EXACT_WIDTH * scale
    slack = PROTECTION_TOLERANCE * scale
    return exact, exact | (upper - true < need - slack) | (true - lower < need - slack)


def _interval_lps(matrix: sp.csc_matrix, rhs: np.ndarray, targets: np.ndarray, true: np.ndarray,
                  need: np.ndarray, sensitive: np.ndarray, every_lp: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]:
    """min and max of each target variable subject to matrix x = rhs, x >= 0 (one block), whether both
    were solved, and the duals of failing sides.

    One HiGHS model; only the objective changes between solves, so each starts from the previous
    optimal basis. Both bounds are minimizations (of x and of -x), so HiGHS's row duals y satisfy
    reduced cost = c - A^T y >= 0 (the caller uses them to find the published cells that pin a bound).
    The duals of every failing side of a sensitive target are returned with the target's index.

    Without ``every_lp``, a target's two LPs are skipped when the optimal points of earlier LPs (each
    a feasible table) already move it by its need both ways and by twice the exact-disclosure width:
    its interval contains those values, so it passes. Its bounds are then those values (inner bounds
    of the interval, ``solved`` False).
    """
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve", "off")  # presolve would discard the warm basis between solves
    # After an objective change the previous basis is still primal feasible: primal simplex goes on
    # from it (3x faster here than the default dual simplex, which starts over).
    h.setOptionValue("simplex_strategy", 4)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
    lp.col_cost_ = np.zeros(matrix.shape[1])
    lp.col_lower_ = np.zeros(matrix.shape[1])
    lp.col_upper_ = np.full(matrix.shape[1], highspy.kHighsInf)
    lp.row_lower_ = lp.row_upper_ = rhs
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = matrix.indptr, matrix.indices, matrix.data
    h.passModel(lp)
    bounds = np.empty((2, targets.size))
    seen = np.stack([true, true]).astype(float)  # smallest and largest value of each target in a solution
    solved = np.ones(targets.size, dtype=bool)
    duals = []
    for i, column in enumerate(targets):
        if not every_lp and _wide_enough(seen[0, i], seen[1, i], true[i], need[i]):
            bounds[:, i], solved[i] = seen[:, i], False
            continue
        for side, sign in ((0, 1.0), (1, -1.0)):
            h.changeColCost(int(column), sign)
            h.run()
            status = h.getModelStatus()
            if status == highspy.HighsModelStatus.kOptimal:
                bounds[side, i] = sign * h.getInfo().objective_function_value
                if not every_lp:
                    point = np.asarray(h.getSolution().col_value)[targets]
                    np.minimum(seen[0], point, out=seen[0])
                    np.maximum(seen[1], point, out=seen[1])
            elif status == highspy.HighsModelStatus.kUnbounded and side == 1:
                bounds[side, i] = seen[1, i] = math.inf
            else:
                raise AuditError(f"audit LP ended with status {h.modelStatusToString(status)}")
            gap = (true[i] - bounds[0, i]) if side == 0 else (bounds[1, i] - true[i])
            exact = side == 1 and bounds[1, i] - bounds[0, i] <= EXACT_WIDTH
            failing = gap < need[i] - PROTECTION_TOLERANCE or exact
            if sensitive[i] and status == highspy.HighsModelStatus.kOptimal and failing:
                duals.append((i, np.asarray(h.getSolution().row_dual)))
        h.changeColCost(int(column), 0.0)
    return bounds[0], bounds[1], solved, duals


def _wide_enough(low: float, high: float, true: float, need: float) -> bool:
    """Whether feasible values ``low`` and ``high`` of a cell already pass it with room to spare: its
    interval contains them, and they reach its need on both sides (the verdict allows
    PROTECTION_TOLERANCE less) and twice the exact-disclosure width apart (solver noise in the
    solutions is far below either margin)."""
    return high - true >= need and true - low >= need and high - low >= 2 * EXACT_WIDTH


@dataclass(frozen=True, eq=False)
class SuppressionResult:
    """Which cells are published, why the others are not, and what the audit found.

    ``before_repair`` is the pattern after primary and secondary suppression, before the audit's repairs.
    """

    rule: SuppressionRule
    table: CellTable
    primary: np.ndarray
    suppressed: np.ndarray
    before_repair: np.ndarray
    audit: AuditResult | None
    repair_rounds: int
    log: list[str] = field(default_factory=list)

    def published_cells(self) -> pd.DataFrame:
        """The cells with a ``status``: published, primary or secondary suppression."""
        cells = self.table.cells[
            ["state", "own", "county", "agglvl", "industry", "estabs", *self.rule.attributes]
        ].copy()
        cells["status"] = np.where(self.primary, "primary", np.where(self.suppressed, "secondary", "published"))
        return cells


def suppress(microdata: pd.DataFrame, rule: SuppressionRule = SuppressionRule(), *, audit: bool = True,
             max_rounds: int = 20, on_round: Callable[[str], None] | None = None,
             progress: Callable[[int, int], None] | None = None, every_lp: bool = False) -> SuppressionResult:
    """Primary and secondary suppression of the QCEW cells of ``microdata``; with ``audit``, LP intervals
    of every suppressed cell, and repair rounds that suppress more cells until no primary is exactly
    disclosed or under-protected (or ``max_rounds`` is reached; remaining failures are reported).

    The audits whose failures are repaired solve every LP: the repair candidates come from the duals
    of the failing LPs, which depend on the warm-start path. The final audit after repairs (whose
    duals are not used) skips the LPs of cells that earlier solutions already show to pass, unless
    ``every_lp``; its verdicts are the same either way (see ``audit_suppression``)."""
    table = build_cells(microdata, rule.attributes)
    primary, need = primary_suppression(table, rule)
    suppressed = secondary_suppression(table, primary, need, rule.attributes)
    log = [f"primary {int(primary.sum()):,} of {len(primary):,} cells; after secondary {int(suppressed.sum()):,}"]
    if on_round:
        on_round(log[-1])
    if not audit:
        return SuppressionResult(rule, table, primary, suppressed, suppressed, None, 0, log)
    before_repair = suppressed
    result = audit_suppression(table, suppressed, need, rule.attributes, sensitive=primary, progress=progress)
    rounds = 0
    while rounds < max_rounds and not result.failures.empty:
        rounds += 1
        failing = np.unique(result.failures["cell"].to_numpy())
        suppressed = _repair(table, suppressed, need, rule.attributes, result)
        suppressed = secondary_suppression(table, suppressed, need, rule.attributes)
        # More suppression only widens intervals, so cells that passed keep passing: re-audit the failing.
        result = audit_suppression(table, suppressed, need, rule.attributes, cells=failing, sensitive=primary,
                                   progress=progress)
        log.append(f"repair round {rounds}: {failing.size:,} cells under-protected; now {int(suppressed.sum()):,} "
                   f"suppressed, {result.failures['cell'].nunique():,} still failing")
        if on_round:
            on_round(log[-1])
    if rounds:  # the final intervals of every suppressed cell, on the final pattern
        if on_round:
            on_round("final audit of every suppressed cell")
        result = audit_suppression(table, suppressed, need, rule.attributes, sensitive=primary, progress=progress,
                                   every_lp=every_lp)
    return SuppressionResult(rule, table, primary, suppressed, before_repair, result, rounds, log)


def _repair(table: CellTable, suppressed: np.ndarray, need: np.ndarray, attributes: Sequence[str],
            audit: AuditResult) -> np.ndarray:
    """Suppress, for each failing cell, one of the published cells that pin its interval: the smallest
    that covers its need; if none does, the smallest with positive values (a later round adds more),
    and the largest as a last resort. Small complements keep high-level cells published."""
    values = table.cells[list(attributes)].to_numpy()
    out = suppressed.copy()
    for cell, candidates in audit.binding.items():
        candidates = candidates[~out[candidates]]
        if candidates.size == 0:
            continue
        cost = values[candidates, 0]
        adequate = (values[candidates] >= need[cell]).all(axis=1) & (cost > 0)
        positive = (values[candidates] > 0).all(axis=1)
        for usable in (adequate, positive):
            if usable.any():
                out[candidates[usable][np.argmin(cost[usable])]] = True
                break
        else:
            out[candidates[np.argmax(cost)]] = True
    return out


def suppression_shares(result: SuppressionResult, attribute: str | None = None) -> pd.DataFrame:
    """Per aggregation level: cells, share of cells suppressed, share of ``attribute`` (default the rule's
    first) in suppressed cells, and the share of cells suppressed before the audit's repairs."""
    attribute = attribute or result.rule.attributes[0]
    cells = result.table.cells
    frame = pd.DataFrame({"agglvl": cells["agglvl"], "suppressed": result.suppressed,
                          "before_repair": result.before_repair, "value": cells[attribute],
                          "hidden_value": np.where(result.suppressed, cells[attribute], 0.0)})
    grouped = frame.groupby("agglvl")
    shares = pd.DataFrame({
        "cells": grouped.size(),
        "suppressed_share": grouped["suppressed"].mean(),
        f"{attribute}_share": grouped["hidden_value"].sum() / grouped["value"].sum().replace(0, np.nan),
        "before_repair_share": grouped["before_repair"].mean(),
    })
    return shares.reset_index()
