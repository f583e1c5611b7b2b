"""A further ad-hoc request, whole process: `gedp tabulate REL --by county,naics4 --moe --out t.csv`
with the release's structure kept, run by two gedp executables alternated (--before, e.g. a venv of
main, and --after, default this one), each with a cache folder of its own, with and without the
modules' bytecode cached (this machine may set PYTHONDONTWRITEBYTECODE; "cached" sets
PYTHONPYCACHEPREFIX to a folder per executable, as an installed package has its .pyc files). Each
run under /usr/bin/time -v: wall seconds, processor seconds (user + system), peak memory; the load
average beside each; the tables of the two compared byte for byte.

    python benchmarks/bench_further.py --release REL --before /path/to/gedp [--after gedp] [--repeat 6]
        [--by county,naics4] [--record]

--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import filecmp
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench_cli import RESULTS, machine


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, user + system seconds and peak memory (MiB) of one run (/usr/bin/time -v)."""
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, env=env, check=True)

    def field(name: str) -> str:
        return re.search(rf"{re.escape(name)}: (.+)", done.stderr).group(1).strip()

    clock = [float(part) for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(value * 60 ** power for power, value in enumerate(reversed(clock)))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return wall, cpu, int(field("Maximum resident set size (kbytes)")) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--before", required=True, help="the gedp executable to compare with")
    parser.add_argument("--after", default=shutil.which("gedp") or "gedp")
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--by", default="county,naics4")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    sides = {"before": args.before, "after": args.after}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {side: os.environ | {"GEDP_CACHE_DIR": str(work / f"cache-{side}"), "PYTHONDONTWRITEBYTECODE": "1"}
               for side in sides}
        request = {side: [gedp, "tabulate", str(args.release), "--by", args.by, "--moe", "--out",
                          str(work / f"{side}.csv")] for side, gedp in sides.items()}
        for side in sides:  # the first request keeps the structure (and warms the file cache)
            subprocess.run(request[side], env=env[side], check=True, capture_output=True)
        same = filecmp.cmp(work / "before.csv", work / "after.csv", shallow=False)
        for mode in ("no bytecode cache", "bytecode cached"):
            for side in sides:
                if mode == "bytecode cached":
                    env[side] = env[side] | {"PYTHONPYCACHEPREFIX": str(work / f"pyc-{side}")}
                    env[side].pop("PYTHONDONTWRITEBYTECODE")
                    subprocess.run(request[side], env=env[side], check=True, capture_output=True)  # writes .pyc
            runs: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
            loads = []
            for _ in range(args.repeat):
                for side in sides:  # alternated: both see the same load
                    runs[side].append(timed(request[side], env[side]))
                    loads.append(os.getloadavg()[0])
            for side, measured in runs.items():
                walls, cpus = sorted(r[0] for r in measured), sorted(r[1] for r in measured)
                rows.append(f"| {side} | {mode} | {min(loads):.1f}-{max(loads):.1f} | "
                            f"{', '.join(f'{r[0]:.2f}' for r in measured)} ({walls[len(walls) // 2]:.2f}) | "
                            f"{', '.join(f'{r[1]:.2f}' for r in measured)} ({cpus[len(cpus) // 2]:.2f}) | "
                            f"{max(r[2] for r in measured):.0f} |")
                print(rows[-1], flush=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp}: a further request with margins, whole process ({args.repeat} runs each, alternated)\n",
             f"Machine: {machine()}\n", f"`gedp tabulate REL --by {args.by} --moe --out t.csv`, structure kept; "
             f"tables of before and after byte-identical: {same}.\n",
             "| gedp | modules | load | wall s (median) | user + system s (median) | peak MiB |",
             "|---|---|---|---|---|---|", *rows]
    print("\n".join(lines))
    if args.record:
        with RESULTS.open("a") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
