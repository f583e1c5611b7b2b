"""`gedp plan`'s time and memory, run twice on one published file (the same plan both times?).

    python benchmarks/bench_plan.py --from-qcew FILE [--runs 2] [--label TEXT] [--no-record]
    python benchmarks/bench_plan.py --make 340000 [--work DIR] ...

``--make N`` writes a stand-in for a state of N establishments with no published file here: the
`large` profile (New Jersey-like) at N establishments, tabulated as a QCEW file at every private level
(51-58, 71-78) by `gedp tabulate --format qcew --unprotected`, with no cell suppressed. The planner
reads it as it reads a published file. Results are appended to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recording import report

PRIVATE_LEVELS = (*range(51, 59), *range(71, 79))


def gedp() -> str:
    return shutil.which("gedp", path=os.path.dirname(sys.executable)) or "gedp"


def make_file(n: int, work: Path) -> Path:
    """A QCEW file of every private level of a `large`-profile state of ``n`` establishments."""
    import pandas as pd
    from bench_scale import state_of_size

    from gedp.synth.io import write_microdata

    work.mkdir(parents=True, exist_ok=True)
    microdata = work / f"large-{n}.parquet"
    write_microdata(state_of_size(n), microdata)
    tables = []
    for level in PRIVATE_LEVELS:
        table = work / f"level-{level}.csv"
        subprocess.run([gedp(), "tabulate", str(microdata), "--format", "qcew", "--agglvl", str(level),
                        "--unprotected", "--out", str(table)], check=True, capture_output=True)
        tables.append(pd.read_csv(table, dtype=str, keep_default_na=False))
    published = work / f"qcew-large-{n}.csv"
    pd.concat(tables).to_csv(published, index=False)
    return published


def timed_plan(published: Path, out: Path) -> tuple[float, float, float]:
    """Wall time (s), processor time of the command and its workers (s), and the largest resident
    memory of any of them (MiB) of one `gedp plan`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([gedp(), "plan", "--from-qcew", str(published), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-qcew", type=Path)
    parser.add_argument("--make", type=int, help="plan on a stand-in of this many establishments")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gedp-bench-plan")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if (args.from_qcew is None) == (args.make is None):
        parser.error("give --from-qcew FILE or --make N")
    published = make_file(args.make, args.work) if args.make else args.from_qcew.resolve()
    rows, plans = [], []
    for run in range(1, args.runs + 1):
        load_before = os.getloadavg()[0]
        out = args.work / f"plan-{run}.yaml"
        args.work.mkdir(parents=True, exist_ok=True)
        wall, cpu, peak = timed_plan(published, out)
        plans.append(out.read_bytes())
        rows.append(f"| {run} | {wall:.1f} s | {cpu:.1f} s | {peak:,.0f} MiB | {load_before:.1f} -> "
                    f"{os.getloadavg()[0]:.1f} |")
    same = all(plan == plans[0] for plan in plans)
    what = (f"a stand-in of {args.make:,} establishments (`--make {args.make}`: the large profile, every private "
            "level, no cell suppressed)" if args.make else f"`{published.name}`")
    lines = [
        f"## {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC: gedp plan {args.label}".rstrip(),
        "",
        f"`gedp plan --from-qcew` on {what}, {args.runs} runs one after the other on 2 cores; processor time of "
        "the command and its workers; load average (1 minute) before -> after each run.",
        "",
        "| run | wall | processor | peak memory (largest process) | load |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Plans {'byte-identical' if same else 'DIFFERENT'} across runs; the plan's first line: "
        f"`{plans[0].decode().splitlines()[0]}`",
        "",
    ]
    report(lines, record=not args.no_record)


if __name__ == "__main__":
    main()
