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
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from alternated import appended, compared, header

RESULTS = Path(__file__).with_name("RESULTS-audit-once.md")
AUDIT = ("import sys\nfrom gedp.audit.release import audit_release\n"
         "print(','.join(c.name for c in audit_release(sys.argv[1]) if not c.passed) or 'none')")
FLOOR = "import sys, gedp.audit.release\nprint('-')"


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
    lines = header(args.repeat, "checks failed")
    with tempfile.TemporaryDirectory() as scratch:
        for release in args.releases:
            cases = {"genuine": (AUDIT, release.resolve()), "jobs moved": (AUDIT, jobs_moved(release, Path(scratch))),
                     "floor (import)": (FLOOR, release.resolve())}
            lines += compared(release, cases, args.before, args.repeat, scratch)
    appended(RESULTS, lines)


if __name__ == "__main__":
    main()
