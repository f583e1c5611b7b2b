"""Whole-process time of the commands whose cost is mostly imports: `gedp --help`, `gedp tabulate --help`,
`python -c "import gedp.api"`, `gedp interval`, `gedp synth --profile small`, and for each release
given `gedp tabulate REL --by county` (with and without `--moe`) and `gedp report REL`, with this
interpreter's gedp and (``--before``) another venv's, alternating run by run so both
see the same load. Per case: median wall seconds, median processor seconds (user + system of the child,
from ``os.wait4``) and the largest peak resident set, over ``--repeat`` runs, with the 1-minute load
average at the start and end of the case. Each run starts in a fresh temporary folder (the report page
and the table are written there), which is also its margin cache (``GEDP_CACHE_DIR``): every request
is a first one, whatever ran before.

    python benchmarks/bench_startup.py RELEASE [RELEASE ...] [--repeat 5] [--before /path/to/venv/bin]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def commands(bin_dir: Path, releases: list[Path]) -> dict[str, list[str]]:
    """Label -> argv of each case, run with the interpreter and ``gedp`` script of ``bin_dir``."""
    gedp, python = str(bin_dir / "gedp"), str(bin_dir / "python")
    cases = {"gedp --help": [gedp, "--help"], "gedp tabulate --help": [gedp, "tabulate", "--help"],
             "import gedp.api": [python, "-c", "import gedp.api"],
             "gedp interval 3 36 360": [gedp, "interval", "3", "36", "360"],
             "gedp synth --profile small --establishments 1500": [gedp, "synth", "--profile", "small",
                                                                  "--establishments", "1500", "--out", "s.parquet"]}
    for release in releases:
        cases[f"gedp tabulate {release.name} --by county"] = [gedp, "tabulate", str(release), "--by", "county",
                                                              "--out", "table.csv"]
        cases[f"gedp tabulate {release.name} --by county --moe"] = [gedp, "tabulate", str(release), "--by",
                                                                    "county", "--moe", "--out", "table.csv"]
        cases[f"gedp report {release.name}"] = [gedp, "report", str(release), "--out", "report.html"]
    return cases


def run_once(argv: list[str]) -> tuple[float, float, float]:
    """Wall seconds, processor seconds (user + system) and peak resident MiB of one child process."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
        start = time.perf_counter()
        env = {**os.environ, "GEDP_CACHE_DIR": folder}
        child = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        error = child.stderr.read().decode() if child.stderr else ""
        if child.returncode != 0:
            raise SystemExit(f"{argv} failed ({child.returncode}): {error[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", type=Path, help="bin folder of another venv's gedp, run alternately")
    parser.add_argument("--only", help="run the cases whose label contains this text")
    args = parser.parse_args()
    sides = {"after": Path(sys.executable).parent}
    if args.before:
        sides = {"before": args.before, **sides}
    cases = {side: commands(folder, [r.resolve() for r in args.releases]) for side, folder in sides.items()}
    print("| command | side | wall s (median) | cpu s (median) | peak MiB | load 1 min |")
    print("|---|---|---|---|---|---|")
    for label in [label for label in cases["after"] if args.only is None or args.only in label]:
        runs: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
        load_start = os.getloadavg()[0]
        for _ in range(args.repeat):
            for side in sides:
                runs[side].append(run_once(cases[side][label]))
        load_end = os.getloadavg()[0]
        for side, measured in runs.items():
            wall = statistics.median(m[0] for m in measured)
            cpu = statistics.median(m[1] for m in measured)
            peak = max(m[2] for m in measured)
            print(f"| {label} | {side} | {wall:.2f} | {cpu:.2f} | {peak:.0f} | {load_start:.1f}-{load_end:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
