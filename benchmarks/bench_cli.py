"""Whole-process time and peak memory of `gedp run`, `gedp protect`, `gedp tabulate --moe`, `gedp synth`
(with and without `--jobs`), `gedp suppress` and `gedp evaluate e5`, each `protect` and `tabulate` beside
its I/O floor.

`gedp protect` runs on the large profile rescaled to each of --sizes, and on the New Jersey state that
`gedp synth --from-qcew` builds from the shared file (alone, and twice as two states: 504k establishments,
27k county x NAICS-6 cells) when ../shared/data is present; `gedp tabulate --moe` then tabulates every
county x NAICS-6 cell and every county x sector cell of those releases. `--only TEXT` keeps the cases
whose label contains TEXT (`A|B`: either). `--before GEDP` also runs every case with another gedp executable (e.g. a
venv of the previous commit), alternating with this one, so both are measured in the same session.

The I/O floor of a `protect` is a whole Python process (start-up and `import pyarrow` included) that
reads its input and writes files of the release's size once: the release's Parquet files with pyarrow
(default options) and its tables CSV (the release is protected with the secure generator, as an agency
runs it). The floor of a `tabulate` is reading the release's protected microdata and measurements with
pyarrow, in this process. Best of --repeat.

Each command runs in a fresh process (as a user runs it); peak memory is the child's maximum resident
set size. Results are appended to benchmarks/RESULTS.md with a description of the machine.

    python benchmarks/bench_cli.py [--repeat 3] [--sizes 35796,1400000] [--only protect] [--before GEDP]
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
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from gedp.synth.profiles import generate_profile, load_profile

RESULTS = Path(__file__).with_name("RESULTS.md")
PARQUET_OUTPUTS = ("protected.parquet", "measurements.parquet")


def gedp_command() -> list[str]:
    found = shutil.which("gedp")
    return [found] if found else [sys.executable, "-m", "gedp"]


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    processor = platform.processor() or platform.machine()
    return f"{processor}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"


#: The I/O floor's process: Python starts and imports pyarrow, reads the release's files (only to have
#: outputs of the release's size in memory, as gedp has them when it writes: timed and taken off),
#: then reads the input and writes the outputs once. Prints the seconds taken off.
FLOOR_SCRIPT = """
import sys, time
from pathlib import Path
import pyarrow.parquet as pq
source, release, scratch = map(Path, sys.argv[1:4])
start = time.perf_counter()
tables = {name: pq.read_table(release / name) for name in sys.argv[4:]}
tables_csv = (release / "qcew_tables.csv").read_bytes()
preparing = time.perf_counter() - start
pq.read_table(source)
for name, table in tables.items():
    pq.write_table(table, scratch / name)
(scratch / "qcew_tables.csv").write_bytes(tables_csv)
print(preparing)
"""


def protect_floor(source: Path, release: Path, scratch: Path) -> float:
    """Whole-process seconds of a `gedp protect`'s I/O floor: a Python process that imports pyarrow,
    reads ``source`` and writes files of ``release``'s size (its Parquet outputs with pyarrow's
    default options, its tables CSV) once; its wall time less the reading of what it writes."""
    start = time.perf_counter()
    taken_off = subprocess.run([sys.executable, "-c", FLOOR_SCRIPT, str(source), str(release), str(scratch),
                                *PARQUET_OUTPUTS], check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - start - float(taken_off)


def tabulate_floor(release: Path) -> float:
    """Seconds to read ``release``'s protected microdata and measurements once with pyarrow."""
    start = time.perf_counter()
    for name in PARQUET_OUTPUTS:
        pq.read_table(release / name)
    return time.perf_counter() - start


def timed_run(command: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall seconds, peak resident MiB (of the largest process) and processor seconds (user + sys of
    the command and of the processes it waited for, e.g. its worker processes) of one command."""
    # RUSAGE_CHILDREN is a high-water mark over all children: measure each case in its own process.
    probe = [sys.executable, "-c",
             "import resource, subprocess, sys, time; t = time.perf_counter(); "
             "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
             "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
             "print(time.perf_counter() - t, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime)",
             *command]
    out = subprocess.run(probe, cwd=cwd, check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), float(out[2])


def release_cases(label: str, source: str, release: str) -> list[tuple[str, list[str], Callable | None]]:
    """`gedp protect` of ``source`` into ``release`` and the two `tabulate --moe` of it, with their floors."""
    def floor_of_protect(work: Path) -> float:
        scratch = work / "floor"
        scratch.mkdir(exist_ok=True)
        return protect_floor(work / source, work / release, scratch)

    cases = [(f"gedp protect {label}, baseline", ["protect", source, "--out", release], floor_of_protect)]
    for by, cells in (("county,naics", "county x NAICS-6"), ("county,sector", "county x sector")):
        cases.append((f"gedp tabulate --moe, every {cells} cell, {label}",
                      ["tabulate", release, "--by", by, "--moe", "--out", f"{release}-{by.replace(',', '-')}.csv"],
                      lambda work, release=release: tabulate_floor(work / release)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="35796", help="establishment counts for `gedp protect`")
    parser.add_argument("--only", default="", help="run only the cases whose label contains this text (a|b: either)")
    parser.add_argument("--before", default="", help="another gedp executable to run every case with too")
    parser.add_argument("--note", default="", help="a line under the heading, e.g. what --before is")
    args = parser.parse_args()
    versions = {"": gedp_command()}
    if args.before:
        versions = {" (before)": [args.before], " (after)": gedp_command()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases: list[tuple[str, list[str], Callable | None]] = [
            ("gedp run (small profile, 35,796 establishments, baseline)", ["run", "--seed", "1", "--out", "run"], None),
            ("gedp evaluate e5 (small profile, 20 replications)", ["evaluate", "e5", "--out", "e5"], None),
        ]
        shared = Path(__file__).resolve().parents[2] / "shared" / "data"
        new_jersey = shared / "qcew_2016q1_34.csv"
        if new_jersey.is_file():
            cases.append(("gedp synth --from-qcew New Jersey (251,987 establishments)",
                          ["synth", "--from-qcew", str(new_jersey), "--out", "nj-synth.parquet"], None))
            cases.append(("gedp synth --from-qcew New Jersey --jobs (251,987 establishments, 3,264,979 jobs)",
                          ["synth", "--from-qcew", str(new_jersey), "--jobs", "--out", "nj-jobs.parquet"], None))
            for name, state in (("Rhode Island", "44"), ("New Jersey", "34")):
                cases.append((f"gedp suppress --from-qcew {name} (synthesis, suppression, LP audit)",
                              ["suppress", "--from-qcew", str(shared / f"qcew_2016q1_{state}.csv"),
                               "--out", f"suppress-{state}"], None))
            subprocess.run([*gedp_command(), "synth", "--from-qcew", str(new_jersey), "--out", "nj.parquet",
                            "--seed", "1"], cwd=work, check=True, capture_output=True)
            nj = pd.read_parquet(work / "nj.parquet")
            twice = pd.concat([nj, nj.assign(state="35", estab_id="35-" + nj["estab_id"])], ignore_index=True)
            twice.to_parquet(work / "nj2.parquet", index=False)
            for name, frame, source in (("New Jersey from --from-qcew", nj, "nj.parquet"),
                                        ("New Jersey twice, as 2 states", twice, "nj2.parquet")):
                cells = frame.groupby(["state", "county", "naics"]).ngroups
                cases += release_cases(f"{name} ({len(frame):,} establishments, {cells:,} county x NAICS-6 cells)",
                                       source, f"protect-{source.removesuffix('.parquet')}")
        for size in (int(s) for s in args.sizes.split(",")):
            source = f"state-{size}.parquet"
            generate_profile(load_profile("large"), n_establishments=size, rng=np.random.default_rng(1)).to_parquet(
                work / source
            )
            cases += release_cases(f"{size:,} establishments (large profile)", source, f"protect-{size}")
        cases = [case for case in cases if any(part in case[0] for part in args.only.split("|"))]
        for label, arguments, floor in cases:
            runs: dict[str, list[tuple[float, float]]] = {version: [] for version in versions}
            floors = []
            for _ in range(args.repeat):
                for version, command in versions.items():  # alternate: both see the same load
                    runs[version].append(timed_run([*command, *arguments], work))
                if floor is not None:
                    floors.append(floor(work))
            for version, measured in runs.items():
                seconds = sorted(r[0] for r in measured)
                best_floor = min(floors) if floors else None
                rows.append((label + version, seconds[len(seconds) // 2], seconds[0], best_floor,
                             max(r[1] for r in measured)))
                floor_text = f", floor {best_floor:.1f}s" if best_floor is not None else ""
                print(f"{rows[-1][0]}: median {rows[-1][1]:.1f}s, best {rows[-1][2]:.1f}s{floor_text}, "
                      f"peak {rows[-1][4]:.0f} MiB", flush=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp}: whole-process CLI ({args.repeat} runs each)\n", f"Machine: {machine()}\n",
             *([args.note + "\n"] if args.note else []),
             "| command | median s | best s | I/O floor s | best / floor | peak memory MiB |",
             "|---|---|---|---|---|---|"]
    for label, median, best, floor, peak in rows:
        floor_cells = f"{floor:.2f} | {best / floor:.1f}x" if floor is not None else "| "
        lines.append(f"| {label} | {median:.1f} | {best:.1f} | {floor_cells} | {peak:.0f} |")
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by the scripts in this folder; newest last.\n")
    with RESULTS.open("a") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"recorded in {RESULTS}")


if __name__ == "__main__":
    main()
