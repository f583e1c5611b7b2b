"""The noise a release's group answers state, checked against their own spread (red team rt26 G1).

Where one query's groups nest in another's (``state,county,naics5`` in ``state,naics5``, in
``state,county``, in ``state``: the parent's key columns a subset of the child's), each parent group's
estimate and the sum of its children's estimates are unbiased for the same total with independent
noises, so z = (parent - sum children) / sqrt(var parent + sum var children) has E[z^2] near 1 when
the variances stated are the noise's. Stated larger by 1/K^2 (a budget restated lower with the same
values: rt26 G1) they shrink z^2 about K^2-fold; stated smaller, they raise it.

The psi mechanism's variances are estimated from its estimates (floored at 0), so a small group's z^2 is
below 1 in expectation, the more so the nearer its truth is to 0: E[z^2] and Var[z^2] of each parent group
are simulated under the release's own stated noise at a truth read from the children's estimates
(``expected_spread``). Those estimates floored at 0 overstate a truth near 0 (noise above 0 kept, below it
cut), and E[z^2] with it: genuine releases whose children are mostly noise (psi at a small mu, job-frame
cells) sat below it by 4-7 sd. The z^2 are therefore held to two references: below, to the one simulated
at each child's estimate less TRUTH_SDS of its stated sd; above, plus (both floored at 0).

The pairs of queries are chosen so that no answer is in two (``disjoint_pairs``): the z are then
independent, and their sum of squares is held to the scaled chi-square of each reference's mean and
variance, two-sided at MAX_FALSE_REFUSAL (``nesting_refusal``), in two strata of parent groups: those
whose total (the precision-weighted mean of its estimate and its children's sum) is estimated under
STRATUM_SDS of its sd, and the others (``size_stratum``; a group's stratum is drawn with it in the
simulation, each group's z^2 compared with what it holds given its stratum). A budget restated lower with
values moved onto the psi scale (rt26 G1) states large groups' noise smaller and small groups' larger than
they hold: pooled, the two nearly cancel; apart, each shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: A genuine release's pooled statistic falls outside the two-sided bounds with at most this probability.
MAX_FALSE_REFUSAL = 1e-9
#: The fewest independent parent groups the pooled statistic needs before it is tested.
MIN_PAIRS = 30
#: Draws of each parent group's z simulated for its expected z^2 and spread (seeded: readers agree).
DRAWS = 64
#: The references' truths: each child's estimate less (lower) or plus (upper) this many of its stated sd,
#: floored at 0.
TRUTH_SDS = 1.0
#: Parent groups are tested in two strata: totals estimated under this many of their sd, and the others.
STRATUM_SDS = 3.0
STRATA = 2  # 1: one pooled statistic
#: A stratum drawn fewer times than this for a group: its simulated z^2 given the stratum is its z^2 over all draws.
MIN_DRAWS = 8


def _columns(query: str) -> frozenset[str] | None:
    """A group query's key columns (``total``: none); None for the identity answers."""
    if query == "identity":
        return None
    return frozenset() if query == "total" else frozenset(query.split(","))


def disjoint_pairs(sizes: Mapping[str, int]) -> list[tuple[str, str]]:
    """Pairs (parent, child) of the queries ``sizes`` (each's number of groups) whose child's key columns
    hold the parent's, most parent groups first, each query in one pair at most (a query in two pairs
    would share its noise between them)."""
    columns = {query: _columns(query) for query in sizes}
    pairs = [(parent, child) for parent, above in columns.items() for child, below in columns.items()
             if above is not None and below is not None and above < below]
    pairs.sort(key=lambda pair: (-sizes[pair[0]], -sizes[pair[1]], pair))
    used: set[str] = set()
    chosen = []
    for parent, child in pairs:
        if parent not in used and child not in used:
            chosen.append((parent, child))
            used |= {parent, child}
    return chosen


@dataclass(frozen=True)
class Nested:
    """One pair of nested answers: the parent groups' and the children's estimate, variance, sd, grid and
    mechanism (psi True), and each child's parent group (children of no parent group left out)."""

    parent: dict
    child: dict
    parent_of: object


def nested_answers(frame, numbers: Mapping, psi_rows, part) -> dict:
    """The ``Nested`` pairs of a release's measurements (``numbers`` its number columns as float arrays,
    ``psi_rows`` each row's mechanism, ``part`` its part), per (part, attribute, parent, child). Parent
    groups without a child group are left out."""
    import numpy as np

    grouped = (frame["query"] != "identity").to_numpy()
    if not grouped.any():
        return {}
    fields = ("estimate", "variance", "sd", "grid")
    rows = frame.loc[grouped].assign(**{name: numbers[name][grouped] for name in fields},
                                     psi=np.asarray(psi_rows)[grouped], part=np.asarray(part)[grouped])
    found = {}
    for (number, attribute), answers in rows.groupby(["part", "attribute"], sort=False):
        by_query = dict(tuple(answers.groupby("query", sort=False)))
        for parent, child in disjoint_pairs({query: len(held) for query, held in by_query.items()}):
            keys = sorted(_columns(parent) or ())
            above, below = by_query[parent].reset_index(drop=True), by_query[child]
            if keys:
                index = above[keys].assign(_parent=np.arange(len(above)))
                parent_of = below[keys].merge(index, on=keys, how="left")["_parent"].to_numpy()
            else:
                parent_of = np.zeros(len(below))
            held = ~np.isnan(parent_of)
            kept = np.isin(np.arange(len(above)), parent_of[held])
            remap = np.cumsum(kept) - 1
            found[int(number), attribute, parent, child] = Nested(
                {name: above[name].to_numpy()[kept] for name in (*fields, "psi")},
                {name: below[name].to_numpy()[held] for name in (*fields, "psi")},
                remap[parent_of[held].astype(np.int64)])
    return found


def nesting_z(pair: Nested):
    """Each parent group's z: its estimate less its children's, over the root of their variances' sum."""
    import numpy as np

    groups = len(pair.parent["estimate"])
    sums = [np.bincount(pair.parent_of, weights=pair.child[name], minlength=groups)
            for name in ("estimate", "variance")]
    with np.errstate(all="ignore"):
        return (pair.parent["estimate"] - sums[0]) / np.sqrt(pair.parent["variance"] + sums[1])


def _draw(answer: dict, truth, psi, rng):
    """Estimates and variances of ``DRAWS`` draws of the answer's mechanism at ``truth`` (rows x draws)."""
    import numpy as np

    sd, grid = answer["sd"][:, None], answer["grid"][:, None]
    noise = rng.standard_normal((len(truth), DRAWS))
    estimate = truth[:, None] + sd * noise
    variance = np.broadcast_to(sd * sd, estimate.shape).copy()
    rows = answer["psi"]
    if rows.any():
        spread = np.sqrt(np.maximum(sd[rows] ** 2 - grid[rows] ** 2 / 12, 0.0))
        released = psi(truth[rows])[:, None] + spread * noise[rows]
        step = grid[rows]
        released = np.where(step > 0, np.rint(released / np.where(step > 0, step, 1.0)) * step, released)
        estimate[rows] = psi.unbiased_estimate(released, sd[rows])
        variance[rows] = psi.releasable_variance(estimate[rows], sd[rows])
    return estimate, variance


def size_stratum(parent, parent_variance, children, children_variance):
    """Each parent group's stratum: 0 while the precision-weighted mean of its estimate and its children's
    sum is under STRATUM_SDS of its sd, else 1 (with exact variances, normal noise and the truth shared,
    that mean is independent of their difference: a group's stratum tells nothing of its z)."""
    import numpy as np

    with np.errstate(all="ignore"):
        weights = 1 / parent_variance + 1 / children_variance
        size = (parent / parent_variance + children / children_variance) / np.sqrt(weights)
    return ((size >= STRATUM_SDS) & (STRATA > 1)).astype(np.int64)


def expected_spread(pair: Nested, psi, rng, shift: float = 0.0):
    """Each parent group's simulated mean and variance of z^2 given each stratum (groups x strata: over the
    draws whose parent's ``size_stratum`` is that stratum; over all draws where fewer than MIN_DRAWS are)
    under the stated noise, the truth the children's estimates plus ``shift`` of their stated sd, floored
    at 0 (the parent's their sum)."""
    import numpy as np

    truth = np.maximum(pair.child["estimate"] + shift * np.sqrt(pair.child["variance"]), 0.0)
    top = np.bincount(pair.parent_of, weights=truth, minlength=len(pair.parent["estimate"]))
    (pe, pv), (ce, cv) = _draw(pair.parent, top, psi, rng), _draw(pair.child, truth, psi, rng)
    groups = len(top)
    index = pair.parent_of[:, None] + groups * np.arange(DRAWS)[None, :]
    sums = [np.bincount(index.ravel(), weights=values.ravel(), minlength=groups * DRAWS).reshape(DRAWS, groups).T
            for values in (ce, cv)]
    with np.errstate(all="ignore"):
        z2 = (pe - sums[0]) ** 2 / (pv + sums[1])
    drawn = size_stratum(pe, pv, *sums)
    means, variances = [], []
    for stratum in range(STRATA):
        held = (drawn == stratum) | ((drawn == stratum).sum(axis=1) < MIN_DRAWS)[:, None]
        count = held.sum(axis=1)
        with np.errstate(all="ignore"):
            mean = np.where(held, z2, 0.0).sum(axis=1) / count
            means.append(mean)
            variances.append(np.where(held, (z2 - mean[:, None]) ** 2, 0.0).sum(axis=1) / (count - 1))
    return np.stack(means, axis=-1), np.stack(variances, axis=-1)


def nesting_statistic(found: Mapping, psi, seed: int = 0) -> list[tuple[int, float, tuple, tuple]]:
    """Per stratum: (its parent groups, their observed sum of z^2, the (mean, variance) of that sum
    simulated at the lower truth, and at the upper, each group given its stratum) over the ``Nested``
    pairs ``found`` (groups whose z or simulated spread is not finite left out)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    drawn = []
    for _, pair in sorted(found.items(), key=lambda item: str(item[0])):  # keys' texts: no arrays printed
        groups = len(pair.parent["estimate"])
        sums = [np.bincount(pair.parent_of, weights=pair.child[name], minlength=groups)
                for name in ("estimate", "variance")]
        stratum = size_stratum(pair.parent["estimate"], pair.parent["variance"], *sums)
        references = (*expected_spread(pair, psi, rng, -TRUTH_SDS), *expected_spread(pair, psi, rng, TRUTH_SDS))
        given = [np.take_along_axis(value, stratum[:, None], axis=1)[:, 0] for value in references]
        drawn.append((nesting_z(pair), stratum, *given))
    z, stratum, *spread = ([np.concatenate([each[k] for each in drawn]) for k in range(6)] if drawn
                           else [np.zeros(0), np.zeros(0, dtype=np.int64), *[np.zeros(0)] * 4])
    kept = np.isfinite(z) & np.all([np.isfinite(value) for value in spread], axis=0) & (spread[1] > 0) & (spread[3] > 0)
    tested = []
    for each in range(STRATA):
        held = kept & (stratum == each)
        sums = [float(value[held].sum()) for value in spread]
        tested.append((int(held.sum()), float(np.sum(z[held] ** 2)), (sums[0], sums[1]), (sums[2], sums[3])))
    return tested


def nesting_tail(pooled: float, low: tuple[float, float], high: tuple[float, float]) -> float:
    """The two-sided tail probability of ``pooled``: below, under the scaled chi-square of the smaller
    mean of the references ``low`` and ``high`` (each a mean and variance: c chi2_nu, c = variance /
    2 mean, nu = 2 mean^2 / variance); above, under that of the larger."""
    from scipy import stats

    def chi2(mean: float, variance: float):
        return stats.chi2(2 * mean * mean / variance, scale=variance / (2 * mean))

    under, over = sorted((low, high))
    return float(min(1.0, 2 * min(chi2(*under).cdf(pooled), chi2(*over).sf(pooled))))


def nesting_tails(found: Mapping, psi, seed: int = 0) -> list[tuple[int, int, float, float, float]]:
    """(stratum, parent groups, observed sum of z^2, the reference's mean on the side it lies, two-sided
    tail) of each stratum of at least MIN_PAIRS parent groups."""
    tails = []
    for stratum, (groups, pooled, low, high) in enumerate(nesting_statistic(found, psi, seed)):
        if groups >= MIN_PAIRS:
            under, over = sorted((low[0], high[0]))
            tails.append((stratum, groups, pooled, under if pooled < under else over,
                          nesting_tail(pooled, low, high)))
    return tails


def nesting_refusal(found: Mapping, psi, max_false: float | None = None, seed: int = 0) -> str | None:
    """Why the z^2 of the ``Nested`` pairs ``found`` are not those of the noise their variances state (a
    stratum's two-sided tail, times the strata tested, below ``max_false``, None: MAX_FALSE_REFUSAL), or
    None: no stratum of MIN_PAIRS parent groups, or each within its bounds."""
    tails = nesting_tails(found, psi, seed)
    if not tails:
        return None
    stratum, groups, pooled, mean, tail = min(tails, key=lambda each: each[-1])
    if tail * len(tails) >= (MAX_FALSE_REFUSAL if max_false is None else max_false):
        return None
    side = "larger" if pooled < mean else "smaller"
    where = ("under " if stratum == 0 else "at least ") + f"{STRATUM_SDS:g} sd"
    return (f"mean z^2 {pooled / groups:.3f} over {groups:,} nested groups (totals {where}) is not the "
            f"{mean / groups:.3f} their stated noise gives (two-sided tail {tail:.1e}): variances {side} than "
            f"the noise they hold")


def check_nesting(release, frame, numbers: Mapping, psi_rows, manifest: Mapping, parts) -> None:
    """Refuse ``release``'s measurements when their nested answers' pooled z^2 are not those of the noise
    their variances state (``nesting_refusal``), naming the pairs of queries compared."""
    import numpy as np

    from gedp.measure.neighbors import make_psi
    from gedp.release.measurement_checks import refuse_answers

    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)
    found = nested_answers(frame, numbers, psi_rows, part)
    reason = nesting_refusal(found, make_psi(**manifest["psi"])) if found else None
    if reason is not None:
        queries = sorted({f"{parent} in {child}" for _, _, parent, child in found})
        raise refuse_answers(release, f"hold nested answers ({'; '.join(queries)}) whose {reason}")
