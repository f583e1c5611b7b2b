"""A state's parts written as each exists (writer.StateParts) against the same parts written at the end."""

import threading
import time
from pathlib import Path

import pytest

import gedp.release.writer
from gedp.config import load_config
from gedp.measure.rng import state_rng
from gedp.release.writer import StateParts
from gedp.running.state_pipeline import protect
from gedp.synth.schema import validate_microdata


def files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def handed_over(small_state):
    """A state protected with hooks that record what they receive, and its contents."""
    received = {}
    contents = protect(validate_microdata(small_state), load_config("baseline"), rng=state_rng(5, "44"),
                       on_measured=lambda m: received.setdefault("measurements", m),
                       on_protected=lambda p: received.setdefault("protected", p.copy()))
    return received, contents


def test_the_hooks_hand_over_the_final_measurements_and_microdata(handed_over):
    received, contents = handed_over
    assert received["measurements"] is contents.measurements
    assert received["protected"].equals(contents.protected)  # a copy taken then: not changed afterwards


@pytest.mark.parametrize("key", [None, {"quarter": "2016q1"}])
def test_parts_written_early_are_the_parts_written_at_the_end(handed_over, tmp_path, key):
    received, contents = handed_over
    late, early = tmp_path / "late", tmp_path / "early"
    for folder in (late, early):
        folder.mkdir()
    StateParts(late, "44", late / "tables.csv", key).finish(contents)
    parts = StateParts(early, "44", early / "tables.csv", key)
    parts.measurements(received["measurements"])
    parts.protected(contents.protected)
    parts.finish(contents)
    written = files(late)
    assert written == files(early)
    prefix = "part-2016q1-44" if key else "part-44"
    assert sorted(written) == [f"measurements.parquet/{prefix}.parquet", f"protected.parquet/{prefix}.parquet",
                               "tables.csv"]


def test_a_failed_release_waits_for_the_parts_being_written(handed_over, tmp_path, monkeypatch):
    """close_all returns only once the part under way is written, and nothing further is started."""
    received, contents = handed_over
    started, release = threading.Event(), threading.Event()
    write_measurements = gedp.release.writer.write_measurements

    def slow(*arguments):
        started.set()
        release.wait(10)
        time.sleep(0.05)
        write_measurements(*arguments)

    monkeypatch.setattr(gedp.release.writer, "write_measurements", slow)
    parts = StateParts(tmp_path, "44", tmp_path / "tables.csv")
    parts.measurements(received["measurements"])
    parts.protected(contents.protected)
    assert started.wait(10)
    threading.Timer(0.05, release.set).start()
    StateParts.close_all(tmp_path)
    assert (tmp_path / "measurements.parquet" / "part-44.parquet").stat().st_size > 0
    assert not (tmp_path / "protected.parquet" / "part-44.parquet").exists()  # cancelled, never started
    assert parts not in StateParts._open
