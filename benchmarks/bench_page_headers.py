"""The cost of walking a release's page headers before its rows are read (``gedp.release.page_headers``):
the walk alone over each part (in this process, best of --repeat), and whole-process `gedp tabulate
RELEASE --by county --moe` with the walk and without it (the same gedp, ``part_sizes._check_pages``
replaced by a no-op in the child), alternating (which runs first swapped each repeat), each run's wall
time and peak resident memory, after a warm-up run of each that fills the margins cache. Results are
appended to benchmarks/RESULTS-page-headers.md with the load average.

    python benchmarks/bench_page_headers.py RELEASE [RELEASE ...] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from gedp.release.page_headers import chunk_range, walk_chunk
from gedp.release.part_sizes import _check_pages, footer_bytes

RESULTS = Path(__file__).with_name("RESULTS-page-headers.md")
WITHOUT = ("import sys, gedp.release.part_sizes as p; p._check_pages = lambda *a: None; "
           "from gedp.cli import app; sys.argv[0] = 'gedp'; app()")
WITH = "import sys; from gedp.cli import app; sys.argv[0] = 'gedp'; app()"


def walk(part: Path) -> tuple[float, int, int]:
    """Seconds to check the part's page headers (as ``check_footer`` does), its pages and longest header."""
    metadata = pq.read_metadata(part)
    groups = [metadata.row_group(group) for group in range(metadata.num_row_groups)]
    start = time.perf_counter()
    _check_pages("bench", part.parent.name, part, groups, part.stat().st_size - footer_bytes(part) - 8)
    seconds = time.perf_counter() - start
    pages = longest = 0
    with open(part, "rb") as file:
        for group in groups:
            for column in range(group.num_columns):
                chunk = group.column(column)
                begin, end = chunk_range(chunk.data_page_offset, chunk.dictionary_page_offset,
                                         chunk.total_compressed_size)
                headers = walk_chunk(file, begin, end, chunk.num_values)
                pages += len(headers)
                longest = max([longest, *(header.length for header in headers)])
    return seconds, pages, longest


def tabulate(release: Path, code: str) -> tuple[float, float]:
    """Wall seconds and peak resident MiB of one `gedp tabulate RELEASE --by county --moe`."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code, "tabulate", str(release), "--by", "county", "--moe"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    assert status == 0, status
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("releases", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for release in args.releases:
        parts = sorted(release.glob("*.parquet/*.parquet"))
        walks = [min(walk(part)[0] for _ in range(args.repeat)) for part in parts]
        pages = sum(walk(part)[1] for part in parts)
        longest = max(walk(part)[2] for part in parts)
        megabytes = sum(part.stat().st_size for part in parts) / 1e6
        tabulate(release, WITH), tabulate(release, WITHOUT)  # fill the margins cache, warm the files
        runs: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
        loads = []
        for repeat in range(args.repeat):
            for name, code in [("without", WITHOUT), ("with", WITH)][::1 if repeat % 2 else -1]:
                runs[name].append(tabulate(release, code))
            loads.append(os.getloadavg()[0])
        medians = {name: statistics.median(seconds for seconds, _ in found) for name, found in runs.items()}
        peaks = {name: statistics.median(peak for _, peak in found) for name, found in runs.items()}
        rows.append(f"| {release.name} | {len(parts)} parts, {megabytes:.1f} MB, {pages:,} pages (longest header "
                    f"{longest} B) | {1000 * sum(walks):.0f} | {medians['without']:.2f} / {peaks['without']:.0f} | "
                    f"{medians['with']:.2f} / {peaks['with']:.0f} | "
                    f"{100 * sum(walks) / medians['without']:.1f}% | {min(loads):.1f}-{max(loads):.1f} |")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"\n## {stamp}: page-header walk (best of {args.repeat}) and `gedp tabulate --by county --moe` "
            f"(median of {args.repeat}, alternating)\n\nMachine: {os.cpu_count()} cores; peak resident MiB (median); "
            f"load: 1-minute load average after each pair\n\n"
            "| release | parts | walk ms | tabulate without walk s / MiB | with walk s / MiB | walk share | load |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    if not RESULTS.exists():
        RESULTS.write_text("# Page-header walk: cost\n\nAppended by bench_page_headers.py; newest last.\n")
    with RESULTS.open("a") as file:
        file.write(text)
    print(text)


if __name__ == "__main__":
    main()
