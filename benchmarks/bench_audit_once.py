"""``gedp audit --release`` of a release with a job frame (``audit.release.audit_release``), with this
gedp and with another (--before, e.g. a venv of the commit before, which read the protected microdata
twice: its state parts, then ``read_protected`` for the job frame's check), alternated so both see
the same load: whole-process wall time, peak memory and processor time, and the verdicts (the checks
failed) of the genuine release and of a copy whose job frame's jobs were moved between
establishments, beside the floor (``import gedp.audit.release``).

    python benchmarks/bench_audit_once.py RELEASE [RELEASE ...] --before PYTHON [--repeat 3]

Results are appended to benchmarks/RESULTS-audit-once.md.
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

import pyarrow as pa
import pyarrow.parquet as pq

RESULTS = Path(__file__).with_name("RESULTS-audit-once.md")
AUDIT = ("import sys\nfrom gedp.audit.release import audit_release\n"
         "print(','.join(c.name for c in audit_release(sys.argv[1]) if not c.passed) or 'none')")
FLOOR = "import sys, gedp.audit.release\nprint('-')"


def timed(python: str, code: str, release: Path, cwd: str) -> tuple[float, float, float, str]:
    """Wall seconds, peak resident MiB, processor seconds and the checks failed of one process (run in
    ``cwd``, outside any source tree, so that each python imports its own gedp)."""
    probe = [sys.executable, "-c",
             "import resource, subprocess, sys, time; t = time.perf_counter(); "
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
             "print(time.perf_counter() - t, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime, "
             "(r.stdout.split() or ['exit-%d' % r.returncode])[-1])",
             python, "-c", code, str(release)]
    out = subprocess.run(probe, check=True, capture_output=True, text=True, cwd=cwd).stdout.split()
    return float(out[0]), float(out[1]), float(out[2]), out[3]


def jobs_moved(release: Path, work: Path) -> Path:
    """A copy of ``release`` whose job frame's jobs are reversed within each part (no longer adding up)."""
    copy = work / f"{release.name}-jobs-moved"
    shutil.copytree(release, copy)
    for part in (copy / "protected_jobs.parquet").iterdir():
        table = pq.read_table(part)
        jobs = pa.array(table.column("jobs").to_numpy()[::-1])
        pq.write_table(table.set_column(table.schema.get_field_index("jobs"), "jobs", jobs), part)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", type=Path, nargs="+")
    parser.add_argument("--before", required=True, help="the python of the gedp to compare with")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    lines = [f"\n## {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f} at the start, "
             f"{os.cpu_count()} cores; medians of {args.repeat} (wall s, peak MiB, CPU s; checks failed)\n",
             "| release | case | this gedp | before |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for release in args.releases:
            cases = {"genuine": (AUDIT, release.resolve()), "jobs moved": (AUDIT, jobs_moved(release, Path(scratch))),
                     "floor (import)": (FLOOR, release.resolve())}
            for label, (code, folder) in cases.items():
                runs: dict[str, list] = {"now": [], "before": []}
                for _ in range(args.repeat):
                    for key, python in (("now", sys.executable), ("before", args.before)):
                        runs[key].append(timed(python, code, folder, scratch))
                shown = []
                for key in ("now", "before"):
                    wall, peak, cpu = (statistics.median(run[i] for run in runs[key]) for i in range(3))
                    failed = "/".join(sorted({run[3] for run in runs[key]}))
                    shown.append(f"{wall:.2f} s, {peak:.0f} MiB, {cpu:.2f} s; {failed}")
                lines.append(f"| {release.name} | {label} | {shown[0]} | {shown[1]} |")
                print(lines[-1], flush=True)
    lines.append(f"\nload {os.getloadavg()[0]:.1f} at the end\n")
    with RESULTS.open("a") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
