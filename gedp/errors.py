"""gedp's errors: one base, GedpError, for everything a user can cause.

The command line turns a GedpError into one line on stderr: exit status 1 for a SolverError or an
AuditError (the computation failed), 2 for everything else (the input, config, budget or output path
was refused). Anything else is a bug and keeps its traceback. ``Terminated`` is not an error but a stop
(SIGTERM, handled as Ctrl-C); a release checks for one received since its run began before its manifest is
written and its charge committed.
"""

from __future__ import annotations

import _signal  # the C functions ``signal`` wraps (``held_stops``)
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class GedpError(Exception):
    """Base of every error gedp reports to its user."""


class InputError(GedpError, ValueError):
    """Input data, configuration or output path that gedp refuses (exit status 2)."""


class ConfigError(InputError):
    """A config file that cannot be used (exit status 2)."""


class BudgetError(InputError):
    """A budget plan or charge that would break the privacy guarantee (exit status 2)."""


class SolverError(GedpError, RuntimeError):
    """The least-squares postprocessing did not reach a verified optimum (exit status 1)."""


class AuditError(GedpError, RuntimeError):
    """A cell-suppression audit LP ended in a status other than optimal or unbounded (exit status 1)."""


class LockTimeout(GedpError):
    """A lock (the ledger's, the margin cache's) that another process held beyond the deadline of the
    wait (exit status 2): the message names the lock's file and what to do."""


class InputProblems(InputError):
    """Every problem found in one input, each a line with its hint (exit status 2); the command line
    prints the subject, then one problem per line."""

    def __init__(self, subject: str, problems: list[str]) -> None:
        self.subject, self.problems = subject, list(problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{subject} has {len(problems)} {noun}: " + "; ".join(problems))


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``timeout``, Slurm and systemd send) as Ctrl-C: raised in the main thread by the
    command line's handler (``gedp.running.process.stop_on_sigterm``), so the command stops the same
    way (staging folders removed, workers stopped, nothing published)."""


#: Every SIGTERM this process received (the handler records each before it raises ``Terminated``).
terminations: list[int] = []
#: Every Ctrl-C (SIGINT) the command line's handler received (``raise_interrupted``).
interruptions: list[int] = []
#: How many of ``terminations`` and of ``interruptions`` were received before the current run began
#: (None outside a run).
_run_start: ContextVar[tuple[int, int] | None] = ContextVar("gedp_run_start", default=None)


@contextmanager
def run_started() -> Iterator[None]:
    """The span of a run (a command, from its start: ``gedp.cli``; a library call, from its entry:
    ``gedp.protect``, ``protect_recorded``, ``protect_panel``), re-entrant: the outermost one counts.
    A SIGTERM received during it, also before its ledger or its protection started, stops it; those an
    earlier run of this process received, which the process survived (a library, or a command line run
    in-process, that handled the ``Terminated``), do not. Held per thread (a ``ContextVar``): a run in
    another thread does not move this one's start."""
    if _run_start.get() is not None:
        yield
        return
    token = _run_start.set((len(terminations), len(interruptions)))
    try:
        yield
    finally:
        _run_start.reset(token)


def stop_if_terminated() -> None:
    """Raise ``Terminated`` again if SIGTERM was received since the run began (ever, outside a run),
    else ``KeyboardInterrupt`` if Ctrl-C was since the run began (the command line's handler records
    it, and every command is a run; outside a run a Ctrl-C some earlier command of the process
    received and survived, in-process, is not this call's): called before a release's manifest is
    written and its charge committed, so a stop whose exception was lost on the way (raised inside a
    finalizer or an import's callback, or in a library that swallowed it) still commits and publishes
    nothing."""
    start = _run_start.get()
    before_terminations, before_interruptions = start or (0, 0)
    if len(terminations) > before_terminations:
        raise Terminated()
    if start is not None and len(interruptions) > before_interruptions:
        raise KeyboardInterrupt()


def raise_terminated(signum: int, frame: object) -> None:
    """The command line's SIGTERM handler (``gedp.running.process.stop_on_sigterm``): recorded, then
    raised as ``Terminated``."""
    terminations.append(signum)
    raise Terminated()


def raise_interrupted(signum: int, frame: object) -> None:
    """The command line's Ctrl-C handler (``gedp.running.process.stop_on_sigterm``): recorded (the
    backstop ``stop_if_terminated`` reads), then raised as Python's own handler raises it, unless the
    command is already stopping or ending: a stop, or the command's exit, is the exception being
    handled (its clean-ups run: workers stopped, staging removed; the process ended with its status).
    Raised again there, a second Ctrl-C could cut a clean-up short before it held stops back (e.g. as
    ``stop_workers`` begins), leaving workers that outlive the command and tracebacks of the
    interpreter's wait for them, or print a traceback after the command's last line. A stop that was
    caught and dropped is no longer being handled, so a later Ctrl-C still stops the command."""
    interruptions.append(signum)
    if isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit)):  # Terminated too
        return
    raise KeyboardInterrupt()


#: The stops held back across a critical section (``held_stops``).
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def held_stops() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back across a critical section, then act on every one received: each
    SIGTERM is recorded (``terminations``: the exit status is 143 even when a Ctrl-C came
    first), then the first stop is raised (``KeyboardInterrupt``, or the command line's ``Terminated``;
    a default handler's signal raised again). Used where a stop half way would leave a state nothing
    cleans: a pool starting its workers (a worker the pool does not know of, which ``stop_workers``
    cannot stop and the pool's shutdown waits for; a new worker inherits the block, so a Ctrl-C that
    reaches it before its initializer, ``worker_signals``, waits and is dropped, and the SIGTERM that
    stops it waits and ends it), the ledger's reservation (a key file without its event). Only the main
    thread handles signals: elsewhere the block does nothing.

    A stop's handler runs between any two steps of the interpreter, so the handlers are read before
    anything changes, every change is inside the ``try``, and handlers and mask are changed by the C
    functions themselves (``_signal``: ``signal.signal`` and ``signal.pthread_sigmask`` are Python
    code, where a stop can be raised before they act): a stop raised by a handler not yet replaced (a
    SIGTERM as the Ctrl-C recorder is put in) or by one already put back (a Ctrl-C as the SIGTERM
    recorder is taken out) leaves no recorder installed and no stop blocked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    first, second = (int(number) for number in HELD_SIGNALS)
    previous = {first: _signal.getsignal(first), second: _signal.getsignal(second)}
    try:
        _signal.signal(first, lambda number, frame: received.append(number))
        _signal.signal(second, lambda number, frame: received.append(number))
        _signal.pthread_sigmask(_signal.SIG_BLOCK, (first, second))
        yield
    finally:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, (first, second))
        try:
            _signal.signal(first, previous[first])
        finally:
            _signal.signal(second, previous[second])  # put back even if the first's stop was raised
        _act_on(list(dict.fromkeys(received)), previous)


def _act_on(stops: list[int], handlers: dict) -> None:
    """Act on the ``stops`` held back (each once, in the order received) as their ``handlers`` would."""
    if signal.SIGTERM in stops and handlers[signal.SIGTERM] is raise_terminated:
        terminations.append(signal.SIGTERM)  # recorded even if a Ctrl-C before it raises first
    for number in stops:
        handler = handlers[number]
        if handler is raise_terminated:
            raise Terminated()
        if callable(handler):
            handler(number, None)  # e.g. Python's KeyboardInterrupt
        elif handler == signal.SIG_DFL:
            signal.raise_signal(number)  # ends the process, as it would have
