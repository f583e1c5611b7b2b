"""What any method could get from a release: efficiency bounds for issue 44's change statistics
(``evaluation.information_bounds``; results in docs/evaluation/implicates-measurements.md).

    python benchmarks/information_bounds.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--out rows.json]

Synthesizes the state (``implicates_utility.truth_frame``), protects it with ``recommended`` (seed
``--seed``), reads the release's identity sds and group answers with their variances, and bounds,
under the oracle that reveals the two other months exactly (P = the truth's empirical laws): the
no-change share (month 1 -> 2), job creation and destruction rates and growth P10 (month 1 -> 3).
Per statistic: the truth, the efficient sd, the two-point half-difference Delta/2 (no estimator is
within it with probability above 0.9 on both states), the statistic of a dataset drawn from Q.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.config import load_config
from gedp.evaluation import information_bounds as ib
from gedp.evaluation.microdata_stats import growth_rates, job_flow_rates, no_change_share
from gedp.postprocess.sizeclass import SIZE_CODES, size_class
from gedp.release.reader import read_answers

MONTHS = ("m1emp", "m2emp", "m3emp")


def release_inputs(truth, seed: int) -> tuple[dict, dict, dict]:
    """The identity answers' sd, the members' group precisions and the group answers, per month, of
    ``truth``'s ``recommended`` release seeded ``seed`` (read from its files)."""
    with tempfile.TemporaryDirectory() as tmp:
        gedp.protect(truth, "recommended", seed=seed, not_for_publication=True).write(Path(tmp) / "r")
        answers = read_answers(Path(tmp) / "r")
    sds, precisions, groups = {}, {}, {}
    for month in MONTHS:
        identity = [a for a in answers[month] if a.query.is_identity]
        sds[month] = float(np.min(identity[0].sd))  # the smallest: more information, conservative
        groups[month] = [a for a in answers[month] if not a.query.is_identity]
        precisions[month] = ib.member_precision(groups[month], truth)
    return sds, precisions, groups


def group_chi_square(truth, months: np.ndarray, groups: dict, cells, laws) -> float:
    """For the level oracle's cells (one per month 2 -> 3 change): the group answers' chi-square
    between the two states in a Gaussian approximation (not a bound): sum over groups and months of
    mu_g^2 / v_g + delta_g^2 / (2 v_g^2), mu_g and delta_g the changes of the group sum's mean and
    variance, v_g = V_g + its variance under P."""
    index = {cell.known[0]: k for k, cell in enumerate(cells)}
    which = np.array([index[d] for d in months[:, 2] - months[:, 1]])
    total = 0.0
    for month, values in zip(MONTHS, ("first", "second", "later")):
        def moments(law_of):
            mean = np.array([law_of(k) @ getattr(c, values) for k, c in enumerate(cells)])
            square = np.array([law_of(k) @ getattr(c, values) ** 2.0 for k, c in enumerate(cells)])
            return mean, square - mean ** 2
        mean_p, var_p = moments(lambda k: cells[k].law)
        mean_q, var_q = moments(lambda k: laws[k])
        for answer in groups[month]:
            by = list(answer.keys.columns)
            where = pd.MultiIndex.from_frame(answer.keys[by].astype(str)).get_indexer(
                pd.MultiIndex.from_frame(truth[by].astype(str)))
            n = len(answer.keys)
            mu = np.bincount(where, (mean_q - mean_p)[which], n)
            delta = np.bincount(where, (var_q - var_p)[which], n)
            v = np.asarray(answer.sd, float) ** 2 + np.bincount(where, var_p[which], n)
            total += float(np.sum(mu ** 2 / v + delta ** 2 / (2 * v ** 2)))
    return total


#: The ridges of ``two_point_search``'s directions (relative to the complete data's information).
RIDGES = tuple(10.0 ** np.arange(-6, 2.01, 0.5))


def row(name: str, truth: float, cells, gradient, value_of, drawn_value, rng) -> dict:
    """One statistic: its efficient sd, the two states found by ``two_point_search`` and a dataset
    drawn from the second."""
    b = ib.bound(cells, gradient)
    found = ib.two_point_search(cells, gradient, value_of, RIDGES)
    data = ib.drawn(cells, found["laws"], rng)
    return {"statistic": name, "truth": truth, "truth_from_laws": value_of([c.law for c in cells]), "sd": b.sd,
            "q_value": found["value"], "half_difference": abs(found["difference"]) / 2, "ridge": found["ridge"],
            "chi2": found["chi2"], "tv_bound": ib.total_variation_bound(found["chi2"]), "q_drawn": drawn_value(data),
            "sampling_sd": sampling_sd(cells, gradient), "min_q_law": float(min(law.min() for law in found["laws"])),
            "q_laws": found["laws"]}


def sampling_sd(cells, gradient) -> float:
    """The sd of the sample statistic around its value under the cells' laws (members drawn anew)."""
    return float(np.sqrt(sum((cell.law @ c ** 2 - (cell.law @ c) ** 2) / cell.count
                             for cell, c in zip(cells, gradient))))


def p10_row(cells, m1, m3, rng, near: int = 3) -> dict:
    """Growth P10: Q moves the share at or below a growth rate x next to P10 (``near`` on each side)
    across 0.1; the largest move of Q's P10 (the laws' quantile) found."""
    rates = growth_rates(m1, m3)
    at_p = ib.growth_quantile(cells, [c.law for c in cells], 0.10)
    values = np.unique(rates)
    i = int(np.searchsorted(values, at_p))
    best = None
    for x in values[max(0, i - near): i + near]:
        r = row("growth_p10", float(np.quantile(rates, 0.10)), cells, ib.cdf_gradient(cells, float(x)),
                lambda laws: ib.growth_quantile(cells, laws, 0.10), lambda d: float(np.quantile(
                    growth_rates(d[:, 0].astype(float), d[:, 2].astype(float)), 0.10)), rng)
        r["cdf_point"] = float(x)
        if best is None or r["half_difference"] > best["half_difference"]:
            best = r
    return best


def identity_budget(factor: float, config: str = "recommended") -> dict:
    """The plan ``config`` with its months' identity answers at ``factor`` times their sd (their mu
    divided by ``factor``: pnc's identity sd is gamma / mu): their mu^2, its share of the plan's total
    mu^2, and the total mu the plan needs with its other answers as they are."""
    queries = load_config(config).plan.queries
    total = sum(mu ** 2 for q in queries for mu in q.mu.values())
    identity = sum(mu ** 2 for q in queries if q.name == "identity" for a, mu in q.mu.items() if a in MONTHS)
    needed = identity / factor ** 2
    return {"identity_mu2": needed, "share": needed / total, "total_mu": float(np.sqrt(total - identity + needed)),
            "plan_mu": float(np.sqrt(total))}


def change_rows(first, third, m, rng) -> list[dict]:
    """The no-change share (``first``'s cells), creation, destruction and P10 (``third``'s) rows."""
    rows = [row("no_change_share", no_change_share(m[0].astype(float), m[1].astype(float)), first,
                ib.no_change_gradient(first), lambda laws: ib.no_change_share(first, laws),
                lambda d: no_change_share(d[:, 0].astype(float), d[:, 1].astype(float)), rng)]
    creation, destruction = job_flow_rates(m[0].astype(float), m[2].astype(float))
    up, down = ib.flow_gradients(third)
    for k, (name, value, gradient) in enumerate((("job_creation_rate", creation, up),
                                                 ("job_destruction_rate", destruction, down))):
        rows.append(row(name, value, third, gradient, lambda laws, k=k: ib.flows(third, laws)[k],
                        lambda d, k=k: job_flow_rates(d[:, 0].astype(float), d[:, 2].astype(float))[k], rng))
    rows.append(p10_row(third, m[0].astype(float), m[2].astype(float), rng))
    return rows


def class_total(month3: np.ndarray, code: int, statistic: str) -> float:
    """Size class ``code``'s establishments or month-3 employment in a dataset's month 3."""
    member = size_class(month3) == code
    return float(member.sum() if statistic == "estabs" else month3[member].sum())


def class_rows(cells, m, rng, smallest: int = 100) -> list[dict]:
    """Each size class (statewide, of at least ``smallest`` establishments): its establishments and
    month-3 employment (the class's statistics in ``microdata_stats.size_class_table``)."""
    rows = []
    for code in SIZE_CODES:
        if (size_class(m[2]) == code).sum() < smallest:
            continue
        for statistic in ("estabs", "m3emp"):
            values = ib.class_values(code, statistic)
            rows.append(row(f"class_{code}_{statistic}", class_total(m[2], code, statistic), cells,
                            ib.total_gradient(cells, values), lambda laws, v=values: ib.total(cells, laws, v),
                            lambda d, c=code, s=statistic: class_total(d[:, 2], c, s), rng) | {"size_class": code})
    return rows


def bounds(truth, seed: int, rng: np.random.Generator, oracle: str = "months", answers: str = "all",
           largest: int = 10, keep_means: bool = False, statistics: str = "changes",
           sd_factors: tuple = (1.0,)) -> list[dict]:
    """The rows of the ``statistics`` ("changes": the four change statistics; "classes": the size
    classes, ``class_rows``; or both, comma-separated) under ``oracle`` ("months": the two other months revealed;
    "change": month 1 and the month 2 -> 3 change revealed, month 3's identity answer kept; "level":
    the month 2 -> 3 change revealed, months 1 and 2 unknown (identity answers only, the pairs up to
    ``largest`` employees moved)) with ``answers`` ("all"; "identity": the identity answers alone, as
    gedp's implicates draw from), once for each of ``sd_factors`` times the release's identity sd
    (a plan with more budget on the identity answers: its group answers left as they are)."""
    m = [np.floor(truth[c].to_numpy(float) + 0.5).astype(int) for c in MONTHS]
    sds, precisions, groups = release_inputs(truth, seed)
    if answers == "identity" or oracle == "level":
        answers = "identity"
        precisions = {month: np.zeros(len(truth)) for month in MONTHS}
    released = min(sds.values())
    rows = []
    for factor in sd_factors:
        s = released * factor
        start = time.process_time()
        if oracle == "months":
            first = ib.cells(np.column_stack([m[0], m[2]]), m[1], precisions["m2emp"], s, unknown_month=2)
            third = ib.cells(np.column_stack([m[0], m[1]]), m[2], precisions["m3emp"], s, unknown_month=3)
        elif oracle == "change":
            first = third = ib.cells(np.column_stack([m[0], m[2] - m[1]]), m[1],
                                     precisions["m2emp"] + precisions["m3emp"], s, sibling=True)
        else:  # the level unknown: identity answers only, pairs up to ``largest`` employees moved
            first = third = ib.level_cells(np.column_stack(m), s, largest, keep_means)
        found = [*(change_rows(first, third, m, rng) if "changes" in statistics.split(",") else []),
                 *(class_rows(third, m, rng) if "classes" in statistics.split(",") else [])]
        if oracle == "level":
            for r in found:
                r["group_chi2_gaussian"] = group_chi_square(truth, np.column_stack(m), groups, first, r.pop("q_laws"))
        seconds = time.process_time() - start
        for r in found:
            r.pop("q_laws", None)
            r.update(oracle=oracle, answers=answers, identity_sd=s, sd_factor=factor,
                     cells=len(first if r["statistic"] == "no_change_share" else third),
                     median_precision=float(np.median(precisions["m2emp"])), bound_seconds=seconds)
        budget = identity_budget(factor)
        for r in found:
            r.update(identity_mu2=budget["identity_mu2"], identity_share=budget["share"], total_mu=budget["total_mu"])
        print(f"bounds at identity sd {s:.4f} in {seconds:.0f} s of processor time; the months' identity answers "
              f"need {budget['share']:.0%} of the plan's mu^2 (total mu {budget['total_mu']:.3f})", flush=True)
        rows += found
    return rows


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from implicates_utility import truth_frame

    parser = argparse.ArgumentParser()
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--structure", default="none")
    parser.add_argument("--seed", type=int, default=1, help="the release's seed")
    parser.add_argument("--oracle", default="months", choices=["months", "change", "level"])
    parser.add_argument("--largest", type=int, default=10, help="with --oracle level: the largest month moved")
    parser.add_argument("--answers", default="all", choices=["all", "identity"])
    parser.add_argument("--keep-means", action="store_true",
                        help="with --oracle level: the second state keeps each cell's mean months (the group answers' "
                             "expectations)")
    parser.add_argument("--statistics", default="changes",
                        help="changes (the change statistics), classes (each size class's establishments and month-3 "
                             "employment) or changes,classes")
    parser.add_argument("--sd-factors", default="1", help="comma-separated multiples of the identity sd to bound at")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    truth = truth_frame(args.qcew, [] if args.structure == "none" else args.structure.split(","))
    rows = bounds(truth, args.seed, np.random.default_rng(args.seed + 2000), args.oracle, args.answers,
                  args.largest, args.keep_means, args.statistics, tuple(float(f) for f in args.sd_factors.split(",")))
    for r in rows:
        print(f"x{r['sd_factor']:<5g}{r['statistic']:>22}: truth {r['truth']:.4f}  sd {r['sd']:.4f}  "
              f"Delta/2 {r['half_difference']:.4f} ({r['half_difference'] / abs(r['truth']):.1%}) "
              f"(Q {r['q_value']:.4f}, drawn {r['q_drawn']:.4f}, TV <= {r['tv_bound']:.2f})  "
              f"sampling sd {r['sampling_sd']:.4f}  "
              f"group answers' chi2 (Gaussian) {r.get('group_chi2_gaussian', np.nan):.3g}",
              flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"qcew": args.qcew.name, "structure": args.structure, "seed": args.seed,
                                        "oracle": args.oracle, "answers": rows[0]["answers"], "largest": args.largest,
                                        "keep_means": args.keep_means, "statistics": args.statistics,
                                        "rows": rows}, indent=1, default=float))


if __name__ == "__main__":
    main()
