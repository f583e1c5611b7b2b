"""The planner's independent predictions and simulated releases, run on the machine's cores.

Each task is a function of a shared, read-only context (the stand-in and what was measured of it)
and one small item (a config, an allocation, a release's seed), and returns a small result (errors
per level). The context is handed to forked worker processes by inheritance, never pickled; a task
draws its noise from its own seeded generator, so the results do not depend on the number of
workers or on the order in which they finish. The workers are as many as the cores, so a task in a worker
runs on one BLAS thread. Where processes cannot be forked (or one core is available), the tasks run one
after the other in this process.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from typing import Any

from gedp.errors import GedpError, held_stops
from gedp.postprocess.cpus import usable_cpus
from gedp.postprocess.structured import one_blas_thread
from gedp.running.process import worker_signals
from gedp.running.state_pool import stop_workers
from gedp.waits import awaited

#: Tasks per worker given out ahead of the result told next when results are not kept (``parallel_map``).
AHEAD = 2
#: The context of the running map, inherited by the forked workers (None outside a map).
_context: tuple[Callable[[Any, Any], Any], Any] | None = None


def parallel_map(task: Callable[[Any, Any], Any], shared: Any, items: Sequence[Any], *,
                 on_result: Callable[[int, Any], None] | None = None, workers: int | None = None,
                 keep: bool = True, stopped: str = "nothing was planned") -> list[Any]:
    """``task(shared, item)`` for every item, in the items' order, on up to ``workers`` processes
    (default: the available cores); ``on_result(index, result)`` is told of each result as it is
    ready, in order. Without ``keep`` the results are only told (the list returned is empty), and at
    most AHEAD tasks per worker are given out ahead of the result told next: memory holds a few
    results at once, not all of them. ``stopped``: what the error of a worker that died says of the work."""
    global _context
    tell = on_result or (lambda index, result: None)
    count = min(len(items), workers or usable_cpus())
    results: list[Any] = []
    if count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for index, item in enumerate(items):
            result = task(shared, item)
            tell(index, result)
            if keep:
                results.append(result)
        return results
    _context = (task, shared)
    # A pool that notices a dead worker (multiprocessing.Pool waits for its result for ever), its workers
    # stopped however the map ends, none waited for: not even one stuck (a forked child can start with a
    # lock another thread of this process held).
    pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork"), initializer=worker_signals)
    try:
        given, futures = iter(items), deque[Future]()
        with held_stops():
            futures.extend(pool.submit(_run, item) for item in islice(given, len(items) if keep else AHEAD * count))
        for index in range(len(items)):
            result = awaited(futures.popleft())
            with held_stops():
                futures.extend(pool.submit(_run, item) for item in islice(given, 1))
            tell(index, result)
            if keep:
                results.append(result)
        return results
    except BrokenProcessPool:
        raise GedpError("a worker process stopped before its task was done (killed, e.g. short of "
                        f"memory); {stopped}") from None
    finally:
        stop_workers(pool)
        _context = None


def _run(item: Any) -> Any:
    """One task in a worker, on the context it inherited."""
    if _context is None:
        raise RuntimeError("a planner worker started outside parallel_map")  # a bug, not an input error
    task, shared = _context
    with one_blas_thread:  # as many workers as cores: more BLAS threads would only wait for a time slice
        return task(shared, item)
