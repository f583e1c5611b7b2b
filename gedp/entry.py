"""The ``gedp`` executable's entry point, light on purpose: Ctrl-C and SIGTERM are handled as gedp
handles them (``gedp.running.process.stop_on_sigterm``) before the command line is imported (a
second or so of typer, rich and click), so a stop at any moment ends in one ``stopped`` line and exit
status 130 (143 after SIGTERM), never a traceback or a silent exit."""

from __future__ import annotations

import sys


def command() -> None:
    """Handle stops, then run ``gedp.cli.command``."""
    from gedp import errors
    from gedp.running.process import end_process, exit_status, stop_on_sigterm

    stop_on_sigterm()
    try:
        from gedp.cli import command as run
    except KeyboardInterrupt:  # also Terminated (SIGTERM)
        sys.stderr.write(f"stopped ({'SIGTERM' if errors.terminations else 'Ctrl-C'})\n")
        end_process(exit_status(130))
    run()
