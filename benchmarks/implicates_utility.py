"""Implicates against the truth on synthetic states (run on demand; results in
docs/evaluation/implicates-measurements.md).

    python benchmarks/implicates_utility.py --qcew FILE --structure NAME[,NAME] --releases 5 --out rows.csv

For each release of the ``recommended`` plan (seeds 1..releases) of a state synthesized from the
published QCEW file (seed 1) with the named structures (``synth.structures``; "none": the synthesizer's
own rules): every statistic of ``evaluation.microdata_stats`` on the truth, on the point release and
on each of M implicates, combined with Rubin's rules (u = 0: the truth is the census value).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

import gedp
from gedp.evaluation.microdata_stats import microdata_statistics
from gedp.release.implicates import implicates_in_memory, prepare
from gedp.synth.structures import apply_structures

KEYS = ["statistic", "sector", "size_class"]


def truth_frame(qcew: Path, structures: list[str]) -> pd.DataFrame:
    frame = gedp.synthesize(from_qcew=qcew, seed=1)
    return apply_structures(frame, structures, np.random.default_rng(2)) if structures else frame


def add_prior_options(parser: argparse.ArgumentParser) -> None:
    """The implicates' prior options and knobs (``set_prior_knobs`` sets the knobs from them)."""
    parser.add_argument("--level-prior", default="month1")
    parser.add_argument("--change-prior", default="independent")
    parser.add_argument("--level-width", type=float, default=None,
                        help="the level prior's components' bandwidth in their steps "
                             "(postprocess.implicates.LEVEL_WIDTH; default: the shipped value)")
    parser.add_argument("--wage-prior", default="sector", help="postprocess.prior_components.WAGE_PRIORS")
    parser.add_argument("--level-smooth", action="store_true",
                        help="a smooth level prior (postprocess.implicates.LEVEL_SMOOTH, deconvolve.SmoothFit)")
    parser.add_argument("--level-by-sector", action="store_true",
                        help="a level prior per sector of MIN_SECTOR_LEVEL+ answers (implicates.LEVEL_BY_SECTOR)")
    parser.add_argument("--cell-changes", default="", choices=["", "all", "changers", "fitted"],
                        help="change priors moved by the cells' month patterns (postprocess.implicates.CELL_CHANGES)")
    parser.add_argument("--whole-changes", action="store_true",
                        help="the smallest establishments' changes in whole employees (implicates.WHOLE_CHANGES)")
    parser.add_argument("--persistence", action="store_true",
                        help="with --whole-changes, month 2's change persists (whole_changes.PERSISTENCE)")
    parser.add_argument("--whole-smooth-level", action="store_true",
                        help="with --whole-changes, month 1's prior smooth (whole_changes.SMOOTH_LEVEL)")
    parser.add_argument("--change-scale", action="store_true",
                        help="change sizes scaled by the level within their band (implicates.CHANGE_SCALE)")
    parser.add_argument("--scale-min-gain", type=float, default=0.0,
                        help="with --change-scale, nats a band's profile must gain over one size "
                             "(change_scale.SCALE_MIN_GAIN)")
    parser.add_argument("--level-direction", action="store_true",
                        help="with --whole-changes, a change's direction by month 1's level "
                             "(whole_changes.LEVEL_DIRECTION)")


def set_prior_knobs(args: argparse.Namespace) -> None:
    """The implicates' knobs set from ``add_prior_options``' arguments."""
    import gedp.postprocess.change_scale as change_scale
    import gedp.postprocess.implicates as implicates
    import gedp.postprocess.whole_changes as whole_changes

    if args.level_width is not None:
        implicates.LEVEL_WIDTH = args.level_width
    implicates.LEVEL_SMOOTH = args.level_smooth
    implicates.LEVEL_BY_SECTOR = args.level_by_sector
    implicates.CELL_CHANGES = args.cell_changes
    implicates.WHOLE_CHANGES = args.whole_changes
    implicates.CHANGE_SCALE = args.change_scale
    change_scale.SCALE_MIN_GAIN = args.scale_min_gain
    whole_changes.PERSISTENCE = args.persistence
    whole_changes.SMOOTH_LEVEL = args.whole_smooth_level
    whole_changes.LEVEL_DIRECTION = args.level_direction


def diagnostic_arguments(description: str | None = None) -> argparse.ArgumentParser:
    """The arguments of a one-release diagnostic of the implicates' priors (``seeded_draws``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--structure", default="none")
    parser.add_argument("--seed", type=int, default=1, help="the release's seed")
    parser.add_argument("--draws", type=int, default=2)
    add_prior_options(parser)
    return parser


def seeded_draws(args: argparse.Namespace):
    """The truth (``truth_frame`` of ``args.qcew`` with ``args.structure``), its ``recommended`` release
    seeded ``args.seed`` made ready for draws (``prepare``: the fitted models, with ``args.level_prior``,
    ``args.change_prior`` and ``args.level_width``), the truth in the draws'
    establishment order, and the chains' generator (seed + 1000)."""
    set_prior_knobs(args)
    truth = truth_frame(args.qcew, [] if args.structure == "none" else args.structure.split(","))
    rng = np.random.default_rng(args.seed + 1000)
    with tempfile.TemporaryDirectory() as tmp:
        gedp.protect(truth, "recommended", seed=args.seed, not_for_publication=True).write(Path(tmp) / "r")
        draws = prepare(Path(tmp) / "r", rng, level_prior=args.level_prior, change_prior=args.change_prior,
                        wage_prior=args.wage_prior)
    ids = draws.public["estab_id"].astype(str)
    return truth.set_index(truth["estab_id"].astype(str)).loc[ids].reset_index(drop=True), draws, rng


def one_release(truth: pd.DataFrame, folder: Path, seed: int, m: int, **options) -> pd.DataFrame:
    release = gedp.protect(truth, "recommended", seed=seed, not_for_publication=True)
    release.write(folder)
    start = time.perf_counter()
    implicates = implicates_in_memory(folder, m, seed=seed + 1000, **options)
    seconds = time.perf_counter() - start
    rows = microdata_statistics(truth).rename(columns={"value": "truth"}).drop(columns="variance")
    point = microdata_statistics(release.microdata).rename(columns={"value": "release"}).drop(columns="variance")
    each = [microdata_statistics(g).set_index(KEYS)["value"] for _, g in implicates.groupby("implicate")]
    stack = pd.concat(each, axis=1).reindex(rows.set_index(KEYS).index)
    values = stack.to_numpy().T
    ok = np.isfinite(values).all(axis=0)
    combined = gedp.combine(np.where(np.isfinite(values), values, 0.0))
    lo, hi = combined.interval(0.95)
    out = rows.merge(point, on=KEYS, how="left")
    out["implicates"] = np.where(ok, combined.estimate, np.nan)
    out["lo"], out["hi"] = np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)
    out["seconds"] = seconds
    return out


def in_order(task, shared, items, tell) -> None:
    """The tasks of ``draw_blocks``'s streams run one after the other in this process."""
    for index, item in enumerate(items):
        tell(index, task(shared, item))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--structure", default="none")
    parser.add_argument("--releases", type=int, default=5)
    parser.add_argument("--first", type=int, default=1, help="the first release's seed")
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--burn-in", type=int, default=None,
                        help="Gibbs sweeps before the first implicate and in the wage priors' fitting chain "
                             "(postprocess.implicates.BURN_IN; default: the shipped value)")
    add_prior_options(parser)
    parser.add_argument("--draw-penalty", action="store_true",
                        help="with --level-smooth, each replicate draws its penalty (deconvolve.SMOOTH_DRAW_PENALTY)")
    parser.add_argument("--streams", action="store_true",
                        help="draw as gedp implicates --processes does: a stream per replicate and block (in this "
                             "process: the same draws for any number of processes)")
    args = parser.parse_args()
    import gedp.postprocess.deconvolve as deconvolve
    import gedp.postprocess.implicates as implicates

    if args.burn_in is not None:
        implicates.BURN_IN = args.burn_in
    set_prior_knobs(args)
    deconvolve.SMOOTH_DRAW_PENALTY = args.draw_penalty
    structures = [] if args.structure == "none" else args.structure.split(",")
    truth = truth_frame(args.qcew, structures)
    parts = []
    for seed in range(args.first, args.first + args.releases):
        with tempfile.TemporaryDirectory() as tmp:
            part = one_release(truth, Path(tmp) / "release", seed, args.m, level_prior=args.level_prior,
                               change_prior=args.change_prior, wage_prior=args.wage_prior,
                               map_tasks=in_order if args.streams else None)
        part.insert(0, "release_seed", seed)
        parts.append(part)
        pd.concat(parts).to_csv(args.out, index=False)
        print(f"release {seed}: implicates in {part['seconds'].iloc[0]:.1f} s", flush=True)


if __name__ == "__main__":
    main()
