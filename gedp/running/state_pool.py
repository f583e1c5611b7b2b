"""Protect the states of a multi-state input in a pool of worker processes (the local engine).

Each task is one state: its worker reads the state, protects it, writes its parts into the staging
release and returns its manifest entry (``gedp.running.engine``'s function, passed in). The entries come back in
state order and each state is reported done once it and every state before it are, so neither the
release nor the progress depends on which worker finished first or on how many there are: a state's
noise comes from its own generator (``state_rng(entropy, state)`` for a seeded release, a secure
generator drawn inside the worker otherwise). At most ``processes`` states are in memory at once.

Workers are fresh interpreters (``spawn``: a ``fork`` of a main process whose pyarrow and BLAS
threads are running could deadlock; ``forkserver`` was no faster on the national input and leaves a
server process behind whose children's processor time no parent accounts for). They ignore Ctrl-C:
the main process stops them all before the staging release is removed, so an interrupted or refused
run leaves neither a release nor a worker writing into one.

A fresh interpreter takes about a second to import gedp, so ``early_workers`` starts the workers of an
input that holds several states (by its Parquet footers) while the main process is still checking and
reading it: they only import what protecting a state needs and receive no state before
``protect_in_pool``, which the checks precede; a run that stops before it stops them.
"""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path

from gedp.errors import GedpError, InputError, held_stops
from gedp.postprocess.cpus import usable_cpus
from gedp.running.process import give_back_freed_memory, reuse_freed_memory, worker_signals
from gedp.waits import completed, result_of

#: How worker processes start.
START_METHOD = "spawn"


#: Input rows per worker below which the automatic choice starts fewer workers: a worker's start (a
#: fresh interpreter importing gedp, about 1.2 s) costs about what protecting 100,000 establishments does.
ROWS_PER_WORKER = 100_000
#: Seconds a stopped worker is given to end on SIGTERM before it is killed (``stop_workers``).
STOP_WAIT = 30.0


def pool_size(processes: int | None, states: int, rows: int | None = None) -> int:
    """How many worker processes protect ``states`` states of ``rows`` input rows in all: ``processes``
    when given (at least 1), else the CPUs this process may run on (all CPUs where the system does not
    say: macOS, Windows), and no more than one per ROWS_PER_WORKER rows; never more than the states."""
    if processes is None:
        processes = usable_cpus()
        if rows is not None:
            processes = min(processes, rows // ROWS_PER_WORKER)
    elif isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise InputError(f"processes {processes!r} must be a whole number of at least 1")
    return max(1, min(processes, states))


def protect_in_pool(protect_state: Callable[..., dict | Exception], arguments: dict[str, tuple],
                    on_state: Callable[[str], None] | None, processes: int) -> list[dict]:
    """The manifest entries of every state of ``arguments`` (state -> the arguments of
    ``protect_state``, a module-level function that protects and writes one state and returns its
    entry or its input or solver error), in state order, each run by one of ``processes`` workers.

    An input or solver error of any state is raised here (the first found in state order among those
    finished), and a worker that dies (e.g. killed short of memory) is reported as a GedpError; on
    these, or on any other exception or Ctrl-C, the workers are stopped before returning.
    """
    pool = _take_started(processes) or _new_pool(processes)
    try:
        with held_stops():
            futures = {state: pool.submit(_state_in_worker, protect_state, *task) for state, task in arguments.items()}
        return _collect(futures, on_state)
    except Exception as err:
        # A worker that dies while others are still starting breaks the pool inside ``submit``, which then
        # fails on the queue the pool closed (OSError "handle is closed") rather than with BrokenProcessPool.
        died = isinstance(err, BrokenProcessPool) or bool(pool._broken)  # before stopping breaks it too
        stop_workers(pool)
        if not died:
            raise
        raise GedpError(f"a worker process stopped before its state was protected (killed, e.g. short of memory "
                        f"for {processes} states at once; or, from a Python script, one whose protect call is not "
                        f"under `if __name__ == '__main__':`); nothing was published: try fewer --processes") from None
    except BaseException:
        stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: Modules a worker imports before its first state (``early_workers``): what protecting a state needs.
WARM_MODULES = ("gedp.running.engine",)

#: The pool ``early_workers`` started, until ``protect_in_pool`` takes it (one run at a time per process).
_started: list[ProcessPoolExecutor] = []


@contextmanager
def early_workers(path: str | Path, processes: int | None) -> Iterator[None]:
    """Start, for the duration of the block, the worker processes that ``protect_in_pool`` will use for
    the Parquet input ``path`` if its footers show several states (a folder of parts or a file whose
    ``state`` statistics hold several values): they import ``WARM_MODULES`` while this process checks
    and reads the input. No state reaches them here; the block's end stops any still running, so a
    refused run leaves no worker behind. Nothing is started for one state, a CSV or ``processes`` 1."""
    size = _expected_size(Path(path), processes)
    if size < 2:
        yield
        return
    pool = _new_pool(size)
    with held_stops():
        for _ in range(size):
            pool.submit(_warm)
    _started.append(pool)
    try:
        yield
    except BaseException:
        stop_workers(pool)
        raise
    finally:
        if pool in _started:
            _started.remove(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _expected_size(path: Path, processes: int | None) -> int:
    """``pool_size`` for the states and rows the footers of a Parquet input show (0 when they show
    one state, for a CSV input and for a number of processes ``pool_size`` refuses)."""
    from gedp.synth.paths import is_parquet

    if not is_parquet(path):
        return 0
    import pyarrow.dataset as ds

    from gedp.synth.footers import range_bounds

    fragments = list(ds.dataset(path, format="parquet").get_fragments())
    values: set = set()
    for fragment in fragments:
        bounds = range_bounds(fragment.metadata, "state")
        # a part that does not say: take the input for one of several states
        values |= {("unknown part", fragment.path)} if bounds is None else bounds
    rows = sum(fragment.metadata.num_rows for fragment in fragments)
    try:
        return pool_size(processes, len(values), rows) if len(values) > 1 else 0
    except InputError:
        return 0


def _warm() -> None:
    """A worker's first task: import what protecting a state needs."""
    for module in WARM_MODULES:
        importlib.import_module(module)


def _new_pool(processes: int) -> ProcessPoolExecutor:
    """A pool of ``processes`` spawned workers that ignore Ctrl-C and reuse freed memory."""
    return ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context(START_METHOD),
                               initializer=_start_worker)


def _take_started(processes: int) -> ProcessPoolExecutor | None:
    """The pool ``early_workers`` started if it has ``processes`` workers (taken: the caller shuts it
    down); a started pool of another size is stopped, so that it holds no CPU."""
    if not _started:
        return None
    pool = _started.pop()
    if pool._max_workers == processes:
        return pool
    stop_workers(pool)
    return None


def release_started() -> None:
    """Stop the workers ``early_workers`` started when the states are protected in this process."""
    _take_started(0)


def _collect(futures: dict[str, Future], on_state: Callable[[str], None] | None) -> list[dict]:
    """The futures' entries in state order, raising a returned error as soon as it is known; each
    state is reported once it and every earlier state are done (no completion order shows)."""
    states = list(futures)
    entries: dict[str, dict] = {}
    reported = 0
    finished: set[Future] = set()
    for future in completed(futures.values()):  # waking to act on a stop another thread took (``completed``)
        finished.add(future)
        for state in states:  # state order, so which error is raised does not depend on timing among these
            if state not in entries and futures[state] in finished:
                entry = result_of(futures[state])
                if isinstance(entry, Exception):
                    raise entry
                entries[state] = entry
        while reported < len(states) and states[reported] in entries:
            if on_state is not None:
                on_state(states[reported])
            reported += 1
    return [entries[state] for state in states]


def _state_in_worker(protect_state: Callable[..., dict | Exception], *task) -> dict | Exception:
    """One state's task in a worker; then the heap's free pages go back to the kernel, so that a
    worker does not hold a large state's memory while it protects the next (gedp/running/process.py)."""
    try:
        return protect_state(*task)
    finally:
        give_back_freed_memory()


def _start_worker() -> None:
    """A worker ignores Ctrl-C (sent to the whole process group: the main process stops it,
    ``worker_signals``) and reuses the memory it frees (gedp/running/process.py)."""
    worker_signals()
    reuse_freed_memory()


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the running workers at once and wait until they have, then shut the pool down, its
    waiting tasks cancelled (``shutdown`` alone would let their tasks finish, or wait for ever on a
    stuck one); Python 3.14's ``terminate_workers`` does the same. A worker still alive
    ``STOP_WAIT`` seconds after its SIGTERM is killed: one that never reaches its initializer keeps
    the stops it was started with blocked (``gedp.errors.held_stops``), and would be waited for
    without end. A stop received meanwhile (a second Ctrl-C of a command that is stopping) is held
    until they have ended and the pool is shut down, then raised: cut short, the wait left workers
    running and a pool half shut (tracebacks of its threads, and of the interpreter's own wait for
    them at exit). One raised before the hold began is raised once they have ended too."""
    early: KeyboardInterrupt | None = None
    ended = False
    while not ended:
        try:
            with held_stops():
                _end_workers(pool)
                ended = True
        except KeyboardInterrupt as stop:
            if ended:
                raise
            early = early or stop  # received before the hold began: the workers are ended first
    if early is not None:
        raise early


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """``stop_workers``'s work: SIGTERM to every running worker, SIGKILL after STOP_WAIT, then shutdown."""
    processes = list((pool._processes or {}).values())
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(STOP_WAIT)
        if process.exitcode is None:
            process.kill()
            process.join()
    pool.shutdown(wait=True, cancel_futures=True)
