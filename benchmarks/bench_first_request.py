"""The first `gedp tabulate REL --by county,naics4 --moe` (which builds the kept margin structure, in
an empty cache folder each run) with this gedp and with another (--before, e.g. a venv of the commit
before), alternated so both see the same load: median and best wall seconds, median processor
seconds and peak memory, with the load average.

    python benchmarks/bench_first_request.py RELEASE [RELEASE ...] --before PYTHON [--repeat 3] [--note TEXT]

Results are appended to benchmarks/RESULTS-first-request.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench_cli import machine, timed_run
from bench_margins import REQUEST

RESULTS = Path(__file__).with_name("RESULTS-first-request.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", type=Path, nargs="+")
    parser.add_argument("--before", required=True, help="the python of the gedp to compare with")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp}: first request, {args.repeat} runs each, alternated\n", f"Machine: {machine()}\n",
             *([args.note + "\n"] if args.note else []),
             "| release | gedp | median wall s | best wall s | median CPU s | peak MiB | load |",
             "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for release in args.releases:
            n = json.loads((release / "manifest.json").read_text())["establishments"]
            commands = {"this": [sys.executable, "-m", "gedp"], "before": [args.before, "-m", "gedp"]}
            runs: dict[str, list] = {label: [] for label in commands}
            loads = [os.getloadavg()[0]]
            for _ in range(args.repeat):
                for label, gedp in commands.items():
                    cache = work / f"cache-{label}"
                    shutil.rmtree(cache, ignore_errors=True)
                    runs[label].append(timed_run(["env", f"GEDP_CACHE_DIR={cache}", *gedp, "tabulate", str(release),
                                                  *REQUEST, "--out", str(work / "table.csv")], work))
                    loads.append(os.getloadavg()[0])
            for label, measured in runs.items():
                wall = [run[0] for run in measured]
                lines.append(f"| {release.name} ({n:,} establishments) | {label} | {statistics.median(wall):.2f} | "
                             f"{min(wall):.2f} | {statistics.median(run[2] for run in measured):.2f} | "
                             f"{max(run[1] for run in measured):,.0f} | {min(loads):.1f}-{max(loads):.1f} |")
                print(lines[-1], flush=True)
    with RESULTS.open("a") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
