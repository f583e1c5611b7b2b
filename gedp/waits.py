"""Waiting on futures from the main thread with Ctrl-C held back while a lock is taken.

``concurrent.futures`` takes locks that the pools' own threads need (a future's, a thread pool's count of
idle threads); a KeyboardInterrupt raised in the main thread just after one is taken leaves it taken, the
pool's thread blocks on it, and the pool's shutdown waits for that thread for ever: a stopped command
that never ends. Every submit, wait and result of the main thread goes through these helpers
(docs/contributing.md); the stop is acted on once the call has returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Any, TypeVar

from gedp.errors import held_stops

#: How often (s) a main thread waiting for its workers wakes to act on a stop another thread took.
STOP_POLL = 0.2

T = TypeVar("T")


def completed(futures: Iterable[Future[T]]) -> Iterator[Future[T]]:
    """The ``futures`` as they finish (``concurrent.futures.as_completed``; those found finished by one
    wake in the order given), the wait woken every STOP_POLL seconds. While the main thread holds
    Ctrl-C back (``gedp.errors.held_stops``, or starting a process), the kernel hands the signal to
    another thread of the process, one a C library started (OpenBLAS, Arrow); Python marks it but
    wakes nothing, and a main thread that then waits without a timeout acts on it only when a future
    finishes (a whole batch of runs: minutes under load). Each wake takes the interpreter's lock back,
    which makes the main thread act on such a signal.

    Each wait holds Ctrl-C back until it has returned (``result_of`` too): ``wait`` takes every
    future's lock one by one, and a KeyboardInterrupt raised between two takes leaves them taken; the
    pool's own thread then blocks on one as it fails the futures of stopped workers, and the pool's
    shutdown waits for that thread for ever (a stopped command that never ends)."""
    order = list(futures)
    pending = set(order)
    while pending:
        with held_stops():
            done, pending = wait(pending, timeout=STOP_POLL, return_when=FIRST_COMPLETED)
        yield from (future for future in order if future in done)


def result_of(future: Future[T]) -> T:
    """A finished future's result (its error raised), Ctrl-C held back meanwhile (``completed``)."""
    with held_stops():
        return future.result()


def submitted(pool: Executor, task: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    """``pool.submit(task, *args, **kwargs)``, Ctrl-C held back meanwhile (``completed``): a thread pool's submit
    takes the lock of its count of idle threads and, starting a thread, that of the thread's start; a
    KeyboardInterrupt raised just after one is taken leaves it taken, the pool's thread blocks on it
    when its task is done, and the pool's shutdown (a ``with`` block's end, the interpreter's exit)
    waits for that thread for ever."""
    with held_stops():
        return pool.submit(task, *args, **kwargs)


def awaited(future: Future[T]) -> T:
    """``future.result()``, waiting as ``completed`` does (a stop that another thread took is acted on;
    a bare ``result()`` interrupted just after it took the future's lock leaves it taken, and the
    pool's thread blocks on it as it sets the result)."""
    for _ in completed([future]):
        pass
    return result_of(future)
