"""Processor time of each test (a pytest plugin, run on demand, not a test): user + system time of the
pytest process and its waited-for children over each test's setup, call and teardown (``os.times()``),
with its wall time and the 1-minute load when it started, one JSON line per test appended to
``$CPU_PER_TEST`` (default ``cpu-per-test.jsonl``). A module fixture's cost falls on the first test
that uses it. One process, so that the children are the test's own:

    PYTHONPATH=benchmarks CPU_PER_TEST=out.jsonl python -m pytest -n 0 -p no:cacheprovider \
        -p cpu_per_test tests/test_x.py
"""

from __future__ import annotations

import json
import os
import time

import pytest


def _processor_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    start, wall, load = _processor_seconds(), time.time(), os.getloadavg()[0]
    yield
    row = {"id": item.nodeid, "cpu": round(_processor_seconds() - start, 3), "wall": round(time.time() - wall, 3),
           "load": round(load, 2)}
    with open(os.environ.get("CPU_PER_TEST", "cpu-per-test.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")
