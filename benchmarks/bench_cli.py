"""Whole-process time and peak memory of `gedp run`, `gedp protect`, `gedp tabulate --moe`, `gedp synth`
(with and without `--jobs`), `gedp suppress` and `gedp evaluate e5`.

`gedp protect` runs on the large profile rescaled to each of --sizes; `gedp synth --from-qcew` and
`gedp suppress --from-qcew` run on the shared Rhode Island and New Jersey files when ../shared/data is
present. `--only TEXT` keeps the cases whose label contains TEXT.

Each command runs in a fresh process (as a user runs it); peak memory is the child's maximum resident
set size. Results are appended to benchmarks/RESULTS.md with a description of the machine.

    python benchmarks/bench_cli.py [--repeat 3] [--sizes 35796,100000] [--only suppress]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gedp.synth.profiles import generate_profile, load_profile

RESULTS = Path(__file__).with_name("RESULTS.md")


def gedp_command() -> list[str]:
    found = shutil.which("gedp")
    return [found] if found else [sys.executable, "-m", "gedp"]


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    processor = platform.processor() or platform.machine()
    return f"{processor}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="35796", help="establishment counts for `gedp protect`")
    parser.add_argument("--only", default="", help="run only the cases whose label contains this text")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = [("gedp run (small profile, 35,796 establishments, baseline)",
                  [*gedp_command(), "run", "--seed", "1", "--out", "run"])]
        cases.append(("gedp evaluate e5 (small profile, 20 replications)",
                      [*gedp_command(), "evaluate", "e5", "--out", "e5"]))
        shared = Path(__file__).resolve().parents[2] / "shared" / "data"
        new_jersey = shared / "qcew_2016q1_34.csv"
        if new_jersey.is_file():
            cases.append(("gedp synth --from-qcew New Jersey (251,987 establishments)",
                          [*gedp_command(), "synth", "--from-qcew", str(new_jersey), "--out", "nj.parquet"]))
            cases.append(("gedp synth --from-qcew New Jersey --jobs (251,987 establishments, 3,264,979 jobs)",
                          [*gedp_command(), "synth", "--from-qcew", str(new_jersey), "--jobs", "--out",
                           "nj-jobs.parquet"]))
            for name, state in (("Rhode Island", "44"), ("New Jersey", "34")):
                cases.append((f"gedp suppress --from-qcew {name} (synthesis, suppression, LP audit)",
                              [*gedp_command(), "suppress", "--from-qcew", str(shared / f"qcew_2016q1_{state}.csv"),
                               "--out", f"suppress-{state}"]))
        for size in (int(s) for s in args.sizes.split(",")):
            source = work / f"state-{size}.parquet"
            generate_profile(load_profile("large"), n_establishments=size, rng=np.random.default_rng(1)).to_parquet(
                source
            )
            cases.append((f"gedp protect {size:,} establishments, baseline",
                          [*gedp_command(), "protect", str(source), "--out", f"protect-{size}"]))
            cases.append((f"gedp tabulate --moe, every county x NAICS-6 cell, {size:,} establishments",
                          [*gedp_command(), "tabulate", f"protect-{size}", "--by", "state,county,naics", "--moe",
                           "--out", f"moe-{size}.csv"]))
        cases = [(label, command) for label, command in cases if args.only in label]
        for label, command in cases:
            # RUSAGE_CHILDREN is a high-water mark over all children: measure each case in its own process.
            probe = [sys.executable, "-c",
                     "import resource, subprocess, sys, time; t = time.perf_counter(); "
                     "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                     "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)",
                     *command]
            runs = []
            for _ in range(args.repeat):
                out = subprocess.run(probe, cwd=work, check=True, capture_output=True, text=True).stdout.split()
                runs.append((float(out[0]), float(out[1])))
            seconds = sorted(r[0] for r in runs)
            rows.append((label, seconds[len(seconds) // 2], seconds[0], max(r[1] for r in runs)))
            print(f"{label}: median {rows[-1][1]:.1f}s, best {rows[-1][2]:.1f}s, peak {rows[-1][3]:.0f} "
                  "MiB", flush=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp}: whole-process CLI ({args.repeat} runs each)\n", f"Machine: {machine()}\n",
             "| command | median s | best s | peak memory MiB |", "|---|---|---|---|"]
    lines += [f"| {label} | {median:.1f} | {best:.1f} | {peak:.0f} |" for label, median, best, peak in rows]
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by the scripts in this folder; newest last.\n")
    with RESULTS.open("a") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"recorded in {RESULTS}")


if __name__ == "__main__":
    main()
