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
import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from alternated import appended, compared, header

RESULTS = Path(__file__).with_name("RESULTS-schema-first.md")
READ = ("import sys, gedp\ntry:\n    gedp.Release(sys.argv[1]).microdata\nexcept gedp.errors.InputError:\n"
        "    sys.exit(2)")
FLOOR = "import sys, gedp, gedp.release.reader"


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
    lines = header(args.repeat, "exit status")
    with tempfile.TemporaryDirectory() as scratch:
        for release in args.releases:
            edited = without_m1emp(release, Path(scratch))
            cases = {"refused (m1emp dropped)": (READ, edited), "read (no edit)": (READ, release),
                     "floor (import)": (FLOOR, release)}
            lines += compared(release, cases, args.before, args.repeat)
    appended(RESULTS, lines)


if __name__ == "__main__":
    main()
