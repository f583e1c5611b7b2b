"""Margins calibrated by simulation from the release itself: does a factor estimated without the truth
bring the bands of ``level_coverage.py`` inside the target? (run on demand, not a test; issue 45).

A state is synthesized from its published QCEW file and protected ``--releases`` times (seeds 1000, ...,
as ``level_coverage.py``). From each release alone a stand-in truth is built (``--stand-in point``: the
release's protected microdata; ``implicate``: one implicate of it, ``Release.implicates``, with exact
zeros where the posterior puts them), protected ``--k`` times with the same config and fresh seeds
(not for publication), and tabulated at ``--levels`` with margins; per cell z = (estimate - stand-in
total) / sd. Per group of cells (attribute x band of the estimate, ``band_bounds.ESTIMATE_EDGES``,
x the level, or the level's family with ``--grouping family``: statewide 51-58 / county 71-78) the
factor c = q95(|z|) / 1.96 (groups of fewer than ``--min-group`` simulated cells keep c = 1). The real
release's margins are multiplied by the c of their cell's group (its own estimate decides the group)
and their coverage measured against the real truth. Only the release (its microdata, answers and
model) enters the factors: the truth is read for the coverage alone.

Writes the before and after rows (``level_coverage.py --cells`` format; compare them with
``coverage_compare.py``), the factors, and the processor time of the calibration beside that of
``gedp.protect`` of the real release.

    nice -n 10 python benchmarks/margin_calibration.py --qcew ../shared/data/qcew_2016q1_44.csv \\
        --mu 2.3065 --config recommended --levels 51 52 53 54 55 56 57 58 71 72 73 74 75 76 77 78 \\
        --stand-in implicate --before ri-before.parquet --after ri-after.parquet --out ri.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from band_bounds import ESTIMATE_EDGES, group_codes  # noqa: E402
from level_coverage import Z, release_rows, state_and_config, state_parser  # noqa: E402

import gedp  # noqa: E402
from gedp.measure.queries import group_establishments  # noqa: E402
from gedp.postprocess.moe import half_widths, variance_functions  # noqa: E402
from gedp.postprocess.tabulate import qcew_keys  # noqa: E402
from gedp.release.reader import release_answers, release_wage_psi  # noqa: E402

ATTRIBUTES = ("m1emp", "wage")


def processor_time() -> float:
    """User + system time of this process and its finished children, in seconds."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def stand_in(release: gedp.Release, kind: str, seed: int) -> pd.DataFrame:
    """A truth built from the release alone: its protected microdata or one implicate, establishment order."""
    if kind == "point":
        frame = release.microdata
    else:
        frame = release.implicates(1, seed=seed).drop(columns="implicate")
    return frame.sort_values("estab_id").reset_index(drop=True)


def simulated_z(truth: pd.DataFrame, release: gedp.Release, levels: dict[str, list[str]]) -> pd.DataFrame:
    """Per cell, level and attribute of ``release`` (a protection of ``truth``): the estimate and
    z = (estimate - true total) / the margin's sd (the margins of ``gedp tabulate --moe``)."""
    protected = release.microdata.set_index("estab_id").loc[truth["estab_id"]].reset_index()
    answers = release_answers(release.folder, protected)
    variances = variance_functions(answers, protected, release_wage_psi(release.folder))
    frames = []
    for level, keys in levels.items():
        grouping = group_establishments(protected, keys)
        margins = half_widths(variances, grouping.codes, grouping.n_groups, 0.95)
        for attribute in ATTRIBUTES:
            estimate = grouping.sum(protected[attribute].to_numpy())
            error = estimate - grouping.sum(truth[attribute].to_numpy())
            frames.append(pd.DataFrame({"level": level, "attribute": attribute, "estimate": estimate,
                                        "z": error / (margins[attribute] / Z)}))
    return pd.concat(frames, ignore_index=True)


def group_keys(cells: pd.DataFrame, grouping: str) -> pd.DataFrame:
    """Each cell's calibration group: attribute, band of its estimate, and its level (or family)."""
    level = cells["level"].astype(str)
    scope = level if grouping == "level" else np.where(level.str.startswith("5"), "statewide", "county")
    band = np.empty(len(cells), dtype=np.int64)
    for attribute in ATTRIBUTES:
        mine = (cells["attribute"] == attribute).to_numpy()
        band[mine] = group_codes(cells["estimate"].to_numpy()[mine], ESTIMATE_EDGES[attribute])
    return pd.DataFrame({"scope": scope, "attribute": cells["attribute"].to_numpy(), "band": band})


def fitted_factors(simulated: pd.DataFrame, grouping: str, min_group: int,
                   attributes: tuple[str, ...] = ATTRIBUTES, relative: bool = False) -> pd.DataFrame:
    """Per group of simulated cells of ``attributes``: its size and c = q95(|z|) / Z (1 where fewer
    than ``min_group`` cells, or no cell has a positive margin); ``relative``: c over the c of all the
    cells of its scope and attribute (the margins' shape across estimates calibrated, not their scale)."""
    simulated = simulated[simulated["attribute"].isin(attributes)].reset_index(drop=True)
    keys = group_keys(simulated, grouping)
    keys["size"] = np.abs(simulated["z"].to_numpy())
    keys = keys[np.isfinite(keys["size"])]
    out = keys.groupby(["scope", "attribute", "band"]).agg(cells=("size", "size"),
                                                           q95=("size", lambda s: float(np.quantile(s, 0.95))))
    out["factor"] = np.where((out["cells"] >= min_group) & (out["q95"] > 0), out["q95"] / Z, 1.0)
    if relative:  # each group's factor over its level's (or family's) and attribute's pooled one
        pooled = keys.groupby(["scope", "attribute"])["size"].quantile(0.95) / Z
        scale = pooled.reindex(pd.MultiIndex.from_arrays([out.index.get_level_values("scope"),
                                                          out.index.get_level_values("attribute")])).to_numpy()
        out["factor"] = np.where((out["cells"] >= min_group) & (scale > 0), out["factor"] / scale, 1.0)
    return out.reset_index()


def calibrated(cells: pd.DataFrame, factors: pd.DataFrame, grouping: str) -> pd.DataFrame:
    """``cells`` (``level_coverage.release_rows`` rows of one release) with margins times their group's
    factor: ``covered`` and ``ratio`` recomputed, the factor in ``factor``."""
    keys = group_keys(cells, grouping)
    factor = keys.merge(factors, on=["scope", "attribute", "band"], how="left")["factor"].fillna(1.0).to_numpy()
    out = cells.copy()
    out["factor"] = factor
    out["ratio"] = cells["ratio"].to_numpy() / factor
    out["covered"] = np.abs(out["ratio"].to_numpy()) <= Z
    out.loc[~np.isfinite(cells["ratio"].to_numpy()), "covered"] = cells["covered"]  # margin 0: as before
    return out


def main() -> None:
    parser = state_parser(__doc__, config="recommended", mu=2.3065, releases=5)
    parser.add_argument("--levels", type=int, nargs="+", required=True, help="QCEW aggregation levels")
    parser.add_argument("--stand-in", choices=("point", "implicate"), default="implicate")
    parser.add_argument("--k", type=int, default=3, help="simulated protections of each stand-in")
    parser.add_argument("--grouping", choices=("level", "family"), default="level")
    parser.add_argument("--min-group", type=int, default=30)
    parser.add_argument("--attributes", nargs="+", choices=ATTRIBUTES, default=list(ATTRIBUTES),
                        help="the attributes whose margins are calibrated (the others keep theirs)")
    parser.add_argument("--relative", action="store_true", help="calibrate the margins' shape across "
                        "estimates, not their scale (fitted_factors)")
    parser.add_argument("--before", type=Path, required=True, help="the real releases' rows (parquet)")
    parser.add_argument("--after", type=Path, required=True, help="the rows with calibrated margins (parquet)")
    parser.add_argument("--out", type=Path, required=True, help="factors and timings (JSON)")
    parser.add_argument("--simulated", type=Path, help="also the simulated cells' z (parquet), for ``refit``")
    args = parser.parse_args()
    truth, config = state_and_config(args)
    levels = {str(level): [key for key in qcew_keys(truth, level) if key not in ("year", "qtr")]
              for level in args.levels}
    before, after, simulations, record = [], [], [], []
    for index in range(args.releases):
        start = processor_time()
        release = gedp.protect(truth, config, seed=1000 + index, not_for_publication=True)
        protect_time = processor_time() - start
        rows = pd.concat(release_rows(truth, release, index, False, levels), ignore_index=True)
        start = processor_time()
        standin = stand_in(release, args.stand_in, seed=7000 + index)
        simulated = pd.concat([simulated_z(standin, gedp.protect(standin, config, seed=5000 + 10 * index + j,
                                                                 not_for_publication=True), levels)
                               for j in range(args.k)], ignore_index=True)
        factors = fitted_factors(simulated, args.grouping, args.min_group, tuple(args.attributes),
                                 args.relative)
        calibration_time = processor_time() - start
        before.append(rows)
        after.append(calibrated(rows, factors, args.grouping))
        simulations.append(simulated.assign(release=index))
        record.append({"release": index, "protect_cpu_s": protect_time, "calibration_cpu_s": calibration_time,
                       "factors": factors.to_dict(orient="records")})
        print(f"release {index + 1}/{args.releases}: protect {protect_time:.1f} s, calibration "
              f"{calibration_time:.1f} s of processor time", flush=True)
    pd.concat(before, ignore_index=True).to_parquet(args.before)
    pd.concat(after, ignore_index=True).to_parquet(args.after)
    if args.simulated is not None:
        pd.concat(simulations, ignore_index=True).to_parquet(args.simulated)
    args.out.write_text(json.dumps({"qcew": args.qcew.name, "mu": args.mu, "config": args.config,
                                    "stand_in": args.stand_in, "k": args.k, "grouping": args.grouping,
                                    "min_group": args.min_group, "attributes": args.attributes,
                                    "relative": args.relative,
                                    "releases": record}, indent=1) + "\n")


def refit() -> None:
    """``refit BEFORE SIMULATED AFTER``: the rows of a run's ``--before`` with margins calibrated from its
    ``--simulated`` z under another ``--grouping`` / ``--min-group`` (no protection run again)."""
    parser = argparse.ArgumentParser(description=refit.__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("simulated", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--grouping", choices=("level", "family"), default="level")
    parser.add_argument("--min-group", type=int, default=30)
    parser.add_argument("--attributes", nargs="+", choices=ATTRIBUTES, default=list(ATTRIBUTES))
    parser.add_argument("--relative", action="store_true")
    args = parser.parse_args(sys.argv[2:])
    before, simulated = pd.read_parquet(args.before), pd.read_parquet(args.simulated)
    after = [calibrated(rows.reset_index(drop=True), fitted_factors(simulated[simulated["release"] == index],
                                                                    args.grouping, args.min_group,
                                                                    tuple(args.attributes), args.relative),
                        args.grouping)
             for index, rows in before.groupby("release", sort=True)]
    pd.concat(after, ignore_index=True).to_parquet(args.after)


if __name__ == "__main__":
    refit() if sys.argv[1:2] == ["refit"] else main()
