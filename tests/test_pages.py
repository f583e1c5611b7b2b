"""gedp's commands leave numpy's arrays in the kernel's default pages (gedp/pages.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: numpy's own reading of its switch, in a fresh process (numpy reads it once, at import).
HUGE_PAGES_PROBE = """
import sys
if sys.argv[1] == "gedp":
    from gedp.pages import prefer_small_pages
    prefer_small_pages()
import numpy
multiarray = numpy._core.multiarray if hasattr(numpy, "_core") else numpy.core.multiarray
print(multiarray._get_madvise_hugepage())
"""

#: What `gedp` (its console entry point) leaves in its environment for numpy and its worker processes.
COMMAND_PROBE = """
import os, sys
sys.argv = ["gedp", "--version"]
from gedp.cli import main
try:
    main()
except SystemExit:
    pass
print(os.environ.get("NUMPY_MADVISE_HUGEPAGE"))
"""


def numpy_asks_huge_pages(*, after_gedp: bool, setting: str | None = None) -> bool:
    environment = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if setting is not None:
        environment["NUMPY_MADVISE_HUGEPAGE"] = setting
    out = subprocess.run([sys.executable, "-c", HUGE_PAGES_PROBE, "gedp" if after_gedp else "plain"],
                         capture_output=True, text=True, check=True, env=environment).stdout
    return out.split()[-1] == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="numpy asks for huge pages on Linux only")
def test_numpy_asks_for_huge_pages_unless_gedp_says_otherwise():
    assert numpy_asks_huge_pages(after_gedp=False)  # the probe sees numpy's default: it can fail
    assert not numpy_asks_huge_pages(after_gedp=True)


def test_an_explicit_setting_is_kept():
    assert numpy_asks_huge_pages(after_gedp=True, setting="1") == sys.platform.startswith("linux")
    assert not numpy_asks_huge_pages(after_gedp=False, setting="0")


def test_the_command_line_sets_small_pages_for_itself_and_its_workers():
    environment = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    out = subprocess.run([sys.executable, "-c", COMMAND_PROBE], capture_output=True, text=True, check=True,
                         env=environment).stdout
    assert out.split()[-1] == "0"
