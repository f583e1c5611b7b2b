"""A further tabulation of a release, answered from its kept index, as a whole process: the bytes
pandas writes for the kept table, without loading the release's readers of Arrow datasets, the
panel readers or the stages' answer modules, nor pandas itself where the groups are consecutive in
the release."""

import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gedp.cli import app
from gedp.release.margins import kept_tabulation

#: Modules a further request has no use for (each costs start-up time).
NOT_LOADED = {"pyarrow.dataset", "gedp.synth.io", "gedp.synth.panel", "gedp.measure.neighbors",
              "gedp.postprocess.months", "gedp.release.manifest", "scipy.sparse", "pandas.io.formats.csvs"}


@pytest.fixture
def release(small_release, tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(small_release[0], folder)
    return folder


def further_request(arguments: list[str], out: str | None) -> tuple[set[str], bytes]:
    """Run ``gedp tabulate`` in a fresh interpreter: the modules it loaded, and what it wrote to
    ``out`` (or to standard output without one)."""
    code = ("import sys\nfrom gedp.cli import main\nsys.argv = ['gedp', *sys.argv[1:]]\ntry:\n    main()\n"
            "except SystemExit:\n    pass\nprint(' '.join(sys.modules), file=sys.stderr)\n")
    arguments = [*arguments, *(["--out", out] if out else [])]
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, check=True,
                          env=os.environ.copy())
    modules = set(done.stderr.decode().split("\n")[-2].split())
    written = open(out, "rb").read() if out else done.stdout
    return modules, written


@pytest.mark.parametrize("by, where, moe, quick", [("county,naics4", None, True, True),
                                                   ("sector", "own == '5'", True, False),
                                                   ("county,naics3", None, False, True), ("total", None, True, True),
                                                   ("naics3", None, True, False)])
def test_a_further_request_writes_pandas_bytes_and_loads_little(release, tmp_path, by, where, moe, quick):
    """A filter, or groups not consecutive in the release, are answered through pandas; the rest
    without importing it (``gedp.release.quick``)."""
    request = ["tabulate", str(release), "--by", by, *(["--where", where] if where else []),
               *(["--moe"] if moe else [])]
    first = CliRunner().invoke(app, ["tabulate", str(release), "--moe", "--out", str(tmp_path / "first.csv")])
    assert first.exit_code == 0, first.output  # a first request with margins keeps the index
    kept = kept_tabulation(release, by, where=where, moe=moe)
    assert kept is not None
    expected = kept[1].to_csv(index=False).encode()
    for out in (str(tmp_path / "further.csv"), None):
        modules, written = further_request(request, out)
        assert written == expected
        assert "gedp.release.cells" in modules and not modules & NOT_LOADED, modules & NOT_LOADED
        assert ("pandas" not in modules) == quick and ("gedp.release.quick" in modules) == (where is None)
