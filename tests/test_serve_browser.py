"""The explorer page in a real browser: headless Chromium (Debian's package; skipped with the reason
when absent) driven over the DevTools protocol as a user: choose a table, press the button, read the
numbers, download the CSV; they are ``gedp tabulate``'s. A panel release draws its line over the
quarters with the changes' margins. No script error and no blocked resource (the content security
policy reports each in the console)."""

import base64
import csv
import fcntl
import io
import json
import os
import queue
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_serve import PANEL_QUARTERS, Served, command_line, releases, size_class_draws  # noqa: F401 (fixtures)

from gedp.postprocess.sizeclass import SIZE_TITLES
from gedp.serve.app import Limits, create_app
from gedp.serve.releases import load_releases

#: Where a screenshot for the docs goes when this is set (docs/images/serve-explorer.png is one).
SCREENSHOT_ENV = "GEDP_SCREENSHOT"


class Browser:
    """Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``: messages are JSON
    ended by a NUL byte, read from the browser's fd 4, written to its fd 3)."""

    def __init__(self, executable: str, profile: Path):
        reading, self._to_browser = os.pipe()
        self._from_browser, writing = os.pipe()
        # the browser's ends moved above 10, then given to it as fds 3 and 4 by bash (dash takes one-digit fds only)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (reading, writing)]
        for fd in (reading, writing):
            os.close(fd)
        command = " ".join([shlex.quote(executable), "--headless", "--no-sandbox", "--disable-gpu",
                            "--disable-background-networking", "--no-first-run", "--remote-debugging-pipe",
                            shlex.quote(f"--user-data-dir={profile}"), "about:blank"])
        self.process = subprocess.Popen(["bash", "-c", f"exec {command} 3<&{high[0]} 4>&{high[1]}"], pass_fds=high,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in high:
            os.close(fd)
        self.replies: dict[int, dict] = {}
        self.events: queue.Queue = queue.Queue()
        self.problems: list[str] = []
        self._next = 0
        self._lock = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=True)
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=1200, height=1500, deviceScaleFactor=1,
                  mobile=False)

    def _read(self):
        pending = b""
        while chunk := os.read(self._from_browser, 1 << 16):
            pending += chunk
            *messages, pending = pending.split(b"\0")
            for message in map(json.loads, messages):
                if message.get("method") == "Runtime.exceptionThrown":
                    self.problems.append(json.dumps(message["params"]["exceptionDetails"])[:500])
                if message.get("method") == "Log.entryAdded" and message["params"]["entry"]["level"] == "error":
                    self.problems.append(message["params"]["entry"]["text"][:500])
                with self._lock:
                    if "id" in message:
                        self.replies[message["id"]] = message
                    else:
                        self.events.put(message)
                    self._lock.notify_all()

    def send(self, method: str, session: bool = False, **params) -> dict:
        self._next += 1
        number = self._next
        message = {"id": number, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        with self._lock:
            assert self._lock.wait_for(lambda: number in self.replies, timeout=60), f"no reply to {method}"
            reply = self.replies.pop(number)
        assert "error" not in reply, reply["error"]
        return reply["result"]

    def run(self, script: str):
        """The value of a script in the page (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", session=True, expression=script, awaitPromise=True,
                           returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, script: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while not (value := self.run(script)):
            assert time.monotonic() < deadline, f"timed out waiting for {script}"
            time.sleep(0.1)
        return value

    def close(self):
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium when apt-get is available)")
    opened = Browser(executable, tmp_path_factory.mktemp("chromium-profile"))
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def page_server(releases):  # noqa: F811 (the fixture imported above)
    served = Served(create_app(load_releases([releases["single"], releases["panel"]]), Limits()))
    yield served
    served.stop()


def choose(browser: Browser, **values: str) -> None:
    """Set form fields as a user does (each a change event), then press the button and wait for the
    answer."""
    for name, value in values.items():
        browser.run(f"(() => {{ const e = document.getElementById({json.dumps(name)}); e.value = {json.dumps(value)};"
                    " e.dispatchEvent(new Event('change')); })()")
    browser.run("document.getElementById('status').textContent = 'waiting'")
    browser.run("document.getElementById('show').click()")
    browser.wait_for("!['waiting', 'Computing…'].includes(document.getElementById('status').textContent)"
                     " && document.querySelectorAll('#table tbody tr').length > 0")


def shown_table(browser: Browser) -> list[list[str]]:
    """The table's cells as shown (a key's code, which its title shows, from its data-code)."""
    return browser.run("[...document.querySelectorAll('#table tr')].map(r => [...r.cells].map(c => c.dataset.code"
                       " ?? c.textContent))")


def number(text: str) -> float:
    return float(text.replace(",", ""))


def open_page(browser, page_server) -> None:
    """The explorer's page, loaded, with its two releases listed."""
    browser.send("Page.navigate", session=True, url=page_server.url + "/")
    browser.wait_for("document.querySelectorAll('#release option').length === 2")


def assert_shown(text: str, value: float) -> None:
    """A number shown on the page is ``value`` as the page rounds it (0.1 under 10, else 1)."""
    assert abs(number(text) - value) <= (0.05 if abs(value) < 10 else 0.5) + 1e-9


def cli_rows(release, request: dict, shown: list) -> list[dict]:
    """``gedp tabulate``'s CSV rows for the request, one for each row of the table shown (its header aside)."""
    expected = list(csv.DictReader(io.StringIO(command_line(release, request))))
    assert len(shown) - 1 == len(expected)
    return expected


def test_a_user_reads_a_table_and_downloads_its_csv(browser, page_server, releases, tmp_path):  # noqa: F811
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.send("Browser.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
    open_page(browser, page_server)
    assert "spend nothing more" in browser.run("document.getElementById('guarantee').textContent")
    choose(browser, release="single", geography="county", industry="sector", ownership="all", measure="m1emp")
    shown = shown_table(browser)
    assert shown[0] == ["State", "County", "Sector", "Establishments", "Employment, month 1",
                        "± margin of error (95%)", "Quality"]
    expected = cli_rows(releases["single"], {"by": "county,sector", "moe": "1"}, shown)
    for row, truth in zip(shown[1:], expected):
        assert row[:3] == [truth["state"], truth["county"], truth["sector"]]
        assert number(row[3]) == int(truth["estabs"])
        for text, value in ((row[4], float(truth["m1emp"])), (row[5], float(truth["m1emp_moe"]))):
            assert_shown(text, value)
        assert row[6] in "ABCDX"
    bars = browser.run("document.querySelectorAll('#chart svg rect.bar').length")
    errors = browser.run("document.querySelectorAll('#chart svg line.error').length")
    assert bars == min(30, len(expected)) and errors == 3 * bars
    browser.run("document.getElementById('download-csv').click()")
    deadline = time.monotonic() + 30
    while not [p for p in downloads.iterdir() if p.suffix == ".csv"]:
        assert time.monotonic() < deadline, "no download"
        time.sleep(0.1)
    time.sleep(0.5)
    downloaded = next(p for p in downloads.iterdir() if p.suffix == ".csv")
    written = tmp_path / "cli.csv"
    command_line(releases["single"], {"by": "county,sector", "moe": "1"}, written)
    assert downloaded.read_bytes() == written.read_bytes()
    assert browser.problems == []


def test_a_user_reads_a_table_by_size_class(browser, page_server, releases):  # noqa: F811
    open_page(browser, page_server)
    assert browser.run("document.getElementById('size-label').hidden") is False
    choose(browser, release="single", geography="state", industry="supersector", ownership="all", size="size_class",
           measure="m3emp")
    shown = shown_table(browser)
    assert shown[0] == ["State", "Supersector", "Size class", "Establishments", "Employment, month 3",
                        "± margin of error (95%)", "Quality"]
    expected = cli_rows(releases["single"], {"by": "state,supersector,size_class", "moe": "1"}, shown)
    titles = browser.run("[...document.querySelectorAll('#table tbody tr')].map(r => r.cells[2].textContent)")
    for row, title, truth in zip(shown[1:], titles, expected):
        assert row[:3] == [truth["state"], truth["supersector"], truth["size_class"]]
        assert title == SIZE_TITLES[int(truth["size_class"])]
        for text, value in ((row[3], float(truth["estabs"])), (row[4], float(truth["m3emp"])),
                            (row[5], float(truth["m3emp_moe"]))):
            assert_shown(text, value)
    assert browser.run("document.getElementById('xlsx-part').hidden") is True  # a table, not a QCEW level
    choose(browser, size="")  # and back: no size classes
    assert "Size class" not in shown_table(browser)[0]
    assert browser.problems == []


def test_a_panel_draws_its_quarters_and_changes(browser, page_server, releases):  # noqa: F811
    open_page(browser, page_server)
    browser.run("(() => { const e = document.getElementById('release'); e.value = 'panel';"
                " e.dispatchEvent(new Event('change')); })()")
    choose(browser, quarter="2016Q2", geography="state", industry="supersector", ownership="all", measure="m3emp")
    browser.wait_for(f"document.querySelectorAll('#changes tbody tr').length === {len(PANEL_QUARTERS) - 1}")
    assert browser.run("document.querySelectorAll('#trend svg circle').length") == len(PANEL_QUARTERS)
    changes = browser.run("[...document.querySelectorAll('#changes tbody tr')].map(r => [...r.cells]"
                          ".map(c => c.textContent))")
    truth = next(csv.DictReader(io.StringIO(command_line(releases["panel"], {"by": "total", "moe": "1",
                                                                             "change": "2016Q1:2016Q2"}))))
    assert changes[0][0] == "2016Q1 to 2016Q2"
    assert abs(number(changes[0][1]) - float(truth["m3emp_chg"])) <= 0.5 + 1e-9
    assert abs(number(changes[0][2].removeprefix("± ")) - float(truth["m3emp_chg_moe"])) <= 0.5 + 1e-9
    shot = base64.b64decode(browser.send("Page.captureScreenshot", session=True, format="png",
                                         captureBeyondViewport=True)["data"])
    assert shot.startswith(b"\x89PNG")
    if os.environ.get(SCREENSHOT_ENV):
        Path(os.environ[SCREENSHOT_ENV]).write_bytes(shot)
    assert browser.problems == []
