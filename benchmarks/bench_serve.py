"""`gedp serve` under load: warm answers of tabulations by public columns with margins, with 8
concurrent clients on loopback, beside `gedp tabulate`'s time for the same requests; the server's
ready time beside one first CLI request (both with an empty margins cache); its memory.

    python benchmarks/bench_serve.py RELEASE [--clients 8] [--requests 400] [--seconds 120]
        [--cli-sample 6] [--label TEXT] [--no-record]
    python benchmarks/bench_serve.py --make 1400000 --work DIR     # a large-profile release of that size

The load starts once the server is warm: its background work (the margins of the lattice's
groupings, ``gedp.release.lattice``) done, which the server's processor time tells.

Requests: every table of state or county, by no industry or one industry level (domain, supersector,
sector, NAICS 3 to 6), with or without ownership as a key, and with no filter, private ownership only,
or one sector only, each with 95% margins (JSON). Each client takes the next request of the list in
turn (after the whole list, requests come again and the server answers them from its cache: both
are reported apart); the run stops after --requests answers or --seconds. Results are appended to
RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from recording import report

INDUSTRIES = ["", "domain", "supersector", "sector", "naics3", "naics4", "naics5", "naics"]
FILTERS = ["", "own == '5'", "sector == '44-45'"]


def requests(release_id: str) -> list[dict]:
    """Every request of the module's list, in an order that mixes small and large tables."""
    made = []
    for where in FILTERS:
        for own in (False, True):
            for industry in INDUSTRIES:
                for area in ("state", "county"):
                    by = ",".join(k for k in (area, industry, "own" if own else "") if k)
                    made.append({"release": release_id, "by": by, "moe": "1", **({"where": where} if where else {})})
    return made[::2] + made[1::2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gedp() -> str:
    return str(Path(sys.executable).with_name("gedp"))


def first_cli_request(release: Path, cache: Path) -> float:
    """Seconds of one first `gedp tabulate --moe` of the release (empty cache: it builds the margins)."""
    env = {**os.environ, "GEDP_CACHE_DIR": str(cache)}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([gedp(), "tabulate", str(release), "--by", "county", "--moe", "--out", f"{out}/t.csv"],
                       env=env, check=True, capture_output=True)
        return time.perf_counter() - start


def start_server(release: Path, cache: Path, port: int,
                 options: tuple[str, ...] = ()) -> tuple[subprocess.Popen, float]:
    """`gedp serve` started with the margins cache ``cache`` (and its ``options``); the seconds until it
    answers /api/releases."""
    env = {**os.environ, "GEDP_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    server = subprocess.Popen([gedp(), "serve", str(release), "--port", str(port), *options], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while True:
        if server.poll() is not None:
            raise SystemExit(f"gedp serve exited: {server.stderr.read().decode()[-2000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/api/releases")
            if connection.getresponse().status == 200:
                return server, time.perf_counter() - start
        except OSError:
            time.sleep(0.05)


def memory_mib(pid: int) -> tuple[float, float]:
    """Resident and peak resident memory of a process, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled(pid: int, limit: float = 300.0) -> float:
    """Seconds until the server's background work (the lattice's margins) is done: until it uses
    less than 5% of a core over two half-seconds in a row (at most ``limit``)."""
    start, quiet = time.perf_counter(), 0
    while quiet < 2 and time.perf_counter() - start < limit:
        used = cpu_seconds(pid)
        time.sleep(0.5)
        quiet = quiet + 1 if cpu_seconds(pid) - used < 0.025 else 0
    return time.perf_counter() - start


def load(port: int, wanted: list[dict], clients: int, limit: int, seconds: float
         ) -> tuple[list[tuple[float, bool]], list[int]]:
    """Latencies (s) of answers by ``clients`` threads, each on its own keep-alive connection, each
    with whether its request was asked before (answered from the server's cache), and the rows of
    each answer; at most ``limit`` answers or ``seconds``."""
    latencies: list[tuple[float, bool]] = []
    bodies: list[bytes] = []
    lock = threading.Lock()
    taken = iter(range(limit))
    deadline = time.monotonic() + seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.monotonic() < deadline:
            with lock:
                number = next(taken, None)
            if number is None:
                return
            path = "/api/tabulate?" + urllib.parse.urlencode(wanted[number % len(wanted)])
            start = time.perf_counter()
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
            elapsed = time.perf_counter() - start
            if response.status != 200:
                raise SystemExit(f"{path}: {response.status} {body[:300]!r}")
            with lock:
                latencies.append((elapsed, number >= len(wanted)))
                bodies.append(body)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, [len(json.loads(body)["rows"]) for body in bodies]  # read after: no client work in the load


def cli_times(release: Path, cache: Path, wanted: list[dict], sample: int) -> list[float]:
    """Seconds of `gedp tabulate` (warm cache: further requests) of a sample of the same requests."""
    env = {**os.environ, "GEDP_CACHE_DIR": str(cache)}
    times = []
    step = max(1, len(wanted) // sample)
    with tempfile.TemporaryDirectory() as out:
        for request in wanted[::step][:sample]:
            arguments = [gedp(), "tabulate", str(release), "--by", request["by"], "--moe", "--out", f"{out}/t.csv"]
            if "where" in request:
                arguments += ["--where", request["where"]]
            start = time.perf_counter()
            subprocess.run(arguments, env=env, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    return times


def summary(what: str, latencies: list[float]) -> list[str]:
    """Table rows: median and p95 latency of ``latencies`` (none when empty)."""
    if not latencies:
        return [f"| {what} | none |"]
    return [f"| {what}: median, p95, max latency ({len(latencies)} answers) | "
            f"{statistics.median(latencies) * 1000:.0f} ms, {percentile(latencies, 0.95) * 1000:.0f} ms, "
            f"{max(latencies) * 1000:.0f} ms |"]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def make_release(n: int, work: Path) -> Path:
    """A release of the large profile rescaled to ``n`` establishments (as benchmarks/bench_scale.py
    makes its inputs), protected for publication."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_scale import state_of_size

    from gedp.synth.io import write_microdata

    work.mkdir(parents=True, exist_ok=True)
    data, release = work / f"large-{n}.parquet", work / f"release-{n}"
    if not release.is_dir():
        write_microdata(state_of_size(n), data)
        subprocess.run([gedp(), "protect", str(data), "--out", str(release)], check=True)
    return release


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("release", type=Path, nargs="?")
    parser.add_argument("--make", type=int, help="make a large-profile release of this many establishments")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gedp-bench-serve")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--cli-sample", type=int, default=6)
    parser.add_argument("--label", default="")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    release = make_release(args.make, args.work) if args.make else args.release
    if release is None:
        parser.error("give a RELEASE or --make N")
    release = release.resolve()
    manifest = json.loads((release / "manifest.json").read_text())
    with tempfile.TemporaryDirectory() as caches:
        first_cli = first_cli_request(release, Path(caches) / "cli")
        port = free_port()
        server, ready = start_server(release, Path(caches) / "serve", port)
        try:
            wanted = requests(release.name)
            load(port, wanted[:2], 1, 2, 60)  # the first answers (imports of the tabulation path)
            warm = settled(server.pid)
            idle, _ = memory_mib(server.pid)
            started, cpu = time.perf_counter(), cpu_seconds(server.pid)
            latencies, rows = load(port, wanted, args.clients, args.requests, args.seconds)
            wall, cpu = time.perf_counter() - started, cpu_seconds(server.pid) - cpu
            resident, peak = memory_mib(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
        cli = cli_times(release, Path(caches) / "cli", wanted, args.cli_sample)
    load_average = os.getloadavg()
    lines = [
        f"## {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC: gedp serve under load {args.label}".rstrip(),
        "",
        f"Release `{release.name}`: {manifest['establishments']:,} establishments, states "
        f"{', '.join(manifest['states'])}; {len(wanted)} distinct requests (state or county x no industry or one "
        f"level x ownership or not x three filters), 95% margins, JSON; {args.clients} concurrent clients on "
        f"loopback; load average {load_average[0]:.1f} at the end (2 cores shared with other work).",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| warm answers | {len(latencies)} in {wall:.1f} s ({len(latencies) / wall:.1f} per s) |",
        f"| server CPU time per answer (all answers: user + system) | {cpu / len(latencies) * 1000:.1f} ms |",
        *summary("computed (each request's first time)", [t for t, again in latencies if not again]),
        *summary("asked again (the server's answer cache)", [t for t, again in latencies if again]),
        f"| rows per answer (median, max) | {statistics.median(rows):.0f}, {max(rows):,} |",
        f"| `gedp tabulate` further request, same requests (median of {len(cli)}, one at a time) | "
        f"{statistics.median(cli):.2f} s |",
        f"| server ready (start to first answer, empty cache) | {ready:.1f} s |",
        f"| server warm (its background work done) after ready | {warm:.1f} s |",
        f"| one first `gedp tabulate --moe` (empty cache) | {first_cli:.1f} s |",
        f"| server memory: loaded, after the load (peak) | {idle:.0f} MiB, {resident:.0f} MiB ({peak:.0f} MiB) |",
        "",
    ]
    report(lines, record=not args.no_record)


if __name__ == "__main__":
    main()
