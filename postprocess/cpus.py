"""The processors this process may run on: what gedp sizes its worker processes and threads by."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container or ``taskset`` may allow fewer
    than the machine has); all CPUs where the system does not say (macOS, Windows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
