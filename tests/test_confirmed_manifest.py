"""A release's statement of its privacy is restated only once its answers were read through every check
(``confirmed_manifest``); answers this process already read through those checks, from files unchanged
since, are not read a second time (a table ready to publish with margins read them twice), and files
changed since are read and checked again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import gedp.release.reader as reader
from gedp.errors import InputError


@pytest.fixture
def copy(seeded_small_release, tmp_path) -> Path:
    copied = tmp_path / "copy"
    shutil.copytree(seeded_small_release("confirmed", 400), copied)
    return copied


@pytest.fixture
def reads(monkeypatch) -> list:
    """The measurement reads of the test, one entry each."""
    done: list = []
    real = reader.read_parts

    def counted(paths, *args, **kwargs):
        if any("measurements" in str(path) for path in paths):
            done.append(paths)
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(reader, "read_parts", counted)
    monkeypatch.setattr(reader, "_CHECKED_MEASUREMENTS", set())
    return done


def test_answers_read_and_checked_are_not_read_again(copy, reads):
    reader.read_measurements(copy)
    assert len(reads) == 1
    assert reader.confirmed_manifest(copy) == reader.read_manifest(copy)
    assert len(reads) == 1


def test_a_release_not_read_before_is_read_to_confirm_it(copy, reads):
    assert reader.confirmed_manifest(copy) == reader.read_manifest(copy)
    assert len(reads) == 1


def test_answers_changed_after_their_read_are_read_and_refused(copy, reads):
    """A part rewritten after a genuine read (one answer's estimate NaN, which the checks refuse) is not
    vouched for by that read: the confirmation reads it and refuses it."""
    reader.read_measurements(copy)
    part = next((copy / "measurements.parquet").glob("*.parquet"))
    table = pq.read_table(part)
    frame = table.to_pandas()
    frame.loc[frame.index[0], "estimate"] = float("nan")
    pq.write_table(type(table).from_pandas(frame, schema=table.schema, preserve_index=False), part)
    with pytest.raises(InputError, match="whose estimate is not a finite number"):
        reader.confirmed_manifest(copy)
    assert len(reads) == 2
