"""What `gedp serve`'s answer cache lets a client tell: one client asks each of --requests distinct
tables (bench_serve's list: state or county by an industry level, with or without ownership and a
filter, 95% margins, JSON), then each again, on one kept-alive connection, of a server started with
the margins cache --cache (default: an empty one) and left to settle (its lattice's margins done); with
the answer cache (the default) and with --no-cache. Reported: the latency of a first answer (computed) and of the same
request again (from the cache, or computed again), the share of first/again pairs the best single
latency threshold tells apart (0.5: no better than a coin), and the server's processor time per answer.

    python benchmarks/bench_serve_cache.py RELEASE [--requests 48] [--cache DIR] [--label TEXT] [--no-record]

Results are appended to RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import os
import statistics
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench_serve import cpu_seconds, free_port, percentile, requests, settled, start_server
from recording import report


def latencies(port: int, wanted: list[dict]) -> list[float]:
    """Seconds of each answer of ``wanted``, asked in turn on one kept-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    times = []
    for request in wanted:
        start = time.perf_counter()
        connection.request("GET", "/api/tabulate?" + urllib.parse.urlencode(request))
        response = connection.getresponse()
        body = response.read()
        times.append(time.perf_counter() - start)
        if response.status != 200:
            raise SystemExit(f"{request}: {response.status} {body[:300]!r}")
    return times


def told_apart(first: list[float], again: list[float]) -> float:
    """The best balanced accuracy of one threshold t calling a latency <= t "asked before"."""
    return max((sum(x > t for x in first) / len(first) + sum(x <= t for x in again) / len(again)) / 2
               for t in [*first, *again])


def measured(release: Path, wanted: list[dict], options: tuple[str, ...], cache: Path | None) -> dict:
    """Latencies of the first answers and of the same requests again, and the server's processor
    seconds per answer of each, of a server started with ``options``."""
    with tempfile.TemporaryDirectory() as empty:
        port = free_port()
        server, _ = start_server(release, cache or Path(empty), port, options)
        try:
            settled(server.pid)
            used = cpu_seconds(server.pid)
            first = latencies(port, wanted)
            middle = cpu_seconds(server.pid)
            again = latencies(port, wanted)
            end = cpu_seconds(server.pid)
        finally:
            server.terminate()
            server.wait(30)
    return {"first": first, "again": again, "cpu_first": (middle - used) / len(wanted),
            "cpu_again": (end - middle) / len(wanted)}


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}, {percentile(values, 0.9) * 1000:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", type=Path)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--cache", type=Path, help="a margins cache holding the release's structure")
    parser.add_argument("--label", default="")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    wanted = requests(args.release.name)[:args.requests]
    rows = []
    for options in ((), ("--no-cache",)):
        before = os.getloadavg()[0]
        done = measured(args.release, wanted, options, args.cache)
        rows.append(f"| {' '.join(options) or 'answer cache (default)'} | {ms(done['first'])} | {ms(done['again'])} "
                    f"| {told_apart(done['first'], done['again']):.2f} | {done['cpu_first'] * 1000:.1f} / "
                    f"{done['cpu_again'] * 1000:.1f} | {before:.1f}-{os.getloadavg()[0]:.1f} |")
    report([f"## gedp serve's answer cache: what an answer's time tells ({dt.date.today()}, "
            f"{args.label or args.release.name}, {len(wanted)} requests, one client)", "",
            "| server | first answer ms: median, p90 | same request again ms: median, p90 | pairs told apart "
            "| server CPU ms per answer: first / again | load |", "| --- | --- | --- | --- | --- | --- |", *rows],
           record=not args.no_record)


if __name__ == "__main__":
    main()
