"""One gedp against another (``--before``: the python of, e.g., a venv of the commit before), each
case's process run alternately with both so they see the same load: whole-process wall time, peak
resident memory, processor time and what the process said last, as medians, in a table appended to a
RESULTS file. Used by bench_schema_first.py and bench_audit_once.py."""

from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def timed(python: str, code: str, release: Path, cwd: str | None = None) -> tuple[float, float, float, str]:
    """Wall seconds, peak resident MiB, processor seconds and the last word of standard output (or
    "exit N" when it printed nothing) of ``python -c code release``, run in ``cwd`` (outside any source
    tree, so that each python imports its own gedp)."""
    probe = [sys.executable, "-c",
             "import resource, subprocess, sys, time; t = time.perf_counter(); "
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
             "print(time.perf_counter() - t, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime, "
             "(r.stdout.split() or ['exit-%d' % r.returncode])[-1])",
             python, "-c", code, str(release)]
    out = subprocess.run(probe, check=True, capture_output=True, text=True, cwd=cwd).stdout.split()
    return float(out[0]), float(out[1]), float(out[2]), out[3].replace("exit-", "exit ")


def header(repeat: int, said: str) -> list[str]:
    """The table's title (time, load, cores) and column heads; ``said`` names the last column's words."""
    return [f"\n## {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f} at the start, "
            f"{os.cpu_count()} cores; medians of {repeat} (wall s, peak MiB, CPU s; {said})\n",
            "| release | case | this gedp | before |", "|---|---|---|---|"]


def compared(release: Path, cases: Mapping[str, tuple[str, Path]], before: str, repeat: int,
             cwd: str | None = None) -> list[str]:
    """A row per case (label: (code, folder)): this gedp's and ``before``'s medians, printed as they come."""
    rows = []
    for label, (code, folder) in cases.items():
        runs: dict[str, list] = {"now": [], "before": []}
        for _ in range(repeat):
            for key, python in (("now", sys.executable), ("before", before)):
                runs[key].append(timed(python, code, folder, cwd))
        shown = []
        for key in ("now", "before"):
            wall, peak, cpu = (statistics.median(run[i] for run in runs[key]) for i in range(3))
            said = "/".join(sorted({run[3] for run in runs[key]}))
            shown.append(f"{wall:.2f} s, {peak:.0f} MiB, {cpu:.2f} s; {said}")
        rows.append(f"| {release.name} | {label} | {shown[0]} | {shown[1]} |")
        print(rows[-1], flush=True)
    return rows


def appended(results: Path, lines: list[str]) -> None:
    """``lines`` and the load at the end appended to ``results``."""
    lines = [*lines, f"\nload {os.getloadavg()[0]:.1f} at the end\n"]
    with results.open("a") as out:
        out.write("\n".join(lines) + "\n")
