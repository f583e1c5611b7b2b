"""``gedp serve``: the API gives the numbers and bytes ``gedp tabulate`` gives for the same request
(releases of one quarter and panels), refuses what it must (unknown parameters, files, keys that are
not public, too many rows, too long), says so safely (security headers, one-line JSON errors), and
refuses hostile releases at load."""

import contextlib
import csv
import http.client
import io
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from gedp.cli import app
from gedp.errors import InputError
from gedp.serve.app import PARAMETERS, Limits, create_app
from gedp.serve.releases import load_releases
from gedp.serve.server import listening_socket

PANEL_QUARTERS = ["2016Q1", "2016Q2", "2016Q3"]
SINGLE_REQUESTS = [
    {"by": "county"}, {"by": "county", "moe": "1"}, {"by": "county,naics3", "moe": "1"},
    {"by": "sector", "moe": "1", "level": "0.9"}, {"by": "naics3", "moe": "1"}, {"by": "total", "moe": "1"},
    {"by": "county,sector", "where": "own == '5'", "moe": "1"}, {"by": "naics4", "where": "sector == '31-33'"},
    {"by": "county,naics", "moe": "1", "level": "0.99", "where": "sector in ['44-45', '72']"},
    {"by": "supersector,own", "moe": "1"},
    {"by": "domain", "where": "county in ['001', '003'] and not naics3 == '722'", "moe": "1"},
    {"by": "state,naics5", "moe": "1", "where": "naics3 != '236'"},
    # the server's lattice: no filter or one value of a column, with the total, the state and the finest cells
    {"by": "county,naics3", "where": "own == '5'", "moe": "1"}, {"by": "total", "where": "sector == '31-33'",
                                                                  "moe": "1", "level": "0.9"},
    {"by": "state", "moe": "1"}, {"by": "county,naics,own", "where": "sector == '44-45'", "moe": "1"}, {"by": "total"},
    {"by": "naics4", "where": "county == '001' and sector == '44-45'", "moe": "1"},
    # tables by size class, over the implicates the server holds
    {"by": "sector,size_class", "moe": "1"}, {"by": "county,size_class", "where": "own == '5'", "moe": "1"},
    {"by": "size_class"},
]
PANEL_REQUESTS = [
    {"by": "county", "quarter": "2016Q1", "moe": "1"}, {"by": "sector", "quarter": "2016Q3", "moe": "1"},
    {"by": "total", "quarter": "2016Q2", "moe": "1", "level": "0.9"}, {"by": "naics3", "quarter": "2016Q2"},
    {"by": "sector", "change": "2016Q1:2016Q3", "moe": "1"}, {"by": "total", "change": "2016Q2:2016Q3", "moe": "1"},
    {"by": "county,sector", "quarter": "2016Q3", "where": "sector == '44-45'", "moe": "1"},
    {"by": "supersector,size_class", "quarter": "2016Q2", "moe": "1"},
]


@pytest.fixture(scope="module", autouse=True)
def size_class_draws(drawn_once_held):
    """A release's size-class implicates drawn once on each side (conftest.DrawnOnce): once for the
    module's servers, once for the commands they are compared with."""
    from gedp.release import implicates

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(implicates, "tabulation_implicates", drawn_once_held)
        yield


@pytest.fixture(scope="module")
def releases(small_release, tmp_path_factory):
    """A release of one quarter and a panel of three quarters (small, seeded)."""
    folder = tmp_path_factory.mktemp("served")
    single = folder / "single"
    shutil.copytree(small_release[0], single)
    runner = CliRunner()
    panel_input = folder / "panel.parquet"
    done = runner.invoke(app, ["synth", "--profile", "small", "--establishments", "600", "--quarters",
                               f"{PANEL_QUARTERS[0]}:{PANEL_QUARTERS[-1]}", "--out", str(panel_input), "--seed", "2"])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["protect", str(panel_input), "--out", str(folder / "panel"), "--seed", "3",
                               "--not-for-publication", "--allow-over-cap"])
    assert done.exit_code == 0, done.output
    return {"single": single, "panel": folder / "panel"}


class Served:
    """A server on a free loopback port, in a thread of this process."""

    def __init__(self, application):
        self.socket = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(application, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def get(self, path: str, params: dict | None = None) -> tuple[int, dict, bytes]:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params is not None else "")
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(releases, tmp_path_factory):
    loaded = load_releases([releases["single"], releases["panel"]])
    assert all(release.warm.wait(600) for release in loaded.values())  # its background work done
    served = Served(create_app(loaded, Limits(max_rows=500)))
    yield served
    served.stop()


def command_line(release: Path, request: dict, out: Path | None = None) -> str:
    """What ``gedp tabulate`` writes for the same request (standard output, or ``out``)."""
    arguments = ["tabulate", str(release)]
    for name in ("by", "where", "quarter", "change", "level", "agglvl"):
        if name in request:
            arguments += [f"--{name}", request[name]]
    if request.get("moe") == "1":
        arguments.append("--moe")
    if request.get("format") in ("qcew", "xlsx"):
        arguments += ["--format", request["format"]]
    if out is not None:
        arguments += ["--out", str(out)]
    done = CliRunner().invoke(app, arguments)
    assert done.exit_code == 0, done.output
    return done.stdout


def same_rows(answer: dict, text: str) -> None:
    """The API's rows are the CSV's rows: the same columns in order, text the same, numbers equal
    to the CSV's text read as a float (so equal to the last bit), an empty field null."""
    rows = list(csv.reader(io.StringIO(text)))
    assert answer["columns"] == rows[0]
    assert len(answer["rows"]) == len(rows) - 1 > 0
    for given, written in zip(answer["rows"], rows[1:]):
        assert list(given) == rows[0]
        for value, field in zip(given.values(), written):
            if value is None:
                assert field == ""
            elif isinstance(value, str):
                assert value == field
            else:
                assert value == float(field) and not isinstance(value, bool)


@pytest.mark.parametrize("kind, request_", [*(("single", r) for r in SINGLE_REQUESTS),
                                            *(("panel", r) for r in PANEL_REQUESTS)])
def test_the_api_gives_the_numbers_and_bytes_of_gedp_tabulate(server, releases, kind, request_, tmp_path):
    """The API's rows are those of the file ``gedp tabulate --out`` writes, and its CSV download is that
    file's bytes (one run of the command: a table by size class draws its 20 implicates in each; what the
    command writes to standard output is the file's bytes, ``test_gedp_tabulate_writes_its_file_to_a_pipe``)."""
    release = releases[kind]
    status, _, body = server.get("/api/tabulate", {"release": kind, **request_})
    assert status == 200, body
    written = tmp_path / "table.csv"
    command_line(release, request_, written)
    same_rows(json.loads(body), written.read_bytes().decode("utf-8"))
    status, headers, body = server.get("/api/tabulate", {"release": kind, **request_, "format": "csv"})
    assert status == 200 and headers["content-disposition"].startswith("attachment")
    assert body == written.read_bytes()


@pytest.mark.parametrize("kind, request_", [("single", SINGLE_REQUESTS[0]), ("single", SINGLE_REQUESTS[2]),
                                            ("panel", PANEL_REQUESTS[-1])])
def test_gedp_tabulate_writes_its_file_to_a_pipe(releases, kind, request_, tmp_path):
    """What ``gedp tabulate`` writes to standard output is the bytes of its ``--out`` file: a table without
    margins, one with margins (the release's kept index) and one by size class over implicates."""
    written = tmp_path / "table.csv"
    command_line(releases[kind], request_, written)
    assert command_line(releases[kind], request_).encode("utf-8") == written.read_bytes()


def test_the_numbers_hold_while_another_thread_of_the_process_solves(server, releases):
    """A request that goes on solving in another thread (one past its time, say) holds BLAS to one thread
    for the whole process, so gedp tabulate's margins computed meanwhile keep their bits. Before, the
    other thread's limit did nothing (threadpoolctl lets only the first thread that set OpenBLAS's count
    set it), this solve skipped its own (a scope was open) and ran on two BLAS threads: the panel's wage
    margins then differed from the API's in the last bits."""
    from gedp.postprocess.structured import one_blas_thread

    entered, leave = threading.Event(), threading.Event()

    def solving():
        with one_blas_thread:
            entered.set()
            leave.wait(120)

    other = threading.Thread(target=solving)
    other.start()
    request_ = {"by": "county", "quarter": "2016Q1", "moe": "1"}
    try:
        assert entered.wait(30)
        status, _, body = server.get("/api/tabulate", {"release": "panel", **request_})
        expected = command_line(releases["panel"], request_)
    finally:
        leave.set()
        other.join(30)
    assert status == 200, body
    same_rows(json.loads(body), expected)


@pytest.mark.parametrize("request_", [{"agglvl": "75", "moe": "1", "format": "qcew"},
                                      {"agglvl": "74", "moe": "1", "format": "xlsx"},
                                      {"agglvl": "54", "moe": "1", "where": "county == '001'", "format": "xlsx"}])
def test_qcew_downloads_are_the_files_of_gedp_tabulate(server, releases, request_, tmp_path):
    status, _, body = server.get("/api/tabulate", {"release": "single", **request_})
    assert status == 200, body
    written = tmp_path / f"table.{'xlsx' if request_['format'] == 'xlsx' else 'csv'}"
    command_line(releases["single"], request_, written)
    assert body == written.read_bytes()


def test_the_flags_of_a_table_are_the_bands_of_each_value_cv(server):
    """Flags recomputed here from the API's values and margins (CV = margin / z / value)."""
    z = {0.9: 1.6448536269514722, 0.95: 1.959963984540054}
    for level in z:
        answer = json.loads(server.get("/api/tabulate", {"release": "single", "by": "county,sector", "moe": "1",
                                                         "level": str(level)})[2])
        for attribute, flags in answer["flags"].items():
            for row, flag in zip(answer["rows"], flags):
                cv = row[f"{attribute}_moe"] / z[level] / abs(row[attribute]) if row[attribute] else math.inf
                expected = "A" if cv < 0.05 else "B" if cv < 0.15 else "C" if cv < 0.30 else "D" if cv < 1 else "X"
                assert flag == expected
        assert {flag for flags in answer["flags"].values() for flag in flags} >= {"A", "X"}


@pytest.mark.parametrize("params, status, message", [
    ({"release": "single", "by": "estab_id"}, 400, "'estab_id' is not a public column"),
    ({"release": "single", "by": "county", "where": "m1emp > 10"}, 400, "'m1emp' is not a public column"),
    ({"release": "single", "by": "county", "where": "__import__('os')"}, 400, "'__import__' is not a public"),
    ({"release": "../../etc", "by": "county"}, 400, "give release=ID, one of single, panel"),
    ({"release": "single", "path": "/etc/passwd"}, 400, "unknown parameter 'path'"),
    ({"release": "single", "by": "county", "where": "naics3 == '000'"}, 400, "no establishments to tabulate"),
    ({"release": "single", "by": "county,sector", "moe": "1", "where": "own == '5'"}, 200, ""),
    ({"release": "single", "by": "naics,county,own", "moe": "1"}, 400, "more than 500:"),
    ({"release": "single", "by": "county", "level": "nan"}, 400, "level must be a finite number"),
    ({"release": "single", "by": "county", "moe": "1", "level": "1.5"}, 400,
     "level (1.5) must be a confidence level from 0.5"),
    ({"release": "panel", "by": "county"}, 400, "give a quarter or a change"),
    ({"release": "panel", "by": "county", "quarter": "../x"}, 400, "quarter ../x is not in release panel"),
    ({"release": "single", "by": "county", "format": "xlsx"}, 400, "format xlsx needs agglvl"),
    ({"release": "single", "by": "x" * 5000}, 414, "longer than 4096 bytes"),
    ({"release": "single", "agglvl": "74", "where": "m1emp > 100"}, 400, "'m1emp' is not a public column"),
    ({"release": "single", "agglvl": "78", "where": "estab_id == '1'"}, 400, "'estab_id' is not a public column"),
    ({"release": "single", "by": "county", "moe": "1", "level": "0.9999999999999999"}, 400,
     "level (0.9999999999999999) must be a confidence level from 0.5 to below 1"),
    ({"release": "single", "by": "county", "moe": "1", "level": "1e-300"}, 400,
     "level (1e-300) must be a confidence level from 0.5 to below 1"),
    ({"release": "single", "by": "sector,size_class", "moe": "1", "level": "0.2"}, 400,
     "level (0.2) must be a confidence level from 0.5 to below 1"),
    ({"release": "single", "by": "size_class", "where": "naics3 == '000'"}, 400, "no establishments to tabulate"),
    ({"release": "single", "by": "size_class", "where": "m3emp > 4"}, 400, "'m3emp' is not a public column"),
])
def test_requests_are_bounded_and_refused_in_one_line(server, params, status, message):
    got, headers, body = server.get("/api/tabulate", params)
    assert got == status, body[:300]
    assert "default-src 'none'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    if status != 200:
        error = json.loads(body)["error"]
        assert message in error
        assert not message.startswith("level (") or error.startswith(message)  # the parameter, not --level


def test_a_request_past_its_time_is_answered_503(releases):
    served = Served(create_app(load_releases([releases["single"]]), Limits(timeout=1e-9)))
    try:
        status, _, body = served.get("/api/tabulate", {"release": "single", "by": "county,naics", "moe": "1"})
    finally:
        served.stop()
    assert status == 503 and "longer than" in json.loads(body)["error"]


def test_requests_past_their_time_never_compute_on_more_than_the_workers(releases, monkeypatch):
    """Red team F1: a request past its time gave its worker slot back while its thread kept computing
    (anyio's abandon_on_cancel): 40 slow requests at --timeout 0.2 had 13 computations at once with 4
    slots. Counted here with a slow fake answer: at most WORKERS at once, every request answered 200
    or 503 with Retry-After, and every computation started ends."""
    from concurrent.futures import ThreadPoolExecutor

    from gedp.serve import app as serve_app
    from gedp.serve.releases import ServedRelease

    running, seen, lock = [0], [0, 0], threading.Lock()
    answer = ServedRelease.answer

    def slow(self, wanted):
        with lock:
            running[0] += 1
            seen[0], seen[1] = max(seen[0], running[0]), seen[1] + 1
        try:
            time.sleep(0.5)
            return answer(self, wanted)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(ServedRelease, "answer", slow)
    served = Served(create_app(load_releases([releases["single"]]), Limits(timeout=0.2)))
    try:
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda i: served.get("/api/tabulate", {
                "release": "single", "by": "county", "where": f"county != '{i:03d}'"}), range(24)))
        deadline = time.monotonic() + 30
        while running[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        served.stop()
    assert running[0] == 0 and 1 <= seen[0] <= serve_app.WORKERS, seen
    assert seen[1] < 24  # requests that found no slot in time never computed
    for status, headers, body in answers:
        assert status == 503 and int(headers["retry-after"]) >= 1, (status, body)
        assert re.search(r"longer than 0.2 s|the server is busy", json.loads(body)["error"]), body


def test_answers_on_a_kept_connection_are_not_held_by_delayed_acknowledgements(server):
    """A reply's header and body go out without waiting for the client's acknowledgement of the first
    (TCP_NODELAY, which asyncio sets only on sockets made for TCP): otherwise every answer on a kept-alive
    connection waits for the client's delayed acknowledgement, 40 ms or more on Linux, whatever its work."""
    assert server.socket.proto == socket.IPPROTO_TCP
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    for _ in range(15):
        start = time.perf_counter()
        connection.request("GET", "/api/releases")
        response = connection.getresponse()
        assert response.status == 200 and response.read()
        latencies.append(time.perf_counter() - start)
    connection.close()
    assert statistics.median(latencies[1:]) < 0.04


def test_releases_manifest_page_and_openapi(server, releases):
    status, headers, body = server.get("/api/releases")
    listed = json.loads(body)
    assert status == 200 and [r["id"] for r in listed] == ["single", "panel"]
    assert listed[1]["quarters"] == PANEL_QUARTERS and "spend nothing more" in listed[0]["guarantee"]
    mu = json.loads((releases["single"] / "manifest.json").read_text())["mu_total"]
    assert f"mu {mu:.4f} (epsilon " in listed[0]["guarantee"] and "at delta 1e-6)" in listed[0]["guarantee"]
    manifest = json.loads(server.get("/api/release/panel/manifest")[2])
    assert manifest == json.loads((releases["panel"] / "manifest.json").read_text())
    assert server.get("/api/release/nothing/manifest")[0] == 404
    assert server.get("/static/..%2Freleases.py")[0] == 404
    status, headers, page = server.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"<script src=\"/static/explorer.js\"" in page and b"http" not in page.replace(b"http-equiv", b"")
    openapi = json.loads(server.get("/api/openapi.json")[2])
    assert [p["name"] for p in openapi["paths"]["/api/tabulate"]["get"]["parameters"]] == list(PARAMETERS)


def test_the_page_never_parses_text_as_html(server):
    """The script builds every element with textContent: no HTML sink, no eval, nothing external."""
    script = server.get("/static/explorer.js")[2].decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "http://", "https://"):
        assert sink not in script.replace("http://www.w3.org/2000/svg", ""), sink


def hostile(release: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "hostile"
    shutil.copytree(release, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    change(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("kind, change, message", [
    ("panel", lambda m: m.update(quarters=["../../../../victim/docs/e", *m["quarters"][1:]]),
     "'quarters' holds '../../../../victim/docs/e', which is not of the form"),
    ("panel", lambda m: m.update(quarters=[*m["quarters"], "2017Q1"]), "'per_quarter' must hold exactly the quarters"),
    ("single", lambda m: m.update(quarters=[1]), "'quarters' holds 1, which is not of the form"),
    ("single", lambda m: m.update(states=["<script>alert(1)</script>"]), "'states' holds '<script>"),
    ("single", lambda m: m.update(mu_total="1e999"), "'mu_total' ('1e999') must be a number >= 0 and <= 1e+06"),
    ("single", lambda m: m.update(mu_total=float("nan")), "'mu_total' (nan) must be a number >= 0 and <= 1e+06"),
    ("single", lambda m: m.update(mu_total=1e300), "'mu_total' (1e+300) must be a number >= 0 and <= 1e+06"),
    ("single", lambda m: m.update(mu_total=0), "'mu_total' is not the largest of its states' charges composed"),
    ("single", lambda m: m.update(establishments=-1), "'establishments' (-1) must be a whole number >= 0"),
])
def test_hostile_releases_are_refused_at_load(releases, tmp_path, margins_cache, kind, change, message):
    victim = tmp_path / "victim" / "docs"
    victim.mkdir(parents=True)
    with pytest.raises(InputError, match=re.escape(message)):
        load_releases([hostile(releases[kind], tmp_path, change)])
    assert victim.is_dir() and not any(margins_cache.rglob("*victim*"))


def test_the_socket_accepts_connections_before_serving_is_announced():
    """`gedp serve` prints "Serving ... at URL" before uvicorn starts; a client that connects as soon as
    it reads that line is queued, not refused (the socket listens from the start)."""
    listening = listening_socket("127.0.0.1", 0)
    try:
        with socket.create_connection(listening.getsockname(), timeout=5):
            pass  # refused (ConnectionRefusedError) by a socket that is bound but not listening
        # a second server on the same port is refused in one line, not with a traceback
        with pytest.raises(InputError, match="cannot listen on 127.0.0.1 port"):
            listening_socket("127.0.0.1", listening.getsockname()[1])
    finally:
        listening.close()


def test_gedp_serve_refuses_a_folder_that_is_not_a_release(tmp_path):
    done = CliRunner().invoke(app, ["serve", str(tmp_path)])
    assert done.exit_code == 2 and "is not a gedp release" in done.output


@pytest.mark.parametrize("params", [{"release": "panel", "by": "county", "change": "9999Q1:2016Q2"},
                                    {"release": "panel", "by": "county", "change": "2016Q1:9999Q2", "moe": "1"},
                                    {"release": "panel", "by": "county", "quarter": "9999Q1"}])
def test_a_refusal_names_the_release_by_its_id_never_its_folder(server, releases, params):
    status, _, body = server.get("/api/tabulate", params)
    error = json.loads(body)["error"]
    assert status == 400 and "9999Q" in error, error
    assert str(releases["panel"].resolve()) not in error and str(releases["panel"].parent) not in error, error
    assert "/" not in error.replace("9999Q1:2016Q2", ""), error


def test_without_paths_replaces_the_folder_and_its_files_by_the_id(releases):
    from gedp.serve.app import without_paths
    from gedp.serve.releases import ServedRelease

    folder = releases["panel"].resolve()
    served = {"panel": ServedRelease("panel", folder, {}, [])}
    message = f"quarter 9999Q1 is not in '{folder}'; {folder}/protected.parquet lacks '/etc/x'"
    assert without_paths(message, served) == ("quarter 9999Q1 is not in release panel; release panel lacks "
                                              "a file of the server")


def test_size_class_tables_of_a_release_too_large_are_refused(releases, monkeypatch):
    """Above the establishments a server draws implicates of, a size-class request is refused in one
    line (and the page is told not to offer it); below, the implicates are drawn once and held."""
    from gedp.serve import releases as served_releases

    held = load_releases([releases["single"]])
    # drawn by the warm-up: a request during it waits for the draw within its 30 s (503 at load 13)
    assert held["single"].warm.wait(600)
    served = Served(create_app(held, Limits()))
    try:
        status, _, body = served.get("/api/tabulate", {"release": "single", "by": "size_class"})
        assert status == 200, body
        first = held["single"].implicates_held[None]
        assert served.get("/api/tabulate", {"release": "single", "by": "sector,size_class"})[0] == 200
        assert held["single"].implicates_held[None] is first  # drawn once
        monkeypatch.setattr(served_releases, "MAX_DERIVED_ESTABLISHMENTS", 10)
        status, _, body = served.get("/api/tabulate", {"release": "single", "by": "county,size_class"})
        assert status == 400 and "gedp tabulate gives them" in json.loads(body)["error"]
        assert json.loads(served.get("/api/releases")[2])[0]["size_classes"] is False
    finally:
        served.stop()


@pytest.mark.parametrize("cache", [True, False])
def test_no_cache_computes_every_answer(releases, monkeypatch, cache):
    """With the answer cache (the default) a request asked again is answered from it: its time (about
    1-3 ms against 20-36 ms computed, benchmarks/bench_serve_cache.py) tells that someone asked it before.
    `gedp serve --no-cache` computes every answer, the same bytes, so its time tells nothing of the kind."""
    from gedp.serve import app as served_app
    from gedp.serve.server import open_server

    computed = []
    answered = served_app.answered_in_full
    monkeypatch.setattr(served_app, "answered_in_full", lambda *args: computed.append(args[1]) or answered(*args))
    opened = open_server([releases["single"]], port=0, cache=cache)
    opened.listening.close()
    served = Served(opened.application)
    try:
        request_ = {"release": "single", "by": "county,sector", "moe": "1", "format": "csv"}
        first, again = (served.get("/api/tabulate", request_) for _ in range(2))
    finally:
        served.stop()
    assert first[0] == again[0] == 200 and first[2] == again[2]
    assert len(computed) == (1 if cache else 2)


def test_size_class_implicates_are_drawn_before_any_request(releases, monkeypatch, capsys):
    """A release of one quarter gets the implicates of its size-class tables drawn in the background
    once loaded: a size-class request no longer draws them within its 30 s (its first one took longer
    at load 17, answered 503: single-request_18 of the API test failed so), nor is answered faster
    because someone asked one before. A warm-up that succeeds says nothing."""
    from gedp.release import implicates

    loaded = load_releases([releases["single"]])
    assert loaded["single"].warm.wait(600) and None in loaded["single"].implicates_held
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(implicates, "tabulation_implicates", lambda *args: pytest.fail("drawn in a request"))
    served = Served(create_app(loaded))
    try:
        status, _, body = served.get("/api/tabulate", {"release": "single", "by": "sector,size_class", "moe": "1"})
    finally:
        served.stop()
    assert status == 200, body


def test_a_size_class_request_before_the_warm_up_drew_its_quarter_waits_for_that_draw(releases, monkeypatch):
    """A size-class request that came before the warm-up had drawn its quarter (a panel of 80 quarters is
    drawn over minutes; a release of one quarter after its margins) drew it itself: 4.2 s, then 0.0 s for
    every later request, so an answer's time told whether anyone had asked that quarter before (red team
    rt26 G4). It now waits for the warm-up's draw (within its time), drawing nothing: its time depends on
    the warm-up alone. Here the warm-up is held in its margins, before its draw, then let go. Power:
    before, the request drew at once, from its own thread."""
    from gedp.release import implicates
    from gedp.release.lattice import CellLattice

    gate, draws = threading.Event(), []
    computed = CellLattice.compute_all
    monkeypatch.setattr(CellLattice, "compute_all", lambda self: gate.wait(120) and computed(self))
    drawn = implicates.tabulation_implicates
    monkeypatch.setattr(implicates, "tabulation_implicates",
                        lambda *args: draws.append(threading.current_thread().name) or drawn(*args))
    loaded = load_releases([releases["single"]])
    served = Served(create_app(loaded, Limits(timeout=60)))
    answers = []
    try:
        asking = threading.Thread(target=lambda: answers.append(
            served.get("/api/tabulate", {"release": "single", "by": "size_class"})))
        asking.start()
        time.sleep(1.0)
        drawn_meanwhile = list(draws)
        gate.set()
        asking.join(120)
    finally:
        gate.set()
        served.stop()
    assert drawn_meanwhile == []  # the request waited, drawing nothing
    assert answers and answers[0][0] == 200, answers
    assert draws == ["margins of single"]  # the warm-up's thread drew, once


def test_a_drawn_quarters_size_class_request_does_not_wait_for_the_warm_up_drawing_another(releases, monkeypatch):
    """While the warm-up draws a panel's next quarter (holding the draws' lock), a size-class request of a
    quarter it drew is answered at once, one of a quarter it has not drawn waits for it (503 at its 5 s
    here: the warm-up is held), and that quarter is answered 200 once drawn. Power: taking the lock
    first, the drawn quarter's request waited for the other draw (503 at its 5 s here)."""
    from gedp.release import implicates

    gate = threading.Event()
    drawn = implicates.tabulation_implicates

    def held_at_the_second(folder, quarter):
        if quarter == PANEL_QUARTERS[1]:
            gate.wait(120)
        return drawn(folder, quarter)

    monkeypatch.setattr(implicates, "tabulation_implicates", held_at_the_second)
    loaded = load_releases([releases["panel"]])
    release = loaded["panel"]
    served = Served(create_app(loaded, Limits(timeout=5)))
    try:
        deadline = time.monotonic() + 300
        while PANEL_QUARTERS[0] not in release.implicates_held and time.monotonic() < deadline:
            time.sleep(0.1)
        asked = {"release": "panel", "by": "size_class"}
        first = served.get("/api/tabulate", {**asked, "quarter": PANEL_QUARTERS[0]})
        last = served.get("/api/tabulate", {**asked, "quarter": PANEL_QUARTERS[2]})
        gate.set()
        assert release.warm.wait(600)
        again = served.get("/api/tabulate", {**asked, "quarter": PANEL_QUARTERS[2]})
    finally:
        gate.set()
        served.stop()
    assert first[0] == 200, first
    assert last[0] == 503 and "took longer" in json.loads(last[2])["error"], last  # waited for the warm-up
    assert again[0] == 200, again


#: A draw's failure as a reader gives it (one line, no value), and one of gedp's own (a value in its text).
WARM_UP_FAILURES = {
    "a gedp error": InputError("release 'single': its measurements cannot be read as the Parquet gedp writes "
                               "(ArrowInvalid; an edited or damaged copy)"),
    "another error": RuntimeError("row 7 holds 123456.78"),
}


@pytest.mark.parametrize("case", list(WARM_UP_FAILURES))
def test_a_failed_warm_up_is_said_once_and_answers_its_size_class_requests(releases, monkeypatch, capsys, case):
    """harden23 item 3: the warm-up swallowed any failure of its draw (each size-class request then drew
    again, and said nothing at start-up). It is said on stderr in one line (no traceback, no value) and the
    server serves on: each size-class request answered 400 with the error the draw gave, the very answer a
    first request gives when no warm-up ran (a gedp error; another: its type only), without drawing again;
    every other table answered as before."""
    from gedp.release import implicates
    from gedp.serve import releases as served_releases

    drawn = []

    def broken(*args):
        drawn.append(args)
        raise WARM_UP_FAILURES[case]

    monkeypatch.setattr(implicates, "tabulation_implicates", broken)
    loaded = load_releases([releases["single"]])
    assert loaded["single"].warm.wait(600)
    said = capsys.readouterr().err
    assert said.startswith("warning: release single: its size-class tables are refused: ") and said.count("\n") == 1
    assert "Traceback" not in said and "123456" not in said
    served = Served(create_app(loaded))
    try:
        answers = [served.get("/api/tabulate", {"release": "single", "by": by})
                   for by in ("size_class", "sector,size_class")]
        plain = served.get("/api/tabulate", {"release": "single", "by": "sector", "moe": "1"})
    finally:
        served.stop()
    assert plain[0] == 200 and len(drawn) == 1  # drawn at start-up only
    messages = {json.loads(body)["error"] for status, _, body in answers if status == 400}
    assert len(messages) == 1 and len(answers) == 2 and "123456" not in messages.pop()
    assert json.loads(answers[0][2])["error"] in said
    if case == "a gedp error":  # what a first request draws and gives without a warm-up
        monkeypatch.setattr(served_releases, "_warm_up", lambda release: release.warm.set())
        cold = load_releases([releases["single"]])
        served = Served(create_app(cold))
        try:
            first = served.get("/api/tabulate", {"release": "single", "by": "size_class"})
        finally:
            served.stop()
        assert first[:1] == answers[0][:1] and first[2] == answers[0][2]


def test_a_panels_size_class_implicates_are_drawn_before_any_request_and_bounded_in_all(releases, monkeypatch):
    """A panel's quarters were drawn at their first size-class request, each up to the establishments a
    server draws, and held for ever: any data user could make a server hold every quarter's (80 at
    that limit: about 20 GB), keep its worker slots and its Ctrl-C waiting for the draws, and tell from an
    answer's time whether a quarter had been asked for (red team rt25 F2, F3). Now every quarter is drawn
    in the background once the panel is loaded, and the limit bounds their sum. Power: before, the
    warm-up drew no quarter, and a panel whose quarters together pass the limit (each below it) was
    answered."""
    from gedp.release import implicates
    from gedp.serve import releases as served_releases

    loaded = load_releases([releases["panel"]])
    release = loaded["panel"]
    assert release.warm.wait(600) and set(release.implicates_held) == set(PANEL_QUARTERS)
    monkeypatch.setattr(implicates, "tabulation_implicates", lambda *args: pytest.fail("drawn in a request"))
    sizes = [len(frame) for frame, _ in release.quarters_held.values()]
    served = Served(create_app(loaded))
    try:
        status, _, body = served.get("/api/tabulate", {"release": "panel", "by": "size_class",
                                                       "quarter": PANEL_QUARTERS[1], "moe": "1"})
        assert status == 200, body
        monkeypatch.setattr(served_releases, "MAX_DERIVED_ESTABLISHMENTS", sum(sizes) - 1)
        assert max(sizes) <= served_releases.MAX_DERIVED_ESTABLISHMENTS  # every quarter below the limit alone
        status, _, body = served.get("/api/tabulate", {"release": "panel", "by": "size_class",
                                                       "quarter": PANEL_QUARTERS[2]})
        assert status == 400 and "summed over its 3 quarters" in json.loads(body)["error"], body
        assert json.loads(served.get("/api/releases")[2])[0]["size_classes"] is False
    finally:
        served.stop()


#: Loaded by the server's interpreter (PYTHONPATH): its size-class draws each take SLOW_DRAW s more.
SLOWED_DRAW = '''
import os, time
import gedp.release.implicates as drawn
real = drawn.tabulation_implicates
def slowed(*args, **kwargs):
    time.sleep(float(os.environ["GEDP_TEST_SLOW_DRAW"]))
    return real(*args, **kwargs)
drawn.tabulation_implicates = slowed
'''
SLOW_DRAW = 60


@contextlib.contextmanager
def slowed_server(release: Path, tmp_path: Path, timeout: float) -> Iterator[tuple[subprocess.Popen, int]]:
    """``gedp serve RELEASE --timeout TIMEOUT`` in a session of its own whose size-class draws are slowed
    (``SLOWED_DRAW``), once it answers, with its port; SIGKILLed at the end if still running."""
    (tmp_path / "sitecustomize.py").write_text(SLOWED_DRAW, encoding="utf-8")
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GEDP_TEST_SLOW_DRAW": str(SLOW_DRAW)}
    server = subprocess.Popen([sys.executable, "-m", "gedp", "serve", str(release), "--port", str(number),
                               "--timeout", str(timeout)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert time.monotonic() < deadline and server.poll() is None, "the server did not start"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{number}/api/releases", timeout=5).read()
                break
            except OSError:
                time.sleep(0.2)
        yield server, number
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()


def test_ctrl_c_ends_a_server_at_once_while_a_request_waits_for_a_draw(releases, tmp_path):
    """A size-class request waiting for the warm-up's draw is answered 503 at its time, but its thread
    goes on (a thread cannot be cancelled); the interpreter's exit joined it, so Ctrl-C ended the
    server only once the draw was done (61 s for one slowed to 60 s; red team rt25). The server's
    threads are wanted by nobody once it stops: it ends at once. Power: before, the end took longer
    than the slowed draw, here asserted under a sixth of it."""
    with slowed_server(releases["single"], tmp_path, 2) as (server, number):
        query = urllib.parse.urlencode({"release": "single", "by": "size_class"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{number}/api/tabulate?{query}", timeout=60).read()
        assert refused.value.code == 503  # answered at its time; its thread waits for the draw
        started = time.monotonic()
        os.killpg(server.pid, signal.SIGINT)
        output = server.communicate(timeout=SLOW_DRAW * 3)[0].decode()
        took = time.monotonic() - started
    assert server.returncode == 130 and output.rstrip().endswith("stopped (Ctrl-C)"), output
    assert took < SLOW_DRAW / 6, took


def test_ctrl_c_answers_the_requests_waiting_for_the_warm_ups_draw_and_ends_at_once(releases, tmp_path):
    """A size-class request waits for the warm-up's draw of its quarter (red team rt26 G4), up to its
    --timeout; uvicorn's stop waits for the requests in flight, so Ctrl-C waited for them (27.2 s with 8
    waiting, --timeout 30). The stop now answers them 503 ("the server is stopping") and the server ends at
    once. Power: before, the end waited for the request's 60 s here, asserted under a sixth of it."""
    answers: list = []

    def ask() -> None:
        query = urllib.parse.urlencode({"release": "single", "by": "size_class"})
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{number}/api/tabulate?{query}", timeout=SLOW_DRAW * 2).read()
            answers.append((200, b""))
        except urllib.error.HTTPError as err:
            answers.append((err.code, err.read()))

    with slowed_server(releases["single"], tmp_path, SLOW_DRAW) as (server, number):
        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(2)  # the request waits for the slowed draw
        started = time.monotonic()
        os.killpg(server.pid, signal.SIGINT)
        output = server.communicate(timeout=SLOW_DRAW * 3)[0].decode()
        took = time.monotonic() - started
        asking.join(SLOW_DRAW * 2)
    assert server.returncode == 130 and output.rstrip().endswith("stopped (Ctrl-C)"), output
    assert took < SLOW_DRAW / 6, took
    assert answers and answers[0][0] == 503 and b"the server is stopping" in answers[0][1], answers
