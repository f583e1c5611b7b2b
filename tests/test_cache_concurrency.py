"""Requests sharing one margin cache (issue 46, red team item 8): concurrent tabulations of several
releases, with pruning running beside them, give the bytes serial ones give; a structure removed
under a reader is rebuilt; pruning waits for readers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import gedp
from gedp.release import margins
from gedp.release.margins import exclusive_cache, is_complete, kept_path, kept_tabulation, shared_cache
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile


@pytest.fixture(scope="module")
def three_releases(tmp_path_factory) -> dict[str, Path]:
    """Two releases of one quarter and a panel of three quarters (400 establishments each): five
    margin structures, one more than are kept, so pruning runs while they are requested."""
    root = tmp_path_factory.mktemp("three")
    state = generate_profile(load_profile("small"), n_establishments=400, rng=np.random.default_rng(31))
    panel = synthesize_panel(state, quarter_range("2016Q1:2016Q3"), rng=np.random.default_rng(31))
    return {"a": gedp.protect(state, seed=1, not_for_publication=True).write(root / "a"),
            "b": gedp.protect(state, seed=2, not_for_publication=True).write(root / "b"),
            "p": gedp.protect(panel, seed=3, not_for_publication=True, allow_over_cap=True).write(root / "p")}


def requests(releases: dict[str, Path]) -> list[list[str]]:
    """Eight tabulations with margins over the three releases."""
    a, b, p = (str(releases[name]) for name in "abp")
    return [[a, "--by", "county"], [b, "--by", "county"], [p, "--quarter", "2016Q1", "--by", "county"],
            [p, "--quarter", "2016Q2", "--by", "county"], [p, "--quarter", "2016Q3", "--by", "county"],
            [a, "--by", "county,own"], [b, "--by", "naics3"], [p, "--change", "2016Q1:2016Q3", "--by", "county"]]


def run_all(releases: dict[str, Path], cache: Path, out: Path) -> dict[int, bytes]:
    """Run the eight requests all at once as gedp processes; their tables."""
    out.mkdir()
    environment = {**os.environ, "GEDP_CACHE_DIR": str(cache)}
    processes = []
    for index, request in enumerate(requests(releases)):
        command = [sys.executable, "-m", "gedp", "tabulate", *request, "--moe", "--out", str(out / f"{index}.csv")]
        processes.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for process in processes:
        output = process.communicate(timeout=300)[0]
        assert process.returncode == 0, output.decode()
    return {index: (out / f"{index}.csv").read_bytes() for index in range(len(processes))}


def serial_tables(releases: dict[str, Path], cache: Path, out: Path) -> dict[int, bytes]:
    """The eight requests one after the other in this process (``gedp tabulate`` through the command
    line's runner, into ``cache``): the reference the concurrent processes are held to, without eight
    interpreters of its own to start."""
    from typer.testing import CliRunner

    from gedp.cli import app

    out.mkdir()
    for index, request in enumerate(requests(releases)):
        done = CliRunner().invoke(app, ["tabulate", *request, "--moe", "--out", str(out / f"{index}.csv")],
                                  env={"GEDP_CACHE_DIR": str(cache)})
        assert done.exit_code == 0, done.output
    return {index: (out / f"{index}.csv").read_bytes() for index in range(len(requests(releases)))}


def test_concurrent_requests_give_the_serial_bytes(three_releases, tmp_path):
    """Serial into a fresh cache (in this process); then twice eight processes at once into another
    fresh cache (the first round builds every structure and prunes one, the second reads and rebuilds
    beside pruning): the same bytes each time, and the cache left with complete structures only."""
    serial = serial_tables(three_releases, tmp_path / "serial-cache", tmp_path / "serial")
    cache = tmp_path / "shared-cache"
    for round_ in ("first", "second"):
        assert run_all(three_releases, cache, tmp_path / round_) == serial
    kept = [p for p in (cache / "margins").iterdir() if margins.STRUCTURE_NAME.fullmatch(p.name)]
    assert len(kept) <= margins.KEPT_STRUCTURES and all(is_complete(p) for p in kept)
    assert not [p for p in (cache / "margins").iterdir() if p.name.startswith((".partial-", ".retired-"))]


def test_a_structure_removed_under_a_reader_is_rebuilt(three_releases, monkeypatch):
    """A structure removed between a reader's check and its reads (as by a process that ignored the
    lock): the request falls back to reading the release, the margins the same, the structure kept anew."""
    release = three_releases["a"]
    fresh = gedp.read_release(release).tabulate("county", moe=True)
    folder = kept_path(release)
    read_pieces = margins.read_pieces

    def removed_first(path):
        import shutil

        shutil.rmtree(path)
        return read_pieces(path)

    monkeypatch.setattr(margins, "read_pieces", removed_first)
    assert kept_tabulation(release, "county", moe=True) is None
    monkeypatch.setattr(margins, "read_pieces", read_pieces)
    again = gedp.read_release(release).tabulate("county", moe=True)
    pd.testing.assert_frame_equal(again, fresh)
    assert is_complete(folder)


def test_pruning_waits_for_readers():
    """The exclusive lock (putting in place, pruning) is not taken while a reader holds the shared one."""
    taken = threading.Event()

    def prune():
        with exclusive_cache():
            taken.set()

    with shared_cache():
        worker = threading.Thread(target=prune)
        worker.start()
        assert not taken.wait(0.5)
    assert taken.wait(30)
    worker.join()
