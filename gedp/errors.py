"""gedp's errors: one base, GedpError, for everything a user can cause.

The command line turns a GedpError into one line on stderr: exit status 1 for a SolverError or an
AuditError (the computation failed), 2 for everything else (the input, config, budget or output path
was refused). Anything else is a bug and keeps its traceback. ``Terminated`` is not an error but a stop
(SIGTERM, handled as Ctrl-C); a release checks for one received since its run began before its manifest is
written and its charge committed.
"""

from __future__ import annotations


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


#: The SIGTERMs this process received since its current run began (the handler records each before
#: it raises ``Terminated``; ``new_run`` forgets those of earlier runs).
terminations: list[int] = []


def new_run() -> None:
    """Begin a run (each protection: ``gedp.running.recorded_release.protect_recorded``,
    ``gedp.running.panel_protect.protect_panel``, ``gedp run``): the SIGTERMs an earlier run of this
    process received, which the process survived (a library, or a command line run in-process, that
    handled the ``Terminated``), do not stop this one from committing and publishing."""
    terminations.clear()


def stop_if_terminated() -> None:
    """Raise ``Terminated`` again if SIGTERM was received: called before a release's manifest is written
    and its charge committed, so a stop whose exception was lost on the way (raised inside a finalizer,
    or in a library that swallowed it) still commits and publishes nothing."""
    if terminations:
        raise Terminated()
