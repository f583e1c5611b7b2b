"""Protected job-frame microdata: each establishment's jobs by worker category, nonnegative and adding
up to its protected employment, with margins of error for any job tabulation.

Per family of categories (``measure.jobframe``), each category attribute is postprocessed like any
attribute (the weighted least squares, ``postprocess.wls.protect_attribute``), giving x_jc >= 0: an
establishment's own x_j is mostly noise, and the bounds bias the small categories up wherever a
category is rare (the sum of many values held at or above 0). The same answers without the bounds
give unbiased category totals T_gc of every measured cell g (``wls.unbounded_totals``), noisy cell
by cell but precise summed over a county or a sector. The released counts y are the raking
(iterative proportional fitting) of the seed w_jc = x_jc + mean of x_.c over the cell
(``raking_seed``, plus ``SEED_FLOOR`` jobs split by the state's mix) to

* rows: sum_c y_jc = E_j, the establishment's protected month-1 employment, and
* for each grouping of ``RAKING_MARGINS`` (county; sector), columns: the group's T_.c summed over its
  cells, made nonnegative and fitted to the group's protected employment and the state's mix
  (``margin_targets``),

i.e. the point of those margins nearest to the seed in Kullback-Leibler divergence (``rake_counts``).
Job tabulations and establishment tabulations of one release then agree (summed over a family's
categories, jobs are m1emp), county and sector mixes follow the measurements without the bounds'
bias, and finer cells take the seed's pattern within them. An integer release rounds y_j to whole
jobs still adding up to the (whole) E_j: the largest fractional parts go up.

Why this is postprocessing (no privacy cost): its inputs are released answers, the protected
employment and public attributes; nothing confidential.

Margins of error linearize at the release (the bounds are ignored: unlike establishment
tabulations, ``postprocess.variances``, they do not shrink the variances of values held near 0):
they treat a cell's jobs of the categories K as Y_gK = (T_gK / T_g) E_g, so with
s_gK = Y_gK / Y_g (read from the released counts), a tabulation's total over the categories K is, to
first order,

    sum_j [ sum_c ([c in K] - s_gK) x_jc + s_gK E_j ]       (g the cell of establishment j),

a linear form in the categories' least-squares estimates and the employment's, which are
independent (independent noise): its variance is the sum of their quadratic forms
(``postprocess.moe.tabulation_variances`` with coefficients). Summed over every category it is
exactly m1emp's margin without that shrinkage. For county and sector tabulations, which the
raking ties to sums of T, this is their first-order variance; for finer ones it is the variance
of the cells' own measured mix, which the raked counts, pooling over the county and the sector, do
not exceed in the measured releases. The quadratic forms weigh the identity answers by variances
estimated at their noisy values, which overstate their spread: measured coverage of the 95% margins
is 98-100% (README, "Job-frame releases"); so job margins are z sqrt(variance), without the score widening
of establishment tabulations (``postprocess.moe``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import scipy.sparse as sp

from gedp.measure.answers import NoisyAnswer
from gedp.measure.jobframe import EMPLOYMENT, FAMILY_COLUMNS, FamilySpec
from gedp.measure.queries import Groupings
from gedp.postprocess.wls import WLSResult, attribute_system, solve_attribute, system_structure, unbounded_totals

if TYPE_CHECKING:
    from gedp.postprocess.variances import EstablishmentVariances

#: Raking stops when every margin's column totals are within this of their targets, relative to each
#: group's employment (rows are then scaled to their totals exactly), or after RAKING_STEPS sweeps.
RAKING_TOLERANCE, RAKING_STEPS = 1e-10, 500
#: The groupings whose category totals the job frame is raked to: the county and the sector (NAICS-2).
RAKING_MARGINS = ("county", "sector")
#: Jobs every establishment's seed gets, split by the state's mix, so that every establishment can
#: take every category and the raking's margins are always reachable.
SEED_FLOOR = 1e-3


def rake_counts(seed: np.ndarray, totals: np.ndarray, margins: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Iterative proportional fitting of ``seed`` (n x K, >= 0, every row with a positive entry) to
    row totals ``totals`` and, for each margin (codes, targets), the column totals ``targets``
    (groups x K, each group's row summing to its rows' totals) of each group of ``codes``: rows and
    each margin's columns scaled in turn. Rows are matched exactly at the end: a row the margins
    emptied (its seed only in categories whose targets in its group are 0) takes its seed's mix, so
    every row with a positive total keeps it (the margins then miss by that row)."""
    seed = np.asarray(seed, dtype=float)
    y = seed.copy()
    totals = np.asarray(totals, dtype=float)
    members = []
    for codes, targets in margins:
        groups = sp.csr_matrix((np.ones(len(y)), (codes, np.arange(len(y)))), shape=(targets.shape[0], len(y)))
        members.append((groups, codes, targets, np.maximum(groups @ totals, 1e-300)[:, None]))
    for _ in range(RAKING_STEPS):
        worst = 0.0
        for groups, codes, targets, scale in members:
            row = y.sum(axis=1)
            y *= np.divide(totals, row, out=np.zeros_like(row), where=row > 0)[:, None]
            column = groups @ y
            worst = max(worst, np.max(np.abs(column - targets) / scale, initial=0.0))
            y *= np.divide(targets, column, out=np.zeros_like(column), where=column > 0)[codes]
        if worst <= RAKING_TOLERANCE:
            break
    emptied = (y.sum(axis=1) <= 0) & (totals > 0)
    y[emptied] = seed[emptied]
    row = y.sum(axis=1)
    return y * np.divide(totals, row, out=np.zeros_like(row), where=row > 0)[:, None]


def margin_targets(cell_totals: np.ndarray, cell_groups: np.ndarray, employment: np.ndarray,
                   state_mix: np.ndarray) -> np.ndarray:
    """One raking margin: per group (rows) and category, the cells' unbounded totals summed, made
    nonnegative (a group with none positive takes ``state_mix``), then raked to the groups'
    protected ``employment`` and to the state's category totals (``state_mix`` scaled to the
    employment), so that every margin agrees with the rows and with the others."""
    n_groups = len(employment)
    table = np.maximum(np.column_stack([np.bincount(cell_groups, weights=column, minlength=n_groups)
                                        for column in cell_totals.T]), 0.0)
    empty = table.sum(axis=1) <= 0
    table[empty] = state_mix
    state = state_mix / state_mix.sum() * employment.sum()
    return rake_counts(table, employment, [(np.zeros(n_groups, dtype=np.int64), state[None, :])])


def cell_sums(values: np.ndarray, cell_codes: np.ndarray) -> np.ndarray:
    """Per cell (rows) and category: the total of ``values`` (n x K)."""
    n_cells = int(cell_codes.max(initial=0)) + 1
    return np.column_stack([np.bincount(cell_codes, weights=column, minlength=n_cells) for column in values.T])


def cell_shares(values: np.ndarray, cell_codes: np.ndarray, measured: np.ndarray | None = None) -> np.ndarray:
    """Per cell (rows) and category: its share of the cell's total of ``values`` (n x K); a cell whose
    values are all 0 is split evenly over the categories ``measured`` there (n x K, default all)."""
    mix = cell_sums(values, cell_codes)
    empty = mix.sum(axis=1) <= 0
    if empty.any():
        mix[empty] = 1.0 if measured is None else (cell_sums(measured.astype(float), cell_codes) > 0)[empty]
    total = mix.sum(axis=1, keepdims=True)
    return np.divide(mix, total, out=np.zeros_like(mix), where=total > 0)


def round_counts(counts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Whole counts, each the floor or ceiling of its value, adding up to each row's whole total:
    the largest fractional parts of a row go up (ties: the first category)."""
    down = np.floor(counts)
    deficit = np.rint(totals - down.sum(axis=1)).astype(np.int64)
    order = np.argsort(-(counts - down), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(counts.shape[1])[None, :].repeat(len(counts), axis=0), axis=1)
    return down + (rank < deficit[:, None])


def raking_seed(estimates: np.ndarray, cell_codes: np.ndarray) -> np.ndarray:
    """The raking's seed: each estimate plus its category's mean over the establishment's cell (the
    finest measured grouping), so every category the cell has can take jobs and an establishment
    whose categories are all estimated 0 starts from its cell's mix. A cell with no estimated jobs at
    all weighs its categories equally."""
    means = cell_sums(estimates, cell_codes)
    means = means / np.maximum(np.bincount(cell_codes, minlength=len(means)), 1)[:, None]
    empty = means.sum(axis=1) <= 0
    means[empty] = 1.0
    return estimates + means[cell_codes]


def protect_family(spec: FamilySpec, answers: Mapping[str, Sequence[NoisyAnswer]], public: pd.DataFrame,
                   employment: np.ndarray, *, solver: str, integer: bool, groupings: Groupings | None = None,
                   on_step: Callable[[str], None] | None = None) -> tuple[np.ndarray, dict[str, WLSResult]]:
    """One family's counts: every category by the weighted least squares (released variances), then
    raked (``rake_counts``) to the protected employment and to each ``RAKING_MARGINS`` grouping's
    category totals from the unbounded least squares (``margin_targets``) and, for an integer
    release, rounded within each establishment (``round_counts``; ``employment`` is then whole).
    Returns the counts (establishments in release order x categories) and the solver results;
    ``groupings``: of ``public``, shared with the release's other attributes."""
    attributes = spec.attributes
    groupings = groupings or Groupings(public)
    results, totals = {}, []
    for attribute in attributes:
        system, identity_rows, cell_codes = attribute_system(answers[attribute], public, "estimated", None, groupings)
        results[attribute] = solve_attribute(system, identity_rows, cell_codes, solver)
        totals.append(unbounded_totals(system, identity_rows, cell_codes))
        if on_step is not None:
            on_step(f"postprocess {attribute}")
    estimates = np.column_stack([results[a].values for a in attributes])
    cell_totals = np.column_stack(totals)
    state_mix = cell_shares(np.maximum(cell_totals.sum(axis=0, keepdims=True), 0.0), np.zeros(1, dtype=np.int64))[0]
    seed = raking_seed(estimates, cell_codes) + SEED_FLOOR * state_mix
    columns = [column for column in RAKING_MARGINS if _holds_cells(groupings((column,)).codes, cell_codes)]
    blocks = groupings(tuple(columns)).codes if columns else cell_codes  # none applies: the cells themselves
    block_of_cell = coarser(blocks, cell_codes)
    block_employment = np.bincount(blocks, weights=employment, minlength=int(blocks.max(initial=0)) + 1)
    margins = []
    for codes in [groupings((column,)).codes for column in columns] or [blocks]:
        group_of_block = coarser(codes, blocks)
        group_employment = np.bincount(group_of_block, weights=block_employment)
        margins.append((group_of_block, margin_targets(cell_totals, group_of_block[block_of_cell], group_employment,
                                                       state_mix)))
    # the margins met at the level of their crossed groups (a few hundred rows; 2-way margins of a
    # 3-way table may admit no exact fit, so at most RAKING_STEPS sweeps), then within each group
    block_targets = rake_counts(cell_sums(seed, blocks), block_employment, margins)
    counts = rake_counts(seed, employment, [(blocks, block_targets)])
    if integer:
        counts = round_counts(counts, employment)
    return counts, results


def coarser(codes: np.ndarray, finer: np.ndarray) -> np.ndarray:
    """For each group of ``finer`` (establishment codes), the code of ``codes`` of its establishments
    (the last one's, where they differ)."""
    group = np.zeros(int(finer.max(initial=-1)) + 1, dtype=np.int64)
    group[finer] = codes
    return group


def _holds_cells(codes: np.ndarray, cell_codes: np.ndarray) -> bool:
    """Whether every cell lies inside one group of ``codes`` (so the group's totals are its cells' sums)."""
    return bool(np.array_equal(coarser(codes, cell_codes)[cell_codes], codes))


def job_table(estab_ids: pd.Series, families: Sequence[tuple[FamilySpec, np.ndarray]]) -> pd.DataFrame:
    """The protected job frame in long form: estab_id, family, the families' worker columns (empty
    where a family has no such column) and ``jobs``; rows with jobs > 0 only, in family order, then
    establishment (release) order, then category order."""
    columns = list(dict.fromkeys(c for f, _ in families for c in f.columns))
    parts = []
    for f, counts in families:
        establishment, category = np.nonzero(counts)
        codes = np.array(f.categories, dtype=object).reshape(len(f.categories), len(f.columns))
        part = {"estab_id": estab_ids.to_numpy()[establishment], "family": f.family}
        for column in columns:
            part[column] = codes[category, f.columns.index(column)] if column in f.columns else None
        part["jobs"] = counts[establishment, category]
        parts.append(pd.DataFrame(part))
    table = pd.concat(parts, ignore_index=True)
    return table.astype({c: "string" for c in ["estab_id", "family", *columns]})


# --- job tabulations ---------------------------------------------------------------------------------
def family_attributes(family: str, answers: Mapping[str, Sequence[NoisyAnswer]]) -> dict[str, tuple[str, ...]]:
    """A family's category attributes in a release's answers (every state's), with their codes."""
    prefix = f"{family}["
    return {a: tuple(a[len(prefix):-1].split(",")) for a in sorted(answers) if a.startswith(prefix)}


def pick_family(families: Mapping[str, Sequence[str]], worker_keys: Sequence[str]) -> str:
    """The first family whose columns include every worker key of a tabulation."""
    for family, columns in families.items():
        if set(worker_keys) <= set(columns):
            return family
    listed = "; ".join(f"{f}: {', '.join(c)}" for f, c in families.items()) or "none"
    raise ValueError(f"no job family of this release has {', '.join(worker_keys)} (families: {listed})")


def tabulate_jobs(protected: pd.DataFrame, jobs: pd.DataFrame, families: Mapping[str, Sequence[str]],
                  by: Sequence[str], *, where: str | None = None, moe: bool = False, level: float = 0.95,
                  answers: Mapping[str, Sequence[NoisyAnswer]] | JobAnswers | None = None) -> pd.DataFrame:
    """Protected jobs by establishment columns and worker columns of one family (the first whose
    columns hold the tabulation's worker keys), over the establishments matching ``where`` (a filter
    on establishment columns): keys, ``estabs`` (establishments with jobs in the cell), ``jobs`` and
    with ``moe`` ``jobs_moe`` (see the module docstring), from the release's ``answers`` (as
    ``JobAnswers`` over ``protected``: their variance structures kept for further tabulations).
    Cells without protected jobs are absent."""
    from statistics import NormalDist

    from gedp.postprocess.tabulate import group_keys, select

    worker_keys = [c for c in dict.fromkeys(by) if c in FAMILY_COLUMNS]
    family = pick_family(families, worker_keys)
    keys = group_keys(protected, [c for c in by if c not in worker_keys])
    keep = select(protected, where)
    rows = jobs[jobs["family"].astype(str) == family]
    position = pd.Index(protected["estab_id"].astype(str)).get_indexer(rows["estab_id"].astype(str))
    if (position < 0).any():
        raise ValueError("the job frame names an establishment the protected microdata lack")
    inside = keep[position]
    if not inside.any():
        raise ValueError("no jobs to tabulate" + (f" match where {where!r}" if where is not None else ""))
    frame = protected.loc[position[inside], keys].reset_index(drop=True)
    for column in worker_keys:
        frame[column] = rows[column].to_numpy()[inside]
    frame["position"], frame["jobs"] = position[inside], rows["jobs"].to_numpy(dtype=float)[inside]
    all_keys = [*keys, *worker_keys]
    if all_keys:
        grouped = frame.groupby(all_keys, sort=True, observed=True)
        table = grouped["jobs"].sum().to_frame()
        table.insert(0, "estabs", grouped["position"].nunique())
        table = table.reset_index()
    else:
        table = pd.DataFrame({"estabs": [frame["position"].nunique()], "jobs": [frame["jobs"].sum()]})
    if moe:
        if answers is None:
            raise ValueError("margins of error need the release's answers (a release directory)")
        z = NormalDist().inv_cdf(0.5 + level / 2)
        held = answers if isinstance(answers, JobAnswers) else JobAnswers(protected, answers)
        variances = job_variances(protected, rows, family, held, keep, keys, worker_keys, table)
        table["jobs_moe"] = z * np.sqrt(variances)
    return table


@dataclass(frozen=True, eq=False)
class JobAnswers:
    """A release's answers over its protected microdata, with what every job tabulation's variances
    take from them (each attribute's ``variances.answers_structure`` over the establishments it
    measures, and the cells of the grouping by all measured columns) built at first use and kept:
    tabulations of one release's answers pay for them once."""

    protected: pd.DataFrame
    answers: Mapping[str, Sequence[NoisyAnswer]]
    _kept: dict = field(default_factory=dict, repr=False)

    @property
    def public(self) -> pd.DataFrame:
        """The protected microdata's public columns."""
        from gedp.synth.schema import public_columns

        if "public" not in self._kept:
            self._kept["public"] = self.protected[public_columns(self.protected)]
        return self._kept["public"]

    def measured(self, attribute: str) -> np.ndarray:
        """The establishments (rows of ``public``, sorted) the attribute's identity answer measures."""
        if ("measured", attribute) not in self._kept:
            identity = next(a for a in self.answers[attribute] if a.query.is_identity)
            ids = pd.Index(self.public["estab_id"].astype(str))
            self._kept["measured", attribute] = np.sort(ids.get_indexer(identity.keys["estab_id"].astype(str)))
        return self._kept["measured", attribute]

    def cell_codes(self, attribute: str) -> np.ndarray:
        """Each establishment's cell of the grouping by all of the attribute's measured columns."""
        if ("cells", attribute) not in self._kept:
            self._kept["cells", attribute] = system_structure(self.answers[attribute], self.public)[1]
        return self._kept["cells", attribute]

    def structure(self, attribute: str, measured_only: bool) -> EstablishmentVariances:
        """The attribute's variance structure over every establishment, or (``measured_only``) over
        those it measures (``measured``), in that order."""
        from gedp.postprocess.variances import answers_structure

        if ("structure", attribute, measured_only) not in self._kept:
            public = self.public.iloc[self.measured(attribute)].reset_index(drop=True) if measured_only else self.public
            self._kept["structure", attribute, measured_only] = answers_structure(self.answers[attribute], public)
        return self._kept["structure", attribute, measured_only]


def job_variances(protected: pd.DataFrame, rows: pd.DataFrame, family: str, held: JobAnswers, keep: np.ndarray,
                  keys: Sequence[str], worker_keys: Sequence[str], table: pd.DataFrame) -> np.ndarray:
    """Variance of each row of a job tabulation ``table`` (see the module docstring), from the
    release's answers over ``protected`` (``held``)."""
    if held.protected is not protected:
        raise ValueError("the job answers are held over other protected microdata than the tabulation's")
    answers, public = held.answers, held.public
    ids = pd.Index(public["estab_id"].astype(str))
    n = len(public)
    categories = family_attributes(family, answers)
    names = list(categories)
    columns = list(dict.fromkeys(c for c in rows.columns if c in FAMILY_COLUMNS and rows[c].notna().any()))
    # released counts y (n x K); s_gc: category c's share of cell g's released jobs
    code = pd.Index([categories[a] for a in names]).get_indexer(
        pd.MultiIndex.from_frame(rows[columns].astype(str)) if len(columns) > 1 else rows[columns[0]].astype(str))
    y = np.zeros((n, len(names)))
    y[ids.get_indexer(rows["estab_id"].astype(str)), code] = rows["jobs"].to_numpy(dtype=float)
    measured, subsets = np.zeros((n, len(names)), dtype=bool), []
    for k, attribute in enumerate(names):
        subsets.append(held.measured(attribute))
        measured[subsets[-1], k] = True
    # s_gc: category c's share of the released jobs of establishment j's cell g
    cell_codes = held.cell_codes(names[0])
    rho = cell_shares(y, cell_codes, measured)[cell_codes]
    # each (establishment, worker-key combination) entry's row of the table (-1: none or not kept)
    combos = ["|".join(categories[a][columns.index(c)] for c in worker_keys) for a in names]
    combo_codes, combo_keys = pd.factorize(pd.Index(combos), sort=True)
    entry_row = _entry_rows(public, keys, worker_keys, combo_keys, table)
    entry_row[~np.tile(keep, len(combo_keys))] = -1
    establishment = np.tile(np.arange(n), len(combo_keys))
    in_combo = combo_codes[None, :] == np.arange(len(combo_keys))[:, None]  # combos x K
    rho_combo = rho @ in_combo.T  # n x combos
    variances = held.structure(EMPLOYMENT, measured_only=False)(entry_row, len(table), establishments=establishment,
                                                                coefficients=rho_combo.T.reshape(-1)).variance
    for k, (attribute, subset) in enumerate(zip(names, subsets)):
        covered = measured[:, k]
        coefficient = covered[:, None] * (in_combo[:, k][None, :] - rho_combo)  # n x combos
        local = np.full(n, -1, dtype=np.int64)
        local[subset] = np.arange(len(subset))
        use = np.tile(covered, len(combo_keys)) & (entry_row >= 0)
        variances += held.structure(attribute, measured_only=True)(
            np.where(use, entry_row, -1), len(table), establishments=np.where(use, local[establishment], 0),
            coefficients=coefficient.T.reshape(-1)).variance
    return variances


def _entry_rows(public: pd.DataFrame, keys: Sequence[str], worker_keys: Sequence[str], combo_keys: pd.Index,
                table: pd.DataFrame) -> np.ndarray:
    """For each (worker-key combination, establishment) entry, combination-major, its row of the
    job tabulation ``table`` (-1 when the table has no such cell); ``combo_keys`` label the
    combinations as their codes joined by "|"."""
    n = len(public)
    if keys:
        grouped = public.groupby(list(keys), sort=True, observed=True)
        group = grouped.ngroup().to_numpy()
        group_keys = grouped.size().index
        table_group = group_keys.get_indexer(pd.MultiIndex.from_frame(table[list(keys)]) if len(keys) > 1
                                             else pd.Index(table[keys[0]]))
    else:
        group, table_group = np.zeros(n, dtype=np.int64), np.zeros(len(table), dtype=np.int64)
    labels = (table[list(worker_keys)].astype(str).agg("|".join, axis=1) if worker_keys
              else pd.Series("", index=table.index))
    combos = combo_keys.get_indexer(labels)
    lookup = np.full((int(group.max(initial=0)) + 1, len(combo_keys)), -1, dtype=np.int64)
    lookup[table_group, combos] = np.arange(len(table))
    return lookup[np.tile(group, len(combo_keys)), np.repeat(np.arange(len(combo_keys)), n)]
