"""A release whose protected microdata lack a column (m1emp dropped from every part), read by the
stored-table reader (``Release.microdata``: ``reader.read_stored``, also behind ``gedp implicates``
and the margin structure's build): whole-process time, peak memory and processor time of the
refusal with this gedp and with another (--before, e.g. a venv of the commit before), alternated so
both see the same load, beside the floor (``import gedp.release.reader``) and a read of the release
without the edit.

    python benchmarks/bench_schema_first.py RELEASE [RELEASE ...] --before PYTHON [--repeat 5]

Results are appended to benchmarks/RESULTS-schema-first.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

RESULTS = Path(__file__).with_name("RESULTS-schema-first.md")
READ = ("import sys, gedp\ntry:\n    gedp.Release(sys.argv[1]).microdata\nexcept gedp.errors.InputError:\n"
        "    sys.exit(2)")
FLOOR = "import sys, gedp, gedp.release.reader"


def timed(python: str, code: str, release: Path) -> tuple[float, float, float, int]:
    """Wall seconds, peak resident MiB, processor seconds and exit status of one process."""
    probe = [sys.executable, "-c",
             "import resource, subprocess, sys, time; t = time.perf_counter(); "
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
             "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
             "print(time.perf_counter() - t, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime, r.returncode)",
             python, "-c", code, str(release)]
    out = subprocess.run(probe, check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), float(out[2]), int(out[3])


def without_m1emp(release: Path, work: Path) -> Path:
    """A copy of ``release`` with m1emp dropped from every part of its protected microdata."""
    copy = work / f"{release.name}-no-m1emp"
    shutil.copytree(release, copy)
    for part in (copy / "protected.parquet").iterdir():
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["m1emp"]), part)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", type=Path, nargs="+")
    parser.add_argument("--before", required=True, help="the python of the gedp to compare with")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    lines = [f"\n## {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f} at the start, "
             f"{os.cpu_count()} cores; medians of {args.repeat} (wall s, peak MiB, CPU s)\n",
             "| release | case | this gedp | before |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for release in args.releases:
            edited = without_m1emp(release, Path(scratch))
            cases = {"refused (m1emp dropped)": (READ, edited), "read (no edit)": (READ, release),
                     "floor (import)": (FLOOR, release)}
            for label, (code, folder) in cases.items():
                runs: dict[str, list] = {"now": [], "before": []}
                for _ in range(args.repeat):
                    for key, python in (("now", sys.executable), ("before", args.before)):
                        runs[key].append(timed(python, code, folder))
                shown = []
                for key in ("now", "before"):
                    wall, peak, cpu = (statistics.median(run[i] for run in runs[key]) for i in range(3))
                    status = {run[3] for run in runs[key]}
                    shown.append(f"{wall:.2f} s, {peak:.0f} MiB, {cpu:.2f} s (exit {'/'.join(map(str, status))})")
                lines.append(f"| {release.name} | {label} | {shown[0]} | {shown[1]} |")
                print(lines[-1], flush=True)
    lines.append(f"\nload {os.getloadavg()[0]:.1f} at the end\n")
    with RESULTS.open("a") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
