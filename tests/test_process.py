"""gedp's commands leave numpy's arrays in the kernel's default pages and reuse the memory they free
(gedp/process.py)."""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys

import pytest

#: numpy's own reading of its switch, in a fresh process (numpy reads it once, at import).
HUGE_PAGES_PROBE = """
import sys
if sys.argv[1] == "gedp":
    from gedp.process import prefer_small_pages
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


#: Fresh pages (minor faults) of filling a 256 MiB array made after one of that size was freed.
REFILL_PROBE = """
import resource, sys
import numpy
if sys.argv[1] == "gedp":
    from gedp.process import reuse_freed_memory
    assert reuse_freed_memory()
size = 256 << 20
first = numpy.empty(size, numpy.uint8)
first.fill(1)
del first
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
second = numpy.empty(size, numpy.uint8)
second.fill(2)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
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


def fresh_pages_of_refill(*, after_gedp: bool) -> int:
    environment = {**os.environ, "NUMPY_MADVISE_HUGEPAGE": "0"}  # 4 KiB pages: one fault per page
    out = subprocess.run([sys.executable, "-c", REFILL_PROBE, "gedp" if after_gedp else "plain"],
                         capture_output=True, text=True, check=True, env=environment).stdout
    return int(out.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"),
                    reason="mallopt is glibc's")
def test_an_array_made_after_one_was_freed_reuses_its_pages():
    pages = (256 << 20) // 4096
    assert fresh_pages_of_refill(after_gedp=False) > pages // 2  # glibc's default: a fresh mapping
    assert fresh_pages_of_refill(after_gedp=True) < pages // 100


def refill_fresh_pages() -> int:
    """REFILL_PROBE's count in the process that calls it, as it is set up."""
    import numpy

    size = 256 << 20
    first = numpy.empty(size, numpy.uint8)
    first.fill(1)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = numpy.empty(size, numpy.uint8)
    second.fill(2)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"),
                    reason="mallopt is glibc's")
def test_the_workers_reuse_freed_memory_too(monkeypatch):
    from gedp import state_pool

    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "0")  # the spawned worker's numpy: one fault per page
    with state_pool._new_pool(1) as pool:
        assert pool.submit(refill_fresh_pages).result() < (256 << 20) // 4096 // 100


#: `gedp --version` through the executable's entry point, with an atexit callback that shows whether
#: the interpreter's normal exit ran; argv[1] "thread": a thread still runs beside the command.
END_PROBE = """
import atexit, sys, threading, time
atexit.register(lambda: print("normal exit", flush=True))
if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(3,)).start()  # longer than the command takes
sys.argv = ["gedp", *sys.argv[2:]]
from gedp.cli import command
print("before", flush=False)  # left in the buffer: the end must flush it
command()
"""


@pytest.mark.parametrize("arguments, code", [(["--version"], 0), (["tabulate", "no-such-release"], 2)])
def test_a_command_ends_at_once_with_its_code_and_its_output(arguments, code):
    alone = subprocess.run([sys.executable, "-c", END_PROBE, "alone", *arguments], capture_output=True, text=True)
    assert alone.returncode == code
    assert alone.stdout.startswith("before\n") and "normal exit" not in alone.stdout
    assert ("gedp" in alone.stdout) if code == 0 else ("error:" in alone.stderr)
    # power: a thread still running gets the interpreter's normal exit (it waits for the thread)
    beside = subprocess.run([sys.executable, "-c", END_PROBE, "thread", *arguments], capture_output=True, text=True)
    assert beside.returncode == code and beside.stdout.rstrip().endswith("normal exit")
