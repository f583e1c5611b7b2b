"""How a gedp command's arrays get their memory from the kernel: in 4 KiB pages.

numpy asks the kernel for 2 MiB ("transparent huge") pages for every array of 4 MiB or more. A
1.4M-establishment `gedp protect` faults in about 3 GB of such pages, and each one is a 2 MiB block
the kernel must find whole and zero at once; on a virtual machine that hands freed memory back to its
host, such blocks are the ones handed back, and the fault waits for the host too. Measured there
(benchmarks/RESULTS.md): system time 3.6-5.7 s -> 2.3-2.7 s, whole runs 8.5-10.3 s -> 7.3-8.3 s, the
same pages allocated. Small pages come from memory the machine has just freed.
"""

from __future__ import annotations

import os

#: numpy's switch, read once when numpy is imported (numpy.org: "NUMPY_MADVISE_HUGEPAGE").
NUMPY_HUGE_PAGES = "NUMPY_MADVISE_HUGEPAGE"


def prefer_small_pages() -> None:
    """Have numpy, when it is imported after this (in this process and in the worker processes it
    starts), leave its arrays to the kernel's default page size. ``NUMPY_MADVISE_HUGEPAGE=1`` in the
    environment keeps huge pages (on a machine where they are faster)."""
    os.environ.setdefault(NUMPY_HUGE_PAGES, "0")
