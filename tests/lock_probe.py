"""What the Ctrl-C probes share (tests/test_engine.py, tests/test_process.py): each probe is a script run in
a child interpreter (``run``), which imports this module (``run`` puts this folder on its path) to raise a
Ctrl-C at a chosen point (``stop_at``) and to find the locks it left taken (``taken``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path


def stop_at(k: int, raised: list | None = None):
    """A profile function (``sys.setprofile``) that raises SIGINT at the k-th point where the main thread
    can act on one: a Python function's start or a C function's return (where the interpreter runs signal
    handlers); ``k`` is appended to ``raised`` when it does."""
    seen = [0]

    def point(frame, event, arg):
        if event in ("call", "c_return"):
            seen[0] += 1
            if seen[0] == k:
                if raised is not None:
                    raised.append(k)
                signal.raise_signal(signal.SIGINT)
    return point


def taken(locks: Iterable, grace: float = 0.0) -> list:
    """The locks (or conditions) that another thread cannot take, within ``grace`` seconds for them all:
    looked at from a new thread, since a reentrant lock is free to the thread that holds it. A grace for
    locks a live thread takes for a moment (a pool's thread ending a task takes its count of idle
    threads): a lock left taken is taken for ever."""
    locks, found = list(locks), []

    def free(lock, timeout: float) -> bool:
        if lock.acquire(timeout=timeout):
            lock.release()
            return True
        return False

    def look():
        busy = [lock for lock in locks if not free(lock, 0.0)]
        deadline = time.monotonic() + grace
        found.extend(lock for lock in busy if not free(lock, max(deadline - time.monotonic(), 0.0)))
    looker = threading.Thread(target=look)
    looker.start()
    looker.join()
    return found


def run(script: str, *arguments: str, timeout: float) -> list[int]:
    """The whole numbers a probe script prints, run as ``python -c script arguments`` with this folder on
    its path (after the others: nothing of the tests shadows a module); it must exit 0."""
    returncode, numbers, stderr = outcome(script, *arguments, timeout=timeout)
    assert returncode == 0, stderr
    return numbers


def outcome(script: str, *arguments: str, timeout: float) -> tuple[int, list[int], str]:
    """A probe script's exit status (negative: killed by that signal), the whole numbers it printed and
    its error output, run as ``run`` does."""
    code = f"import sys\nsys.path.append({str(Path(__file__).parent)!r})\n{script}"
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=timeout)
    numbers = [int(word) for word in done.stdout.split()] if done.returncode == 0 else []
    return done.returncode, numbers, done.stderr
