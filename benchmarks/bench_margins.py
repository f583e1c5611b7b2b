"""Margins in a second: whole-process `gedp tabulate REL --by county,naics4 --moe` on a large release,
the first request (which builds the kept margin structure, in an empty cache folder each run) and a
further one (the structure kept), beside the same further request with another gedp (--before, e.g.
a venv of main, in a cache folder of its own), alternated so all see the same load; the plain
tabulation (no margins), the request's import time (`python -X importtime`) and the load average
for reference.

    python benchmarks/bench_margins.py [--release REL | --establishments 1400000] [--repeat 5]
        [--before GEDP] [--note TEXT]

Without --release, the `large` profile rescaled to --establishments is protected first (secure
generator). Results are appended to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_cli import RESULTS, gedp_command, machine, tabulate_floor, timed_run

from gedp.synth.profiles import generate_profile, load_profile

REQUEST = ["--by", "county,naics4", "--moe"]


def import_seconds(release: Path, work: Path) -> float:
    """Seconds the request spends importing modules (the sum of -X importtime's top-level entries)."""
    command = [sys.executable, "-X", "importtime", "-m", "gedp", "tabulate", str(release), *REQUEST,
               "--out", str(work / "imports.csv")]
    lines = subprocess.run(command, capture_output=True, text=True, check=True).stderr.splitlines()
    # top-level imports are the entries without indentation in the module column
    return sum(int(line.split("|")[1]) for line in lines
               if line.startswith("import time:") and not line.split("|")[2].startswith("  ")
               and line.split("|")[1].strip().isdigit()) / 1e6


def make_release(work: Path, establishments: int) -> Path:
    """A protected release of the large profile rescaled to ``establishments``."""
    source = work / "state.parquet"
    generate_profile(load_profile("large"), n_establishments=establishments,
                     rng=np.random.default_rng(1)).to_parquet(source)
    subprocess.run([*gedp_command(), "protect", str(source), "--out", str(work / "release")], check=True,
                   capture_output=True)
    return work / "release"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", type=Path)
    parser.add_argument("--establishments", type=int, default=1_400_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", default="", help="another gedp executable to run the request with too")
    parser.add_argument("--note", default="", help="a line under the heading, e.g. the commits measured")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        release = args.release.resolve() if args.release else make_release(work, args.establishments)
        cache = work / "cache"
        os.environ["GEDP_CACHE_DIR"] = str(cache)  # the children's cache: never the user's
        out = ["--out", str(work / "table.csv")]
        cases = {"further request (structure kept)": [*gedp_command(), "tabulate", str(release), *REQUEST, *out],
                 "first request (builds the structure)": [*gedp_command(), "tabulate", str(release), *REQUEST, *out],
                 "plain tabulation (no margins)": [*gedp_command(), "tabulate", str(release), *REQUEST[:2], *out]}
        if args.before:  # in a cache folder of its own: its structure stays kept
            cases["before: further request"] = ["env", f"GEDP_CACHE_DIR={work / 'cache-before'}", args.before,
                                                "tabulate", str(release), *REQUEST, *out]
            timed_run(cases["before: further request"], work)
        timed_run(cases["further request (structure kept)"], work)  # builds it; warms the file cache
        loads = [os.getloadavg()[0]]
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label in cases}
        floors, imports = [], []
        for _ in range(args.repeat):
            for label, command in cases.items():  # alternate: all see the same load
                if label.startswith("first"):
                    shutil.rmtree(cache / "margins", ignore_errors=True)
                runs[label].append(timed_run(command, work))
            floors.append(tabulate_floor(release))
            imports.append(import_seconds(release, work))
            loads.append(os.getloadavg()[0])
        rows = []
        for label, measured in runs.items():
            seconds = sorted(run[0] for run in measured)
            request = " ".join(REQUEST[:2] if label.startswith("plain") else REQUEST)
            rows.append(f"| gedp tabulate {request}, {label} | {seconds[len(seconds) // 2]:.2f} | "
                        f"{seconds[0]:.2f} | {max(run[1] for run in measured):,.0f} |")
            print(rows[-1], flush=True)
    n = json.loads((release / "manifest.json").read_text())["establishments"]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp}: margins in a second ({args.repeat} runs each, alternated)\n", f"Machine: {machine()}\n",
             *([args.note + "\n"] if args.note else []),
             f"Release of {n:,} establishments. Reading its protected microdata and measurements with pyarrow "
             f"(the I/O floor): best {min(floors):.2f} s; the request's imports (-X importtime): median "
             f"{sorted(imports)[len(imports) // 2]:.2f} s. Load average (1 min) over the runs: "
             f"{min(loads):.1f}-{max(loads):.1f}.\n",
             "| command | median s | best s | peak memory MiB |", "|---|---|---|---|", *rows]
    with RESULTS.open("a") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"recorded in {RESULTS}")


if __name__ == "__main__":
    main()
