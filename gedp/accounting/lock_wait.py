"""A file lock (``fcntl.flock``) waited for with a deadline: the ledger's (``ledger_file.locked_ledger``)
and the margin cache's (``gedp.release.margins``).

A process that holds such a lock and hangs would otherwise hold every other one waiting for ever. A
waiter takes the lock at once when it is free; else it says once, after ``NOTICE_SECONDS``, what it is
waiting for (on stderr: the lock's file and, for the ledger, the process holding it and since when),
and gives up after ``GEDP_LOCK_TIMEOUT`` seconds (default ``DEFAULT_TIMEOUT``) with a one-line
``LockTimeout`` naming the file and what to do. It has changed nothing then: the ledger's waiter has
not read the ledger under the lock, so no event is written and no key file made.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gedp.errors import InputError, LockTimeout

#: The environment variable that sets how long a process waits for a lock, in seconds.
TIMEOUT_ENV = "GEDP_LOCK_TIMEOUT"
#: Ten minutes: far longer than any holder keeps a lock (a ledger's reserve reads and hashes the
#: input's establishments; a tabulation reads the cache), short enough that a hung holder is noticed.
DEFAULT_TIMEOUT = 600.0
#: How long a waiter waits before it says so, and how often it tries the lock again (seconds).
NOTICE_SECONDS = 2.0
POLL_SECONDS = 0.05


#: ``os.open``'s errors for a lock path that is not a regular file: a symbolic link (``O_NOFOLLOW``), a
#: folder opened for writing, a socket.
_NOT_REGULAR = (errno.ELOOP, errno.EISDIR, errno.ENXIO)


def open_lock_file(lock: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """The descriptor of the regular file ``lock`` opened with ``flags`` (made, mode 0600, with
    ``O_CREAT``), never through a symbolic link, and without waiting (``O_NONBLOCK``: a FIFO does not
    hang the open). A symbolic link, FIFO, folder, socket or device at ``lock`` is refused with an
    ``InputError`` naming it: writing the holder's line into a link's target would overwrite any file
    the user can write. Other ``OSError``s are the caller's."""
    handle = -1
    try:
        handle = os.open(lock, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        regular = stat.S_ISREG(os.fstat(handle).st_mode)
    except OSError as err:
        if err.errno not in _NOT_REGULAR:
            raise
        regular = False
    if not regular:
        if handle >= 0:
            os.close(handle)
        raise InputError(f"lock file '{lock}' must be a regular file, not a symbolic link, FIFO or folder: "
                         f"gedp does not open it; remove it and run again")
    return handle


def lock_timeout() -> float:
    """The seconds a process waits for a lock: ``$GEDP_LOCK_TIMEOUT``, else ``DEFAULT_TIMEOUT``; a value
    that is not a finite number >= 0 is refused (0: never wait)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        shown = text if len(text) <= 20 else text[:17] + "..."
        raise InputError(f"{TIMEOUT_ENV} ({shown!r}) must be a number of seconds >= 0 (how long gedp waits for "
                         f"a lock another process holds; default {DEFAULT_TIMEOUT:g})")
    return seconds


class LockWait:
    """One wait for the lock at ``lock`` (what it is: ``what``), under one deadline however many times
    the lock's file is opened again; ``holder()`` describes who holds it (" (held by ...)" or ""), and
    ``hint`` says what to do when the deadline passes."""

    def __init__(self, lock: Path, what: str, hint: str, holder: Callable[[], str] = lambda: "") -> None:
        self.lock, self.what, self.hint, self.holder = lock, what, hint, holder
        self.timeout = lock_timeout()
        self.started = time.monotonic()
        self.told = False

    def take(self, handle: int, kind: int) -> None:
        """Take ``kind`` (``fcntl.LOCK_EX`` or ``LOCK_SH``) on the open file ``handle`` (a descriptor)
        before the deadline, or raise ``LockTimeout`` (the caller closes ``handle``)."""
        import fcntl

        while True:
            try:
                fcntl.flock(handle, kind | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            waited = time.monotonic() - self.started
            if waited >= self.timeout:
                raise LockTimeout(f"{self.what} at '{self.lock}'{self.holder()} was not let go within "
                                  f"{self.timeout:g} s ({TIMEOUT_ENV}): {self.hint}")
            if not self.told and waited >= NOTICE_SECONDS:
                print(f"waiting for {self.what} at '{self.lock}'{self.holder()} (up to {self.timeout:g} s, "
                      f"{TIMEOUT_ENV})", file=sys.stderr, flush=True)
                self.told = True
            time.sleep(min(POLL_SECONDS, self.timeout - waited))
