"""A served release's tables ready to publish are read from its files on each request: they are refused
once the folder no longer holds the files the server loaded (red team rt28 J5: microdata replaced under a
running server changed its QCEW tables while its other tables and stated guarantee stayed the loaded ones)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from test_serve import Served

from gedp.release import resolved
from gedp.serve.app import create_app
from gedp.serve.releases import ServedRelease, load_releases

CHANGED = "changed on disk since the server loaded it"


def county_employment(served: Served, level: str) -> tuple[int, object]:
    """The month-1 employment of the first county in the county totals ready to publish (agglvl 71)."""
    status, _, body = served.get("/api/tabulate", {"release": "single", "agglvl": "71", "moe": "1", "level": level})
    if status != 200:
        return status, json.loads(body)["error"]
    return status, json.loads(body)["rows"][0]["month1_emplvl"]


def tripled(folder) -> None:
    """Every value of the folder's protected microdata tripled (a copy the readers accept: values moved up)."""
    for part in (folder / "protected.parquet").glob("*.parquet"):
        protected = pd.read_parquet(part)
        for name in ("m1emp", "m2emp", "m3emp", "wage"):
            protected[name] = protected[name].to_numpy(dtype=np.float64) * 3
        protected.to_parquet(part, index=False)


def served_then_changed(source, folder, remove: bool) -> list[tuple[int, object]]:
    """Serve a copy of ``source`` at ``folder``; the county's employment as loaded, once its microdata were
    tripled, and (``remove``) once the folder is removed: each request with another level (none kept)."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    served = Served(create_app(load_releases([folder]), cache=False))
    try:
        found = [county_employment(served, "0.9")]
        tripled(folder)
        found.append(county_employment(served, "0.91"))
        if remove:
            shutil.rmtree(folder)
            found.append(county_employment(served, "0.92"))
        return found
    finally:
        served.stop()


def test_tables_ready_to_publish_of_a_folder_changed_after_loading_are_refused(small_release, tmp_path, monkeypatch):
    """The protected microdata of the served folder tripled after start-up: the QCEW table is refused in one
    line, and so is it once the folder is removed. Power: without the check the tripled values are served
    (three times what the same server served before)."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    with monkeypatch.context() as unchecked:
        unchecked.setattr(ServedRelease, "unchanged", lambda self: None)
        unchecked.setattr(resolved, "check_resolved", lambda *args: None)  # the re-solve refuses the tripled copy too
        (status, before), (changed, after) = served_then_changed(small_release[0], tmp_path / "single", False)
    assert status == changed == 200 and before > 0 and abs(after / before - 3) < 1e-9, (before, after)
    (status, before), *refused = served_then_changed(small_release[0], tmp_path / "single", True)
    assert status == 200 and before > 0
    for status, error in refused:
        assert status == 400 and CHANGED in error, error


def test_a_folder_holding_a_link_to_nothing_is_served_as_before(small_release, tmp_path, monkeypatch):
    """Links beside a release's files (one to nothing, one to the folder's parent) are no files of the
    release: the server loads it as it did before it noted the folder's files (a link to nothing stopped
    the load with FileNotFoundError), and its tables ready to publish are served while nothing changes."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "single"
    shutil.copytree(small_release[0], folder)
    (folder / "dangling").symlink_to(tmp_path / "nothing")
    (folder / "loop").symlink_to("..")
    served = Served(create_app(load_releases([folder]), cache=False))
    try:
        status, employment = county_employment(served, "0.9")
    finally:
        served.stop()
    assert status == 200 and employment > 0, employment


def test_size_class_implicates_of_a_folder_changed_after_loading_are_refused(small_release, tmp_path, monkeypatch):
    """The warm-up draws a release's size-class implicates from its files after start-up: a folder whose
    files changed since the load (here the protected microdata rewritten, their identity changed) is
    refused, as its tables ready to publish are (review28: the draw read whatever the folder then held,
    served under the loaded release's guarantee). Power: without the check the same draw succeeds."""
    from gedp.errors import InputError
    from gedp.serve import releases

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(releases, "_warm_up", lambda release: release.warmed())  # the draw is the test's
    folder = tmp_path / "single"
    shutil.copytree(small_release[0], folder)
    (release,) = load_releases([folder]).values()
    for part in (folder / "protected.parquet").glob("*.parquet"):
        part.write_bytes(part.read_bytes())  # the same bytes written again: a write the server cannot vouch for
    with monkeypatch.context() as unchecked:
        unchecked.setattr(ServedRelease, "unchanged", lambda self: None)
        assert len(release.implicates(None)) > 0
    release.implicates_held.clear()
    with pytest.raises(InputError, match=CHANGED):
        release.implicates(None)
