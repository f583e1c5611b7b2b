"""Every read of one input by one release is of the same data: a file swapped for another of as many
rows between the first read (states and ids), the ledger's and a state's is refused, CSV by the
SHA-256 of the bytes read, Parquet by each part's stamp (inode, size, modification and change times,
which no one but root can set back)."""

import os
import shutil

import pytest
from typer.testing import CliRunner

import gedp.running.recorded_release
from gedp.cli import app

runner = CliRunner()


@pytest.fixture
def inputs(small_state, tmp_path):
    """The same 300 establishments twice, as CSV and as Parquet: as given, and with other values."""
    frame = small_state.head(300).copy()
    other = frame.assign(m1emp=frame["m1emp"][::-1].to_numpy(), estab_id=frame["estab_id"] + "x")
    paths = {}
    for name, table in (("given", frame), ("other", other)):
        for suffix in ("csv", "parquet"):
            path = tmp_path / f"{name}.{suffix}"
            table.to_csv(path, index=False) if suffix == "csv" else table.to_parquet(path, index=False)
            paths[name, suffix] = path
    return paths


def swap(source, replacement):
    """Put ``replacement``'s bytes in ``source``, its modification time kept (as `touch -r` would)."""
    times = os.stat(source)
    shutil.copyfile(replacement, source)
    os.utime(source, ns=(times.st_atime_ns, times.st_mtime_ns))


def protect(source, out, *extra):
    return runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out), *extra])


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
@pytest.mark.parametrize("swaps", ["before the ledger", "after the ledger", "for the ledger only"])
def test_an_input_swapped_between_reads_is_refused(inputs, tmp_path, monkeypatch, suffix, swaps):
    """Swapped after the first read, after the ledger's read, or for the ledger's read only (then
    put back, its modification time restored: the ledger would charge other establishments than
    those released)."""
    source, other = inputs["given", suffix], inputs["other", suffix]
    original = tmp_path / f"original.{suffix}"
    shutil.copyfile(source, original)
    first_read, reserve = gedp.running.recorded_release.input_states, gedp.running.recorded_release.reserve

    def read_then_swap(path, *args, **kwargs):
        found = first_read(path, *args, **kwargs)
        swap(source, other)
        return found

    def reserve_then_swap(*args, **kwargs):
        reservation = reserve(*args, **kwargs)
        swap(source, other if swaps == "after the ledger" else original)
        return reservation

    if swaps != "after the ledger":
        monkeypatch.setattr(gedp.running.recorded_release, "input_states", read_then_swap)
    if swaps != "before the ledger":
        monkeypatch.setattr(gedp.running.recorded_release, "reserve", reserve_then_swap)
    result = protect(source, tmp_path / "out", "--ledger", tmp_path / "ledger.json", "--lifetime-cap", "5")
    assert result.exit_code == 2, result.output
    assert "was changed while gedp read it" in result.output
    assert not (tmp_path / "out").exists()


def test_a_csv_read_twice_unchanged_is_the_same_release(inputs, tmp_path):
    """The pinned reads change nothing of a release: CSV and Parquet of the same rows, same bytes."""
    outs = []
    for suffix in ("csv", "parquet"):
        outs.append(tmp_path / suffix)
        result = protect(inputs["given", suffix], outs[-1], "--seed", "3", "--not-for-publication")
        assert result.exit_code == 0, result.output
    first, second = ((out / "protected.parquet").read_bytes() if (out / "protected.parquet").is_file() else
                     b"".join(p.read_bytes() for p in sorted((out / "protected.parquet").rglob("*.parquet")))
                     for out in outs)
    assert first == second and len(first) > 0
