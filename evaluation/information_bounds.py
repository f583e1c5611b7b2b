"""What any method could learn from a release: efficiency bounds for the within-quarter change
statistics of ``evaluation.microdata_stats`` (Fisher information and Le Cam's two points).

Model: a state is N establishments drawn independently from a law P of (m1, m2, m3) (whole
employees). For the unknown month x of an establishment the release gives an identity answer
sqrt(x) + N(0, s^2) (s public) and group answers sum_g x + N(0, V_g) (V_g public). An oracle gives
any estimator more: the two other months exactly (the *cell* of the establishment), and in place of
the group answers a measurement x + N(0, 1 / tau) per member with tau = sum over its groups of
n_g / V_g (the group answer is a sum of such measurements: a garbling). So per establishment the
unknown month is seen through the 2-D observation (sqrt-scale answer, raw-scale measurement), and a
bound under the oracle holds for every estimator of the release.

Sub-model: the law p_c of the unknown month in each cell c, free on the points where the truth's
empirical law is positive (tangent h_c with sum 0). Its Fisher information per establishment is
``pair_information`` (integral of f_a f_b / f_P, Gauss-Hermite), summed over the cell's members
(``CellInformation``; precisions rounded up to a geometric grid, ``PRECISION_STEP``: more information,
so the bound stays a lower bound). A statistic's gradient c (``no_change_gradient``,
``flow_gradients``, ``cdf_gradient``) gives the efficient variance sum_c c_c' G_c c_c (G_c the
pseudo-inverse in the tangent space) and the least favourable direction h_c = G_c c_c
(``Bound``); ``two_point`` moves P along it until the release's chi-square distance between the
two states is ``CHI2_BUDGET`` (then KL <= chi^2 and Pinsker's TV <= sqrt(KL / 2) = 0.8: no estimator
is within half the two states' difference of the truth with probability above 0.9 on both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gedp.postprocess.sizeclass import size_class

#: Gauss-Hermite nodes per dimension of the 2-D observation.
NODES = 32
#: Gauss-Hermite nodes per dimension of a 3-D observation.
NODES_3D = 14
#: Members' precisions are rounded up to powers of this step (conservative: more information).
PRECISION_STEP = 1.25
#: The two states' total chi-square distance: KL <= 1.28 and Pinsker's TV <= sqrt(1.28 / 2) = 0.8.
CHI2_BUDGET = 1.28
#: Precisions below this are taken as 0 (the measurement carries no information at the unit scale).
TINY_PRECISION = 1e-9


def member_precision(group_answers, members: pd.DataFrame) -> np.ndarray:
    """Per establishment (rows of ``members``, the public columns), sum over the ``group_answers``
    (``NoisyAnswer``s of one month, not the identity query) of n_g / sd_g^2 for its group g."""
    total = np.zeros(len(members))
    for answer in group_answers:
        by = list(answer.keys.columns)
        groups = pd.MultiIndex.from_frame(answer.keys[by].astype(str))
        where = groups.get_indexer(pd.MultiIndex.from_frame(members[by].astype(str)))
        if (where < 0).any():
            raise ValueError(f"{int((where < 0).sum())} establishments are in no group of {by}")
        sizes = np.bincount(where, minlength=len(groups))
        total += (sizes / np.asarray(answer.sd, float) ** 2)[where]
    return total


def rounded_up(precision: np.ndarray, step: float = PRECISION_STEP) -> np.ndarray:
    """Precisions rounded up to powers of ``step`` (0 stays 0)."""
    precision = np.asarray(precision, float)
    safe = np.maximum(precision, TINY_PRECISION)
    up = step ** np.ceil(np.log(safe) / np.log(step) - 1e-12)
    return np.where(precision > TINY_PRECISION, up, 0.0)


def information(means: list[np.ndarray], sds: list[float], law: np.ndarray, nodes: int | None = None) -> np.ndarray:
    """M[a, b] = integral f_a f_b / f_P, f_a the density of independent Gaussian observations with
    means ``means[d][a]`` and sds ``sds[d]`` (d: the observation's dimensions), f_P = sum law[a] f_a
    (``law`` may sum to less than 1: f_P is then smaller and M larger, a conservative information):
    one establishment's Fisher information about ``law``, by Gauss-Hermite quadrature under each f_a."""
    law = np.asarray(law, float)
    dims = len(means)
    u, w = np.polynomial.hermite.hermgauss(nodes or (NODES if dims <= 2 else NODES_3D))
    u, w = u * np.sqrt(2), w / np.sqrt(np.pi)
    grid = np.stack(np.meshgrid(*([u] * dims), indexing="ij"), -1).reshape(-1, dims)  # (node, dim)
    weight = np.prod(np.stack(np.meshgrid(*([w] * dims), indexing="ij"), -1).reshape(-1, dims), axis=1)
    log_f = np.zeros((len(law), len(grid), len(law)))  # (a, node, b)
    for d, (mean, sd) in enumerate(zip(means, sds)):
        mean = np.asarray(mean, float)
        point = mean[:, None] + sd * grid[None, :, d]
        log_f += -0.5 * ((point[:, :, None] - mean[None, None, :]) / sd) ** 2
    f = np.exp(log_f - log_f.max(axis=-1, keepdims=True))
    ratio = f / (f @ law)[..., None]
    m = np.einsum("anb,n->ab", ratio, weight)
    return (m + m.T) / 2


def pair_information(support: np.ndarray, law: np.ndarray, s: float, tau: float, shifts: tuple = (0,),
                     nodes: int | None = None) -> np.ndarray:
    """``information`` of x = support[a] seen through identity answers sqrt(x + shift) + N(0, s^2)
    for each of ``shifts`` and a measurement x + N(0, 1 / tau) (none where tau is 0)."""
    support = np.asarray(support, float)
    shifts = tuple(shifts)
    if len(shifts) > 1 and len(set(shifts)) == 1:  # equal answers: their mean is sufficient
        s, shifts = s / np.sqrt(len(shifts)), shifts[:1]
    means, sds = [np.sqrt(support + shift) for shift in shifts], [s] * len(shifts)
    if tau > TINY_PRECISION:
        means.append(support)
        sds.append(1 / np.sqrt(tau))
    return information(means, sds, law, nodes)


def tangent_inverse(m: np.ndarray, free: np.ndarray | None = None, kept: np.ndarray | None = None) -> np.ndarray:
    """G with c' G c the variance of c' p's efficient estimate when p has information ``m`` and
    sum p = 1 (the pseudo-inverse of m restricted to directions with sum 0), moving only the ``free``
    points (all by default; G is 0 elsewhere) and, given ``kept`` (rows: functions of the points),
    only in directions that keep their means."""
    k = len(m)
    free = np.ones(k, bool) if free is None else np.asarray(free, bool)
    out = np.zeros((k, k))
    if free.sum() < 2:
        return out
    rows = np.ones((1, int(free.sum())))
    if kept is not None:
        rows = np.vstack([rows, np.asarray(kept, float)[:, free]])
    _, sv, vt = np.linalg.svd(rows)
    basis = vt[int((sv > 1e-9 * sv[0]).sum()):].T  # orthonormal, orthogonal to every row
    if basis.shape[1] == 0:
        return out
    inner = basis.T @ m[np.ix_(free, free)] @ basis
    out[np.ix_(free, free)] = basis @ np.linalg.pinv(inner, hermitian=True) @ basis.T
    return out


@dataclass
class Cell:
    """One cell of establishments with the same revealed values: the points of the unknown (each
    with its months ``first``, ``second`` and ``later``: months 1, 2 and 3), the truth's law on them,
    the members' count, the information summed over them and its tangent pseudo-inverse (both 0
    outside the ``free`` points, the only ones the sub-model moves)."""

    known: tuple
    first: np.ndarray
    second: np.ndarray
    later: np.ndarray
    law: np.ndarray
    count: int
    information: np.ndarray
    inverse: np.ndarray
    free: np.ndarray
    kept: np.ndarray | None = None


def _cell(key: tuple, counts: np.ndarray, months, free, information_of, kept: np.ndarray | None = None) -> Cell:
    law = counts / counts.sum()
    k = len(law)
    info = np.zeros((k, k))
    if free.sum() > 1:
        info[np.ix_(free, free)] = information_of(law, free)
    return Cell(key, *months, law, int(counts.sum()), info, tangent_inverse(info, free, kept), free, kept)


def cells(known: np.ndarray, unknown: np.ndarray, precision: np.ndarray, s: float, *, unknown_month: int = 2,
          sibling: bool = False, step: float = PRECISION_STEP) -> list[Cell]:
    """Cells of the revealed values: (m1, m3) with m2 unknown (``unknown_month`` 2), (m1, m2) with m3
    unknown (3), or with ``sibling`` (m1, d) with m2 unknown and m3 = m2 + d, whose identity answer
    sqrt(m2 + d) is seen too; the law the truth's, the information its members' (the unknown month's
    answer, and its measurement of precision ``precision`` rounded up by ``rounded_up``)."""
    tau = rounded_up(precision, step)
    frame = pd.DataFrame(np.asarray(known, int)).assign(x=np.asarray(unknown, int), tau=tau)
    out = []
    for key, part in frame.groupby([0, 1], sort=True):
        key = tuple(int(v) for v in key)
        points, counts = np.unique(part["x"].to_numpy(), return_counts=True)
        ones = np.ones(len(points), int)
        if sibling:
            months = (key[0] * ones, points, points + key[1])
        elif unknown_month == 2:
            months = (key[0] * ones, points, key[1] * ones)
        else:
            months = (key[0] * ones, key[1] * ones, points)
        shifts = (0, key[1]) if sibling else (0,)
        taus = part["tau"].value_counts()

        def information_of(law, free, points=points, shifts=shifts, taus=taus):
            return sum(n * pair_information(points[free], law[free], s, float(t), shifts) for t, n in taus.items())

        out.append(_cell(key, counts, months, np.ones(len(points), bool), information_of))
    return out


def level_cells(months: np.ndarray, s: float, largest: int, keep_means: bool = False) -> list[Cell]:
    """Cells of the revealed month 2 -> 3 change d (rows of ``months``: m1, m2, m3), the pair (m1, m2)
    unknown and seen through the identity answers alone (sqrt(m1), sqrt(m2), sqrt(m2 + d)); the
    sub-model moves the pairs with both months at most ``largest`` (the others' law fixed; their
    densities left out of the information's denominator: more information, conservative).
    ``keep_means``: only directions that keep each cell's mean m1 and m2 (so every group answer's
    expectation is the same under both states)."""
    months = np.asarray(months, int)
    out = []
    for d, part in pd.DataFrame(months).groupby(months[:, 2] - months[:, 1], sort=True):
        pairs, counts = np.unique(part[[0, 1]].to_numpy(), axis=0, return_counts=True)
        free = (pairs <= largest).all(axis=1)

        def information_of(law, free, pairs=pairs, d=int(d), n=len(part)):  # summed over the cell's n members
            first, second = np.sqrt(pairs[free, 0]), pairs[free, 1]
            if d == 0:
                return n * information([first, np.sqrt(second)], [s, s / np.sqrt(2)], law[free])
            return n * information([first, np.sqrt(second), np.sqrt(second + d)], [s, s, s], law[free])

        kept = pairs.T.astype(float) if keep_means else None
        out.append(_cell((int(d),), counts, (pairs[:, 0], pairs[:, 1], pairs[:, 1] + int(d)), free, information_of,
                         kept))
    return out


@dataclass
class Bound:
    """A statistic's efficient variance and least favourable direction (per cell)."""

    variance: float
    direction: list[np.ndarray]

    @property
    def sd(self) -> float:
        return float(np.sqrt(self.variance))


def bound(all_cells: list[Cell], gradient: list[np.ndarray]) -> Bound:
    """sum_c c_c' G_c c_c and h_c = G_c c_c for the per-cell gradients c_c."""
    direction = [cell.inverse @ c for cell, c in zip(all_cells, gradient)]
    return Bound(float(sum(c @ h for c, h in zip(gradient, direction))), direction)


def chi_square(all_cells: list[Cell], direction: list[np.ndarray]) -> float:
    """The release's chi-square distance (summed over establishments) between P and P + h: exactly
    sum_c h_c' M_c h_c (the observation's density is linear in the law)."""
    return float(sum(h @ cell.information @ h for cell, h in zip(all_cells, direction)))


def two_point(all_cells: list[Cell], direction: list[np.ndarray], budget: float = CHI2_BUDGET) -> tuple[float, list]:
    """t and the laws of Q = P + t h with total chi-square ``budget`` (t lowered until every law of Q is
    at least 0)."""
    size = chi_square(all_cells, direction)
    t = float(np.sqrt(budget / size)) if size > 0 else 0.0
    for cell, h in zip(all_cells, direction):
        negative = h < 0
        if negative.any():
            t = min(t, float(np.min(cell.law[negative] / -h[negative])))
    return t, [cell.law + t * h for cell, h in zip(all_cells, direction)]


def ridge_direction(all_cells: list[Cell], gradient: list[np.ndarray], ridge: float) -> list[np.ndarray]:
    """h_c = (M_c + ridge N_c diag(1 / p_c))^+ c_c in the tangent space of the free points: the least
    favourable direction shrunk toward the complete data's (ridge 0: ``bound``'s; large: the
    multinomial's), so that Q stays a law where the release barely sees some direction."""
    out = []
    for cell, c in zip(all_cells, gradient):
        shrunk = cell.information + ridge * cell.count * np.diag(np.where(cell.free, 1 / cell.law, 0.0))
        out.append(tangent_inverse(shrunk, cell.free, cell.kept) @ c)
    return out


def two_point_search(all_cells: list[Cell], gradient: list[np.ndarray], value_of, ridges,
                     budget: float = CHI2_BUDGET) -> dict:
    """The largest |value_of(Q) - value_of(P)| over Q = P + t h, h a ``ridge_direction`` (either sign)
    and t at the chi-square ``budget`` or where a law of Q reaches 0 (``two_point``): every such Q is
    a state the release tells from P with total variation at most sqrt(chi^2 / 2)."""
    base = value_of([cell.law for cell in all_cells])
    best = {"difference": 0.0, "ridge": None, "t": 0.0, "chi2": 0.0, "laws": [cell.law for cell in all_cells],
            "value": base}
    for ridge in ridges:
        direction = ridge_direction(all_cells, gradient, ridge)
        for sign in (1.0, -1.0):
            signed = [sign * h for h in direction]
            t, laws = two_point(all_cells, signed, budget)
            value = value_of(laws)
            if abs(value - base) > abs(best["difference"]):
                best = {"difference": value - base, "ridge": ridge, "t": t, "laws": laws, "value": value,
                        "chi2": chi_square(all_cells, [t * h for h in signed])}
    return best


def total_variation_bound(chi2: float) -> float:
    """Pinsker's bound on the total variation of N observations with summed chi-square ``chi2``
    (KL <= chi^2)."""
    return float(np.sqrt(chi2 / 2))


# --- the statistics: functions of the cells' laws, and their derivatives --------------------------

def _ratio_gradient(all_cells: list[Cell], numerator, denominator) -> list[np.ndarray]:
    """The derivative in each cell's law of sum_c N_c law_c @ numerator(c) / sum_c N_c law_c @ denominator(c)."""
    top = sum(cell.count * cell.law @ numerator(cell) for cell in all_cells)
    bottom = sum(cell.count * cell.law @ denominator(cell) for cell in all_cells)
    return [cell.count * (numerator(cell) - top / bottom * denominator(cell)) / bottom for cell in all_cells]


def _ratio(all_cells: list[Cell], laws: list[np.ndarray], numerator, denominator) -> float:
    top = sum(cell.count * law @ numerator(cell) for cell, law in zip(all_cells, laws))
    return float(top / sum(cell.count * law @ denominator(cell) for cell, law in zip(all_cells, laws)))


def _same(cell: Cell) -> np.ndarray:
    return ((cell.first == cell.second) & (cell.first > 0)).astype(float)


def _active(cell: Cell) -> np.ndarray:
    return ((cell.first > 0) | (cell.second > 0)).astype(float)


def no_change_share(all_cells: list[Cell], laws: list[np.ndarray]) -> float:
    """Month 1 -> 2: establishments with m2 = m1 > 0 over those with m1 > 0 or m2 > 0
    (``microdata_stats.no_change_share`` on whole numbers)."""
    return _ratio(all_cells, laws, _same, _active)


def no_change_gradient(all_cells: list[Cell]) -> list[np.ndarray]:
    """The derivative of ``no_change_share`` in each cell's law."""
    return _ratio_gradient(all_cells, _same, _active)


def _up(cell: Cell) -> np.ndarray:
    return np.clip(cell.later - cell.first, 0, None).astype(float)


def _down(cell: Cell) -> np.ndarray:
    return np.clip(cell.first - cell.later, 0, None).astype(float)


def _average(cell: Cell) -> np.ndarray:
    return (cell.first + cell.later) / 2


def flows(all_cells: list[Cell], laws: list[np.ndarray]) -> tuple[float, float]:
    """Job creation and destruction rates month 1 -> 3 (``microdata_stats.job_flow_rates``)."""
    return _ratio(all_cells, laws, _up, _average), _ratio(all_cells, laws, _down, _average)


def flow_gradients(all_cells: list[Cell]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The derivatives of ``flows``' creation and destruction rates in each cell's law."""
    return _ratio_gradient(all_cells, _up, _average), _ratio_gradient(all_cells, _down, _average)


def growth(first: np.ndarray, later: np.ndarray) -> np.ndarray:
    """DHS growth rates (later - first) / ((first + later) / 2) (NaN where both are 0)."""
    mean = (np.asarray(first, float) + later) / 2
    return np.where(mean > 0, (later - first) / np.where(mean > 0, mean, 1.0), np.nan)


def _employing(cell: Cell) -> np.ndarray:
    return np.isfinite(growth(cell.first, cell.later)).astype(float)


def _at_most(at: float):
    return lambda cell: (np.nan_to_num(growth(cell.first, cell.later), nan=np.inf) <= at).astype(float)


def growth_cdf(all_cells: list[Cell], laws: list[np.ndarray], at: float) -> float:
    """The share of establishments employing in month 1 or 3 whose growth month 1 -> 3 is <= ``at``."""
    return _ratio(all_cells, laws, _at_most(at), _employing)


def cdf_gradient(all_cells: list[Cell], at: float) -> list[np.ndarray]:
    """The derivative of ``growth_cdf`` at ``at`` in each cell's law."""
    return _ratio_gradient(all_cells, _at_most(at), _employing)


def growth_quantile(all_cells: list[Cell], laws: list[np.ndarray], q: float) -> float:
    """The q-quantile (the smallest growth rate whose share at or below it is >= q) of the growth
    rates under the cells' laws."""
    rates = [growth(cell.first, cell.later) for cell in all_cells]
    v = np.concatenate([g[np.isfinite(g)] for g in rates])
    w = np.concatenate([cell.count * law[np.isfinite(g)] for cell, law, g in zip(all_cells, laws, rates)])
    order = np.argsort(v, kind="stable")
    cumulative = np.cumsum(w[order]) / w.sum()
    return float(v[order][np.searchsorted(cumulative, q - 1e-12)])


def total(all_cells: list[Cell], laws: list[np.ndarray], values) -> float:
    """sum_c N_c law_c @ values(c): the state's expected count or sum of ``values`` under the laws."""
    return float(sum(cell.count * law @ values(cell) for cell, law in zip(all_cells, laws)))


def total_gradient(all_cells: list[Cell], values) -> list[np.ndarray]:
    """The derivative of ``total`` in each cell's law: N_c values(c)."""
    return [cell.count * values(cell).astype(float) for cell in all_cells]


def class_values(code: int, statistic: str):
    """The values whose ``total`` is size class ``code``'s (BLS, by month 3) establishment count
    (``statistic`` "estabs") or month-3 employment ("m3emp"), as ``microdata_stats.size_class_table``."""
    def values(cell: Cell) -> np.ndarray:
        member = (size_class(cell.later) == code).astype(float)
        return member if statistic == "estabs" else member * cell.later
    return values


def drawn(all_cells: list[Cell], laws: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A dataset of state Q: per cell, its members' points drawn from the cell's law (rows: m1, m2, m3)."""
    rows = []
    for cell, law in zip(all_cells, laws):
        law = np.clip(law, 0, None)
        pick = rng.choice(len(law), size=cell.count, p=law / law.sum())
        rows.append(np.column_stack([cell.first[pick], cell.second[pick], cell.later[pick]]))
    return np.vstack(rows)
