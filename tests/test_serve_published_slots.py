"""Tables ready to publish (agglvl: written from the release's files, seconds each) hold at most
PUBLISHED_WORKERS of the server's worker slots (red team rt28 J3: four workbooks with junk levels, each a
new cache key, held every slot, and every other user's request was answered 503)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import Served

from gedp.serve import app as serve_app
from gedp.serve.app import Limits, create_app
from gedp.serve.releases import ServedRelease, load_releases


def test_tables_ready_to_publish_leave_slots_for_the_other_requests(small_release, tmp_path, monkeypatch):
    """Four QCEW-level requests (made to take 3 s each) at once, then a plain by=county request: it is
    answered at once (it was 503 after its whole time: every slot held), and at most PUBLISHED_WORKERS of
    the slow ones ever compute together. Power: with as many such slots as workers, the plain request
    finds none free within its 2 s and is answered 503."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "single"
    shutil.copytree(small_release[0], folder)
    running, most, lock = [0], [0], threading.Lock()

    def slow(self, request):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(3)
            raise serve_app.InputError("slowed")
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(ServedRelease, "_written_by_the_library", slow)
    held = load_releases([folder])

    def plain_answer(published: int) -> tuple[int, float]:
        monkeypatch.setattr(serve_app, "PUBLISHED_WORKERS", published)
        served = Served(create_app(held, Limits(timeout=2.0), cache=False))
        try:
            with ThreadPoolExecutor(4) as pool:
                slow_ones = [pool.submit(served.get, "/api/tabulate", {"release": "single", "agglvl": "78",
                                                                       "format": "xlsx", "level": f"0.9{i}"})
                             for i in range(4)]
                time.sleep(0.5)
                start = time.monotonic()
                status, _, body = served.get("/api/tabulate", {"release": "single", "by": "county"})
                took = time.monotonic() - start
                for each in slow_ones:
                    each.result()
            deadline = time.monotonic() + 20
            while running[0] and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            served.stop()
        assert status in (200, 503), body
        if status == 200:
            assert json.loads(body)["rows"]
        return status, took

    status, took = plain_answer(serve_app.PUBLISHED_WORKERS)
    assert status == 200 and took < 1.5 and most[0] <= serve_app.PUBLISHED_WORKERS, (status, took, most)
    most[0] = 0
    status, took = plain_answer(serve_app.WORKERS)
    assert status == 503 and most[0] == serve_app.WORKERS, (status, took, most)


def test_a_busy_answer_says_which_slots_were_held():
    """A table ready to publish that finds its PUBLISHED_WORKERS slots held is told so, not that every
    worker is computing (review28: it said "4 requests computing" with 2 computing); a request that finds
    every slot held is told that."""
    workers = serve_app.Workers(4, 2)
    for _ in range(2):
        workers.published.acquire()
    with pytest.raises(serve_app.Busy, match="^2 tables ready to publish computing$"):
        workers.run(time.monotonic() + 0.05, True, lambda: None)
    assert workers.run(time.monotonic() + 0.05, False, lambda: "answered") == "answered"
    for _ in range(4):
        workers.slots.acquire()
    with pytest.raises(serve_app.Busy, match="^4 requests computing$"):
        workers.run(time.monotonic() + 0.05, False, lambda: None)
